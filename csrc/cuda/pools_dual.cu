// The second order's adjoint (the VJP along one tangent, N = Dual<float, 1>) with its pool counts fixed at
// compile time, a warp per voxel (launch_rules.hpp fixed_pool_warp, launch_plan.hpp launch_vjp_pools): a
// translation unit of its own, so nvcc builds it beside pools.cu and the passes.
#include "passes.cuh"

namespace bs {

template void launch_vjp_pools<Dual1, Dual1, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&, int64_t,
                                                             const SampleIO<Dual1>&, const DeviceEventGrad<Dual1>&,
                                                             const GradOut<float>&, Dual1*, Dual1*);
template void launch_vjp_pools<Dual1, Cx<Dual1>, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&, int64_t,
                                                                 const SampleIO<Dual1>&, const DeviceEventGrad<Dual1>&,
                                                                 const GradOut<float>&, Cx<Dual1>*, Dual1*);

}  // namespace bs
