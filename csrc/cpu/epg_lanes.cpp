// The lane path's dispatch: the code of each instruction set (AVX2 with FMA, 8 float lanes; AVX-512, 16) is
// compiled in a unit of its own (epg_lanes_<set>.cpp) and picked here once per process by what the processor
// has, among the sets the build compiled (BS_BUILT_<SET>_LANES, csrc/cpu/CMakeLists.txt: a source build
// compiles only its processor's widest; an AVX-512 processor also runs the AVX2 lanes). An x86-64 processor
// with neither (or BLOCHSIM_HOST_ISA=sse2, or without the set built) runs the per-voxel path, 4.3-6x slower
// than SSE2 lanes, which cost a fresh install 18 s of CPU (epg_lanes_sse2.cpp). Elsewhere (another
// architecture or compiler) the portable 4-lane code of epg_lanes_sse2.cpp runs.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "epg_lanes.hpp"
#include "host_isa.hpp"

#ifndef BS_BUILT_AVX2_LANES
#define BS_BUILT_AVX2_LANES 0
#endif
#ifndef BS_BUILT_AVX512_LANES
#define BS_BUILT_AVX512_LANES 0
#endif

namespace bs {

// Each set's entry points, defined and instantiated in its own unit. Declared here, not in a header, so in
// that unit no declaration without the set's target comes before the definitions.
#define BS_DECLARE_LANES(isa)                                                                        \
  namespace isa {                                                                                    \
  template <class R, int P>                                                                          \
  void forward_lanes_at(const Problem<R>& pb, int64_t V, int threads, void* signal,                  \
                        void* signal_tangent);                                                       \
  template <class R, int P>                                                                          \
  void vjp_lanes_at(const Problem<R>& pb, int64_t V, int threads, const LaneAdjointIO& io);          \
  }
#ifdef BS_HAVE_WIDE_LANES
BS_DECLARE_LANES(lanes_avx2)
BS_DECLARE_LANES(lanes_avx512)
#else
BS_DECLARE_LANES(lanes_sse2)
#endif
#undef BS_DECLARE_LANES

namespace {
Isa isa() {
  static const Isa chosen = pick_host_isa();
  return chosen;
}
}  // namespace

template <class R, int P>
bool forward_lanes(const Problem<R>& pb, int64_t V, int threads, void* signal, void* signal_tangent) {
  if (!plain_orders(pb)) return false;
  switch (isa()) {
#ifdef BS_HAVE_WIDE_LANES
    case Isa::kAvx512:
#if BS_BUILT_AVX512_LANES
      lanes_avx512::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent);
      break;
#endif
      [[fallthrough]];
    case Isa::kAvx2:
#if BS_BUILT_AVX2_LANES
      lanes_avx2::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent);
      break;
#endif
      [[fallthrough]];
    default: return false;
#else
    default: lanes_sse2::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent);
#endif
  }
  return true;
}

template <class R, int P>
bool vjp_lanes(const Problem<R>& pb, int64_t V, int threads, const LaneAdjointIO& io) {
  if (!plain_orders(pb)) return false;
  switch (isa()) {
#ifdef BS_HAVE_WIDE_LANES
    case Isa::kAvx512:
#if BS_BUILT_AVX512_LANES
      lanes_avx512::vjp_lanes_at<R, P>(pb, V, threads, io);
      break;
#endif
      [[fallthrough]];
    case Isa::kAvx2:
#if BS_BUILT_AVX2_LANES
      lanes_avx2::vjp_lanes_at<R, P>(pb, V, threads, io);
      break;
#endif
      [[fallthrough]];
    default: return false;
#else
    default: lanes_sse2::vjp_lanes_at<R, P>(pb, V, threads, io);
#endif
  }
  return true;
}
template bool vjp_lanes<float, 0>(const Problem<float>&, int64_t, int, const LaneAdjointIO&);
template bool vjp_lanes<float, 1>(const Problem<float>&, int64_t, int, const LaneAdjointIO&);
template bool vjp_lanes<double, 0>(const Problem<double>&, int64_t, int, const LaneAdjointIO&);
template bool vjp_lanes<double, 1>(const Problem<double>&, int64_t, int, const LaneAdjointIO&);

#define BS_FORWARD_LANES(R)                                                         \
  template bool forward_lanes<R, 0>(const Problem<R>&, int64_t, int, void*, void*); \
  template bool forward_lanes<R, 1>(const Problem<R>&, int64_t, int, void*, void*); \
  template bool forward_lanes<R, 2>(const Problem<R>&, int64_t, int, void*, void*); \
  template bool forward_lanes<R, 4>(const Problem<R>&, int64_t, int, void*, void*);
BS_FORWARD_LANES(float)
BS_FORWARD_LANES(double)
#undef BS_FORWARD_LANES

}  // namespace bs

// The lane sets this library holds, as bits (1: the portable 4 lanes, 2: AVX2, 4: AVX-512), and the set the
// lane path runs in this process (the same bits, 0: the per-voxel path), for `blochsim info` and the tests.
// Declared extern "C" in capi.h.
int32_t bs_host_lane_sets(void) {
#ifdef BS_HAVE_WIDE_LANES
  return (BS_BUILT_AVX2_LANES ? 2 : 0) | (BS_BUILT_AVX512_LANES ? 4 : 0);
#else
  return 1;
#endif
}

int32_t bs_host_lanes_running(void) {
  const int32_t built = bs_host_lane_sets();
#ifdef BS_HAVE_WIDE_LANES
  switch (bs::isa()) {
    case bs::Isa::kAvx512:
      if (built & 4) return 4;
      [[fallthrough]];
    case bs::Isa::kAvx2:
      if (built & 2) return 2;
      [[fallthrough]];
    default: return 0;
  }
#else
  return built;
#endif
}
