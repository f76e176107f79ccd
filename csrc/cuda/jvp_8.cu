// JVP with 8 tangents.
#include "passes.cuh"

template void bs::cuda_jvp<8>(const bs_epg_jvp_args&);
