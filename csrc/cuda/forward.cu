// Forward simulation.
#include "passes.cuh"

template void bs::forward_pass<bs::DeviceLauncher>(const bs::DeviceLauncher&, const bs_epg_forward_args&);
