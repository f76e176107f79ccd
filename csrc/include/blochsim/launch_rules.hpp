// Launch rules of the CUDA kernels, shared by the nvcc host code (csrc/cuda/epg_launch.cuh) and the CUDA 12
// launcher built by g++ (csrc/cuda12_launcher/launcher.cpp): block size, the compile-time layout a launch
// uses, and the device scratch it needs. Plain C++: no CUDA headers.
#pragma once

#include <cstdlib>
#include <cstring>

#include "blochsim/event_loop.hpp"

namespace bs {

// Threads per block: 128, or 32 when there are too few voxels to give every multiprocessor several
// blocks of 128 (a thread per voxel leaves small problems latency-bound; smaller blocks spread them).
inline int threads_for(int64_t V) { return V < 128 * 264 ? 32 : 128; }
inline int64_t blocks_for(int64_t V) { return (V + threads_for(V) - 1) / threads_for(V); }
inline int64_t padded_voxels(int64_t V) { return blocks_for(V) * threads_for(V); }

// The compile-time order count a launch uses: 32 (states in registers) for pool model 0 at a real number
// type, else 0 (run-time K, states in device scratch). Dual types are not specialised: unrolled, their
// kernels take ptxas minutes and spill anyway.
template <class N, class R>
inline int registers_layout(const Problem<R>& pb) {
  return Num<N>::P == 0 && !pb.tabulated && pb.K == 32 ? 32 : 0;
}

// Forward and JVP: a warp per voxel (orders across lanes, epg_device.cuh) for up to 64 orders while the
// problem is small, else a thread per voxel. The switch points were measured on the H200 (docs/design.md,
// benchmarks/results/mapping): the thread kernels do 32x less per-event work per voxel and win once there
// are a few thousand voxels on the real path, about 10k on the complex path, 20k with pool tables.
// BLOCHSIM_CUDA_MAPPING=thread|warp forces one (where the warp kernel applies), so benchmarks can compare.
// -1: not forced; 0: thread; 1: warp.
inline int forced_mapping() {
  const char* forced = std::getenv("BLOCHSIM_CUDA_MAPPING");
  if (forced && std::strcmp(forced, "thread") == 0) return 0;
  if (forced && std::strcmp(forced, "warp") == 0) return 1;
  return -1;
}

template <class R>
inline bool warp_mapping(const Problem<R>& pb, int64_t V, bool complex_path) {
  if (pb.K > 64) return false;
  if (forced_mapping() >= 0) return forced_mapping() == 1;
  return V <= (pb.tabulated ? 20000 : complex_path ? 10000 : 3000);
}
inline int warp_orders_per_lane(int64_t K) { return K <= 32 ? 1 : 2; }

// Adjoints (VJP, VJP-JVP) of pool model 0 take a warp per voxel too (each lane its own checkpoints); the
// tabulated adjoints keep a thread per voxel (their table cotangents are per voxel). Measured on the H200
// (docs/design.md), thread/warp ms: real VJP at 2k, 20k, 100k voxels 31/18, 45/48, 139/187; complex VJP
// 63/25, 159/73, 600/264; real VJP-JVP (hvp) 129/33, 325/139, 1384/595. So warp up to 15,000 voxels for a
// real float adjoint, at any size for complex or dual ones.
template <class N, class S, class R>
inline bool warp_adjoint(const Problem<R>& pb, int64_t V) {
  if (pb.tabulated || pb.K > 64) return false;
  if (forced_mapping() >= 0) return forced_mapping() == 1;
  return Num<N>::P > 0 || !std::is_same<N, S>::value || V <= 15000;
}

// Scratch a thread needs in device memory, in S: the work state(s) (run-time K only: one forward, three
// for an adjoint) and, for adjoints, the store. Threads interleave there (epg_device.cuh): element i of
// thread t at scratch[i * threads + t], so a warp's 32 threads touch 32 consecutive elements.
template <class R>
inline int64_t device_scratch_per_voxel(const Problem<R>& pb, bool adjoint, bool in_registers) {
  return (in_registers ? 0 : (adjoint ? 3 : 1) * state_size(pb)) + (adjoint ? store_states(pb) * state_size(pb) : 0);
}

// `warp_kernels`: the library has the warp kernels (the CUDA 12 launcher does not: a thread per voxel).
template <class N, class S, class R>
inline int64_t forward_scratch_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  if (warp_kernels && warp_mapping(pb, V, !std::is_same<N, S>::value)) return 0;
  return int64_t(sizeof(S)) * padded_voxels(V) * device_scratch_per_voxel(pb, false, registers_layout<N>(pb) > 0);
}

template <class N, class S, class R>
inline int64_t vjp_state_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  if (warp_kernels && warp_adjoint<N, S>(pb, V)) {  // a store per lane, of 3 planes x KPL
    const int64_t per_lane = store_states(pb) * 3 * warp_orders_per_lane(pb.K);
    return (int64_t(sizeof(S)) * 32 * V * per_lane + 255) / 256 * 256;
  }
  const int64_t per_voxel = device_scratch_per_voxel(pb, true, registers_layout<N>(pb) > 0);
  return (int64_t(sizeof(S)) * padded_voxels(V) * per_voxel + 255) / 256 * 256;
}

template <class R>
inline int64_t table_total(const Problem<R>& pb) {
  int64_t sizes[5];
  table_sizes(pb, sizes);
  return sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4];
}

template <class N, class S, class R>
inline int64_t vjp_scratch_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  return vjp_state_bytes<N, S>(pb, V, warp_kernels) + int64_t(sizeof(N)) * padded_voxels(V) * table_total(pb);
}

}  // namespace bs
