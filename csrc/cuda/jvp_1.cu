// JVP with 1 tangents.
#include "passes.cuh"

template void bs::jvp_pass<1, bs::DeviceLauncher>(const bs::DeviceLauncher&, const bs_epg_jvp_args&);
