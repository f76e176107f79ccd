// The host's instruction set for its SIMD paths (the EPG lanes, PERK's tiles): the widest this CPU runs
// among those built, or a narrower one when BLOCHSIM_HOST_ISA asks (tests run every set); chosen once per
// process by each caller's static.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

// The wider sets are compiled in GCC's target regions, so they exist only there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BS_HOST_WIDE_ISA 1
#endif

namespace bs {

enum class Isa { kSse2, kAvx2, kAvx512 };

// The widest set this processor runs (the build's probe, csrc/cpu/probes/host_isa.cpp, asks it too).
inline Isa widest_host_isa() {
  Isa best = Isa::kSse2;
#ifdef BS_HOST_WIDE_ISA
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    best = Isa::kAvx512;
#endif
  return best;
}

inline Isa pick_host_isa() {
  Isa best = widest_host_isa();
  if (const char* env = std::getenv("BLOCHSIM_HOST_ISA")) {
    const std::string want(env);
    if (want != "sse2" && want != "avx2" && want != "avx512")
      throw std::invalid_argument("BLOCHSIM_HOST_ISA must be sse2, avx2 or avx512, got '" + want + "'");
    const Isa asked = want == "sse2" ? Isa::kSse2 : want == "avx2" ? Isa::kAvx2 : Isa::kAvx512;
    if (asked < best) best = asked;
  }
  return best;
}

}  // namespace bs
