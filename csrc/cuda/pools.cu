// Tabulated kernels with their pool counts fixed at compile time (launch_rules.hpp with_fixed_pools): the
// value forward in groups of 4 lanes and the float adjoint with a warp per voxel (launch_plan.hpp
// launch_forward_pools, launch_vjp_pools; the second order's are pools_dual.cu's). A translation unit of
// their own, so nvcc builds them beside the other passes.
#include "passes.cuh"

namespace bs {

template void launch_forward_pools<float, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&, int64_t,
                                                          const SampleIO<float>&);
template void launch_forward_pools<Cx<float>, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&, int64_t,
                                                              const SampleIO<float>&);
template BS_VJP_POOLS(float, float);
template BS_VJP_POOLS(float, Cx<float>);

}  // namespace bs
