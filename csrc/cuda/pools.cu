// Tabulated kernels with their pool counts fixed at compile time (launch_rules.hpp with_fixed_pools): the
// value forward in groups of 4 lanes and the float adjoint with a warp per voxel. A translation unit of
// their own, so nvcc builds them beside the other passes.
#include "passes.cuh"

namespace bs {

template <class S, int LAYOUT>
void forward_pools(const Problem<float>& pb, int64_t V, const SampleIO<float>& io, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((V * 4 + 127) / 128)), block(128);
  forward_warp_kernel<float, S, 8, LAYOUT, 4><<<grid, block, 0, stream>>>(pb, V, io);
  check_cuda(cudaGetLastError(), "forward kernel launch");
}

template <class S, int LAYOUT>
void vjp_pools(const Problem<float>& pb, int64_t V, const SampleIO<float>& io, const DeviceEventGrad<float>& eg,
               const GradOut<float>& out, S* scratch, float* table_scratch, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((V + 3) / 4)), block(128);  // four voxels per block
  vjp_warp_kernel<float, S, 1, LAYOUT><<<grid, block, 0, stream>>>(pb, V, io, eg, out, scratch, table_scratch);
  check_cuda(cudaGetLastError(), "adjoint kernel launch");
}

template <class S>
void launch_forward_pools(const Problem<float>& pb, int64_t V, const SampleIO<float>& io, cudaStream_t stream) {
  const bool compiled = with_fixed_pools(pb.nt, pb.nl, [&](auto layout) {
    forward_pools<S, decltype(layout)::value>(pb, V, io, stream);
  });
  if (!compiled) throw std::logic_error("no compiled pool layout");  // fixed_pools decides first
}

template <class S>
void launch_vjp_pools(const Problem<float>& pb, int64_t V, const SampleIO<float>& io, const DeviceEventGrad<float>& eg,
                      const GradOut<float>& out, S* scratch, float* table_scratch, cudaStream_t stream) {
  const bool compiled = with_fixed_pools(pb.nt, pb.nl, [&](auto layout) {
    vjp_pools<S, decltype(layout)::value>(pb, V, io, eg, out, scratch, table_scratch, stream);
  });
  if (!compiled) throw std::logic_error("no compiled pool layout");  // fixed_pools decides first
}

template void launch_forward_pools<float>(const Problem<float>&, int64_t, const SampleIO<float>&, cudaStream_t);
template void launch_forward_pools<Cx<float>>(const Problem<float>&, int64_t, const SampleIO<float>&, cudaStream_t);
template void launch_vjp_pools<float>(const Problem<float>&, int64_t, const SampleIO<float>&,
                                      const DeviceEventGrad<float>&, const GradOut<float>&, float*, float*,
                                      cudaStream_t);
template void launch_vjp_pools<Cx<float>>(const Problem<float>&, int64_t, const SampleIO<float>&,
                                          const DeviceEventGrad<float>&, const GradOut<float>&, Cx<float>*, float*,
                                          cudaStream_t);

}  // namespace bs
