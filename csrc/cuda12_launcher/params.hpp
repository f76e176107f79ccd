// Kernel parameters that only the device code defines, mirrored for the g++ launcher (launcher.cpp).
// cudaLaunchKernel copies each argument by its size in the cubin, so the mirror must match the device
// struct byte for byte: kernels.cu static_asserts that, at NVRTC compile time, for every number type used.
#pragma once

#include <stdint.h>

namespace bs12 {

// bs::DeviceEventGrad<N> (csrc/cuda/epg_device.cuh): R* out[4]; R* out_tan[4]; bool active.
template <class R>
struct EventGradParams {
  R* out[4];
  R* out_tan[4];
  bool active;
};

}  // namespace bs12
