// The EPG event loop for pool model 0 (free water), written once over a number type N and a state
// scalar S (N for the real path's three real planes, Cx<N> for complex states).
//
// States per voxel: F+(k), F-(k), Z(k), k = 0..K-1, the signed-order coefficients of Weigel (2015):
// F+(k) = F_k, F-(k) = conj(F_{-k}); every phase applied to F_n is applied conjugated to F-(k).
// States are in units of M0 (equilibrium Z(0) = 1); the sample is M0 * F+(0) * exp(-i psi).
// On the real path the pulses share one phase axis phi0 (half turns folded into signed flips) and the
// states are F+ = -i f e^{i phi0}, F- = i g e^{-i phi0}, Z = z with f, g, z real; ADC phases then arrive
// relative to phi0.
//
// Per event (the oracle's rules, blochsim/_reference/epg.py): interval (relax, precess, diffuse, flow, washout), CRUSH_BEFORE shift,
// RF (inversion or rotation), ADC, CRUSH_AFTER shift, SPOIL_AFTER or SHIFT_AFTER.
//
// Every operation has its adjoint beside it. An adjoint takes lambda, the gradient of the real loss with
// respect to the state after the operation (packed as re + i im for complex states), returns the gradient
// before it, and adds the gradients of the operation's parameters.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "blochsim/number.hpp"
#include "capi.h"

namespace bs {

constexpr double kPi = 3.14159265358979323846;

// ---- inputs with tangents ---------------------------------------------------------------------------
template <class R>
struct Input {
  const R* data = nullptr;  // value i at data[i * stride]; null: identity
  int64_t stride = 0;
  const R* tan = nullptr;   // tangent p of value i at tan[p * tan_stride_p + i * tan_stride]; null: zero
  int64_t tan_stride_p = 0;
  int64_t tan_stride = 0;
  R identity = 0;
};

// Element i of voxel v of a per-voxel table (stride = the voxel stride; tan_stride = the tangents' voxel stride).
template <class N, class R>
BS_HD N fetch_table(const Input<R>& in, int64_t v, int64_t i) {
  N x = N(in.data[v * in.stride + i]);
  if constexpr (Num<N>::P > 0) {
    if (in.tan)
      for (int p = 0; p < Num<N>::P; ++p) x.d[p] = in.tan[p * in.tan_stride_p + v * in.tan_stride + i];
  }
  return x;
}

template <class N, class R>
BS_HD N fetch(const Input<R>& in, int64_t i) {
  N x = N(in.data ? in.data[i * in.stride] : in.identity);
  if constexpr (Num<N>::P > 0) {
    if (in.tan)
      for (int p = 0; p < Num<N>::P; ++p) x.d[p] = in.tan[p * in.tan_stride_p + i * in.tan_stride];
  }
  return x;
}

// ---- the problem as the kernel reads it -----------------------------------------------------------------
template <class R>
struct Problem {
  int64_t E, reps, S, K;
  int stride;
  int slots;  // the adjoints' replay slots a stretch, one per pass (bs_program checkpoint_slots; 0: stride)
  const int32_t* action;
  const int32_t* record;
  Input<R> dt, dt_wrap, flip, phase;
  Input<R> tissue[BS_NUM_TISSUE];
  double dk;  // crusher dephasing per m
  double voxel_m;  // voxel size, m (0: none)
  bool diffusion, flow, washout, offres;
  // Pools: nt water-like pools carry transverse states; the last nl - nt longitudinal pools are semisolid.
  // Tabulated layouts read their interval operators from per-voxel tables (see relax_tables.hpp).
  int nt = 1, nl = 1;
  bool tabulated = false;
  int64_t num_intervals = 0;
  const int32_t* interval = nullptr;  // [E] table row of each event's interval
  int64_t wrap_interval = 0;          // table row of event 0's interval on later repetitions
  Input<R> table_L, table_r, table_T, table_zeq, table_sat;  // element (v, i) at data[v * stride + i]
  // Pulses played per voxel (pulses.hpp): per event a row of the transmit fields, of the profiles or of the
  // spinors (-1: none); null: no event has one. Voxel v plays at slice position (v + voxel_offset) % P.
  const int32_t* field_row = nullptr;
  const int32_t* profile_row = nullptr;
  const int32_t* spinor_row = nullptr;
  int64_t num_field_rows = 0, num_spinor_rows = 0, num_profile_rows = 0;
  int64_t num_positions = 1, voxel_offset = 0, profile_bins = 0;
  double profile_theta_max = 0;
  Input<R> table_field, table_spinor, table_profile;
  // The value forwards' profiled pulses with B1 and its phase uniform over the voxels (pairs_per_launch):
  // each event's rotation at each slice position, [E, P, kPairReals], formed once per launch
  // (pulses.hpp decode_pulse_pair) and read by every voxel at that position; null: formed per voxel.
  const R* pulse_pairs = nullptr;
  // The CUDA library's value forwards: the train's events decoded and folded once per launch, in device
  // memory (epg_device.cuh decode_events_kernel); null: each block decodes its own.
  const void* events = nullptr;
  // The CUDA library's real plain adjoints in groups with the pulses uniform: the train's events decoded
  // once per launch (event_loop.hpp PlainCode, epg_device.cuh decode_plain_events_kernel); null: each voxel
  // loads and forms its own.
  const void* plain_events = nullptr;
  // The CUDA library's general adjoints (vjp_warp_kernel) at the first order with the pulses uniform: each
  // event's values, rotation and demodulation decoded once per launch (event_loop.hpp EventCode,
  // epg_device.cuh decode_general_events_kernel); null: each voxel loads and forms its own.
  const void* event_codes = nullptr;
};

// Tissue of one voxel in kernel units (rates in 1/s).
template <class N>
struct Voxel {
  N t1_ms, t2_ms, r1, r2, m0, b1, b1phase, b0, inv, D, v;
  int64_t position = 0;  // slice position (profiled pulses): (v + voxel_offset) % P, taken once per voxel
};

template <class N>
BS_HD N rate_from_ms(const N& t_ms) {  // 1/T in 1/s; T is clamped to >= 1e-6 ms, so T = 0 gives no signal
  using R = typename Num<N>::Real;
  if (value_of(t_ms) < R(1e-6)) return N(R(1e9));
  return R(1000) / t_ms;
}
template <class N>
BS_HD N drate_dms(const N& t_ms) {  // d(1/T)/dT_ms
  using R = typename Num<N>::Real;
  if (value_of(t_ms) < R(1e-6)) return N(R(0));
  if (!(value_of(t_ms) < R(INFINITY))) return N(R(0));
  return -(R(1000) / (t_ms * t_ms));
}

template <class N, class R>
BS_HD Voxel<N> load_voxel(const Problem<R>& pb, int64_t v) {
  Voxel<N> t;
  t.t1_ms = fetch<N>(pb.tissue[BS_T1_MS], v);
  t.t2_ms = fetch<N>(pb.tissue[BS_T2_MS], v);
  t.r1 = rate_from_ms(t.t1_ms);
  t.r2 = rate_from_ms(t.t2_ms);
  t.m0 = fetch<N>(pb.tissue[BS_M0], v);
  t.b1 = fetch<N>(pb.tissue[BS_B1], v);
  t.b1phase = fetch<N>(pb.tissue[BS_B1_PHASE_RAD], v);
  t.b0 = fetch<N>(pb.tissue[BS_B0_HZ], v);
  t.inv = fetch<N>(pb.tissue[BS_INVERSION_EFFICIENCY], v);
  t.D = fetch<N>(pb.tissue[BS_DIFFUSION_UM2_PER_MS], v);
  t.v = fetch<N>(pb.tissue[BS_VELOCITY_M_PER_S], v);
  if (pb.num_positions > 1) t.position = (v + pb.voxel_offset) % pb.num_positions;
  return t;
}

// Gradient accumulators of one voxel's tissue (kernel units: rates, not times).
template <class N>
struct VoxelGrad {
  N r1, r2, m0, b1, b1phase, b0, inv, D, v;
  BS_HD VoxelGrad() : r1(0), r2(0), m0(0), b1(0), b1phase(0), b0(0), inv(0), D(0), v(0) {}
};

template <class N>
struct Rotation;

// ---- gradient lobes -------------------------------------------------------------------------------------
// Each shift is the lobe of one unit of dephasing dk, played at constant amplitude over the whole interval it
// faces: a CRUSH_AFTER or SHIFT_AFTER shift over the interval after its event, a CRUSH_BEFORE shift over the
// one before it (the oracle's module docstring, "Gradient lobes"; WAITs without an action are dropped at
// compile time, so an interval runs between two events that touch the states). An interval's `count` lobes
// include the `behind` shifts the event before it made, already in the stored orders: a state stored at
// signed order n is at order n - behind when the interval starts and n - behind + count when it ends.
struct Lobes {
  int8_t behind = 0, count = 0;  // the default: an interval without a gradient
};

// The lobes of event e's interval on repetition rep: the shifts after the event before it (on later
// repetitions, event 0's comes after the last event; on the first, nothing comes before event 0) and the
// event's own CRUSH_BEFORE. After a spoiler the transverse states are 0 and its shifts weigh nothing; they are
// counted as the oracle counts them (its CRUSH_AFTER, not its SHIFT_AFTER).
template <class R>
BS_HD Lobes interval_lobes(const Problem<R>& pb, int64_t rep, int64_t e) {
  Lobes lobes;
  if (e > 0 || rep > 0) {
    const int32_t before = pb.action[e > 0 ? e - 1 : pb.E - 1];
    lobes.behind = int8_t((before & BS_CRUSH_AFTER ? 1 : 0) +
                          ((before & BS_SHIFT_AFTER) && !(before & BS_SPOIL_AFTER) ? 1 : 0));
  }
  lobes.count = int8_t(lobes.behind + (pb.action[e] & BS_CRUSH_BEFORE ? 1 : 0));
  return lobes;
}

// Event values of event e of repetition rep (global event i = rep * E + e). `rotation` and `turn`, where
// set, hold what every voxel would compute alike: the RF rotation (B1 uniform over the voxels) and the ADC's
// demodulation cis(-phase) (the device's block-decoded events, epg_device.cuh); null: each voxel computes
// its own. kValues (a dual N): `value_rotation` and `value_turn` are those of the values alone, no tangent
// reaching the pulse or the sample (the second order along tissue properties, its pulses uniform over the
// voxels and none played per voxel: event_loop.hpp kDecodedValues), so the states are turned by real
// coefficients; step_forward and step_adjoint read them by kValues alone (a test at run time beside the
// others moved ptxas's registers in kernels that never set them: the (1, 2) pools' value forward 136 -> 157).
// Without kValues the struct is as it was (an empty base): the value forwards' and JVPs' block-decoded events
// hold it in shared memory, and 16 bytes more there put a JVP's states on the stack (ptxas, sm_90: 4,624
// bytes for the real groups of 8 at Dual<2>).
template <class N, bool kValues>
struct ValuePulse {};
template <class N>
struct ValuePulse<N, true> {
  const Rotation<typename Num<N>::Real>* value_rotation = nullptr;
  const Cx<typename Num<N>::Real>* value_turn = nullptr;
};
template <class N, bool kValues = false>
struct EventValues : ValuePulse<N, kValues> {
  int32_t action, record;
  bool last_rep, wrap;
  Lobes lobes;  // of the interval ahead of the event; read only where diffusion or flow acts
  int32_t sample_at = 0;  // where the event samples, after e (a decoded fold's: event_loop.hpp fold_at)
  int64_t e;
  N dt, flip, phase;
  const Rotation<N>* rotation = nullptr;
  const Cx<N>* turn = nullptr;
};
// A sample's demodulation: `turn` where it is set (a fold's sample's, whose phase is not its head's), else
// cis(-phase).
template <class N, bool kValues>
BS_HD Cx<N> demodulation(const EventValues<N, kValues>& ev) {
  if constexpr (kValues) return Cx<N>(N(ev.value_turn->re), N(ev.value_turn->im));
  return ev.turn ? *ev.turn : cis(-ev.phase);
}

template <class N, class R>
BS_HD EventValues<N> load_event(const Problem<R>& pb, int64_t rep, int64_t e) {
  EventValues<N> ev;
  ev.e = e;
  ev.action = pb.action[ev.e];
  ev.record = pb.record[ev.e];
  ev.last_rep = rep == pb.reps - 1;
  ev.wrap = ev.e == 0 && rep > 0;
  ev.dt = ev.wrap ? fetch<N>(pb.dt_wrap, 0) : fetch<N>(pb.dt, ev.e);
  ev.flip = fetch<N>(pb.flip, ev.e);
  ev.phase = fetch<N>(pb.phase, ev.e);
  if (pb.diffusion || pb.flow) ev.lobes = interval_lobes(pb, rep, e);
  return ev;
}
template <class N, class R>
BS_HD EventValues<N> load_event(const Problem<R>& pb, int64_t i) {
  return load_event<N>(pb, i / pb.E, i % pb.E);
}

// ---- states -------------------------------------------------------------------------------------------
// Where a voxel's states live: element k at p[k * st]. st = 1 on the host and for register arrays; in the
// device's scratch a warp's threads interleave (st = 32, epg_device.cuh thread_scratch), so its accesses
// coalesce.
template <class S>
struct Ref {
  S* p;
  int64_t st;
  BS_HD S& operator[](int64_t k) const { return p[k * st]; }
  BS_HD Ref operator+(int64_t n) const { return Ref{p + n * st, st}; }
};

template <class S>
struct Planes {
  Ref<S> p;  // F+ (real path: f)
  Ref<S> m;  // F- (real path: g)
  Ref<S> z;  // Z
};

template <class S>
BS_HD void copy_planes(Planes<S> dst, Planes<S> src, int64_t K) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    dst.p[k] = src.p[k];
    dst.m[k] = src.m[k];
    dst.z[k] = src.z[k];
  }
}
template <class S>
BS_HD void equilibrium(Planes<S> x, int64_t K) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) x.p[k] = x.m[k] = x.z[k] = S(0);
  x.z[0] = S(1);
}
template <class S>
BS_HD void zero_planes(Planes<S> x, int64_t K) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) x.p[k] = x.m[k] = x.z[k] = S(0);
}

// ---- shift: F+(k) -> F+(k+1), F-(k) -> F-(k-1), new F+(0) = conj(new F-(0)) ---------------------------
template <class S>
BS_HD void shift(Planes<S> x, int64_t K) {
  BS_UNROLL
  for (int64_t k = K - 1; k > 0; --k) x.p[k] = x.p[k - 1];
  BS_UNROLL
  for (int64_t k = 0; k < K - 1; ++k) x.m[k] = x.m[k + 1];
  x.m[K - 1] = S(0);
  x.p[0] = conj(x.m[0]);
}
template <class S>
BS_HD void shift_adjoint(Planes<S> l, int64_t K) {
  const S from_p0 = conj(l.p[0]);
  BS_UNROLL
  for (int64_t k = 0; k < K - 1; ++k) l.p[k] = l.p[k + 1];
  l.p[K - 1] = S(0);
  BS_UNROLL
  for (int64_t k = K - 1; k > 0; --k) l.m[k] = l.m[k - 1];
  l.m[0] = S(0);
  if (K > 1) l.m[1] += from_p0;
}

template <class S>
BS_HD void spoil(Planes<S> x, int64_t K) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) x.p[k] = x.m[k] = S(0);
}

// ---- interval: relaxation with recovery into Z(0), precession, diffusion, flow, washout ----------------
// Factor of a state of signed order n (transverse) or order k (longitudinal) over dt, washout aside:
//   F_n: exp(-r2 dt - i 2 pi b0 dt - c_n Dk dt - i f_n dk v dt)   (Weigel 2015)
//   Z_k: exp(-r1 dt - k^2 Dk dt - i k dk v dt),  Dk = D * 1e-9 * dk^2 (D in um^2/ms -> m^2/s)
// with c_n and f_n the interval's weights of order n (diffusion_weight, flow_weight: n^2 + n + 1/3 and
// n + 1/2 for a lobe played while the state is stored at n, n^2 and n without a lobe). F-(k) = conj(F_{-k})
// takes the conjugate of F_{-k}'s factor. Washout multiplies everything by w = 1 - min(|v| dt / L, 1) and
// brings in fresh equilibrium: Z(0) -> a_Z0 (Z(0) - 1) + 1.
template <class N>
struct Interval {
  N dt = N(0), E1 = N(1), E2 = N(1), w = N(1), dw_ddt = N(0), dw_dv = N(0);
  Cx<N> rot;       // exp(-i 2 pi b0 dt)
  N Dk = N(0);     // diffusion rate per unit c_n, 1/s
  N phv = N(0);    // dk v dt: flow phase per order
  double dk = 0, dk2 = 0;
  bool diffusion = false, flow = false, washout = false, offres = false, tabulated = false;
  Lobes lobes;     // the gradient lobes played over the interval
};

// Weigel's weights of a state stored at signed order n over an interval with `lobes`: its dephasing moves
// linearly from m = n - behind to m + count, so diffusion weighs the mean of (m + count s)^2 over s in [0, 1],
// m^2 + m count + count^2 / 3, and flow turns by the mean order, m + count / 2.
template <class R>
BS_HD R diffusion_weight(R n, const Lobes& lobes) {
  const R m = n - R(lobes.behind), count = R(lobes.count);
  return m * m + m * count + count * count / R(3);
}
template <class R>
BS_HD R flow_weight(R n, const Lobes& lobes) {
  return n - R(lobes.behind) + R(lobes.count) * R(0.5);
}

// With `tabulated`, relaxation and precession come from the tables: only diffusion, flow and washout remain.
template <class N, class R>
BS_HD Interval<N> make_interval(const Problem<R>& pb, const Voxel<N>& t, const N& dt, bool offres) {
  Interval<N> c;
  c.dt = dt;
  c.tabulated = pb.tabulated;
  c.E1 = pb.tabulated ? N(1) : exp(-(t.r1 * dt));
  c.E2 = pb.tabulated ? N(1) : exp(-(t.r2 * dt));
  offres = offres && !pb.tabulated;
  c.offres = offres;
  c.rot = offres ? cis(-(R(2 * kPi) * t.b0 * dt)) : Cx<N>(N(1));
  c.diffusion = pb.diffusion;
  c.flow = pb.flow;
  c.washout = pb.washout;
  c.dk = pb.dk;
  c.dk2 = pb.dk * pb.dk;
  c.Dk = t.D * R(1e-9 * pb.dk * pb.dk);
  c.phv = t.v * dt * R(pb.dk);
  c.w = N(1);
  c.dw_ddt = N(0);
  c.dw_dv = N(0);
  if (pb.washout) {
    const R sgn = value_of(t.v) < 0 ? R(-1) : R(1);
    const N frac = sgn * t.v * dt / R(pb.voxel_m);
    if (value_of(frac) < R(1)) {
      c.w = R(1) - frac;
      c.dw_ddt = -(sgn * t.v) / R(pb.voxel_m);
      c.dw_dv = -(sgn * dt) / R(pb.voxel_m);
    } else {
      c.w = N(0);
    }
  }
  return c;
}
// The interval ahead of event `ev`, with its lobes.
template <class N, class R, bool kValues>
BS_HD Interval<N> make_interval(const Problem<R>& pb, const Voxel<N>& t, const EventValues<N, kValues>& ev) {
  Interval<N> c = make_interval(pb, t, ev.dt, pb.offres);
  c.lobes = ev.lobes;
  return c;
}

// Factors (washout excluded) of order k for the three planes, on either path: F+(k) has signed order k,
// F-(k) = conj(F_{-k}) the conjugate of order -k's factor.
template <class N>
BS_HD void order_factors(const Interval<N>& c, int64_t k, Cx<N>& ap, Cx<N>& am, Cx<N>& az) {
  using R = typename Num<N>::Real;
  ap = c.rot * c.E2;
  am = conj(c.rot) * c.E2;
  az = Cx<N>(c.E1);
  const R kk = R(k);
  if (c.diffusion) {
    ap = ap * exp(-(c.Dk * c.dt * diffusion_weight(kk, c.lobes)));
    am = am * exp(-(c.Dk * c.dt * diffusion_weight(-kk, c.lobes)));
    az = az * exp(-(c.Dk * c.dt * (kk * kk)));
  }
  if (c.flow) {
    ap = ap * cis(-(c.phv * flow_weight(kk, c.lobes)));
    am = am * cis(c.phv * flow_weight(-kk, c.lobes));
    az = az * cis(-(c.phv * kk));
  }
}

template <class N>
BS_HD Cx<N> factor_times(const Cx<N>& a, const Cx<N>& x) {
  return a * x;
}
template <class N>
BS_HD N factor_times(const Cx<N>& a, const N& x) {  // real path: factors are real there
  return a.re * x;
}
// Each plane of x times its factor, into out (may be x). `real`: the factors have no imaginary part (no
// precession), so the complex path multiplies by their real parts: half the multiplications. The real
// path's factors are real already (factor_times).
template <class N, class S>
BS_HD void scale_planes(Planes<S> out, Planes<S> x, int64_t K, const Cx<N>& ap, const Cx<N>& am, const Cx<N>& az,
                        bool real) {
  if (!std::is_same<S, N>::value && real) {
    const N fp = ap.re, fm = am.re, fz = az.re;
    BS_UNROLL
    for (int64_t k = 0; k < K; ++k) {
      out.p[k] = x.p[k] * fp;
      out.m[k] = x.m[k] * fm;
      out.z[k] = x.z[k] * fz;
    }
    return;
  }
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    out.p[k] = factor_times(ap, x.p[k]);
    out.m[k] = factor_times(am, x.m[k]);
    out.z[k] = factor_times(az, x.z[k]);
  }
}
template <class N>
BS_HD Cx<N> factor_adjoint(const Cx<N>& lam, const Cx<N>& a) {
  return conj(a) * lam;
}
template <class N>
BS_HD N factor_adjoint(const N& lam, const Cx<N>& a) {
  return a.re * lam;
}
template <class N>
BS_HD Cx<N> as_cx(const Cx<N>& x) {
  return x;
}
template <class N>
BS_HD Cx<N> as_cx(const N& x) {
  return Cx<N>(x);
}

// From `x` into `out` (the same planes: in place; the adjoint's recomputation reads the state it keeps and
// writes its scratch, with no copy first). k0: the order of x's first entry (a lane of a warp holds orders
// k0 .. k0 + K - 1); recovery enters at order 0. Without precession (no B0 map) the factors are real, and
// the complex path multiplies by them as reals: half the multiplications.
template <class N, class S>
BS_HD void relax_into(Planes<S> out, Planes<S> x, int64_t K, const Interval<N>& c, int64_t k0 = 0) {
  if (!c.diffusion && !c.flow) {
    Cx<N> ap, am, az;
    order_factors(c, 0, ap, am, az);
    ap = ap * c.w;
    am = am * c.w;
    az = az * c.w;
    scale_planes(out, x, K, ap, am, az, !c.offres);
    if (k0 == 0) out.z[0] += S(-az.re + typename Num<N>::Real(1));
    return;
  }
  Cx<N> az0;
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    Cx<N> ap, am, az;
    order_factors(c, k + k0, ap, am, az);
    out.p[k] = factor_times(ap * c.w, x.p[k]);
    out.m[k] = factor_times(am * c.w, x.m[k]);
    out.z[k] = factor_times(az * c.w, x.z[k]);
    if (k == 0) az0 = az * c.w;
  }
  if (k0 == 0) out.z[0] += S(-az0.re + typename Num<N>::Real(1));
}
template <class N, class S>
BS_HD void relax(Planes<S> x, int64_t K, const Interval<N>& c, int64_t k0 = 0) {
  relax_into(x, x, K, c, k0);
}

// Sums over orders (and pools) of q = conj(lambda') * a_nowash * x, plain and weighted by the order terms
// of diffusion (c_n) and flow (f_n): the interval's parameter gradients are linear in them.
template <class N>
struct IntervalSums {
  Cx<N> QP, QM, QZ, QPc, QMc, QZc, QPf, QMf, QZf;
};

// Parameter gradients of an interval from its sums: dt, rates, B0, D, v (see order_factors).
template <class N>
BS_HD void interval_grads(const Interval<N>& c, const Voxel<N>& t, const IntervalSums<N>& q, VoxelGrad<N>& g,
                          N* g_dt) {
  using R = typename Num<N>::Real;
  const N w = c.w;
  const N q_all = re(q.QP) + re(q.QM) + re(q.QZ);
  // Re(-i a Q) = a Im Q: precession and flow turn the transverse planes in opposite senses.
  N gdt = N(0);
  if (!c.tabulated) {  // tabulated layouts carry relaxation and precession in their tables
    gdt = -(t.r2 * (re(q.QP) + re(q.QM))) - t.r1 * re(q.QZ);
    g.r2 += -(w * c.dt * (re(q.QP) + re(q.QM)));
    g.r1 += -(w * c.dt * re(q.QZ));
  }
  if (c.offres) {
    gdt += R(2 * kPi) * t.b0 * (im(q.QP) - im(q.QM));
    g.b0 += w * (R(2 * kPi) * c.dt * (im(q.QP) - im(q.QM)));
  }
  if (c.diffusion) {
    const N qc = re(q.QPc) + re(q.QMc) + re(q.QZc);
    gdt -= c.Dk * qc;
    g.D += -(w * (R(1e-9 * c.dk2) * c.dt * qc));
  }
  if (c.flow) {
    const N qf = im(q.QPf) - im(q.QMf) + im(q.QZf);
    gdt += R(c.dk) * t.v * qf;
    g.v += w * (R(c.dk) * c.dt * qf);
  }
  if (c.washout) g.v += c.dw_dv * q_all;
  *g_dt += w * gdt + c.dw_ddt * q_all;
}

// Adjoint of relax. x is the state before the interval. Adds d/d(dt) to *g_dt and tissue terms to g
// (a warp lane's share: k0 as in relax, the lanes' terms summed by the caller).
template <class N, class S>
BS_HD void relax_adjoint(Planes<S> l, Planes<S> x, int64_t K, const Interval<N>& c, const Voxel<N>& t,
                         VoxelGrad<N>& g, N* g_dt, int64_t k0 = 0) {
  using R = typename Num<N>::Real;
  // Sums of q = conj(lambda') * a_nowash * x over each plane, plain and weighted by the order terms.
  Cx<N> QP, QM, QZ, QPc, QMc, QZc, QPf, QMf, QZf;
  if (!c.diffusion && !c.flow) {  // factors are the same for every order: sum first, multiply once
    Cx<N> ap, am, az;
    order_factors(c, 0, ap, am, az);
    S sp = S(0), sm = S(0), sz = S(0);
    BS_UNROLL
    for (int64_t k = 0; k < K; ++k) {
      sp += conj(l.p[k]) * x.p[k];
      sm += conj(l.m[k]) * x.m[k];
      sz += conj(l.z[k]) * x.z[k];
    }
    if (k0 == 0) sz += -conj(l.z[0]);  // Z(0) enters as Z(0) - 1 (recovery)
    QP = ap * as_cx(sp);
    QM = am * as_cx(sm);
    QZ = az * as_cx(sz);
    const Cx<N> wp = ap * c.w, wm = am * c.w, wz = az * c.w;
    scale_planes(l, l, K, conj(wp), conj(wm), conj(wz), !c.offres);  // the adjoint scales by the conjugates
  } else {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    Cx<N> ap, am, az;
    order_factors(c, k + k0, ap, am, az);
    const S xz = k + k0 == 0 ? S(x.z[0] - S(1)) : x.z[k];
    const Cx<N> qp = conj(as_cx(l.p[k])) * (ap * as_cx(x.p[k]));
    const Cx<N> qm = conj(as_cx(l.m[k])) * (am * as_cx(x.m[k]));
    const Cx<N> qz = conj(as_cx(l.z[k])) * (az * as_cx(xz));
    QP += qp;
    QM += qm;
    QZ += qz;
    if (c.diffusion) {
      const R kk = R(k + k0);
      QPc += qp * N(diffusion_weight(kk, c.lobes));
      QMc += qm * N(diffusion_weight(-kk, c.lobes));
      QZc += qz * N(kk * kk);
    }
    if (c.flow) {
      const R kk = R(k + k0);
      QPf += qp * N(flow_weight(kk, c.lobes));
      QMf += qm * N(flow_weight(-kk, c.lobes));
      QZf += qz * N(kk);
    }
    l.p[k] = factor_adjoint(l.p[k], ap * c.w);
    l.m[k] = factor_adjoint(l.m[k], am * c.w);
    l.z[k] = factor_adjoint(l.z[k], az * c.w);
  }
  }
  interval_grads(c, t, IntervalSums<N>{QP, QM, QZ, QPc, QMc, QZc, QPf, QMf, QZf}, g, g_dt);
}

// ---- RF: inversion and rotation -------------------------------------------------------------------------
template <class S, class N>
BS_HD void invert(Planes<S> x, int64_t K, const N& eta) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) x.z[k] = x.z[k] * (-eta);
}
template <class S, class N>
BS_HD void invert_adjoint(Planes<S> l, Planes<S> x, int64_t K, const N& eta, N& g_eta) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    g_eta += -re_dot(as_cx(l.z[k]), as_cx(x.z[k]));
    l.z[k] = l.z[k] * (-eta);
  }
}

// Rotation by flip alpha about (cos phi, sin phi, 0) (blochsim/_reference/pulse.py), on (F+, F-, Z).
template <class N>
struct Rotation {
  N ca, sa, c2, s2, half_sa;
  Cx<N> e1, e2;  // exp(i phi), exp(2 i phi)
  // The complex path's coefficients as products, formed once per pulse: e2 s2, e1 sa, e1 sa / 2 (a third
  // fewer operations per order than forming them in the loop).
  Cx<N> e2s2, e1sa, e1hs;
};
template <class N>
BS_HD Rotation<N> make_rotation(const N& alpha, const N& phi, bool complex_path) {
  using R = typename Num<N>::Real;
  Rotation<N> r;
  sin_cos(alpha, r.sa, r.ca);
  r.c2 = (R(1) + r.ca) * R(0.5);
  r.s2 = (R(1) - r.ca) * R(0.5);
  r.half_sa = r.sa * R(0.5);
  if (complex_path) {
    r.e1 = cis(phi);
    r.e2 = r.e1 * r.e1;
    r.e2s2 = r.e2 * r.s2;
    r.e1sa = r.e1 * r.sa;
    r.e1hs = r.e1 * r.half_sa;
  }
  return r;
}

// (Q: N, or N's real type where the rotation carries no tangent: EventValues::value_rotation.)
template <class N, class Q>
BS_HD void rotate(Planes<Cx<N>> x, int64_t K, const Rotation<Q>& r) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    const Cx<N> P = x.p[k], M = x.m[k], Z = x.z[k];
    x.p[k] = P * r.c2 + r.e2s2 * M - mul_i(r.e1sa * Z);
    x.m[k] = conj(r.e2s2) * P + M * r.c2 + mul_i(conj(r.e1sa) * Z);
    x.z[k] = mul_i(r.e1hs * M - conj(r.e1hs) * P) + Z * r.ca;
  }
}
// x: state before the rotation. Adds d/d alpha and d/d phi. Each is Re(lambda'^H D x) summed over the
// orders, D = dR/d alpha or dR/d phi (3 x 3 in (F+, F-, Z); R's entries as `rotate` forms them), so the
// orders give the nine sums S_ij = sum_k conj(lambda'_i) x_j once and the two D meet them once a pulse:
// Re sum_ij D_ij S_ij. D's diagonal is real (zero for phi), so S_ii is needed in its real part only. An
// order then costs 30 multiply-adds for both gradients, where forming D x per order took about 200.
template <class N, class Q>
BS_HD void rotate_adjoint(Planes<Cx<N>> l, Planes<Cx<N>> x, int64_t K, const Rotation<Q>& r, N& g_alpha,
                          N& g_phi) {
  using R = typename Num<N>::Real;
  N sPP = N(0), sMM = N(0), sZZ = N(0);
  Cx<N> sPM, sPZ, sMP, sMZ, sZP, sZM;
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    const Cx<N> P = x.p[k], M = x.m[k], Z = x.z[k];
    const Cx<N> lP = l.p[k], lM = l.m[k], lZ = l.z[k];
    sPP += re_dot(lP, P);
    sMM += re_dot(lM, M);
    sZZ += re_dot(lZ, Z);
    sPM += conj(lP) * M;
    sPZ += conj(lP) * Z;
    sMP += conj(lM) * P;
    sMZ += conj(lM) * Z;
    sZP += conj(lZ) * P;
    sZM += conj(lZ) * M;
    // lambda <- R^H lambda'
    l.p[k] = lP * r.c2 + r.e2s2 * lM + mul_i(r.e1hs * lZ);
    l.m[k] = conj(r.e2s2) * lP + lM * r.c2 - mul_i(conj(r.e1hs) * lZ);
    l.z[k] = mul_i(conj(r.e1sa) * lP - r.e1sa * lM) + lZ * r.ca;
  }
  // dR/d alpha = [[-hs, e2 hs, -i e1 ca], [e2* hs, -hs, i e1* ca], [-i e1* ca/2, i e1 ca/2, -sa]] (hs = sa/2);
  // dR/d phi = [[0, 2i e2 s2, e1 sa], [-2i e2* s2, 0, e1* sa], [-e1* hs, -e1 hs, 0]].
  const Q half_ca = r.ca * R(0.5), two_s2 = r.s2 * R(2);
  const Cx<Q> e1 = r.e1, e2 = r.e2;
  g_alpha += -(r.half_sa * (sPP + sMM)) - r.sa * sZZ +
             re((e2 * r.half_sa) * sPM + conj(e2) * r.half_sa * sMP) +
             re(mul_i(conj(e1) * r.ca * sMZ - e1 * r.ca * sPZ) + mul_i(e1 * half_ca * sZM - conj(e1) * half_ca * sZP));
  g_phi += re(mul_i(e2 * two_s2 * sPM - conj(e2) * two_s2 * sMP)) + re(r.e1sa * sPZ + conj(r.e1sa) * sMZ) -
           re(conj(r.e1hs) * sZP + r.e1hs * sZM);
}

// Real path: f, g, z with F+ = -i f, F- = i g in the frame of the common pulse axis. With c2 = 1 - s2,
// f' = c2 f - s2 g + sa z = f + w and g' = g + w, w = sa z - s2 (f + g): 7 operations per order, not 9.
template <class N, class Q>
BS_HD void rotate(Planes<N> x, int64_t K, const Rotation<Q>& r) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    const N f = x.p[k], g = x.m[k], z = x.z[k];
    const N u = f + g;
    const N w = r.sa * z - r.s2 * u;
    x.p[k] = f + w;
    x.m[k] = g + w;
    x.z[k] = r.ca * z - r.half_sa * u;
  }
}
// ---- real plain path: an interval, a shift and a pulse in one pass ----------------------------------------
// With every order relaxing alike (plain_orders) and a real rotation, relaxing (E1, E2, recovery 1 - E1
// into Z(0)), shifting A = 0 or 1 times and rotating (ca, sa, s2, half_sa; an inversion: ca = -eta, the rest
// 0) compose into one map per order. With F, G, Z an order's operands before the interval (A = 1: F = f(k-1),
// G = g(k+1), and F = G = g(1) at order 0) and t = F + G:
//   w = a Z - b t,  f' = E2 F + w,  g' = E2 G + w,  z' = c Z - d t,
//   a = sa E1, b = s2 E2, c = ca E1, d = half_sa E2; order 0's w and z' gain a0 = sa (1 - E1), c0 = ca (1 - E1).
// 7 operations per order where relax, shift and rotate take 10 and the shift's moves.
template <class N>
struct RelaxRotate {
  N E2, a, b, c, d, a0, c0;
};
template <class N>
BS_HD RelaxRotate<N> relax_rotate_factors(const N& E1, const N& E2, const N& ca, const N& sa, const N& s2,
                                          const N& half_sa) {
  using R = typename Num<N>::Real;
  const N rec = R(1) - E1;
  return RelaxRotate<N>{E2, sa * E1, s2 * E2, ca * E1, half_sa * E2, sa * rec, ca * rec};
}
// From `in` into `out` (another array: in the register kernel the copy back is a renaming), over a voxel's
// whole array (order 0 first). The first and last orders are taken apart, so the loops between hold no
// order-dependent branch and vectorise on the host. With a shift (A = 1) the device forms every order's w
// and z' first (w kept in out.p), then g' in rising and f' in falling order: written per order at once, the
// register kernel's pass took 30 register moves beside its 224 operations (sm_90 SASS, K = 32), written
// this way none. The host keeps one loop: three passes over memory took a quarter longer (docs/design.md).
// Numbers whose passes run in place (the host's voxel lanes, csrc/cpu/lanes.hpp): `out` may then be `in`,
// and the shifted pass keeps f(k - 1) before order k - 1 writes over it. An order's operands are whole SIMD
// registers there, so the carried value costs nothing, and the copy back after the pass goes.
template <class N>
struct PassesInPlace {
  static constexpr bool value = false;
};
template <int A, class N>
BS_HD void relax_rotate(Planes<N> out, Planes<N> in, int64_t K, const RelaxRotate<N>& q) {
  const auto order = [&](int64_t k, const N& F, const N& G) {
    const N Z = in.z[k];
    const N t = F + G;
    const N w = q.a * Z - q.b * t;
    out.p[k] = q.E2 * F + w;
    out.m[k] = q.E2 * G + w;
    out.z[k] = q.c * Z - q.d * t;
  };
  if constexpr (A == 0) {
    BS_NO_ALIAS
    for (int64_t k = 0; k < K; ++k) order(k, in.p[k], in.m[k]);
  } else {
    const N g1 = K > 1 ? in.m[1] : N(0);
#ifdef __CUDA_ARCH__
    const auto w_and_z = [&](int64_t k, const N& t) {
      const N Z = in.z[k];
      out.p[k] = q.a * Z - q.b * t;
      out.z[k] = q.c * Z - q.d * t;
    };
    w_and_z(0, g1 + g1);
    BS_NO_ALIAS
    for (int64_t k = 1; k < K - 1; ++k) w_and_z(k, in.p[k - 1] + in.m[k + 1]);
    if (K > 1) w_and_z(K - 1, in.p[K - 2]);
    BS_NO_ALIAS
    for (int64_t k = 0; k < K - 1; ++k) out.m[k] = q.E2 * in.m[k + 1] + out.p[k];
    out.m[K - 1] = out.p[K - 1];
    BS_NO_ALIAS
    for (int64_t k = K - 1; k > 0; --k) out.p[k] = q.E2 * in.p[k - 1] + out.p[k];
    out.p[0] += q.E2 * g1;
#else
    if constexpr (PassesInPlace<N>::value) {
      N f_before = in.p[0];
      order(0, g1, g1);
      for (int64_t k = 1; k < K - 1; ++k) {
        const N F = f_before;
        f_before = in.p[k];
        order(k, F, in.m[k + 1]);
      }
      if (K > 1) order(K - 1, f_before, N(0));
    } else {
      order(0, g1, g1);
      BS_NO_ALIAS
      for (int64_t k = 1; k < K - 1; ++k) order(k, in.p[k - 1], in.m[k + 1]);
      if (K > 1) order(K - 1, in.p[K - 2], N(0));
    }
#endif
  }
  out.p[0] += q.a0;  // recovery, through w and z'
  out.m[0] += q.a0;
  out.z[0] += q.c0;
}
// Gradients of the loss with respect to a pass's factors (RelaxRotate's fields), summed over orders.
template <class N>
struct RelaxRotateGrads {
  N E2 = N(0), a = N(0), b = N(0), c = N(0), d = N(0), a0 = N(0), c0 = N(0);
};
// Adjoint of relax_rotate<A> (one pass over the orders, as the forward): l, the gradient with respect to
// `out`, becomes the gradient with respect to `in` (the pass's input, read here) in place, and g gains the
// factors' gradients: with lw = lf + lg, E2: lf F + lg G, a: lw Z, b: -lw t, c: lz Z, d: -lz t. A = 1: the
// operands came one order over (F = f(k-1), G = g(k+1), g(1) twice at order 0), so their gradients go back
// there; g(k+1)'s is held for one order, until order k + 1 has read its own lg.
template <int A, class N>
BS_HD void relax_rotate_adjoint(Planes<N> l, Planes<N> in, int64_t K, const RelaxRotate<N>& q,
                                RelaxRotateGrads<N>& g) {
  N sE2 = N(0), sa = N(0), sb = N(0), sc = N(0), sd = N(0);
  g.a0 += l.p[0] + l.m[0];
  g.c0 += l.z[0];
  const auto order = [&](int64_t k, const N& F, const N& G, N& lF, N& lG) {
    const N Z = in.z[k];
    const N t = F + G;
    const N lf = l.p[k], lg = l.m[k], lz = l.z[k];
    const N lw = lf + lg;
    sE2 += lf * F + lg * G;
    sa += lw * Z;
    sb += lw * t;
    sc += lz * Z;
    sd += lz * t;
    const N lt = -(q.b * lw + q.d * lz);
    lF = q.E2 * lf + lt;
    lG = q.E2 * lg + lt;
    l.z[k] = q.a * lw + q.c * lz;
  };
  N lF, lG;
  if constexpr (A == 0) {
    for (int64_t k = 0; k < K; ++k) {
      order(k, in.p[k], in.m[k], lF, lG);
      l.p[k] = lF;
      l.m[k] = lG;
    }
  } else {
    const N g1 = K > 1 ? in.m[1] : N(0);
    order(0, g1, g1, lF, lG);
    N held = lF + lG;  // g(1)'s, read as F and G at order 0
    l.m[0] = N(0);     // the shift dropped g(0)
    for (int64_t k = 1; k < K; ++k) {
      order(k, in.p[k - 1], k + 1 < K ? in.m[k + 1] : N(0), lF, lG);
      l.p[k - 1] = lF;
      l.m[k] = held;
      held = lG;  // g(k+1)'s (none past the last order)
    }
    l.p[K - 1] = N(0);  // and f(K-1)
  }
  g.E2 += sE2;
  g.a += sa;
  g.b -= sb;
  g.c += sc;
  g.d -= sd;
}
// f(0) after relax_rotate<A>: what a sample right after the pass reads.
template <int A, class N>
BS_HD N relax_rotate_f0(Planes<N> in, int64_t K, const RelaxRotate<N>& q) {
  const N g1 = K > 1 ? in.m[1] : N(0);
  const N F = A ? g1 : in.p[0], G = A ? g1 : in.m[0];
  return q.E2 * F + (q.a * in.z[0] - q.b * (F + G)) + q.a0;
}
template <class N, class Q>
BS_HD void rotate_adjoint(Planes<N> l, Planes<N> x, int64_t K, const Rotation<Q>& r, N& g_alpha, N&) {
  using R = typename Num<N>::Real;
  const Q half_ca = r.ca * R(0.5);
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    const N f = x.p[k], g = x.m[k], z = x.z[k];
    const N lf = l.p[k], lg = l.m[k], lz = l.z[k];
    const N d_fg = r.ca * z - r.half_sa * (f + g);  // d/d alpha of f' and of g'
    g_alpha += (lf + lg) * d_fg - lz * (half_ca * (f + g) + r.sa * z);
    l.p[k] = r.c2 * lf - r.s2 * lg - r.half_sa * lz;
    l.m[k] = r.c2 * lg - r.s2 * lf - r.half_sa * lz;
    l.z[k] = r.sa * (lf + lg) + r.ca * lz;
  }
}

// ---- ADC: sample = M0 * F+(0) * exp(-i psi) ---------------------------------------------------------------
template <class N>
BS_HD Cx<N> transverse(const Cx<N>& p0) {
  return p0;
}
template <class N>
BS_HD Cx<N> transverse(const N& f0) {  // F+ = -i f
  return Cx<N>(N(0), -f0);
}
template <class N>
BS_HD void add_sample_adjoint(Cx<N>& l_p0, const Cx<N>& w, const Cx<N>& c) {  // signal = c * p0
  l_p0 += conj(c) * w;
}
template <class N>
BS_HD void add_sample_adjoint(N& l_f0, const Cx<N>& w, const Cx<N>& c) {  // signal = c * (-i f0)
  l_f0 += re_dot(w, mul_i(-c));
}

}  // namespace bs
