// JVP with 1 tangents.
#include "passes.cuh"

template void bs::cuda_jvp<1>(const bs_epg_jvp_args&);
