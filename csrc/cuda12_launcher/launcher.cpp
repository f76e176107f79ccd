// Host side of the CUDA 12 package, built by g++ because PyPI has no CUDA 12 nvcc (docs/design.md, "Build and loading").
//
// It exports the C ABI of the nvcc library (blochsim/cuda_abi.inc) over the same launch plan
// (blochsim/launch_plan.hpp: which kernel of blochsim/launch_table.def, on which grid and block), with a
// launcher that has only the thread-per-voxel kernels (fatbin_kernels.hpp) and starts them through the
// driver API. The kernels come from the fatbin that scripts/build_cu12_fatbin.py built with NVRTC from the
// same device headers, for the kernels kernel_list.cpp lists from this plan; it is embedded below, loaded
// once with the driver's cuLibraryLoadData, and each kernel is found by its lowered name (cu12_kernels.h)
// and launched with cuLaunchKernel. The driver API, not cudaLibraryLoadData/cudaLaunchKernel: the CUDA 12.6
// runtime that torch's cu126 wheels bring has no cudaLibrary* entry points; the driver's exist from CUDA
// 12.0 (R525). libcuda is opened at first launch, not linked, so the library loads (and reports its ABI)
// on machines without a driver. tests/test_cuda_loader.py holds the launchers to the table on the CPU;
// tests/test_cuda.py holds either build to the host library on a GPU.
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

#include "cu12_kernels.h"
#include "cuda12_launcher/fatbin_kernels.hpp"

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
  // For bs_epg_resident_voxels (ResidencyQuery); null where the driver lacks them (the answer is then 0).
  decltype(&::cuKernelGetFunction) kernel_get_function = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor) occupancy = nullptr;
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
    kernel_get_function =
        reinterpret_cast<decltype(kernel_get_function)>(dlsym(handle, BS12_STR(cuKernelGetFunction)));
    occupancy = reinterpret_cast<decltype(occupancy)>(
        dlsym(handle, BS12_STR(cuOccupancyMaxActiveBlocksPerMultiprocessor)));
    check(library_load_data(&library, bs12_fatbin, nullptr, nullptr, 0, nullptr, nullptr, 0),
          "loading the blochsim CUDA 12 kernels (machine code for sm_75, sm_80 and sm_90, PTX for compute_90)");
  }
};

const Driver& driver() {
  static const Driver d;  // a failure throws, and the next call tries again
  return d;
}

// The kernel of `expression`; on its first use, where the driver can tell, its parameter sizes are held to
// the arguments' (`sizes`): params.hpp and the launch plan's arguments must be what the device code takes.
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

// The CUDA 12 package's launcher: the thread-per-voxel kernels, each started by its name expression.
struct DriverLauncher : ThreadKernels {
  cudaStream_t stream;
  explicit DriverLauncher(void* caller_stream) : stream(static_cast<cudaStream_t>(caller_stream)) {}

  void zero(void* data, size_t bytes) const {
    if (!resident_voxels) check_cuda(cudaMemsetAsync(data, 0, bytes, stream), "memset");
  }

  template <class Tag, class... A>
  void start(Tag tag, const LaunchShape& shape, A... args) const {
    const std::string expression = kernel_expression(tag);
    const Driver& d = driver();
    const CUfunction kernel = find_kernel(d, expression, {sizeof(A)...});
    if (resident_voxels) return resident(d, kernel, shape);
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
    d.check(d.launch_kernel(kernel, shape.grid, 1, 1, shape.block, 1, 1, shape.shared_bytes,
                            reinterpret_cast<CUstream>(stream), params, nullptr),
            "kernel launch " + expression);
  }

  // The voxels a launch of `kernel` on `shape` keeps on the current device at once (ResidencyQuery), in the
  // current context (the caller's: torch has made it current where it asks).
  void resident(const Driver& d, CUfunction kernel, const LaunchShape& shape) const {
    if (!shape.voxels_per_block || !d.kernel_get_function || !d.occupancy) return;
    CUfunction function = nullptr;
    int blocks = 0, device = 0, processors = 0;
    d.check(d.kernel_get_function(&function, reinterpret_cast<CUkernel>(kernel)), "cuKernelGetFunction");
    d.check(d.occupancy(&blocks, function, static_cast<int>(shape.block), shape.shared_bytes),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    *resident_voxels = int64_t(blocks) * processors * shape.voxels_per_block;
  }
};

}  // namespace
using CudaLauncher = DriverLauncher;
}  // namespace bs

#include "blochsim/cuda_abi.inc"
