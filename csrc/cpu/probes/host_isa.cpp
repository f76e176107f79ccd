// Run at configure time (csrc/cpu/CMakeLists.txt, BLOCHSIM_HOST_LANES=native): prints the widest SIMD set
// of the building processor, so a source build compiles only the lane unit it will run.
#include <cstdio>

#include "../host_isa.hpp"

int main() {
  const bs::Isa isa = bs::widest_host_isa();
  std::puts(isa == bs::Isa::kAvx512 ? "avx512" : isa == bs::Isa::kAvx2 ? "avx2" : "none");
  return 0;
}
