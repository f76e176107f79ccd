// The lane path compiled per instruction set: the x86-64 baseline (SSE2, 4 float lanes), AVX2 with FMA (8)
// and AVX-512 (16), each in a namespace of its own, picked once per process by what the processor has.
// The headers come first, outside the target regions, so everything they define stays baseline code
// (a function the linker may take from any unit must be); only epg_lanes.inc's functions carry a target,
// and the event loop's functions, always inline, are compiled into them.
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "epg_host.hpp"
#include "epg_lanes.hpp"

namespace bs {

namespace lanes_sse2 {
constexpr int kFloatLanes = 4;
#include "epg_lanes.inc"
}  // namespace lanes_sse2

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC's target regions
#define BS_HAVE_WIDE_LANES 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace lanes_avx2 {
constexpr int kFloatLanes = 8;
#include "epg_lanes.inc"
}  // namespace lanes_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
namespace lanes_avx512 {
constexpr int kFloatLanes = 16;
#include "epg_lanes.inc"
}  // namespace lanes_avx512
#pragma GCC pop_options
#endif

namespace {
enum class Isa { kSse2, kAvx2, kAvx512 };

Isa pick_isa() {
  Isa best = Isa::kSse2;
#ifdef BS_HAVE_WIDE_LANES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    best = Isa::kAvx512;
#endif
  if (const char* env = std::getenv("BLOCHSIM_HOST_ISA")) {
    const std::string want(env);
    const Isa asked = want == "sse2" ? Isa::kSse2 : want == "avx2" ? Isa::kAvx2 : Isa::kAvx512;
    if (want != "sse2" && want != "avx2" && want != "avx512")
      throw std::invalid_argument("BLOCHSIM_HOST_ISA must be sse2, avx2 or avx512, got '" + want + "'");
    if (asked < best) best = asked;
  }
  return best;
}

Isa isa() {
  static const Isa chosen = pick_isa();
  return chosen;
}
}  // namespace

template <class R, int P>
bool forward_lanes(const Problem<R>& pb, int64_t V, int threads, void* signal, void* signal_tangent) {
  if (!plain_orders(pb)) return false;
  switch (isa()) {
#ifdef BS_HAVE_WIDE_LANES
    case Isa::kAvx512: lanes_avx512::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent); break;
    case Isa::kAvx2: lanes_avx2::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent); break;
#endif
    default: lanes_sse2::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent);
  }
  return true;
}

template <class R>
bool vjp_lanes(const Problem<R>& pb, int64_t V, int threads, const void* cotangent, const bs_grads& grads) {
  if (!plain_orders(pb)) return false;
  switch (isa()) {
#ifdef BS_HAVE_WIDE_LANES
    case Isa::kAvx512: lanes_avx512::vjp_lanes_at<R>(pb, V, threads, cotangent, grads); break;
    case Isa::kAvx2: lanes_avx2::vjp_lanes_at<R>(pb, V, threads, cotangent, grads); break;
#endif
    default: lanes_sse2::vjp_lanes_at<R>(pb, V, threads, cotangent, grads);
  }
  return true;
}
template bool vjp_lanes<float>(const Problem<float>&, int64_t, int, const void*, const bs_grads&);
template bool vjp_lanes<double>(const Problem<double>&, int64_t, int, const void*, const bs_grads&);

#define BS_FORWARD_LANES(R)                                                  \
  template bool forward_lanes<R, 0>(const Problem<R>&, int64_t, int, void*, void*); \
  template bool forward_lanes<R, 1>(const Problem<R>&, int64_t, int, void*, void*); \
  template bool forward_lanes<R, 2>(const Problem<R>&, int64_t, int, void*, void*); \
  template bool forward_lanes<R, 4>(const Problem<R>&, int64_t, int, void*, void*); \
  template bool forward_lanes<R, 8>(const Problem<R>&, int64_t, int, void*, void*);
BS_FORWARD_LANES(float)
BS_FORWARD_LANES(double)
#undef BS_FORWARD_LANES

}  // namespace bs
