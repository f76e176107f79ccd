// The second order's adjoint (the VJP along one tangent, N = Dual<float, 1>) with its pool counts fixed at
// compile time, a warp per voxel (launch_rules.hpp fixed_pool_warp, launch_plan.hpp launch_vjp_pools): a
// translation unit of its own, so nvcc builds it beside pools.cu and the passes.
#include "passes.cuh"

namespace bs {

template BS_VJP_POOLS(Dual1, Dual1);
template BS_VJP_POOLS(Dual1, Cx<Dual1>);

}  // namespace bs
