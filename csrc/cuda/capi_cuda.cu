// The C ABI of the nvcc library (blochsim/cuda_abi.inc, shared with the CUDA 12 package), over its launcher.
#include "passes.cuh"

namespace bs {
using CudaLauncher = DeviceLauncher;
}

#include "blochsim/cuda_abi.inc"
