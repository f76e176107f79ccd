// Second-order adjoint (the adjoint at Dual<float, 1>).
#include "passes.cuh"

template void bs::vjp_jvp_pass<bs::DeviceLauncher>(const bs::DeviceLauncher&, const bs_epg_vjp_jvp_args&);
