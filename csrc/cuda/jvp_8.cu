// JVP with 8 tangents.
#include "passes.cuh"

template void bs::jvp_pass<8, bs::DeviceLauncher>(const bs::DeviceLauncher&, const bs_epg_jvp_args&);
