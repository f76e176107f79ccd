// The C ABI of the CUDA library: the host library's bs_* entry points, float32, on the caller's stream.
#include <exception>
#include <string>

#include "blochsim/abi_guard.hpp"
#include "passes.cuh"


namespace {
using bs::guarded;

template <class Args>
const Args& float32_args(const void* args) {
  if (!args) throw std::invalid_argument("args must not be null");
  const Args& a = *static_cast<const Args*>(args);
  if (a.dtype != BS_FLOAT32)
    throw std::invalid_argument("the CUDA kernels take float32 (dtype 0); float64 runs on the host build");
  return a;
}

template <class N, class S>
int64_t vjp_bytes(const bs_program& pg, const bs_tissue& ts, const bs_tables& tb) {
  return bs::vjp_scratch_bytes<N, S>(bs::make_problem<float>(pg, ts, nullptr, tb, nullptr, false), ts.num_voxels);
}
template <class N, class S>
int64_t forward_bytes(const bs_program& pg, const bs_tissue& ts, const bs_tables& tb) {
  return bs::forward_scratch_bytes<N, S>(bs::make_problem<float>(pg, ts, nullptr, tb, nullptr, false), ts.num_voxels);
}
}  // namespace

extern "C" {

int32_t bs_abi_version(void) { return BS_ABI_VERSION; }
const char* bs_version(void) { return BLOCHSIM_VERSION; }
const char* bs_last_error(void) { return bs::last_error().c_str(); }

int32_t bs_epg_forward(const bs_epg_forward_args* a) {
  return guarded([&] { bs::cuda_forward(float32_args<bs_epg_forward_args>(a)); });
}

int32_t bs_epg_jvp(const bs_epg_jvp_args* a) {
  return guarded([&] {
    const auto& args = float32_args<bs_epg_jvp_args>(a);
    switch (args.tangents.count) {
      case 1: return bs::cuda_jvp<1>(args);
      case 2: return bs::cuda_jvp<2>(args);
      case 4: return bs::cuda_jvp<4>(args);
      case 8: return bs::cuda_jvp<8>(args);
      default:
        throw std::invalid_argument("tangents.count must be 1, 2, 4 or 8, got " + std::to_string(args.tangents.count));
    }
  });
}

int32_t bs_epg_vjp(const bs_epg_vjp_args* a) {
  return guarded([&] { bs::cuda_vjp(float32_args<bs_epg_vjp_args>(a)); });
}

int32_t bs_epg_vjp_jvp(const bs_epg_vjp_jvp_args* a) {
  return guarded([&] { bs::cuda_vjp_jvp(float32_args<bs_epg_vjp_jvp_args>(a)); });
}

int64_t bs_epg_scratch_bytes(int32_t pass, const void* args) {
  int64_t bytes = -1;
  using D1 = bs::Dual<float, 1>;
  using D8 = bs::Dual<float, 8>;
  const int32_t status = guarded([&] {
    switch (pass) {
      case 0: {
        const auto& a = float32_args<bs_epg_forward_args>(args);
        bytes = a.program.path == BS_PATH_REAL ? forward_bytes<float, float>(a.program, a.tissue, a.tables)
                                               : forward_bytes<float, bs::Cx<float>>(a.program, a.tissue, a.tables);
        break;
      }
      case 1: {  // sized for the widest dual a JVP launches
        const auto& a = float32_args<bs_epg_jvp_args>(args);
        bytes = a.program.path == BS_PATH_REAL ? forward_bytes<D8, D8>(a.program, a.tissue, a.tables)
                                               : forward_bytes<D8, bs::Cx<D8>>(a.program, a.tissue, a.tables);
        break;
      }
      case 2: {
        const auto& a = float32_args<bs_epg_vjp_args>(args);
        bytes = a.program.path == BS_PATH_REAL ? vjp_bytes<float, float>(a.program, a.tissue, a.tables)
                                               : vjp_bytes<float, bs::Cx<float>>(a.program, a.tissue, a.tables);
        break;
      }
      case 3: {
        const auto& a = float32_args<bs_epg_vjp_jvp_args>(args);
        bytes = a.program.path == BS_PATH_REAL ? vjp_bytes<D1, D1>(a.program, a.tissue, a.tables)
                                               : vjp_bytes<D1, bs::Cx<D1>>(a.program, a.tissue, a.tables);
        break;
      }
      default:
        throw std::invalid_argument("pass must be 0 (forward), 1 (JVP), 2 (VJP) or 3 (VJP-JVP)");
    }
  });
  return status == 0 ? bytes : -1;
}
}
