// Device kernels: the host's event loop (csrc/include/blochsim), compiled by nvcc, one thread per voxel.
//
// Layout: a thread simulates one voxel. For pool model 0 at K = 8, 16 or 32 orders the problem's order
// count, pool counts and layout are made compile-time constants in the kernel, so the state arrays live in
// registers (the loops over orders unroll); any other K and the tabulated layouts keep their states in
// device scratch. Adjoints keep their replay buffer and checkpoints (every stride-th state) in device
// scratch, and sum event-value gradients over voxels with a warp reduction and one atomic per warp.
#pragma once

#include <cuda_runtime.h>

#include "blochsim/unpack.hpp"

namespace bs {

template <class R>
__device__ __forceinline__ R shfl_xor(R x, int offset) {
  return __shfl_xor_sync(0xffffffffu, x, offset);
}
template <class R>
__device__ __forceinline__ R warp_sum(R x) {
  for (int o = 16; o > 0; o >>= 1) x += shfl_xor(x, o);
  return x;
}
template <class R, int P>
__device__ __forceinline__ Dual<R, P> warp_sum(Dual<R, P> x) {
  x.v = warp_sum(x.v);
  for (int p = 0; p < P; ++p) x.d[p] = warp_sum(x.d[p]);
  return x;
}

// Event-value gradients: each warp reduces its voxels' terms and adds them with one atomic.
template <class N>
struct DeviceEventGrad {
  using R = typename Num<N>::Real;
  R* out[4];      // dt [E], flip [E], phase [E], dt_wrap [1]
  R* out_tan[4];  // the same, tangents (second-order adjoint), or null
  bool active;    // false for the padding threads of the last warp
  __device__ void add(int kind, int64_t e, const N& x) const {
    const N y = warp_sum(active ? x : N(0));
    if ((threadIdx.x & 31) != 0) return;
    const int64_t i = kind == kGradDtWrap ? 0 : e;
    if (out[kind]) atomicAdd(out[kind] + i, value_of(y));
    if constexpr (Num<N>::P > 0) {
      if (out_tan[kind]) atomicAdd(out_tan[kind] + i, y.d[0]);
    }
  }
};

// Fix the layout at compile time where it is: model 0 with KC orders (KC = 0: keep the runtime count).
template <int KC, class R>
__device__ __forceinline__ Problem<R> specialise(Problem<R> pb) {
  if constexpr (KC > 0) {
    pb.K = KC;
    pb.nt = 1;
    pb.nl = 1;
    pb.tabulated = false;
  }
  return pb;
}

// Threads interleave in device scratch (launch_rules.hpp sizes it): element i of thread t at
// scratch[i * threads + t], so a warp's 32 threads touch 32 consecutive elements.
__device__ __forceinline__ int64_t launched_threads() { return int64_t(gridDim.x) * blockDim.x; }

template <class N, class S, int KC, class R>
__global__ void __launch_bounds__(128) forward_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io, S* scratch) {
  const int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (v >= V) return;
  const Problem<R> pb = specialise<KC>(pb_in);
  io.base = v * pb.S;
  if constexpr (KC > 0) {
    S work[3 * KC];
    forward_voxel<N, S>(pb, v, load_voxel<N>(pb, v), Ref<S>{work, 1}, io);
  } else {
    forward_voxel<N, S>(pb, v, load_voxel<N>(pb, v), Ref<S>{scratch + v, launched_threads()}, io);
  }
}

template <class N, class S, int KC, class R>
__global__ void __launch_bounds__(128) vjp_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io,
                                                  DeviceEventGrad<N> eg, GradOut<R> out, S* scratch,
                                                  N* table_scratch, int64_t table_total) {
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const bool active = thread < V;
  const int64_t v = active ? thread : V - 1;  // padding threads replay the last voxel and write nothing
  const Problem<R> pb = specialise<KC>(pb_in);
  eg.active = active;
  io.base = v * pb.S;
  if (!active) {
    io.signal = nullptr;
    out = GradOut<R>{};
  }
  const Ref<S> mine{scratch + thread, launched_threads()};
  N* table_acc = table_scratch + thread * table_total;
  if constexpr (KC > 0) {
    S work[3 * 3 * KC];
    vjp_voxel_out<N, S>(pb, v, Ref<S>{work, 1}, mine, table_acc, io, eg, out);
  } else {
    vjp_voxel_out<N, S>(pb, v, mine, mine + 3 * state_size(pb), table_acc, io, eg, out);
  }
}

}  // namespace bs
