// JVP with 2 tangents.
#include "passes.cuh"

template void bs::cuda_jvp<2>(const bs_epg_jvp_args&);
