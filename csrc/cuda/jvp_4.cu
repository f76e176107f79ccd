// JVP with 4 tangents.
#include "passes.cuh"

template void bs::jvp_pass<4, bs::DeviceLauncher>(const bs::DeviceLauncher&, const bs_epg_jvp_args&);
