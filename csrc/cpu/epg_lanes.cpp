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
#include "blochsim/abi_guard.hpp"
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

// The lane sets built into this library, as bits: 1 the portable 4 lanes, 2 AVX2, 4 AVX-512.
constexpr int32_t kLanesPortable = 1, kLanesAvx2 = 2, kLanesAvx512 = 4;
#ifdef BS_HAVE_WIDE_LANES
constexpr int32_t kLanesBuilt = (BS_BUILT_AVX2_LANES ? kLanesAvx2 : 0) | (BS_BUILT_AVX512_LANES ? kLanesAvx512 : 0);
#else
constexpr int32_t kLanesBuilt = kLanesPortable;
#endif

// The set the lane path runs in this process (0: the per-voxel path): the widest both built and run by this
// processor (BLOCHSIM_HOST_ISA may narrow it), chosen once.
int32_t lanes_running() {
  static const int32_t chosen = [] {
#ifdef BS_HAVE_WIDE_LANES
    const Isa isa = pick_host_isa();
    if (isa == Isa::kAvx512 && (kLanesBuilt & kLanesAvx512)) return kLanesAvx512;
    if (isa >= Isa::kAvx2 && (kLanesBuilt & kLanesAvx2)) return kLanesAvx2;
    return 0;
#else
    return kLanesPortable;
#endif
  }();
  return chosen;
}

// Each entry runs the chosen set's code; a set not built here has no case (its unit is not linked).
template <class R, int P>
bool forward_lanes(const Problem<R>& pb, int64_t V, int threads, void* signal, void* signal_tangent) {
  if (!plain_orders(pb)) return false;
  switch (lanes_running()) {
#if defined(BS_HAVE_WIDE_LANES) && BS_BUILT_AVX512_LANES
    case kLanesAvx512: lanes_avx512::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent); return true;
#endif
#if defined(BS_HAVE_WIDE_LANES) && BS_BUILT_AVX2_LANES
    case kLanesAvx2: lanes_avx2::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent); return true;
#endif
#ifndef BS_HAVE_WIDE_LANES
    case kLanesPortable: lanes_sse2::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent); return true;
#endif
    default: return false;
  }
}

template <class R, int P>
bool vjp_lanes(const Problem<R>& pb, int64_t V, int threads, const LaneAdjointIO& io) {
  if (!plain_orders(pb)) return false;
  switch (lanes_running()) {
#if defined(BS_HAVE_WIDE_LANES) && BS_BUILT_AVX512_LANES
    case kLanesAvx512: lanes_avx512::vjp_lanes_at<R, P>(pb, V, threads, io); return true;
#endif
#if defined(BS_HAVE_WIDE_LANES) && BS_BUILT_AVX2_LANES
    case kLanesAvx2: lanes_avx2::vjp_lanes_at<R, P>(pb, V, threads, io); return true;
#endif
#ifndef BS_HAVE_WIDE_LANES
    case kLanesPortable: lanes_sse2::vjp_lanes_at<R, P>(pb, V, threads, io); return true;
#endif
    default: return false;
  }
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

// The lane sets this library holds and the one running (bits as kLanesBuilt; 0: the per-voxel path; -1: a
// BLOCHSIM_HOST_ISA it refuses, see bs_last_error), for `blochsim info` and the tests. Declared extern "C"
// in capi.h.
int32_t bs_host_lane_sets(void) { return bs::kLanesBuilt; }
int32_t bs_host_lanes_running(void) {
  int32_t running = -1;
  bs::guarded([&] { running = bs::lanes_running(); });
  return running;
}
