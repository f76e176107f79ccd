// JVP with 2 tangents.
#include "passes.cuh"

template void bs::jvp_pass<2, bs::DeviceLauncher>(const bs::DeviceLauncher&, const bs_epg_jvp_args&);
