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
extern template void launch_vjp_pools<float, float, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&,
                                                                    int64_t, const SampleIO<float>&,
                                                                    const DeviceEventGrad<float>&,
                                                                    const GradOut<float>&, float*, float*);
extern template void launch_vjp_pools<float, Cx<float>, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&,
                                                                        int64_t, const SampleIO<float>&,
                                                                        const DeviceEventGrad<float>&,
                                                                        const GradOut<float>&, Cx<float>*, float*);
// pools_dual.cu: the second order's (the VJP along one tangent) with pool counts fixed at compile time.
using Dual1 = Dual<float, 1>;
extern template void launch_vjp_pools<Dual1, Dual1, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&,
                                                                    int64_t, const SampleIO<Dual1>&,
                                                                    const DeviceEventGrad<Dual1>&,
                                                                    const GradOut<float>&, Dual1*, Dual1*);
extern template void launch_vjp_pools<Dual1, Cx<Dual1>, DeviceLauncher>(const DeviceLauncher&, const Problem<float>&,
                                                                        int64_t, const SampleIO<Dual1>&,
                                                                        const DeviceEventGrad<Dual1>&,
                                                                        const GradOut<float>&, Cx<Dual1>*, Dual1*);

}  // namespace bs
