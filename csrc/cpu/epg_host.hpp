// Host entry points: unpack the C ABI structs into a Problem, run voxels in fixed blocks on the thread
// pool, and reduce per-block event gradients in block order (bitwise identical for any thread count).
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "blochsim/event_loop.hpp"
#include "capi.h"
#include "thread_pool.hpp"

namespace bs {

constexpr int64_t kVoxelsPerBlock = 16;

template <class R>
Problem<R> make_problem(const bs_program& pg, const bs_tissue& ts, const bs_tangents* tg, const bs_tables& tb,
                        const bs_tables* tb_tan) {
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
  pb.voxel_m = pg.voxel_size_m;
  const bool moving = ts.data[BS_VELOCITY_M_PER_S] != nullptr;
  pb.diffusion = pb.dk != 0 && ts.data[BS_DIFFUSION_UM2_PER_MS] != nullptr;
  pb.flow = pb.dk != 0 && moving;
  pb.washout = pb.voxel_m > 0 && moving;
  pb.offres = ts.data[BS_B0_HZ] != nullptr;
  if (pg.path == BS_PATH_REAL && (pb.offres || moving || ts.data[BS_B1_PHASE_RAD]))
    throw std::invalid_argument("the real path cannot take B0, B1phase or v: compile for the complex path");
  for (int64_t e = 0; e < pb.E; ++e)
    if (pb.record[e] >= pb.S) throw std::invalid_argument("record slot out of range");
  pb.nt = pg.num_transverse_pools;
  pb.nl = pg.num_longitudinal_pools;
  pb.tabulated = pg.tabulated != 0;
  if (!pb.tabulated && (pb.nt != 1 || pb.nl != 1))
    throw std::invalid_argument("pool model 0 has one transverse and one longitudinal pool");
  if (pb.nt < 1 || pb.nl < pb.nt || pb.nl > kMaxPools)
    throw std::invalid_argument("pools: need 1 <= num_transverse_pools <= num_longitudinal_pools <= 8");
  if (pb.tabulated) {
    pb.num_intervals = pg.num_intervals;
    pb.interval = pg.interval;
    pb.wrap_interval = pg.wrap_interval;
    if (!pb.interval || !tb.L || !tb.r || !tb.T || !tb.zeq || (pb.nl > pb.nt && !tb.sat))
      throw std::invalid_argument("a tabulated layout needs its interval rows and tables L, r, T, zeq (and sat)");
    for (int64_t e = 0; e < pb.E; ++e)
      if ((pb.action[e] & BS_INTERVAL) && (pb.interval[e] < 0 || pb.interval[e] >= pb.num_intervals))
        throw std::invalid_argument("interval row out of range");
    Input<R>* tables[5] = {&pb.table_L, &pb.table_r, &pb.table_T, &pb.table_zeq, &pb.table_sat};
    const void* data[5] = {tb.L, tb.r, tb.T, tb.zeq, tb.sat};
    const void* tans[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
    if (tb_tan) {
      tans[0] = tb_tan->L, tans[1] = tb_tan->r, tans[2] = tb_tan->T, tans[3] = tb_tan->zeq, tans[4] = tb_tan->sat;
    }
    for (int i = 0; i < 5; ++i) {
      tables[i]->data = static_cast<const R*>(data[i]);
      tables[i]->stride = tb.stride_v[i];
      tables[i]->tan = static_cast<const R*>(tans[i]);
      if (tb_tan) {
        tables[i]->tan_stride_p = tb_tan->stride_p[i];
        tables[i]->tan_stride = tb_tan->stride_v[i];
      }
    }
  }
  return pb;
}

// Forward (N = R) and JVP (N = Dual<R, P>).
template <class N, class S>
void run_forward(const bs_program& pg, const bs_tissue& ts, const bs_tables& tb, const bs_tangents* tg,
                 const bs_tables* tb_tan, int threads, void* signal, void* signal_tangent) {
  using R = typename Num<N>::Real;
  const Problem<R> pb = make_problem<R>(pg, ts, tg, tb, tb_tan);
  const int64_t V = ts.num_voxels, nblocks = (V + kVoxelsPerBlock - 1) / kVoxelsPerBlock;
  parallel_for(nblocks, threads, [&](int64_t b, int) {
    thread_local std::vector<char> scratch_bytes;
    const size_t need = sizeof(S) * state_size(pb);
    if (scratch_bytes.size() < need) scratch_bytes.resize(need);
    S* work = reinterpret_cast<S*>(scratch_bytes.data());
    SampleIO<N> io;
    io.signal = static_cast<R*>(signal);
    io.signal_tan = static_cast<R*>(signal_tangent);
    io.tan_stride = V * pb.S;
    for (int64_t v = b * kVoxelsPerBlock; v < V && v < (b + 1) * kVoxelsPerBlock; ++v) {
      io.base = v * pb.S;
      forward_voxel<N, S>(pb, v, load_voxel<N>(pb, v), work, io);
    }
  });
}

// VJP (N = R) and second-order adjoint (N = Dual<R, 1>).
template <class N, class S>
void run_vjp(const bs_program& pg, const bs_tissue& ts, const bs_tables& tb, const bs_tangents* tg,
             const bs_tables* tb_tan, int threads, const void* cotangent, const void* cotangent_tangent,
             const bs_grads& grads, const bs_grads* grads_tangent, const bs_table_grads* table_grads,
             const bs_table_grads* table_grads_tangent, void* signal, void* signal_tangent) {
  using R = typename Num<N>::Real;
  const Problem<R> pb = make_problem<R>(pg, ts, tg, tb, tb_tan);
  const int64_t V = ts.num_voxels, E = pb.E, nblocks = (V + kVoxelsPerBlock - 1) / kVoxelsPerBlock;
  const int64_t nev = 3 * E + 1;  // dt[E], flip[E], phase[E], dt_wrap
  std::vector<N> block_grads(static_cast<size_t>(nblocks * nev), N(0));
  int64_t sizes[5];
  table_sizes(pb, sizes);
  const int64_t table_total = sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4];
  GradOut<R> out{};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    out.tissue[j] = static_cast<R*>(grads.tissue[j]);
    out.tissue_tan[j] = grads_tangent ? static_cast<R*>(grads_tangent->tissue[j]) : nullptr;
  }
  if (table_grads) {
    void* const t[5] = {table_grads->L, table_grads->r, table_grads->T, table_grads->zeq, table_grads->sat};
    for (int i = 0; i < 5; ++i) out.table[i] = static_cast<R*>(t[i]);
  }
  if (table_grads_tangent) {
    const bs_table_grads* g = table_grads_tangent;
    void* const t[5] = {g->L, g->r, g->T, g->zeq, g->sat};
    for (int i = 0; i < 5; ++i) out.table_tan[i] = static_cast<R*>(t[i]);
  }
  parallel_for(nblocks, threads, [&](int64_t b, int) {
    thread_local std::vector<char> scratch_bytes;
    const size_t work_bytes = sizeof(S) * state_size(pb) * 3;
    const size_t store_bytes = sizeof(S) * state_size(pb) * store_states(pb);
    const size_t need = work_bytes + store_bytes + sizeof(N) * (table_total + 1);
    if (scratch_bytes.size() < need) scratch_bytes.resize(need);
    S* work = reinterpret_cast<S*>(scratch_bytes.data());
    S* store = reinterpret_cast<S*>(scratch_bytes.data() + work_bytes);
    N* table_acc = reinterpret_cast<N*>(scratch_bytes.data() + work_bytes + store_bytes);
    SampleIO<N> io;
    io.signal = static_cast<R*>(signal);
    io.signal_tan = static_cast<R*>(signal_tangent);
    io.tan_stride = 0;
    io.cot = static_cast<const R*>(cotangent);
    io.cot_tan = static_cast<const R*>(cotangent_tangent);
    const EventGrad<N> eg{block_grads.data() + b * nev, E};
    for (int64_t v = b * kVoxelsPerBlock; v < V && v < (b + 1) * kVoxelsPerBlock; ++v) {
      io.base = v * pb.S;
      vjp_voxel_out<N, S>(pb, v, work, store, table_acc, io, eg, out);
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
