// The nvcc library's launcher: every kernel of the launch table started with <<<>>> on the caller's stream.
// Which kernel, grid and block a pass launches is launch_plan.hpp's, shared with the CUDA 12 package.
#pragma once

#include <string>

#include "blochsim/launch_plan.hpp"
#include "epg_device.cuh"

namespace bs {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

struct DeviceLauncher : ResidencyQuery {
  static constexpr bool kWarpKernels = true;
  template <class N>
  using EventGrad = DeviceEventGrad<N>;

  cudaStream_t stream;
  explicit DeviceLauncher(void* caller_stream) : stream(static_cast<cudaStream_t>(caller_stream)) {}

  void zero(void* data, size_t bytes) const {
    if (!resident_voxels) check_cuda(cudaMemsetAsync(data, 0, bytes, stream), "memset");
  }

  // start(Tag<...>(), shape, arguments...) for each row of the table (or, asked, the voxels it keeps resident).
#define BS_KERNEL(tag, kernel, what, params, args)                                                 \
  template <BS_UNPAREN params, class... A>                                                         \
  void start(tag<BS_UNPAREN args>, const LaunchShape& shape, const A&... arguments) const {         \
    if (resident_voxels) {                                                                         \
      void (*const function)(A...) = &kernel<BS_UNPAREN args>; /* (its reals: the arguments') */ \
      return resident(function, shape);                                                            \
    }                                                                                              \
    kernel<BS_UNPAREN args><<<shape.grid, shape.block, shape.shared_bytes, stream>>>(arguments...); \
    check_cuda(cudaGetLastError(), what);                                                          \
  }
#include "blochsim/launch_table.def"

  // The voxels a launch of `kernel` on `shape` keeps on the current device at once (ResidencyQuery).
  template <class... P>
  void resident(void (*kernel)(P...), const LaunchShape& shape) const {
    if (!shape.voxels_per_block) return;
    int blocks = 0, device = 0, processors = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, shape.block, shape.shared_bytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    *resident_voxels = int64_t(blocks) * processors * shape.voxels_per_block;
  }
};

}  // namespace bs
