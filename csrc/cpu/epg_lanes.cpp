// The lane path's dispatch: the code of each instruction set (AVX2 with FMA, 8 float lanes; AVX-512, 16) is
// compiled in a unit of its own (epg_lanes_<set>.cpp) and picked here once per process by what the processor
// has. An x86-64 processor with neither (or BLOCHSIM_HOST_ISA=sse2) runs the per-voxel path, 4.3-6x slower
// than SSE2 lanes, which cost a fresh install 18 s of CPU (epg_lanes_sse2.cpp). Elsewhere (another
// architecture or compiler) the portable 4-lane code of epg_lanes_sse2.cpp runs.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "epg_lanes.hpp"
#include "host_isa.hpp"

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
    case Isa::kAvx512: lanes_avx512::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent); break;
    case Isa::kAvx2: lanes_avx2::forward_lanes_at<R, P>(pb, V, threads, signal, signal_tangent); break;
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
    case Isa::kAvx512: lanes_avx512::vjp_lanes_at<R, P>(pb, V, threads, io); break;
    case Isa::kAvx2: lanes_avx2::vjp_lanes_at<R, P>(pb, V, threads, io); break;
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
