// The host's real plain path (pool model 0 on the real path with every order relaxing alike: plain_orders)
// runs voxels in SIMD lanes: a block's voxels as one Lanes number (lanes.hpp), through the event loop's own
// step_forward_plain (forward, JVP) and step_adjoint_plain (VJP). The lane code is compiled once per
// instruction set (epg_lanes.cpp) and picked at run time; the scalar per-voxel path (epg_host.hpp) runs
// every other layout and the second-order adjoint.
#pragma once

#include <cstdint>
#include <vector>

#include "blochsim/event_loop.hpp"
#include "capi.h"
#include "lanes.hpp"

namespace bs {

// The one-voxel number under a lane number: R for Lanes<R, W>, Dual<R, P> for Dual<Lanes<R, W>, P>.
template <class N>
struct OneVoxel;
template <class R, int W>
struct OneVoxel<Lanes<R, W>> {
  using type = R;
};
template <class R, int W, int P>
struct OneVoxel<Dual<Lanes<R, W>, P>> {
  using type = Dual<R, P>;
};

// Lane l of a lane number set from (get_lane: read as) a one-voxel number.
template <class R, int W>
BS_HD void set_lane(Lanes<R, W>& x, int l, R a) {
  x.set(l, a);
}
template <class R, int W, int P>
BS_HD void set_lane(Dual<Lanes<R, W>, P>& x, int l, const Dual<R, P>& a) {
  x.v.set(l, a.v);
  for (int p = 0; p < P; ++p) x.d[p].set(l, a.d[p]);
}
template <class R, int W>
BS_HD R get_lane(const Lanes<R, W>& x, int l) {
  return x[l];
}
template <class R, int W, int P>
BS_HD Dual<R, P> get_lane(const Dual<Lanes<R, W>, P>& x, int l) {
  Dual<R, P> a;
  a.v = x.v[l];
  for (int p = 0; p < P; ++p) a.d[p] = x.d[p][l];
  return a;
}

// What every voxel of a call computes alike, per event of one repetition (entry E: event 0's interval on
// later repetitions, the wrap): the interval, the pulse's rotation factors where B1 is uniform (no tangent),
// and the ADC's demodulation cis(-phase). N1: the one-voxel number.
template <class N1>
struct SharedEvent {
  N1 dt, ca, sa, s2, half_sa;
  Cx<N1> turn;
};
template <class N1, class R>
std::vector<SharedEvent<N1>> shared_events(const Problem<R>& pb, bool uniform_b1) {
  std::vector<SharedEvent<N1>> table(static_cast<size_t>(pb.E + 1));
  const N1 b1 = uniform_b1 ? fetch<N1>(pb.tissue[BS_B1], 0) : N1(R(1));
  for (int64_t e = 0; e <= pb.E; ++e) {
    const int64_t i = e < pb.E ? e : 0;
    SharedEvent<N1>& s = table[static_cast<size_t>(e)];
    s.dt = e < pb.E ? fetch<N1>(pb.dt, i) : fetch<N1>(pb.dt_wrap, 0);
    const Rotation<N1> r = make_rotation(fetch<N1>(pb.flip, i) * b1, N1(R(0)), false);
    s.ca = r.ca;
    s.sa = r.sa;
    s.s2 = r.s2;
    s.half_sa = r.half_sa;
    s.turn = cis(-fetch<N1>(pb.phase, i));
  }
  return table;
}

// B1 the same for every voxel and without a tangent: the rotations come from the shared table.
template <class R>
bool uniform_b1(const Problem<R>& pb) {
  const Input<R>& b1 = pb.tissue[BS_B1];
  return (!b1.data || b1.stride == 0) && !b1.tan;
}

// What an adjoint of the lane path reads and writes: the VJP's cotangent and gradients; the second order's
// (P = 1) also their tangents and, where asked, the forward's samples and their tangents (null: not wanted;
// a null cotangent tangent is zero). Layouts as in capi.h.
struct LaneAdjointIO {
  const void* cotangent = nullptr;          // [V, S] complex, read
  const void* cotangent_tangent = nullptr;  // [V, S] complex, read, or null
  bs_grads grads{};                         // written where not null
  const bs_grads* grads_tangent = nullptr;  // P = 1: written where not null
  void* signal = nullptr;                   // [V, S] complex, written, or null
  void* signal_tangent = nullptr;           // [V, S] complex, written, or null
};

// Entry points of the lane path (epg_lanes.cpp), for problems of the real path (V voxels). Each returns
// false, doing nothing, where the problem is not plain (plain_orders). vjp_lanes<R, 0> is the VJP,
// vjp_lanes<R, 1> the second-order adjoint (forward over reverse along the problem's one tangent).
template <class R, int P>
bool forward_lanes(const Problem<R>& pb, int64_t V, int threads, void* signal, void* signal_tangent);
template <class R, int P>
bool vjp_lanes(const Problem<R>& pb, int64_t V, int threads, const LaneAdjointIO& io);

// The lane code of each instruction set is compiled in a translation unit of its own (epg_lanes_sse2.cpp,
// epg_lanes_avx2.cpp, epg_lanes_avx512.cpp: epg_lanes.inc in a namespace per set), so the three compile side
// by side; epg_lanes.cpp picks one per process. The wider sets need GCC's target regions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BS_HAVE_WIDE_LANES 1
#endif

}  // namespace bs
