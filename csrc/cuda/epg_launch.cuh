// Host side of the CUDA library: unpack the ABI structs, size scratch, launch on the caller's stream.
#pragma once

#include <string>

#include "blochsim/launch_rules.hpp"
#include "epg_device.cuh"

namespace bs {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// The kernels with pool counts fixed at compile time (pools.cu), for problems they take
// (launch_rules.hpp fixed_pools).
template <class S>
void launch_forward_pools(const Problem<float>& pb, int64_t V, const SampleIO<float>& io, cudaStream_t stream);
template <class S>
void launch_vjp_pools(const Problem<float>& pb, int64_t V, const SampleIO<float>& io, const DeviceEventGrad<float>& eg,
                      const GradOut<float>& out, S* scratch, float* table_scratch, cudaStream_t stream);

template <class N, class S, class R>
void launch_forward(const Problem<R>& pb_in, int64_t V, const SampleIO<N>& io, void* scratch, int64_t scratch_bytes,
                    cudaStream_t stream) {
  if (V == 0) return;
  if (scratch_bytes < forward_scratch_bytes<N, S>(pb_in, V)) throw std::invalid_argument("scratch is too small");
  Problem<R> pb = pb_in;
  if constexpr (Num<N>::P == 0) {  // the events, decoded once (for_each_event)
    auto* const table = reinterpret_cast<BlockEvent<N>*>(static_cast<char*>(scratch) + forward_state_bytes<N, S>(pb, V));
    if (event_chunks(pb) > 0) {
      decode_events_kernel<N, S><<<static_cast<unsigned>(event_chunks(pb)), kBlockEvents, 0, stream>>>(pb, table);
      check_cuda(cudaGetLastError(), "event decoding launch");
    }
    if (event_chunks(pb) > 1) {
      const int64_t boundaries = event_chunks(pb) - 1;
      join_chunks_kernel<N><<<static_cast<unsigned>((boundaries + 127) / 128), 128, 0, stream>>>(table, event_chunks(pb));
      check_cuda(cudaGetLastError(), "chunk joining launch");
    }
    pb.events = table;
  }
  const int lanes = forward_lanes<N, S>(pb, V);
  if (lanes > 1) {
    const dim3 grid(static_cast<unsigned>((V * lanes + 127) / 128)), block(128);
    const bool two = warp_orders_per_lane(pb.K) == 2;
    if constexpr (std::is_same<N, float>::value) {  // groups: the value forward
      if (lanes == 4 || lanes == 8) {
        const bool plain = plain_orders(pb);
        if (lanes == 4 && fixed_pools<N>(pb)) {
          launch_forward_pools<S>(pb, V, io, stream);
          return;
        }
        if (lanes == 4 && pb.tabulated)
          forward_warp_kernel<N, S, 8, kTables, 4><<<grid, block, 0, stream>>>(pb, V, io);
        else if (lanes == 4 && plain)
          forward_warp_kernel<N, S, 8, kPlain, 4><<<grid, block, 0, stream>>>(pb, V, io);
        else if (lanes == 4)
          forward_warp_kernel<N, S, 8, kModel0, 4><<<grid, block, 0, stream>>>(pb, V, io);
        else if (pb.tabulated)
          forward_warp_kernel<N, S, 4, kTables, 8><<<grid, block, 0, stream>>>(pb, V, io);
        else if (plain)
          forward_warp_kernel<N, S, 4, kPlain, 8><<<grid, block, 0, stream>>>(pb, V, io);
        else
          forward_warp_kernel<N, S, 4, kModel0, 8><<<grid, block, 0, stream>>>(pb, V, io);
        check_cuda(cudaGetLastError(), "forward kernel launch");
        return;
      }
    }
    if (pb.tabulated) {
      if (two)
        forward_warp_kernel<N, S, 2, kTables, 32><<<grid, block, 0, stream>>>(pb, V, io);
      else
        forward_warp_kernel<N, S, 1, kTables, 32><<<grid, block, 0, stream>>>(pb, V, io);
    } else {
      if (two)
        forward_warp_kernel<N, S, 2, kModel0, 32><<<grid, block, 0, stream>>>(pb, V, io);
      else
        forward_warp_kernel<N, S, 1, kModel0, 32><<<grid, block, 0, stream>>>(pb, V, io);
    }
    check_cuda(cudaGetLastError(), "forward kernel launch");
    return;
  }
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
  S* state_scratch = static_cast<S*>(scratch);
  N* table_scratch = reinterpret_cast<N*>(static_cast<char*>(scratch) + vjp_state_bytes<N, S>(pb, V));
  if (warp_adjoint<N, S>(pb, V)) {
    const dim3 grid(static_cast<unsigned>((V + 3) / 4)), block(128);  // four voxels per block
    const bool two = warp_orders_per_lane(pb.K) == 2;
    if constexpr (std::is_same<N, float>::value) {
      if (fixed_pools<N>(pb)) {
        launch_vjp_pools<S>(pb, V, io, eg, out, state_scratch, table_scratch, stream);
        return;
      }
    }
    if (pb.tabulated) {
      if (two)
        vjp_warp_kernel<N, S, 2, kTables><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch);
      else
        vjp_warp_kernel<N, S, 1, kTables><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch);
    } else {
      if (two)
        vjp_warp_kernel<N, S, 2, kModel0><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch);
      else
        vjp_warp_kernel<N, S, 1, kModel0><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch);
    }
    check_cuda(cudaGetLastError(), "adjoint kernel launch");
    return;
  }
  const dim3 grid(static_cast<unsigned>(blocks_for(V))), block(threads_for(V));
  if constexpr (Num<N>::P == 0) {
    if (registers_layout<N>(pb) == 32) {
      vjp_kernel<N, S, 32><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch);
      check_cuda(cudaGetLastError(), "adjoint kernel launch");
      return;
    }
  }
  vjp_kernel<N, S, 0><<<grid, block, 0, stream>>>(pb, V, io, eg, out, state_scratch, table_scratch);
  check_cuda(cudaGetLastError(), "adjoint kernel launch");
}

}  // namespace bs
