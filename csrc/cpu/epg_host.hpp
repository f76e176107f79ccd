// Host entry points: unpack the C ABI structs into a Problem, run voxels in fixed blocks on the thread
// pool, and reduce per-block event gradients in block order (bitwise identical for any thread count).
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "blochsim/event_loop.hpp"
#include "blochsim/unpack.hpp"
#include "capi.h"
#include "scratch.hpp"
#include "thread_pool.hpp"

namespace bs {

constexpr int64_t kVoxelsPerBlock = 16;

// Forward (N = R) and JVP (N = Dual<R, P>).
template <class N, class S>
void run_forward(const bs_program& pg, const bs_tissue& ts, const bs_tables& tb, const bs_tangents* tg,
                 const bs_tables* tb_tan, int threads, void* signal, void* signal_tangent) {
  using R = typename Num<N>::Real;
  Problem<R> pb = make_problem<R>(pg, ts, tg, tb, tb_tan);
  const int64_t V = ts.num_voxels, nblocks = (V + kVoxelsPerBlock - 1) / kVoxelsPerBlock;
  // The value forward's profiled pulses, once per (event, position) (pulses.hpp pairs_per_launch).
  std::vector<R> pairs;
  if constexpr (std::is_same<N, R>::value && !std::is_same<S, N>::value) {
    if (pairs_per_launch(pb, V)) {
      pairs.resize(static_cast<size_t>(pulse_pair_count(pb) * kPairReals));
      parallel_for(pb.E, threads, [&](int64_t e, int) {
        for (int64_t p = 0; p < pb.num_positions; ++p) decode_pulse_pair(pb, e, p, pairs.data());
      });
      pb.pulse_pairs = pairs.data();
    }
  }
  CallScratch scratch(sizeof(S) * 2 * state_size(pb));  // the state and forward_voxel's second
  parallel_for(nblocks, threads, [&](int64_t b, int worker) {
    S* work = reinterpret_cast<S*>(scratch.get(worker));
    SampleIO<N> io;
    io.signal = static_cast<R*>(signal);
    io.signal_tan = static_cast<R*>(signal_tangent);
    io.tan_stride = V * pb.S;
    for (int64_t v = b * kVoxelsPerBlock; v < V && v < (b + 1) * kVoxelsPerBlock; ++v) {
      io.base = v * pb.S;
      forward_voxel<N, S>(pb, v, load_voxel<N>(pb, v), Ref<S>{work, 1}, io);
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
  int64_t sizes[kTableCount];
  table_sizes(pb, sizes);
  int64_t table_total = 0;
  for (int i = 0; i < kTableCount; ++i) table_total += sizes[i];
  GradOut<R> out{};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    out.tissue[j] = static_cast<R*>(grads.tissue[j]);
    out.tissue_tan[j] = grads_tangent ? static_cast<R*>(grads_tangent->tissue[j]) : nullptr;
  }
  table_grad_outputs(table_grads, out.table);
  table_grad_outputs(table_grads_tangent, out.table_tan);
  const size_t work_bytes = sizeof(S) * state_size(pb) * 3;
  const size_t store_bytes = sizeof(S) * state_size(pb) * store_states(pb, plain_adjoint<N, S>(pb));
  CallScratch scratch(work_bytes + store_bytes + sizeof(N) * (table_total + 1));
  parallel_for(nblocks, threads, [&](int64_t b, int worker) {
    char* const bytes = scratch.get(worker);
    S* work = reinterpret_cast<S*>(bytes);
    S* store = reinterpret_cast<S*>(bytes + work_bytes);
    N* table_acc = reinterpret_cast<N*>(bytes + work_bytes + store_bytes);
    SampleIO<N> io;
    io.signal = static_cast<R*>(signal);
    io.signal_tan = static_cast<R*>(signal_tangent);
    io.tan_stride = 0;
    io.cot = static_cast<const R*>(cotangent);
    io.cot_tan = static_cast<const R*>(cotangent_tangent);
    const EventGrad<N> eg{block_grads.data() + b * nev, E};
    for (int64_t v = b * kVoxelsPerBlock; v < V && v < (b + 1) * kVoxelsPerBlock; ++v) {
      io.base = v * pb.S;
      vjp_voxel_out<N, S>(pb, v, Ref<S>{work, 1}, Ref<S>{store, 1}, table_grad_at(pb, out, table_acc, 0, 1), io, eg,
                          out);
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
