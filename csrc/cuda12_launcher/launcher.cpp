// Host side of the CUDA 12 package, built by g++ because PyPI has no CUDA 12 nvcc (PACKAGING.md).
//
// It exports the same bs_* C ABI as csrc/cuda/capi_cuda.cu and does what csrc/cuda/epg_launch.cuh does:
// unpack the ABI structs, size scratch, launch on the caller's stream. The kernels come from the fatbin that
// scripts/build_cu12_fatbin.py built with NVRTC from the same device headers; it is embedded below, loaded
// once with the driver's cuLibraryLoadData, and each kernel is found by its lowered name (cu12_kernels.h)
// and launched with cuLaunchKernel. The driver API, not cudaLibraryLoadData/cudaLaunchKernel: the CUDA 12.6
// runtime that torch's cu126 wheels bring has no cudaLibrary* entry points; the driver's exist from CUDA
// 12.0 (R525). libcuda is opened at first launch, not linked, so the library loads (and reports its ABI)
// on machines without a driver. The launch logic is a copy of epg_launch.cuh (g++ cannot compile nvcc's
// <<<>>>): keep the two in step. tests/test_cuda_loader.py compares the copied rules and the kernel
// signatures on the CPU; tests/test_cuda.py holds either build to the host library on a GPU.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <exception>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blochsim/abi_guard.hpp"
#include "blochsim/launch_rules.hpp"
#include "blochsim/unpack.hpp"
#include "cu12_kernels.h"
#include "cuda12_launcher/params.hpp"

#ifndef BS12_FATBIN_PATH
#error "BS12_FATBIN_PATH must name the fatbin built by scripts/build_cu12_fatbin.py"
#endif

// The fatbin, in the section cuobjdump reads (.nv_fatbin), so scripts/check_wheel.py can list its
// architectures as it does for nvcc's output. Nothing registers it: cuLibraryLoadData loads it.
asm(".pushsection .nv_fatbin, \"a\"\n"
    ".balign 16\n"
    ".globl bs12_fatbin\n"
    ".hidden bs12_fatbin\n"
    "bs12_fatbin:\n"
    ".incbin \"" BS12_FATBIN_PATH "\"\n"
    ".popsection\n");
extern "C" const unsigned char bs12_fatbin[];

namespace bs {
namespace {

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(status));
}

// ---- the embedded library and its kernels -------------------------------------------------------------
template <class T>
struct TypeName;  // spelled as scripts/build_cu12_fatbin.py spells the name expressions
template <>
struct TypeName<float> {
  static std::string get() { return "float"; }
};
template <int P>
struct TypeName<Dual<float, P>> {
  static std::string get() { return "bs::Dual<float, " + std::to_string(P) + ">"; }
};
template <class N>
struct TypeName<Cx<N>> {
  static std::string get() { return "bs::Cx<" + TypeName<N>::get() + ">"; }
};

template <class N, class S>
std::string kernel_name(const char* kernel, int kc) {
  return std::string("bs::") + kernel + "<" + TypeName<N>::get() + ", " + TypeName<S>::get() + ", " +
         std::to_string(kc) + ", float>";
}

#define BS12_STR2(x) #x
#define BS12_STR(x) BS12_STR2(x)  // the symbol cuda.h maps a name to (e.g. a _v2 version)

// The driver entry points used, from libcuda.so.1, and the embedded library loaded into it.
struct Driver {
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuLibraryLoadData) library_load_data = nullptr;
  decltype(&::cuLibraryGetKernel) library_get_kernel = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
  decltype(&::cuKernelGetParamInfo) kernel_get_param_info = nullptr;  // R550+; null on older drivers
  CUlibrary library = nullptr;

  void check(CUresult status, const std::string& what) const {
    if (status == CUDA_SUCCESS) return;
    const char* message = nullptr;
    get_error_string(status, &message);
    throw std::runtime_error(what + ": " + (message ? message : "CUDA driver error " + std::to_string(status)));
  }

  Driver() {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw std::runtime_error(std::string("cannot open the NVIDIA driver (libcuda.so.1): ") + dlerror());
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (!fn)
        throw std::runtime_error(std::string("the NVIDIA driver lacks ") + name +
                                 ": blochsim-cuda12 needs driver R525 or newer");
    };
    sym(get_error_string, BS12_STR(cuGetErrorString));
    sym(ctx_get_current, BS12_STR(cuCtxGetCurrent));
    sym(library_load_data, BS12_STR(cuLibraryLoadData));
    sym(library_get_kernel, BS12_STR(cuLibraryGetKernel));
    sym(launch_kernel, BS12_STR(cuLaunchKernel));
    kernel_get_param_info =
        reinterpret_cast<decltype(kernel_get_param_info)>(dlsym(handle, BS12_STR(cuKernelGetParamInfo)));
    check(library_load_data(&library, bs12_fatbin, nullptr, nullptr, 0, nullptr, nullptr, 0),
          "loading the blochsim CUDA 12 kernels (machine code for sm_75, sm_80 and sm_90, PTX for compute_90)");
  }
};

const Driver& driver() {
  static const Driver d;  // a failure throws, and the next call tries again
  return d;
}

// The kernel of `expression`; on its first use, where the driver can tell, its parameter sizes are held to
// the arguments' (`sizes`): params.hpp and the copied launch logic must pass what the device code takes.
CUfunction find_kernel(const Driver& d, const std::string& expression, std::initializer_list<size_t> sizes) {
  static std::mutex mutex;
  static std::map<std::string, CUkernel> kernels;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = kernels.find(expression);
  if (it != kernels.end()) return reinterpret_cast<CUfunction>(it->second);
  const char* lowered = nullptr;
  for (const auto& row : kKernelNames)
    if (expression == row[0]) lowered = row[1];
  if (!lowered) throw std::logic_error("kernel " + expression + " is not in the fatbin (scripts/build_cu12_fatbin.py)");
  CUkernel kernel = nullptr;
  d.check(d.library_get_kernel(&kernel, d.library, lowered), "finding kernel " + expression);
  if (d.kernel_get_param_info) {
    size_t i = 0, offset = 0, size = 0;
    for (size_t want : sizes) {
      if (d.kernel_get_param_info(kernel, i, &offset, &size) == CUDA_SUCCESS && size != want)
        throw std::logic_error(expression + ": parameter " + std::to_string(i) + " is " + std::to_string(size) +
                               " bytes in the fatbin, the launcher passes " + std::to_string(want));
      ++i;
    }
  }
  kernels.emplace(expression, kernel);
  return reinterpret_cast<CUfunction>(kernel);  // a CUkernel launches as a CUfunction (cuLaunchKernel)
}

template <class... A>
void launch(const std::string& expression, int64_t V, cudaStream_t stream, A... args) {
  const Driver& d = driver();
  const CUfunction kernel = find_kernel(d, expression, {sizeof(A)...});
  // A CUkernel runs in the stream's context, or for the null stream in the thread's current one: make
  // sure the runtime has bound its (torch's) primary context to this thread, as <<<>>> would.
  if (!stream) {
    CUcontext ctx = nullptr;
    d.ctx_get_current(&ctx);
    if (!ctx) {
      int device = 0;
      check_cuda(cudaGetDevice(&device), "cudaGetDevice");
      check_cuda(cudaSetDevice(device), "cudaSetDevice");
    }
  }
  void* params[] = {static_cast<void*>(&args)...};
  const unsigned blocks = static_cast<unsigned>(blocks_for(V)), threads = static_cast<unsigned>(threads_for(V));
  d.check(d.launch_kernel(kernel, blocks, 1, 1, threads, 1, 1, 0, reinterpret_cast<CUstream>(stream),
                          params, nullptr),
          "kernel launch " + expression);
}

template <class N, class S, class R>
void launch_forward(const Problem<R>& pb, int64_t V, const SampleIO<N>& io, void* scratch, int64_t scratch_bytes,
                    cudaStream_t stream) {
  if (V == 0) return;
  if (scratch_bytes < forward_scratch_bytes<N, S>(pb, V, false)) throw std::invalid_argument("scratch is too small");
  const int kc = registers_layout<N>(pb);
  launch(kernel_name<N, S>("forward_kernel", kc), V, stream, pb, V, io, static_cast<S*>(scratch));
}

template <class N, class S, class R>
void launch_vjp(const Problem<R>& pb, int64_t V, const SampleIO<N>& io, const bs_grads& grads,
                const bs_grads* grads_tangent, const bs_table_grads* table_grads,
                const bs_table_grads* table_grads_tangent, void* scratch, int64_t scratch_bytes, cudaStream_t stream) {
  if (V == 0) return;
  if (scratch_bytes < vjp_scratch_bytes<N, S>(pb, V, false)) throw std::invalid_argument("scratch is too small");
  bs12::EventGradParams<R> eg{};
  void* const outs[4] = {grads.dt_s, grads.flip_rad, grads.phase_rad, grads.dt_wrap_s};
  const int64_t counts[4] = {pb.E, pb.E, pb.E, 1};
  for (int i = 0; i < 4; ++i) {
    eg.out[i] = static_cast<R*>(outs[i]);
    if (outs[i]) check_cuda(cudaMemsetAsync(outs[i], 0, sizeof(R) * counts[i], stream), "memset");
  }
  if (grads_tangent) {
    void* const t[4] = {grads_tangent->dt_s, grads_tangent->flip_rad, grads_tangent->phase_rad,
                        grads_tangent->dt_wrap_s};
    for (int i = 0; i < 4; ++i) {
      eg.out_tan[i] = static_cast<R*>(t[i]);
      if (t[i]) check_cuda(cudaMemsetAsync(t[i], 0, sizeof(R) * counts[i], stream), "memset");
    }
  }
  GradOut<R> out{};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    out.tissue[j] = static_cast<R*>(grads.tissue[j]);
    out.tissue_tan[j] = grads_tangent ? static_cast<R*>(grads_tangent->tissue[j]) : nullptr;
  }
  if (table_grads) {
    void* const t[5] = {table_grads->L, table_grads->r, table_grads->T, table_grads->zeq, table_grads->sat};
    for (int i = 0; i < 5; ++i) out.table[i] = static_cast<R*>(t[i]);
  }
  if (table_grads_tangent) {
    const bs_table_grads* g = table_grads_tangent;
    void* const t[5] = {g->L, g->r, g->T, g->zeq, g->sat};
    for (int i = 0; i < 5; ++i) out.table_tan[i] = static_cast<R*>(t[i]);
  }
  S* state_scratch = static_cast<S*>(scratch);
  N* table_scratch = reinterpret_cast<N*>(static_cast<char*>(scratch) + vjp_state_bytes<N, S>(pb, V, false));
  const int kc = registers_layout<N>(pb);
  launch(kernel_name<N, S>("vjp_kernel", kc), V, stream, pb, V, io, eg, out, state_scratch, table_scratch);
}

// ---- as csrc/cuda/passes.cuh and the pass translation units ----------------------------------------------
template <class N>
SampleIO<N> sample_io(void* signal, void* signal_tangent, int64_t tan_stride, const void* cot, const void* cot_tan) {
  SampleIO<N> io;
  io.signal = static_cast<float*>(signal);
  io.signal_tan = static_cast<float*>(signal_tangent);
  io.tan_stride = tan_stride;
  io.cot = static_cast<const float*>(cot);
  io.cot_tan = static_cast<const float*>(cot_tan);
  return io;
}

void cuda_forward(const bs_epg_forward_args& a) {
  const auto pb = make_problem<float>(a.program, a.tissue, nullptr, a.tables, nullptr, false);
  const auto io = sample_io<float>(a.signal, nullptr, 0, nullptr, nullptr);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.program.path == BS_PATH_REAL)
    launch_forward<float, float>(pb, a.tissue.num_voxels, io, a.scratch, a.scratch_bytes, stream);
  else
    launch_forward<float, Cx<float>>(pb, a.tissue.num_voxels, io, a.scratch, a.scratch_bytes, stream);
}

template <int P>
void cuda_jvp(const bs_epg_jvp_args& a) {
  using N = Dual<float, P>;
  const auto pb = make_problem<float>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent, false);
  const int64_t V = a.tissue.num_voxels;
  const auto io = sample_io<N>(a.signal, a.signal_tangent, V * pb.S, nullptr, nullptr);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.program.path == BS_PATH_REAL)
    launch_forward<N, N>(pb, V, io, a.scratch, a.scratch_bytes, stream);
  else
    launch_forward<N, Cx<N>>(pb, V, io, a.scratch, a.scratch_bytes, stream);
}

void cuda_vjp(const bs_epg_vjp_args& a) {
  const auto pb = make_problem<float>(a.program, a.tissue, nullptr, a.tables, nullptr, false);
  const auto io = sample_io<float>(nullptr, nullptr, 0, a.cotangent, nullptr);
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int64_t V = a.tissue.num_voxels;
  if (a.program.path == BS_PATH_REAL)
    launch_vjp<float, float>(pb, V, io, a.grads, nullptr, &a.table_grads, nullptr, a.scratch, a.scratch_bytes,
                             stream);
  else
    launch_vjp<float, Cx<float>>(pb, V, io, a.grads, nullptr, &a.table_grads, nullptr, a.scratch,
                                 a.scratch_bytes, stream);
}

void cuda_vjp_jvp(const bs_epg_vjp_jvp_args& a) {
  if (a.tangents.count != 1) throw std::invalid_argument("tangents.count must be 1 for the second-order adjoint");
  using N = Dual<float, 1>;
  const auto pb = make_problem<float>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent, false);
  const auto io = sample_io<N>(a.signal, a.signal_tangent, 0, a.cotangent, a.cotangent_tangent);
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int64_t V = a.tissue.num_voxels;
  if (a.program.path == BS_PATH_REAL)
    launch_vjp<N, N>(pb, V, io, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent, a.scratch,
                     a.scratch_bytes, stream);
  else
    launch_vjp<N, Cx<N>>(pb, V, io, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent, a.scratch,
                         a.scratch_bytes, stream);
}

// ---- as csrc/cuda/capi_cuda.cu -----------------------------------------------------------------------------
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
  return vjp_scratch_bytes<N, S>(make_problem<float>(pg, ts, nullptr, tb, nullptr, false), ts.num_voxels, false);
}
template <class N, class S>
int64_t forward_bytes(const bs_program& pg, const bs_tissue& ts, const bs_tables& tb) {
  return forward_scratch_bytes<N, S>(make_problem<float>(pg, ts, nullptr, tb, nullptr, false), ts.num_voxels, false);
}

}  // namespace
}  // namespace bs

extern "C" {

int32_t bs_abi_version(void) { return BS_ABI_VERSION; }
const char* bs_version(void) { return BLOCHSIM_VERSION; }
const char* bs_last_error(void) { return bs::last_error().c_str(); }

int32_t bs_epg_forward(const bs_epg_forward_args* a) {
  return bs::guarded([&] { bs::cuda_forward(bs::float32_args<bs_epg_forward_args>(a)); });
}

int32_t bs_epg_jvp(const bs_epg_jvp_args* a) {
  return bs::guarded([&] {
    const auto& args = bs::float32_args<bs_epg_jvp_args>(a);
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
  return bs::guarded([&] { bs::cuda_vjp(bs::float32_args<bs_epg_vjp_args>(a)); });
}

int32_t bs_epg_vjp_jvp(const bs_epg_vjp_jvp_args* a) {
  return bs::guarded([&] { bs::cuda_vjp_jvp(bs::float32_args<bs_epg_vjp_jvp_args>(a)); });
}

int64_t bs_epg_scratch_bytes(int32_t pass, const void* args) {
  int64_t bytes = -1;
  using D1 = bs::Dual<float, 1>;
  using D8 = bs::Dual<float, 8>;
  using bs::forward_bytes;
  using bs::vjp_bytes;
  const int32_t status = bs::guarded([&] {
    switch (pass) {
      case 0: {
        const auto& a = bs::float32_args<bs_epg_forward_args>(args);
        bytes = a.program.path == BS_PATH_REAL ? forward_bytes<float, float>(a.program, a.tissue, a.tables)
                                               : forward_bytes<float, bs::Cx<float>>(a.program, a.tissue, a.tables);
        break;
      }
      case 1: {  // sized for the widest dual a JVP launches
        const auto& a = bs::float32_args<bs_epg_jvp_args>(args);
        bytes = a.program.path == BS_PATH_REAL ? forward_bytes<D8, D8>(a.program, a.tissue, a.tables)
                                               : forward_bytes<D8, bs::Cx<D8>>(a.program, a.tissue, a.tables);
        break;
      }
      case 2: {
        const auto& a = bs::float32_args<bs_epg_vjp_args>(args);
        bytes = a.program.path == BS_PATH_REAL ? vjp_bytes<float, float>(a.program, a.tissue, a.tables)
                                               : vjp_bytes<float, bs::Cx<float>>(a.program, a.tissue, a.tables);
        break;
      }
      case 3: {
        const auto& a = bs::float32_args<bs_epg_vjp_jvp_args>(args);
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
