// Adjoint (VJP), checkpointed.
#include "passes.cuh"

template void bs::vjp_pass<bs::DeviceLauncher>(const bs::DeviceLauncher&, const bs_epg_vjp_args&);
