// The passes of the CUDA library, one translation unit each (so nvcc builds them in parallel).
#pragma once

#include "epg_launch.cuh"

namespace bs {

template <class N>
SampleIO<N> sample_io(void* signal, void* signal_tangent, int64_t tan_stride, const void* cot, const void* cot_tan) {
  SampleIO<N> io;
  io.signal = static_cast<float*>(signal);
  io.signal_tan = static_cast<float*>(signal_tangent);
  io.tan_stride = tan_stride;
  io.cot = static_cast<const float*>(cot);
  io.cot_tan = static_cast<const float*>(cot_tan);
  return io;
}

void cuda_forward(const bs_epg_forward_args& a);
template <int P>
void cuda_jvp(const bs_epg_jvp_args& a);
void cuda_vjp(const bs_epg_vjp_args& a);
void cuda_vjp_jvp(const bs_epg_vjp_jvp_args& a);

// JVP at P tangents (instantiated in jvp_P.cu).
template <int P>
void cuda_jvp(const bs_epg_jvp_args& a) {
  using N = Dual<float, P>;
  const auto pb = make_problem<float>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent, false);
  const int64_t V = a.tissue.num_voxels;
  const auto io = sample_io<N>(a.signal, a.signal_tangent, V * pb.S, nullptr, nullptr);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.program.path == BS_PATH_REAL)
    launch_forward<N, N>(pb, V, io, a.scratch, a.scratch_bytes, stream);
  else
    launch_forward<N, Cx<N>>(pb, V, io, a.scratch, a.scratch_bytes, stream);
}

}  // namespace bs
