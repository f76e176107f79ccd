// The passes of the nvcc library (launch_plan.hpp), one translation unit each so nvcc builds them in
// parallel: each unit named below instantiates its part for the nvcc launcher, and every other unit is
// told here not to.
#pragma once

#include "epg_launch.cuh"

namespace bs {

extern template void forward_pass<DeviceLauncher>(const DeviceLauncher&, const bs_epg_forward_args&);  // forward.cu
extern template void jvp_pass<1, DeviceLauncher>(const DeviceLauncher&, const bs_epg_jvp_args&);        // jvp_1.cu
extern template void jvp_pass<2, DeviceLauncher>(const DeviceLauncher&, const bs_epg_jvp_args&);        // jvp_2.cu
extern template void jvp_pass<4, DeviceLauncher>(const DeviceLauncher&, const bs_epg_jvp_args&);        // jvp_4.cu
extern template void jvp_pass<8, DeviceLauncher>(const DeviceLauncher&, const bs_epg_jvp_args&);        // jvp_8.cu
extern template void vjp_pass<DeviceLauncher>(const DeviceLauncher&, const bs_epg_vjp_args&);           // vjp.cu
extern template void vjp_jvp_pass<DeviceLauncher>(const DeviceLauncher&, const bs_epg_vjp_jvp_args&);   // vjp_jvp.cu
// pools.cu: the kernels with pool counts fixed at compile time.
extern template void launch_forward_pools<float, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&,
                                                                 int64_t, const SampleIO<float>&);
extern template void launch_forward_pools<Cx<float>, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&,
                                                                     int64_t, const SampleIO<float>&);
// The adjoint with pool counts fixed at compile time, of number type N and states S: pools.cu instantiates the
// first order's (float), pools_dual.cu the second order's (Dual<float, 1>, the VJP along one tangent).
#define BS_VJP_POOLS(N, S)                                                                                   \
  void launch_vjp_pools<N, S, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&, int64_t,          \
                                              const SampleIO<N>&, const DeviceEventGrad<N>&,                 \
                                              const GradOut<float>&, S*, N*, int)
using Dual1 = Dual<float, 1>;
extern template BS_VJP_POOLS(float, float);
extern template BS_VJP_POOLS(float, Cx<float>);
extern template BS_VJP_POOLS(Dual1, Dual1);
extern template BS_VJP_POOLS(Dual1, Cx<Dual1>);

}  // namespace bs
