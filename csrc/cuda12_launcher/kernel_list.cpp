// Lists the kernels the CUDA 12 package's launcher can start, one name expression a line (to the file
// argv[1], or stdout), so its fatbin is built with exactly those (CMakeLists.txt runs it before
// scripts/build_cu12_fatbin.py). It compiles the same C ABI over the same launch plan as launcher.cpp, with
// a launcher of the same kind (ThreadKernels) that, instead of starting a kernel, lists each kernel type it
// is compiled to start. Nothing here runs a pass.
#include <cstdio>
#include <set>
#include <string>

#include "cuda12_launcher/fatbin_kernels.hpp"

namespace bs {
namespace {

std::set<std::string>& listed() {
  static std::set<std::string> names;
  return names;
}
// Instantiated for every kernel type some pass can start; initialised, and so listed, before main.
template <class Tag>
const bool kListed = (listed().insert(kernel_expression(Tag())), true);

struct ListingLauncher : ThreadKernels {
  explicit ListingLauncher(void*) {}
  void zero(void*, size_t) const {}
  template <class Tag, class... A>
  void start(Tag, const LaunchShape&, const A&...) const {
    (void)kListed<Tag>;
  }
};

}  // namespace
using CudaLauncher = ListingLauncher;
}  // namespace bs

#include "blochsim/cuda_abi.inc"

int main(int argc, char** argv) {
  FILE* out = argc > 1 ? std::fopen(argv[1], "w") : stdout;
  if (!out) {
    std::perror(argv[1]);
    return 1;
  }
  for (const std::string& name : bs::listed()) std::fprintf(out, "%s\n", name.c_str());
  return std::fclose(out) == 0 ? 0 : 1;
}
