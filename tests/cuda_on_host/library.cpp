// The CUDA library's C ABI (blochsim/cuda_abi.inc: the forward, JVP, VJP and VJP-JVP passes, their launch
// plans and scratch sizes) with its kernels (csrc/cuda/epg_device.cuh), compiled by g++ over cuda_runtime.h
// beside this file: each launch runs its grid on host threads, one per CUDA thread, over host memory.
// CUDA_ON_HOST_PASS selects what one object holds (0 the forward pass, 1 the JVP passes, 2 the VJP, 3 the
// VJP-JVP, 4 the C ABI over them), so the build runs in parallel; tests/test_cuda_on_host.py builds and
// links the five.
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "blochsim/launch_plan.hpp"
#include "epg_device.cuh"

namespace bs {
// The kernels started since the tests last asked (cuda_on_host_kernels_started): which kernel a pass chose
// where two take the same shape (vjp_warp_kernel, vjp_values_kernel). One set for the five objects (an inline
// function's static).
inline std::set<std::string>& kernels_started() {
  static std::set<std::string> names;
  return names;
}
inline std::mutex& kernels_started_lock() {
  static std::mutex lock;
  return lock;
}

struct HostGridLauncher : ResidencyQuery {
  static constexpr bool kWarpKernels = true;
  template <class N>
  using EventGrad = DeviceEventGrad<N>;
  // Asked where a launch runs (ResidencyQuery), this launcher answers as a card that keeps this many blocks of
  // any kernel resident: the tests hold each mapping's voxels a block against it.
  static constexpr int64_t kResidentBlocks = 16;
  explicit HostGridLauncher(void*) {}
  void zero(void* data, size_t bytes) const {
    if (!resident_voxels) std::memset(data, 0, bytes);
  }
  // The adjoint kernels declare no shared memory: their blocks run at once; every other kernel's one at a time.
  template <class Tag>
  static bool blocks_at_once() {
    return std::string_view(Tag::name).substr(0, 3) == "vjp";
  }
#define BS_KERNEL(tag, kernel, what, params, args)                                                   \
  template <BS_UNPAREN params, class... A>                                                           \
  void start(tag<BS_UNPAREN args>, const LaunchShape& shape, const A&... arguments) const {           \
    if (resident_voxels) {                                                                           \
      if (shape.voxels_per_block) *resident_voxels = kResidentBlocks * shape.voxels_per_block;        \
      return;                                                                                        \
    }                                                                                                \
    {                                                                                                \
      const std::lock_guard<std::mutex> hold(kernels_started_lock());                               \
      kernels_started().insert(tag<BS_UNPAREN args>::name);                                          \
    }                                                                                                \
    cuda_on_host::run_grid(shape.grid, shape.block, blocks_at_once<tag<BS_UNPAREN args>>(),          \
                           [&] { kernel<BS_UNPAREN args>(arguments...); });                           \
  }
#include "blochsim/launch_table.def"
};
using CudaLauncher = HostGridLauncher;

// Each pass is instantiated in the object of its PASS and declared in the others.
#define CUDA_ON_HOST_INSTANCE(pass) CUDA_ON_HOST_INSTANCE_##pass
#if CUDA_ON_HOST_PASS == 0
#define CUDA_ON_HOST_INSTANCE_0 template
#else
#define CUDA_ON_HOST_INSTANCE_0 extern template
#endif
#if CUDA_ON_HOST_PASS == 1
#define CUDA_ON_HOST_INSTANCE_1 template
#else
#define CUDA_ON_HOST_INSTANCE_1 extern template
#endif
#if CUDA_ON_HOST_PASS == 2
#define CUDA_ON_HOST_INSTANCE_2 template
#else
#define CUDA_ON_HOST_INSTANCE_2 extern template
#endif
#if CUDA_ON_HOST_PASS == 3
#define CUDA_ON_HOST_INSTANCE_3 template
#else
#define CUDA_ON_HOST_INSTANCE_3 extern template
#endif
CUDA_ON_HOST_INSTANCE(0) void forward_pass<HostGridLauncher>(const HostGridLauncher&, const bs_epg_forward_args&);
CUDA_ON_HOST_INSTANCE(1) void jvp_pass<1, HostGridLauncher>(const HostGridLauncher&, const bs_epg_jvp_args&);
CUDA_ON_HOST_INSTANCE(1) void jvp_pass<2, HostGridLauncher>(const HostGridLauncher&, const bs_epg_jvp_args&);
CUDA_ON_HOST_INSTANCE(1) void jvp_pass<4, HostGridLauncher>(const HostGridLauncher&, const bs_epg_jvp_args&);
CUDA_ON_HOST_INSTANCE(1) void jvp_pass<8, HostGridLauncher>(const HostGridLauncher&, const bs_epg_jvp_args&);
CUDA_ON_HOST_INSTANCE(2) void vjp_pass<HostGridLauncher>(const HostGridLauncher&, const bs_epg_vjp_args&);
CUDA_ON_HOST_INSTANCE(3) void vjp_jvp_pass<HostGridLauncher>(const HostGridLauncher&, const bs_epg_vjp_jvp_args&);
}  // namespace bs

#if CUDA_ON_HOST_PASS == 4
#include "blochsim/cuda_abi.inc"

// The names of the kernels started since the last call, joined by commas (the tests' card.kernels).
extern "C" const char* cuda_on_host_kernels_started() {
  static std::string joined;
  const std::lock_guard<std::mutex> hold(bs::kernels_started_lock());
  joined.clear();
  for (const std::string& name : bs::kernels_started()) joined += (joined.empty() ? "" : ",") + name;
  bs::kernels_started().clear();
  return joined.c_str();
}
#endif
