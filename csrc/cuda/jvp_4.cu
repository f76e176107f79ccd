// JVP with 4 tangents.
#include "passes.cuh"

template void bs::cuda_jvp<4>(const bs_epg_jvp_args&);
