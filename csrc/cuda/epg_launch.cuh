// Host side of the CUDA library: unpack the ABI structs, size scratch, launch on the caller's stream.
#pragma once

#include <string>

#include "epg_device.cuh"

namespace bs {

// Threads per block: 128, or 32 when there are too few voxels to give every multiprocessor several
// blocks of 128 (a thread per voxel leaves small problems latency-bound; smaller blocks spread them).
inline int threads_for(int64_t V) { return V < 128 * 264 ? 32 : 128; }

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// The compile-time order count a launch uses: 32 (states in registers) for pool model 0 at a real number
// type, else 0 (run-time K, states in device scratch). Dual types are not specialised: unrolled, their
// kernels take ptxas minutes and spill anyway.
template <class N, class R>
inline int registers_layout(const Problem<R>& pb) {
  return Num<N>::P == 0 && !pb.tabulated && pb.K == 32 ? 32 : 0;
}

inline int64_t blocks_for(int64_t V) { return (V + threads_for(V) - 1) / threads_for(V); }
inline int64_t padded_voxels(int64_t V) { return blocks_for(V) * threads_for(V); }

template <class N, class S, class R>
inline int64_t forward_scratch_bytes(const Problem<R>& pb, int64_t V) {
  return registers_layout<N>(pb) ? 0 : int64_t(sizeof(S)) * V * 3 * state_size(pb);
}

template <class N, class S, class R>
inline int64_t vjp_scratch_bytes(const Problem<R>& pb, int64_t V) {
  const int64_t padded = padded_voxels(V);
  int64_t sizes[5];
  table_sizes(pb, sizes);
  const int64_t table_total = sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4];
  const int64_t per_voxel = device_scratch_per_voxel(pb, true, registers_layout<N>(pb) > 0);
  const int64_t states = (int64_t(sizeof(S)) * padded * per_voxel + 255) / 256 * 256;
  return states + int64_t(sizeof(N)) * padded * table_total;
}

template <class N, class S, class R>
void launch_forward(const Problem<R>& pb, int64_t V, const SampleIO<N>& io, void* scratch, int64_t scratch_bytes,
                    cudaStream_t stream) {
  if (V == 0) return;
  if (scratch_bytes < forward_scratch_bytes<N, S>(pb, V)) throw std::invalid_argument("scratch is too small");
  const dim3 grid(static_cast<unsigned>(blocks_for(V))), block(threads_for(V));
  if constexpr (Num<N>::P == 0) {
    if (registers_layout<N>(pb) == 32) {
      forward_kernel<N, S, 32><<<grid, block, 0, stream>>>(pb, V, io, static_cast<S*>(scratch));
      check_cuda(cudaGetLastError(), "forward kernel launch");
      return;
    }
  }
  forward_kernel<N, S, 0><<<grid, block, 0, stream>>>(pb, V, io, static_cast<S*>(scratch));
  check_cuda(cudaGetLastError(), "forward kernel launch");
}

template <class N, class S, class R>
void launch_vjp(const Problem<R>& pb, int64_t V, const SampleIO<N>& io, const bs_grads& grads,
                const bs_grads* grads_tangent, const bs_table_grads* table_grads,
                const bs_table_grads* table_grads_tangent, void* scratch, int64_t scratch_bytes, cudaStream_t stream) {
  if (V == 0) return;
  if (scratch_bytes < vjp_scratch_bytes<N, S>(pb, V)) throw std::invalid_argument("scratch is too small");
  DeviceEventGrad<N> eg{};
  void* const outs[4] = {grads.dt_s, grads.flip_rad, grads.phase_rad, grads.dt_wrap_s};
  const int64_t counts[4] = {pb.E, pb.E, pb.E, 1};
  for (int i = 0; i < 4; ++i) {
    eg.out[i] = static_cast<R*>(outs[i]);
    if (outs[i]) check_cuda(cudaMemsetAsync(outs[i], 0, sizeof(R) * counts[i], stream), "memset");
  }
  if (grads_tangent) {
    void* const t[4] = {grads_tangent->dt_s, grads_tangent->flip_rad, grads_tangent->phase_rad,
                        grads_tangent->dt_wrap_s};
    for (int i = 0; i < 4; ++i) {
      eg.out_tan[i] = static_cast<R*>(t[i]);
      if (t[i]) check_cuda(cudaMemsetAsync(t[i], 0, sizeof(R) * counts[i], stream), "memset");
    }
  }
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
  int64_t sizes[5];
  table_sizes(pb, sizes);
  const int64_t table_total = sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4];
  const int64_t padded = padded_voxels(V);
  const int64_t per_voxel = device_scratch_per_voxel(pb, true, registers_layout<N>(pb) > 0);
  const int64_t states = (int64_t(sizeof(S)) * padded * per_voxel + 255) / 256 * 256;
  S* state_scratch = static_cast<S*>(scratch);
  N* table_scratch = reinterpret_cast<N*>(static_cast<char*>(scratch) + states);
  const dim3 grid(static_cast<unsigned>(blocks_for(V))), block(threads_for(V));
  if constexpr (Num<N>::P == 0) {
    if (registers_layout<N>(pb) == 32) {
      vjp_kernel<N, S, 32><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch,
                                                       table_total);
      check_cuda(cudaGetLastError(), "adjoint kernel launch");
      return;
    }
  }
  vjp_kernel<N, S, 0><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch, table_total);
  check_cuda(cudaGetLastError(), "adjoint kernel launch");
}

}  // namespace bs
