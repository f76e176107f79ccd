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
// Per event (API.md section 3.3): interval (relax, precess, diffuse, flow, washout), CRUSH_BEFORE shift,
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
  const int32_t* action;
  const int32_t* record;
  Input<R> dt, dt_wrap, flip, phase;
  Input<R> tissue[BS_NUM_TISSUE];
  double dk;  // crusher dephasing per m
  double L;   // voxel size, m (0: none)
  bool diffusion, flow, washout, offres;
};

// Tissue of one voxel in kernel units (rates in 1/s).
template <class N>
struct Voxel {
  N t1_ms, t2_ms, r1, r2, m0, b1, b1phase, b0, inv, D, v;
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
  return t;
}

// Gradient accumulators of one voxel's tissue (kernel units: rates, not times).
template <class N>
struct VoxelGrad {
  N r1, r2, m0, b1, b1phase, b0, inv, D, v;
  BS_HD VoxelGrad() : r1(0), r2(0), m0(0), b1(0), b1phase(0), b0(0), inv(0), D(0), v(0) {}
};

// Event values of global event i (repetition i / E, event i % E).
template <class N>
struct EventValues {
  int32_t action, record;
  bool last_rep, wrap;
  int64_t e;
  N dt, flip, phase;
};

template <class N, class R>
BS_HD EventValues<N> load_event(const Problem<R>& pb, int64_t i) {
  EventValues<N> ev;
  ev.e = i % pb.E;
  const int64_t rep = i / pb.E;
  ev.action = pb.action[ev.e];
  ev.record = pb.record[ev.e];
  ev.last_rep = rep == pb.reps - 1;
  ev.wrap = ev.e == 0 && rep > 0;
  ev.dt = ev.wrap ? fetch<N>(pb.dt_wrap, 0) : fetch<N>(pb.dt, ev.e);
  ev.flip = fetch<N>(pb.flip, ev.e);
  ev.phase = fetch<N>(pb.phase, ev.e);
  return ev;
}

// ---- states -------------------------------------------------------------------------------------------
template <class S>
struct Planes {
  S* p;  // F+ (real path: f)
  S* m;  // F- (real path: g)
  S* z;  // Z
};

template <class S>
BS_HD void copy_planes(Planes<S> dst, Planes<S> src, int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    dst.p[k] = src.p[k];
    dst.m[k] = src.m[k];
    dst.z[k] = src.z[k];
  }
}
template <class S>
BS_HD void equilibrium(Planes<S> x, int64_t K) {
  for (int64_t k = 0; k < K; ++k) x.p[k] = x.m[k] = x.z[k] = S(0);
  x.z[0] = S(1);
}
template <class S>
BS_HD void zero_planes(Planes<S> x, int64_t K) {
  for (int64_t k = 0; k < K; ++k) x.p[k] = x.m[k] = x.z[k] = S(0);
}

// ---- shift: F+(k) -> F+(k+1), F-(k) -> F-(k-1), new F+(0) = conj(new F-(0)) ---------------------------
template <class S>
BS_HD void shift(Planes<S> x, int64_t K) {
  for (int64_t k = K - 1; k > 0; --k) x.p[k] = x.p[k - 1];
  for (int64_t k = 0; k < K - 1; ++k) x.m[k] = x.m[k + 1];
  x.m[K - 1] = S(0);
  x.p[0] = conj(x.m[0]);
}
template <class S>
BS_HD void shift_adjoint(Planes<S> l, int64_t K) {
  const S from_p0 = conj(l.p[0]);
  for (int64_t k = 0; k < K - 1; ++k) l.p[k] = l.p[k + 1];
  l.p[K - 1] = S(0);
  for (int64_t k = K - 1; k > 0; --k) l.m[k] = l.m[k - 1];
  l.m[0] = S(0);
  if (K > 1) l.m[1] += from_p0;
}

template <class S>
BS_HD void spoil(Planes<S> x, int64_t K) {
  for (int64_t k = 0; k < K; ++k) x.p[k] = x.m[k] = S(0);
}

// ---- interval: relaxation with recovery into Z(0), precession, diffusion, flow, washout ----------------
// Factor of a state of signed order n (transverse) or order k (longitudinal) over dt, washout aside:
//   F_n: exp(-r2 dt - i 2 pi b0 dt - (n^2 + n + 1/3) Dk dt - i (n + 1/2) dk v dt)   (Weigel 2015)
//   Z_k: exp(-r1 dt - k^2 Dk dt - i k dk v dt),  Dk = D * 1e-9 * dk^2 (D in um^2/ms -> m^2/s)
// F-(k) = conj(F_{-k}) takes the conjugate of F_{-k}'s factor. Washout multiplies everything by
// w = 1 - min(|v| dt / L, 1) and brings in fresh equilibrium: Z(0) -> a_Z0 (Z(0) - 1) + 1.
template <class N>
struct Interval {
  N dt = N(0), E1 = N(1), E2 = N(1), w = N(1), dw_ddt = N(0), dw_dv = N(0);
  Cx<N> rot;       // exp(-i 2 pi b0 dt)
  N Dk = N(0);     // diffusion rate per unit c_n, 1/s
  N phv = N(0);    // dk v dt: flow phase per order
  double dk = 0, dk2 = 0;
  bool diffusion = false, flow = false, washout = false, offres = false;
};

template <class N, class R>
BS_HD Interval<N> make_interval(const Problem<R>& pb, const Voxel<N>& t, const N& dt, bool offres) {
  Interval<N> c;
  c.dt = dt;
  c.E1 = exp(-(t.r1 * dt));
  c.E2 = exp(-(t.r2 * dt));
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
    const N frac = sgn * t.v * dt / R(pb.L);
    if (value_of(frac) < R(1)) {
      c.w = R(1) - frac;
      c.dw_ddt = -(sgn * t.v) / R(pb.L);
      c.dw_dv = -(sgn * dt) / R(pb.L);
    } else {
      c.w = N(0);
    }
  }
  return c;
}

// Factors (washout excluded) of order k for the three planes, on either path.
template <class N>
BS_HD void order_factors(const Interval<N>& c, int64_t k, Cx<N>& ap, Cx<N>& am, Cx<N>& az) {
  using R = typename Num<N>::Real;
  ap = c.rot * c.E2;
  am = conj(c.rot) * c.E2;
  az = Cx<N>(c.E1);
  if (c.diffusion) {
    const R kk = R(k);
    ap = ap * exp(-(c.Dk * c.dt * (kk * kk + kk + R(1) / R(3))));
    am = am * exp(-(c.Dk * c.dt * (kk * kk - kk + R(1) / R(3))));
    az = az * exp(-(c.Dk * c.dt * (kk * kk)));
  }
  if (c.flow) {
    const R kk = R(k);
    ap = ap * cis(-(c.phv * (kk + R(0.5))));
    am = am * cis(c.phv * (R(0.5) - kk));
    az = az * cis(-(c.phv * kk));
  }
}

template <class N>
BS_HD void apply_factor(Cx<N>& x, const Cx<N>& a) {
  x = a * x;
}
template <class N>
BS_HD void apply_factor(N& x, const Cx<N>& a) {  // real path: factors are real there
  x = a.re * x;
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

template <class N, class S>
BS_HD void relax(Planes<S> x, int64_t K, const Interval<N>& c) {
  if (!c.diffusion && !c.flow) {
    Cx<N> ap, am, az;
    order_factors(c, 0, ap, am, az);
    ap = ap * c.w;
    am = am * c.w;
    az = az * c.w;
    for (int64_t k = 0; k < K; ++k) {
      apply_factor(x.p[k], ap);
      apply_factor(x.m[k], am);
      apply_factor(x.z[k], az);
    }
    x.z[0] += S(-az.re + typename Num<N>::Real(1));
    return;
  }
  Cx<N> az0;
  for (int64_t k = 0; k < K; ++k) {
    Cx<N> ap, am, az;
    order_factors(c, k, ap, am, az);
    apply_factor(x.p[k], ap * c.w);
    apply_factor(x.m[k], am * c.w);
    apply_factor(x.z[k], az * c.w);
    if (k == 0) az0 = az * c.w;
  }
  x.z[0] += S(-az0.re + typename Num<N>::Real(1));
}

// Adjoint of relax. x is the state before the interval. Adds d/d(dt) to *g_dt and tissue terms to g.
template <class N, class S>
BS_HD void relax_adjoint(Planes<S> l, Planes<S> x, int64_t K, const Interval<N>& c, const Voxel<N>& t,
                         VoxelGrad<N>& g, N* g_dt) {
  using R = typename Num<N>::Real;
  // Sums of q = conj(lambda') * a_nowash * x over each plane, plain and weighted by the order terms.
  Cx<N> QP, QM, QZ, QPc, QMc, QZc, QPf, QMf, QZf;
  if (!c.diffusion && !c.flow) {  // factors are the same for every order: sum first, multiply once
    Cx<N> ap, am, az;
    order_factors(c, 0, ap, am, az);
    S sp = S(0), sm = S(0), sz = S(0);
    for (int64_t k = 0; k < K; ++k) {
      sp += conj(l.p[k]) * x.p[k];
      sm += conj(l.m[k]) * x.m[k];
      sz += conj(l.z[k]) * x.z[k];
    }
    sz += -conj(l.z[0]);  // Z(0) enters as Z(0) - 1 (recovery)
    QP = ap * as_cx(sp);
    QM = am * as_cx(sm);
    QZ = az * as_cx(sz);
    const Cx<N> wp = ap * c.w, wm = am * c.w, wz = az * c.w;
    for (int64_t k = 0; k < K; ++k) {
      l.p[k] = factor_adjoint(l.p[k], wp);
      l.m[k] = factor_adjoint(l.m[k], wm);
      l.z[k] = factor_adjoint(l.z[k], wz);
    }
  } else {
  for (int64_t k = 0; k < K; ++k) {
    Cx<N> ap, am, az;
    order_factors(c, k, ap, am, az);
    const S xz = k == 0 ? S(x.z[0] - S(1)) : x.z[k];
    const Cx<N> qp = conj(as_cx(l.p[k])) * (ap * as_cx(x.p[k]));
    const Cx<N> qm = conj(as_cx(l.m[k])) * (am * as_cx(x.m[k]));
    const Cx<N> qz = conj(as_cx(l.z[k])) * (az * as_cx(xz));
    QP += qp;
    QM += qm;
    QZ += qz;
    if (c.diffusion) {
      const R kk = R(k);
      QPc += qp * N(kk * kk + kk + R(1) / R(3));
      QMc += qm * N(kk * kk - kk + R(1) / R(3));
      QZc += qz * N(kk * kk);
    }
    if (c.flow) {
      const R kk = R(k);
      QPf += qp * N(kk + R(0.5));
      QMf += qm * N(R(0.5) - kk);
      QZf += qz * N(kk);
    }
    l.p[k] = factor_adjoint(l.p[k], ap * c.w);
    l.m[k] = factor_adjoint(l.m[k], am * c.w);
    l.z[k] = factor_adjoint(l.z[k], az * c.w);
  }
  }
  const N w = c.w;
  const N q_all = re(QP) + re(QM) + re(QZ);
  // Re(-i a Q) = a Im Q: precession and flow turn the transverse planes in opposite senses.
  N gdt = -(t.r2 * (re(QP) + re(QM))) - t.r1 * re(QZ);
  if (c.offres) {
    gdt += R(2 * kPi) * t.b0 * (im(QP) - im(QM));
    g.b0 += w * (R(2 * kPi) * c.dt * (im(QP) - im(QM)));
  }
  if (c.diffusion) {
    const N qc = re(QPc) + re(QMc) + re(QZc);
    gdt -= c.Dk * qc;
    g.D += -(w * (R(1e-9 * c.dk2) * c.dt * qc));
  }
  if (c.flow) {
    const N qf = im(QPf) - im(QMf) + im(QZf);
    gdt += R(c.dk) * t.v * qf;
    g.v += w * (R(c.dk) * c.dt * qf);
  }
  if (c.washout) g.v += c.dw_dv * q_all;
  *g_dt += w * gdt + c.dw_ddt * q_all;
  g.r2 += -(w * c.dt * (re(QP) + re(QM)));
  g.r1 += -(w * c.dt * re(QZ));
}


// ---- RF: inversion and rotation -------------------------------------------------------------------------
template <class S, class N>
BS_HD void invert(Planes<S> x, int64_t K, const N& eta) {
  for (int64_t k = 0; k < K; ++k) x.z[k] = x.z[k] * (-eta);
}
template <class S, class N>
BS_HD void invert_adjoint(Planes<S> l, Planes<S> x, int64_t K, const N& eta, N& g_eta) {
  for (int64_t k = 0; k < K; ++k) {
    g_eta += -re_dot(as_cx(l.z[k]), as_cx(x.z[k]));
    l.z[k] = l.z[k] * (-eta);
  }
}

// Rotation by flip alpha about (cos phi, sin phi, 0) (API.md 3.3), on (F+, F-, Z).
template <class N>
struct Rotation {
  N ca, sa, c2, s2, half_sa;
  Cx<N> e1, e2;  // exp(i phi), exp(2 i phi)
};
template <class N>
BS_HD Rotation<N> make_rotation(const N& alpha, const N& phi, bool complex_path) {
  using R = typename Num<N>::Real;
  Rotation<N> r;
  r.ca = cos(alpha);
  r.sa = sin(alpha);
  r.c2 = (R(1) + r.ca) * R(0.5);
  r.s2 = (R(1) - r.ca) * R(0.5);
  r.half_sa = r.sa * R(0.5);
  if (complex_path) {
    r.e1 = cis(phi);
    r.e2 = r.e1 * r.e1;
  }
  return r;
}

template <class N>
BS_HD void rotate(Planes<Cx<N>> x, int64_t K, const Rotation<N>& r) {
  for (int64_t k = 0; k < K; ++k) {
    const Cx<N> P = x.p[k], M = x.m[k], Z = x.z[k];
    x.p[k] = P * r.c2 + r.e2 * (M * r.s2) - mul_i(r.e1 * (Z * r.sa));
    x.m[k] = conj(r.e2) * (P * r.s2) + M * r.c2 + mul_i(conj(r.e1) * (Z * r.sa));
    x.z[k] = mul_i(r.e1 * (M * r.half_sa) - conj(r.e1) * (P * r.half_sa)) + Z * r.ca;
  }
}
// x: state before the rotation. Adds d/d alpha and d/d phi.
template <class N>
BS_HD void rotate_adjoint(Planes<Cx<N>> l, Planes<Cx<N>> x, int64_t K, const Rotation<N>& r, N& g_alpha,
                          N& g_phi) {
  using R = typename Num<N>::Real;
  const N half_ca = r.ca * R(0.5);
  for (int64_t k = 0; k < K; ++k) {
    const Cx<N> P = x.p[k], M = x.m[k], Z = x.z[k];
    const Cx<N> lP = l.p[k], lM = l.m[k], lZ = l.z[k];
    // d/d alpha of the rotated state
    const Cx<N> dP = r.e2 * (M * r.half_sa) - P * r.half_sa - mul_i(r.e1 * (Z * r.ca));
    const Cx<N> dM = conj(r.e2) * (P * r.half_sa) - M * r.half_sa + mul_i(conj(r.e1) * (Z * r.ca));
    const Cx<N> dZ = mul_i(r.e1 * (M * half_ca) - conj(r.e1) * (P * half_ca)) - Z * r.sa;
    g_alpha += re_dot(lP, dP) + re_dot(lM, dM) + re_dot(lZ, dZ);
    // d/d phi
    const Cx<N> fP = mul_i(r.e2 * (M * (r.s2 * R(2)))) + r.e1 * (Z * r.sa);
    const Cx<N> fM = conj(r.e1) * (Z * r.sa) - mul_i(conj(r.e2) * (P * (r.s2 * R(2))));
    const Cx<N> fZ = -(conj(r.e1) * (P * r.half_sa) + r.e1 * (M * r.half_sa));
    g_phi += re_dot(lP, fP) + re_dot(lM, fM) + re_dot(lZ, fZ);
    // lambda <- R^H lambda'
    l.p[k] = lP * r.c2 + r.e2 * (lM * r.s2) + mul_i(r.e1 * (lZ * r.half_sa));
    l.m[k] = conj(r.e2) * (lP * r.s2) + lM * r.c2 - mul_i(conj(r.e1) * (lZ * r.half_sa));
    l.z[k] = mul_i(conj(r.e1) * (lP * r.sa) - r.e1 * (lM * r.sa)) + lZ * r.ca;
  }
}

// Real path: f, g, z with F+ = -i f, F- = i g in the frame of the common pulse axis.
template <class N>
BS_HD void rotate(Planes<N> x, int64_t K, const Rotation<N>& r) {
  for (int64_t k = 0; k < K; ++k) {
    const N f = x.p[k], g = x.m[k], z = x.z[k];
    x.p[k] = r.c2 * f - r.s2 * g + r.sa * z;
    x.m[k] = r.c2 * g - r.s2 * f + r.sa * z;
    x.z[k] = r.ca * z - r.half_sa * (f + g);
  }
}
template <class N>
BS_HD void rotate_adjoint(Planes<N> l, Planes<N> x, int64_t K, const Rotation<N>& r, N& g_alpha, N&) {
  using R = typename Num<N>::Real;
  const N half_ca = r.ca * R(0.5);
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

// ---- one event, forward and adjoint ---------------------------------------------------------------------
template <class N, class S, class R>
BS_HD void step_forward(const Problem<R>& pb, const Voxel<N>& t, const EventValues<N>& ev, Planes<S> x,
                        Cx<N>* samples) {
  constexpr bool complex_path = !std::is_same<S, N>::value;
  const int64_t K = pb.K;
  if (ev.action & BS_INTERVAL) relax(x, K, make_interval(pb, t, ev.dt, pb.offres));
  if (ev.action & BS_CRUSH_BEFORE) shift(x, K);
  if (ev.action & BS_INVERSION) {
    invert(x, K, t.inv);
  } else if (ev.action & BS_ROTATE) {
    rotate(x, K, make_rotation(ev.flip * t.b1, ev.phase + t.b1phase, complex_path));
  }
  if (samples && ev.record >= 0 && ev.last_rep) samples[ev.record] = transverse(x.p[0]) * cis(-ev.phase) * t.m0;
  if (ev.action & BS_CRUSH_AFTER) shift(x, K);
  if (ev.action & BS_SPOIL_AFTER) {
    spoil(x, K);
  } else if (ev.action & BS_SHIFT_AFTER) {
    shift(x, K);
  }
}

// Event-value gradient accumulators (summed over repetitions).
template <class N>
struct EventGrad {
  N* dt;       // [E]
  N* dt_wrap;  // [1]
  N* flip;     // [E]
  N* phase;    // [E]
};

// Adjoint of one event. x_pre: state before the event; tmp: scratch planes; l: lambda, updated in place.
template <class N, class S, class R>
BS_HD void step_adjoint(const Problem<R>& pb, const Voxel<N>& t, const EventValues<N>& ev, Planes<S> x_pre,
                        Planes<S> tmp, Planes<S> l, const Cx<N>* cot, VoxelGrad<N>& g, EventGrad<N> eg) {
  constexpr bool complex_path = !std::is_same<S, N>::value;
  const int64_t K = pb.K;
  // Recompute the state ahead of the RF / ADC.
  copy_planes(tmp, x_pre, K);
  Interval<N> iv;
  if (ev.action & BS_INTERVAL) {
    iv = make_interval(pb, t, ev.dt, pb.offres);
    relax(tmp, K, iv);
  }
  if (ev.action & BS_CRUSH_BEFORE) shift(tmp, K);
  // Reverse order.
  if (ev.action & BS_SPOIL_AFTER) {
    spoil(l, K);
  } else if (ev.action & BS_SHIFT_AFTER) {
    shift_adjoint(l, K);
  }
  if (ev.action & BS_CRUSH_AFTER) shift_adjoint(l, K);
  if (cot && ev.record >= 0 && ev.last_rep) {  // ADC events carry no RF: the sample reads tmp
    const Cx<N> w = cot[ev.record];
    const Cx<N> turn = cis(-ev.phase);
    const Cx<N> u = transverse(tmp.p[0]) * turn;
    g.m0 += re_dot(w, u);
    eg.phase[ev.e] += t.m0 * re_dot(w, mul_i(-u));
    add_sample_adjoint(l.p[0], w, turn * t.m0);
  }
  if (ev.action & BS_INVERSION) {
    invert_adjoint(l, tmp, K, t.inv, g.inv);
  } else if (ev.action & BS_ROTATE) {
    N g_alpha = N(0), g_phi = N(0);
    rotate_adjoint(l, tmp, K, make_rotation(ev.flip * t.b1, ev.phase + t.b1phase, complex_path), g_alpha, g_phi);
    eg.flip[ev.e] += g_alpha * t.b1;
    g.b1 += g_alpha * ev.flip;
    eg.phase[ev.e] += g_phi;
    g.b1phase += g_phi;
  }
  if (ev.action & BS_CRUSH_BEFORE) shift_adjoint(l, K);
  if (ev.action & BS_INTERVAL) relax_adjoint(l, x_pre, K, iv, t, g, ev.wrap ? eg.dt_wrap : eg.dt + ev.e);
}

// ---- whole voxels ---------------------------------------------------------------------------------------
// Scratch a voxel needs, in units of S: the planes of the current state, tmp, lambda, the replay buffer
// (stride states) and the checkpoints (one every stride events).
template <class R>
BS_HD int64_t scratch_planes(const Problem<R>& pb, bool adjoint) {
  const int64_t n = pb.E * pb.reps;
  return adjoint ? 3 + pb.stride + (n + pb.stride - 1) / pb.stride : 1;
}

template <class S>
BS_HD Planes<S> planes_at(S* base, int64_t K, int64_t index) {
  S* b = base + 3 * K * index;
  return Planes<S>{b, b + K, b + 2 * K};
}

template <class N, class S, class R>
BS_HD void forward_voxel(const Problem<R>& pb, const Voxel<N>& t, S* scratch, Cx<N>* samples) {
  Planes<S> x = planes_at(scratch, pb.K, 0);
  equilibrium(x, pb.K);
  const int64_t n = pb.E * pb.reps;
  for (int64_t i = 0; i < n; ++i) step_forward(pb, t, load_event<N>(pb, i), x, samples);
}

// Checkpointed adjoint of one voxel: the forward sweep keeps every stride-th state; the reverse sweep
// replays each stretch from its checkpoint. Writes the forward samples too when `samples` is given.
template <class N, class S, class R>
BS_HD void vjp_voxel(const Problem<R>& pb, const Voxel<N>& t, S* scratch, const Cx<N>* cot, Cx<N>* samples,
                     VoxelGrad<N>& g, EventGrad<N> eg) {
  const int64_t K = pb.K, n = pb.E * pb.reps, stride = pb.stride;
  Planes<S> x = planes_at(scratch, K, 0), tmp = planes_at(scratch, K, 1), l = planes_at(scratch, K, 2);
  auto replay = [&](int64_t j) { return planes_at(scratch, K, 3 + j); };
  auto checkpoint = [&](int64_t c) { return planes_at(scratch, K, 3 + stride + c); };
  equilibrium(x, K);
  for (int64_t i = 0; i < n; ++i) {
    if (i % stride == 0) copy_planes(checkpoint(i / stride), x, K);
    step_forward(pb, t, load_event<N>(pb, i), x, samples);
  }
  zero_planes(l, K);
  for (int64_t c = (n - 1) / stride; c >= 0; --c) {
    const int64_t i0 = c * stride, i1 = i0 + stride < n ? i0 + stride : n;
    copy_planes(x, checkpoint(c), K);
    for (int64_t i = i0; i < i1; ++i) {
      copy_planes(replay(i - i0), x, K);
      if (i + 1 < i1) step_forward(pb, t, load_event<N>(pb, i), x, static_cast<Cx<N>*>(nullptr));
    }
    for (int64_t i = i1 - 1; i >= i0; --i) step_adjoint(pb, t, load_event<N>(pb, i), replay(i - i0), tmp, l, cot, g, eg);
  }
}

}  // namespace bs
