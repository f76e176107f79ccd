// Host entry points: unpack the C ABI structs into a Problem, run voxels in fixed blocks on the thread
// pool, and reduce per-block event gradients in block order (bitwise identical for any thread count).
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "blochsim/epg.hpp"
#include "capi.h"
#include "thread_pool.hpp"

namespace bs {

constexpr int64_t kVoxelsPerBlock = 16;

template <class R>
Problem<R> make_problem(const bs_program& pg, const bs_tissue& ts, const bs_tangents* tg) {
  Problem<R> pb;
  pb.E = pg.num_events;
  pb.reps = pg.num_repetitions;
  pb.S = pg.num_samples;
  pb.K = pg.num_states;
  pb.stride = pg.checkpoint_stride;
  if (pb.E < 1) throw std::invalid_argument("num_events must be >= 1");
  if (pb.reps < 1) throw std::invalid_argument("num_repetitions must be >= 1");
  if (pb.K < 1) throw std::invalid_argument("num_states must be >= 1");
  if (pb.stride < 1) throw std::invalid_argument("checkpoint_stride must be >= 1");
  if (pg.path != BS_PATH_REAL && pg.path != BS_PATH_COMPLEX) throw std::invalid_argument("path must be 0 or 1");
  pb.action = pg.action;
  pb.record = pg.record;
  auto event_input = [&](const void* data, const void* tan, int64_t tan_stride_p) {
    Input<R> in;
    in.data = static_cast<const R*>(data);
    in.stride = 1;
    in.tan = static_cast<const R*>(tan);
    in.tan_stride_p = tan_stride_p;
    in.tan_stride = 1;
    return in;
  };
  pb.dt = event_input(pg.dt_s, tg ? tg->dt_s : nullptr, pb.E);
  pb.dt_wrap = event_input(pg.dt_wrap_s, tg ? tg->dt_wrap_s : nullptr, 1);
  pb.flip = event_input(pg.flip_rad, tg ? tg->flip_rad : nullptr, pb.E);
  pb.phase = event_input(pg.phase_rad, tg ? tg->phase_rad : nullptr, pb.E);
  if (!pb.dt.data || !pb.dt_wrap.data || !pb.flip.data || !pb.phase.data || !pb.action || !pb.record)
    throw std::invalid_argument("program arrays must not be null");
  static const double identity[BS_NUM_TISSUE] = {0, 0, 1, 1, 0, 0, 1, 0, 0};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    Input<R>& in = pb.tissue[j];
    in.data = static_cast<const R*>(ts.data[j]);
    in.stride = ts.stride[j];
    in.identity = R(identity[j]);
    if (tg) {
      in.tan = static_cast<const R*>(tg->tissue[j]);
      in.tan_stride_p = tg->tissue_stride_p[j];
      in.tan_stride = tg->tissue_stride_v[j];
    }
  }
  if (!pb.tissue[BS_T1_MS].data || !pb.tissue[BS_T2_MS].data)
    throw std::invalid_argument("tissue T1 and T2 are required");
  pb.dk = pg.crusher_dk_rad_per_m;
  pb.L = pg.voxel_size_m;
  const bool moving = ts.data[BS_VELOCITY_M_PER_S] != nullptr;
  pb.diffusion = pb.dk != 0 && ts.data[BS_DIFFUSION_UM2_PER_MS] != nullptr;
  pb.flow = pb.dk != 0 && moving;
  pb.washout = pb.L > 0 && moving;
  pb.offres = ts.data[BS_B0_HZ] != nullptr;
  if (pg.path == BS_PATH_REAL && (pb.offres || moving || ts.data[BS_B1_PHASE_RAD]))
    throw std::invalid_argument("the real path cannot take B0, B1phase or v: compile for the complex path");
  for (int64_t e = 0; e < pb.E; ++e)
    if (pb.record[e] >= pb.S) throw std::invalid_argument("record slot out of range");
  return pb;
}

template <class N>
inline void store_complex(const Cx<N>& x, typename Num<N>::Real* out, typename Num<N>::Real* out_tan,
                          int64_t index, int64_t tan_stride_p) {
  out[2 * index] = value_of(x.re);
  out[2 * index + 1] = value_of(x.im);
  if constexpr (Num<N>::P > 0) {
    if (out_tan)
      for (int p = 0; p < Num<N>::P; ++p) {
        out_tan[2 * (p * tan_stride_p + index)] = x.re.d[p];
        out_tan[2 * (p * tan_stride_p + index) + 1] = x.im.d[p];
      }
  }
}

template <class N>
inline Cx<N> load_complex(const typename Num<N>::Real* in, const typename Num<N>::Real* in_tan, int64_t index) {
  Cx<N> x(N(in[2 * index]), N(in[2 * index + 1]));
  if constexpr (Num<N>::P > 0) {
    if (in_tan) {
      x.re.d[0] = in_tan[2 * index];
      x.im.d[0] = in_tan[2 * index + 1];
    }
  }
  return x;
}

// Forward (N = R) and JVP (N = Dual<R, P>).
template <class N, class S>
void run_forward(const bs_program& pg, const bs_tissue& ts, const bs_tangents* tg, int threads, void* signal,
                 void* signal_tangent) {
  using R = typename Num<N>::Real;
  const Problem<R> pb = make_problem<R>(pg, ts, tg);
  const int64_t V = ts.num_voxels, nblocks = (V + kVoxelsPerBlock - 1) / kVoxelsPerBlock;
  R* out = static_cast<R*>(signal);
  R* out_tan = static_cast<R*>(signal_tangent);
  parallel_for(nblocks, threads, [&](int64_t b, int) {
    thread_local std::vector<char> scratch_bytes;
    const size_t need = sizeof(S) * 3 * pb.K * scratch_planes(pb, false) + sizeof(Cx<N>) * (pb.S + 1);
    if (scratch_bytes.size() < need) scratch_bytes.resize(need);
    S* scratch = reinterpret_cast<S*>(scratch_bytes.data());
    Cx<N>* samples = reinterpret_cast<Cx<N>*>(scratch_bytes.data() + sizeof(S) * 3 * pb.K * scratch_planes(pb, false));
    for (int64_t v = b * kVoxelsPerBlock; v < V && v < (b + 1) * kVoxelsPerBlock; ++v) {
      const Voxel<N> t = load_voxel<N>(pb, v);
      forward_voxel<N, S>(pb, t, scratch, samples);
      for (int64_t s = 0; s < pb.S; ++s) store_complex(samples[s], out, out_tan, v * pb.S + s, V * pb.S);
    }
  });
}

// VJP (N = R) and second-order adjoint (N = Dual<R, 1>).
template <class N, class S>
void run_vjp(const bs_program& pg, const bs_tissue& ts, const bs_tangents* tg, int threads, const void* cotangent,
             const void* cotangent_tangent, const bs_grads& grads, const bs_grads* grads_tangent, void* signal,
             void* signal_tangent) {
  using R = typename Num<N>::Real;
  const Problem<R> pb = make_problem<R>(pg, ts, tg);
  const int64_t V = ts.num_voxels, E = pb.E, nblocks = (V + kVoxelsPerBlock - 1) / kVoxelsPerBlock;
  const int64_t nev = 3 * E + 1;  // dt[E], flip[E], phase[E], dt_wrap
  std::vector<N> block_grads(static_cast<size_t>(nblocks * nev), N(0));
  const R* cot = static_cast<const R*>(cotangent);
  const R* cot_tan = static_cast<const R*>(cotangent_tangent);
  parallel_for(nblocks, threads, [&](int64_t b, int) {
    thread_local std::vector<char> scratch_bytes;
    const size_t planes_bytes = sizeof(S) * 3 * pb.K * scratch_planes(pb, true);
    const size_t need = planes_bytes + 2 * sizeof(Cx<N>) * (pb.S + 1);
    if (scratch_bytes.size() < need) scratch_bytes.resize(need);
    S* scratch = reinterpret_cast<S*>(scratch_bytes.data());
    Cx<N>* w = reinterpret_cast<Cx<N>*>(scratch_bytes.data() + planes_bytes);
    Cx<N>* samples = w + (pb.S + 1);
    N* acc = block_grads.data() + b * nev;
    EventGrad<N> eg{acc, acc + 3 * E, acc + E, acc + 2 * E};
    for (int64_t v = b * kVoxelsPerBlock; v < V && v < (b + 1) * kVoxelsPerBlock; ++v) {
      const Voxel<N> t = load_voxel<N>(pb, v);
      for (int64_t s = 0; s < pb.S; ++s) w[s] = load_complex<N>(cot, cot_tan, v * pb.S + s);
      VoxelGrad<N> g;
      vjp_voxel<N, S>(pb, t, scratch, w, samples, g, eg);
      if (signal)
        for (int64_t s = 0; s < pb.S; ++s)
          store_complex(samples[s], static_cast<R*>(signal), static_cast<R*>(signal_tangent), v * pb.S + s, 0);
      // Times: d/dT = d/d(rate) * d(rate)/dT.
      const N per_param[BS_NUM_TISSUE] = {g.r1 * drate_dms(t.t1_ms), g.r2 * drate_dms(t.t2_ms), g.m0, g.b1,
                                          g.b1phase, g.b0, g.inv, g.D, g.v};
      for (int j = 0; j < BS_NUM_TISSUE; ++j) {
        if (grads.tissue[j]) static_cast<R*>(grads.tissue[j])[v] = value_of(per_param[j]);
        if constexpr (Num<N>::P > 0) {
          if (grads_tangent && grads_tangent->tissue[j])
            static_cast<R*>(grads_tangent->tissue[j])[v] = per_param[j].d[0];
        }
      }
    }
  });
  // Reduce blocks in order, in double.
  std::vector<double> total(static_cast<size_t>(nev), 0.0), total_tan(static_cast<size_t>(nev), 0.0);
  for (int64_t b = 0; b < nblocks; ++b)
    for (int64_t i = 0; i < nev; ++i) {
      const N& x = block_grads[b * nev + i];
      total[i] += value_of(x);
      if constexpr (Num<N>::P > 0) total_tan[i] += x.d[0];
    }
  auto write = [&](const bs_grads& dst, const std::vector<double>& src) {
    auto put = [&](void* p, int64_t offset, int64_t count) {
      if (!p) return;
      for (int64_t i = 0; i < count; ++i) static_cast<R*>(p)[i] = R(src[offset + i]);
    };
    put(dst.dt_s, 0, E);
    put(dst.flip_rad, E, E);
    put(dst.phase_rad, 2 * E, E);
    put(dst.dt_wrap_s, 3 * E, 1);
  };
  write(grads, total);
  if (grads_tangent) write(*grads_tangent, total_tan);
}

}  // namespace bs
