// The CUDA library's adjoint passes with their kernels run on the host: csrc/cuda/epg_device.cuh and the
// launch plan (launch_plan.hpp vjp_pass, vjp_jvp_pass; launch_rules.hpp) compiled by g++ against
// cuda_on_host/ (a stand-in CUDA runtime: every warp of a grid at once, 32 threads each), with a launcher that
// runs each kernel's grid on the host instead of a stream. So an adjoint's launch rules, scratch size,
// kernels, warp sums and atomics run as the card would run them, on host memory
// (test_plain_groups_on_host.py routes the engine's adjoint calls here).
#include <cstring>

#include "blochsim/abi_guard.hpp"
#include "blochsim/launch_plan.hpp"
#include "epg_device.cuh"

namespace bs {
namespace {
struct HostGridLauncher {
  static constexpr bool kWarpKernels = true;
  template <class N>
  using EventGrad = DeviceEventGrad<N>;
  void zero(void* data, size_t bytes) const { std::memset(data, 0, bytes); }
#define BS_KERNEL(tag, kernel, what, params, args)                                                   \
  template <BS_UNPAREN params, class... A>                                                           \
  void start(tag<BS_UNPAREN args>, const LaunchShape& shape, const A&... arguments) const {           \
    cuda_on_host::run_grid(shape.grid, shape.block, [&] { kernel<BS_UNPAREN args>(arguments...); }); \
  }
#include "blochsim/launch_table.def"
};

// bs_epg_scratch_bytes of the CUDA build (cuda_abi.inc), for the adjoint passes of the real path.
template <class N>
int64_t adjoint_bytes(const bs_program& pg, const bs_tissue& ts, const bs_tables& tb) {
  return vjp_scratch_bytes<N, N>(make_problem<float>(pg, ts, nullptr, tb, nullptr, false), ts.num_voxels, true);
}
}  // namespace
}  // namespace bs

extern "C" {
const char* emul_last_error(void) { return bs::last_error().c_str(); }
// pass 2: bs_epg_vjp_args, 3: bs_epg_vjp_jvp_args (float32, the real path); -1 with emul_last_error's message.
int64_t emul_scratch_bytes(int32_t pass, const void* args) {
  int64_t bytes = -1;
  const int32_t status = bs::guarded([&] {
    if (pass == 2) {
      const auto& a = *static_cast<const bs_epg_vjp_args*>(args);
      bytes = bs::adjoint_bytes<float>(a.program, a.tissue, a.tables);
    } else if (pass == 3) {
      const auto& a = *static_cast<const bs_epg_vjp_jvp_args*>(args);
      bytes = bs::adjoint_bytes<bs::Dual<float, 1>>(a.program, a.tissue, a.tables);
    } else {
      throw std::invalid_argument("pass must be 2 (VJP) or 3 (VJP-JVP)");
    }
  });
  return status == 0 ? bytes : -1;
}
int32_t emul_vjp(const bs_epg_vjp_args* a) {
  return bs::guarded([&] { bs::vjp_pass(bs::HostGridLauncher{}, *a); });
}
int32_t emul_vjp_jvp(const bs_epg_vjp_jvp_args* a) {
  return bs::guarded([&] { bs::vjp_jvp_pass(bs::HostGridLauncher{}, *a); });
}
}
