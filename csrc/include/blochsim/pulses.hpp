// Pulses played per voxel: static shims, slice profiles and dynamic pTx spinors, on the
// complex path. An event's rotation is read from per-voxel tables the engine forms (blochsim/engine/pulses.py):
//
//   field   [V|1, F, 2]                 the transmit field of shim row f: (magnitude, phase rad). It replaces the
//                                       tissue's B1 and B1phase for the events of that row: the flip scales by the
//                                       magnitude, the phase gains the phase (a shim's weighted channel sum).
//   profile [1, P, Dp, bins, 8]         profiled definition d at slice position p: the Cayley-Klein pair at phase 0
//                                       and its derivative, (a, b, da/dtheta, db/dtheta) as (re, im) pairs, at
//                                       bins knots of effective flip theta = flip * B1 evenly over [0, theta_max],
//                                       read by cubic Hermite interpolation. Voxel v plays at position
//                                       (v + voxel_offset) % P: the engine lays a slice-resolved call's voxels out
//                                       tissue-major, positions innermost.
//   spinor  [V|1, Rs, 4]                a voxel's Cayley-Klein pair (a, b) at phase 0 for row s (a dynamic pTx
//                                       pulse composed from the voxel's channel fields).
//
// (a, b) is the first row of the SU(2) matrix of the rotation (blochsim/sequence/spinor.py); the event's RF phase
// phi (its phase plus B1phase, or the field's phase) is applied afterwards, b -> b e^{-i phi}. A negative theta
// plays |theta| at phi + pi (b -> -b). On (F+, F-, Z) the pair turns
//   P' = A P + B M + C Z,  M' = conj(B) P + conj(A) M + conj(C) Z,  Z' = D P + conj(D) M + E Z,
//   A = conj(a)^2, B = -conj(b)^2, C = -2 conj(a) conj(b), D = conj(a) b, E = |a|^2 - |b|^2,
// Weigel 2015's eq. 15 for a = cos(alpha/2), b = -i e^{-i phi} sin(alpha/2).
#pragma once

#include "blochsim/relax_tables.hpp"

namespace bs {

template <class R>
BS_HD bool per_voxel_pulses(const Problem<R>& pb) {
  return pb.field_row || pb.profile_row || pb.spinor_row;
}
// Where a launch's rule guarantees no pulse played per voxel (event_loop.hpp values_decodable, launch_rules.hpp
// jvp_groups), the kernel drops the rows from its own problem so that the spinor and field branches compile out.
template <class R>
BS_HD void drop_pulse_rows(Problem<R>& pb) {
  pb.field_row = pb.profile_row = pb.spinor_row = nullptr;
}
BS_HD int32_t row_of(const int32_t* rows, int64_t e) { return rows ? rows[e] : -1; }
// Whether every voxel plays each pulse alike: B1 and its phase uniform over the voxels and no pulse played
// per voxel (the device then forms each pulse's rotation once per launch).
template <class R>
BS_HD bool uniform_pulse(const Problem<R>& pb) {
  const Input<R>& b1 = pb.tissue[BS_B1];
  const Input<R>& phase = pb.tissue[BS_B1_PHASE_RAD];
  return (!b1.data || b1.stride == 0) && (!phase.data || phase.stride == 0) && !per_voxel_pulses(pb);
}

// Whether event e turns by a Cayley-Klein pair of the tables (not the hard rotation of flip and phase).
template <class R>
BS_HD bool spinor_pulse(const Problem<R>& pb, int64_t e) {
  return row_of(pb.profile_row, e) >= 0 || row_of(pb.spinor_row, e) >= 0;
}

// The transmit of event e in voxel v: B1 magnitude and phase, from its field row or the tissue.
template <class N>
struct Transmit {
  N b1, b1phase;
  int32_t field;  // the field row (-1: the tissue's B1, B1phase)
};
template <class N, class R>
BS_HD Transmit<N> transmit_of(const Problem<R>& pb, int64_t v, const Voxel<N>& t, int64_t e) {
  const int32_t f = row_of(pb.field_row, e);
  if (f < 0) return Transmit<N>{t.b1, t.b1phase, -1};
  return Transmit<N>{fetch_table<N>(pb.table_field, v, 2 * f), fetch_table<N>(pb.table_field, v, 2 * f + 1), f};
}

template <class N>
struct Spinor {
  Cx<N> a, b;
};

// The profile of row d at slice position p and effective flip theta (>= 0, <= theta_max: the engine checks),
// and its derivative along theta in `d_theta`.
template <class N, class R>
BS_HD Spinor<N> profile_spinor(const Problem<R>& pb, int64_t p, int64_t d, const N& theta, Spinor<N>& d_theta) {
  const int64_t bins = pb.profile_bins;
  const R h = R(pb.profile_theta_max / double(bins - 1));
  int64_t j = int64_t(value_of(theta) / h);
  j = j < 0 ? 0 : j > bins - 2 ? bins - 2 : j;
  const N s = (theta - R(j) * h) / h;
  const N s2 = s * s, s3 = s2 * s;
  // Hermite basis and its derivative along s.
  const N h00 = R(2) * s3 - R(3) * s2 + R(1), h10 = s3 - R(2) * s2 + s, h01 = R(3) * s2 - R(2) * s3, h11 = s3 - s2;
  const N d00 = R(6) * s2 - R(6) * s, d10 = R(3) * s2 - R(4) * s + R(1), d01 = R(6) * s - R(6) * s2,
          d11 = R(3) * s2 - R(2) * s;
  const int64_t knot = ((p * pb.num_profile_rows + d) * bins + j) * 8;
  const R* y0 = pb.table_profile.data + knot;  // shared by every voxel (stride 0): constants of the definitions
  const R* y1 = y0 + 8;
  N value[4], slope[4];
  for (int i = 0; i < 4; ++i) {
    value[i] = h00 * y0[i] + h10 * (h * y0[4 + i]) + h01 * y1[i] + h11 * (h * y1[4 + i]);
    slope[i] = (d00 * y0[i] + d10 * (h * y0[4 + i]) + d01 * y1[i] + d11 * (h * y1[4 + i])) / h;
  }
  d_theta = Spinor<N>{Cx<N>(slope[0], slope[1]), Cx<N>(slope[2], slope[3])};
  return Spinor<N>{Cx<N>(value[0], value[1]), Cx<N>(value[2], value[3])};
}

// The pair (at phase 0) of event e in voxel v at slice position p and, for a profile, its derivative along the
// signed effective flip alpha (zero for a spinor row, whose pair depends on the flip through the table: the
// engine's autograd).
template <class N, class R>
BS_HD Spinor<N> pulse_spinor(const Problem<R>& pb, int64_t v, int64_t p, int64_t e, const N& alpha,
                             Spinor<N>& d_alpha) {
  const int32_t s = row_of(pb.spinor_row, e);
  if (s >= 0) {
    d_alpha = Spinor<N>{};
    return Spinor<N>{Cx<N>(fetch_table<N>(pb.table_spinor, v, 4 * s), fetch_table<N>(pb.table_spinor, v, 4 * s + 1)),
                     Cx<N>(fetch_table<N>(pb.table_spinor, v, 4 * s + 2),
                           fetch_table<N>(pb.table_spinor, v, 4 * s + 3))};
  }
  using RR = typename Num<N>::Real;
  const bool negative = value_of(alpha) < RR(0);  // |alpha| at phi + pi: b -> -b
  Spinor<N> d;
  Spinor<N> q = profile_spinor(pb, p, row_of(pb.profile_row, e), negative ? -alpha : alpha, d);
  if (negative) {
    q.b = -q.b;
    d.a = -d.a;  // d a(|alpha|) / d alpha = -a'; d (-b(|alpha|)) / d alpha = +b'
  }
  d_alpha = d;
  return q;
}

// The rotation of a pair on (F+, F-, Z) (the header comment) and its adjoint.
template <class N>
struct GeneralRotation {
  Cx<N> A, B, C, D;
  N E;
};
template <class N>
BS_HD GeneralRotation<N> general_rotation(const Spinor<N>& q) {
  using R = typename Num<N>::Real;
  const Cx<N> ac = conj(q.a), bc = conj(q.b);
  return GeneralRotation<N>{ac * ac, -(bc * bc), (ac * bc) * N(R(-2)), ac * q.b, re_dot(q.a, q.a) - re_dot(q.b, q.b)};
}
template <class N>
BS_HD void rotate_general(Planes<Cx<N>> x, int64_t K, const GeneralRotation<N>& r) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    const Cx<N> P = x.p[k], M = x.m[k], Z = x.z[k];
    x.p[k] = r.A * P + r.B * M + r.C * Z;
    x.m[k] = conj(r.B) * P + conj(r.A) * M + conj(r.C) * Z;
    x.z[k] = r.D * P + conj(r.D) * M + Z * r.E;
  }
}
// x: the state before the rotation. l becomes R^H l; g gains the gradients of A..E (packed re + i im).
template <class N>
BS_HD void rotate_general_adjoint(Planes<Cx<N>> l, Planes<Cx<N>> x, int64_t K, const GeneralRotation<N>& r,
                                  GeneralRotation<N>& g) {
  BS_UNROLL
  for (int64_t k = 0; k < K; ++k) {
    const Cx<N> P = x.p[k], M = x.m[k], Z = x.z[k];
    const Cx<N> lP = l.p[k], lM = l.m[k], lZ = l.z[k];
    g.A += lP * conj(P) + conj(lM) * M;
    g.B += lP * conj(M) + conj(lM) * P;
    g.C += lP * conj(Z) + conj(lM) * Z;
    g.D += lZ * conj(P) + conj(lZ) * M;
    g.E += re_dot(lZ, Z);
    l.p[k] = conj(r.A) * lP + r.B * lM + conj(r.D) * lZ;
    l.m[k] = conj(r.B) * lP + r.A * lM + r.D * lZ;
    l.z[k] = conj(r.C) * lP + r.C * lM + lZ * r.E;
  }
}

// ---- the rotations formed once per launch ---------------------------------------------------------------
// A profiled pulse's rotation depends on the voxel through its slice position alone where B1 and its phase
// are the same in every voxel (the tissue's B1 and B1 phase of stride 0, the event without a field row), so
// the value forwards form it once per (event, position) (decode_pulse_pair: the host's forward before its
// voxels, the CUDA library's decode_events_kernel) and each voxel reads it: per voxel and event that saves
// the Hermite read and the phase's sine and cosine (docs/design.md, slice profiles, for the timings).
// Adjoints and tangent types form theirs per voxel (they need the derivatives along the flip).
constexpr int kPairReals = 12;  // A, B, C, D (re, im), E, three unused: 16-byte aligned rows for the device

template <class R>
BS_HD int64_t pulse_pair_count(const Problem<R>& pb) {  // rows of pb.pulse_pairs
  return pb.E * pb.num_positions;
}
// Whether a value forward of V voxels forms them once: B1 and its phase uniform, a voxel or more per position
// (with fewer, forming every position's costs more than forming each voxel's), and the rows within 4 Mi
// reals or the signal the call writes (a long train of few samples at many positions would otherwise take
// more memory for them than for its results).
template <class R>
BS_HD bool pairs_per_launch(const Problem<R>& pb, int64_t V) {
  const Input<R>& b1 = pb.tissue[BS_B1];
  const Input<R>& phase = pb.tissue[BS_B1_PHASE_RAD];
  const int64_t reals = pulse_pair_count(pb) * kPairReals, signal = 2 * V * pb.S;
  return pb.profile_row && (!b1.data || b1.stride == 0) && (!phase.data || phase.stride == 0) &&
         V >= pb.num_positions && (reals <= (int64_t(1) << 22) || reals <= signal);
}
// Whether event e reads its rotation from pb.pulse_pairs (a profile row, not a spinor or field row).
template <class R>
BS_HD bool launch_pair(const Problem<R>& pb, int64_t e) {
  return pb.pulse_pairs && row_of(pb.profile_row, e) >= 0 && row_of(pb.spinor_row, e) < 0 &&
         row_of(pb.field_row, e) < 0;
}
// Row (e, p) of pb.pulse_pairs into `pairs` (events that launch_pair would not read: left as they are).
template <class R>
BS_HD void decode_pulse_pair(const Problem<R>& pb, int64_t e, int64_t p, R* pairs) {
  if (row_of(pb.profile_row, e) < 0 || row_of(pb.spinor_row, e) >= 0 || row_of(pb.field_row, e) >= 0) return;
  const R b1 = fetch<R>(pb.tissue[BS_B1], 0), b1phase = fetch<R>(pb.tissue[BS_B1_PHASE_RAD], 0);
  Spinor<R> d;
  Spinor<R> q = pulse_spinor(pb, 0, p, e, fetch<R>(pb.flip, e) * b1, d);
  q.b = q.b * cis(-(fetch<R>(pb.phase, e) + b1phase));
  const GeneralRotation<R> r = general_rotation(q);
  const R row[kPairReals] = {r.A.re, r.A.im, r.B.re, r.B.im, r.C.re, r.C.im, r.D.re, r.D.im, r.E, R(0), R(0), R(0)};
  R* const out = pairs + (e * pb.num_positions + p) * kPairReals;
  for (int i = 0; i < kPairReals; ++i) out[i] = row[i];
}
template <class R>
BS_HD GeneralRotation<R> read_pulse_pair(const Problem<R>& pb, int64_t e, int64_t p) {
  const R* const row = pb.pulse_pairs + (e * pb.num_positions + p) * kPairReals;
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<R, float>::value) {  // A..D in two 16-byte loads
    const float4 a = reinterpret_cast<const float4*>(row)[0], b = reinterpret_cast<const float4*>(row)[1];
    const float E = row[8];
    return GeneralRotation<R>{Cx<R>(a.x, a.y), Cx<R>(a.z, a.w), Cx<R>(b.x, b.y), Cx<R>(b.z, b.w), E};
  } else
#endif
  {
    return GeneralRotation<R>{Cx<R>(row[0], row[1]), Cx<R>(row[2], row[3]), Cx<R>(row[4], row[5]),
                              Cx<R>(row[6], row[7]), row[8]};
  }
}

// The pair's rotation of every water-like pool of x (forward), voxel v at slice position p.
template <class N, class S, class R>
BS_HD void rotate_by_spinor(const Problem<R>& pb, int64_t v, int64_t p, int64_t e, const N& alpha, const N& phi,
                            State<S> x, int64_t K) {
  if constexpr (!std::is_same<S, N>::value) {
    GeneralRotation<N> r;
    bool formed = false;
    if constexpr (std::is_same<N, R>::value) {  // a value forward
      if (launch_pair(pb, e)) {
        r = read_pulse_pair(pb, e, p);
        formed = true;
      }
    }
    if (!formed) {
      Spinor<N> d;
      Spinor<N> q = pulse_spinor(pb, v, p, e, alpha, d);
      q.b = q.b * cis(-phi);
      r = general_rotation(q);
    }
    for (int i = 0; i < x.nt; ++i) rotate_general(x.water(i), K, r);
  }
}

// Adjoint of rotate_by_spinor: l becomes the gradient before the pulse (tmp: the state before it); g_alpha and
// g_phi gain the flip's and the phase's gradients, the spinor table's row its cotangent.
template <class N, class S, class R>
BS_HD void rotate_by_spinor_adjoint(const Problem<R>& pb, int64_t v, int64_t e, const N& alpha, const N& phi,
                                    State<S> l, State<S> tmp, int64_t K, N& g_alpha, N& g_phi, TableGrad<N> tg) {
  if constexpr (!std::is_same<S, N>::value) {
    using RR = typename Num<N>::Real;
    Spinor<N> d;
    const Spinor<N> q0 = pulse_spinor(pb, v, (v + pb.voxel_offset) % pb.num_positions, e, alpha, d);
    const Cx<N> turn = cis(-phi);
    const Spinor<N> q{q0.a, q0.b * turn};
    const GeneralRotation<N> r = general_rotation(q);
    GeneralRotation<N> g{Cx<N>(), Cx<N>(), Cx<N>(), Cx<N>(), N(0)};
    for (int p = 0; p < l.nt; ++p) rotate_general_adjoint(l.water(p), tmp.water(p), K, r, g);
    // A..E -> (a, b): the header comment's formulas, each differentiated (conj-holomorphic parts conjugated).
    const Cx<N> ac = conj(q.a), bc = conj(q.b);
    const N two(RR(2));
    const Cx<N> g_a = conj(g.A) * ac * two - conj(g.C) * bc * two + conj(g.D) * q.b + q.a * (g.E * two);
    const Cx<N> g_b = -(conj(g.B) * bc * two) - conj(g.C) * ac * two + q.a * g.D - q.b * (g.E * two);
    // b = b0 e^{-i phi}: b0's gradient turns back, and phi gains Re(conj(g_b) (-i b)).
    const Cx<N> g_b0 = g_b * conj(turn);
    g_phi += re_dot(g_b, -mul_i(q.b));
    const int32_t s = row_of(pb.spinor_row, e);
    if (s >= 0) {
      tg.spinor[4 * s] += re(g_a);
      tg.spinor[4 * s + 1] += im(g_a);
      tg.spinor[4 * s + 2] += re(g_b0);
      tg.spinor[4 * s + 3] += im(g_b0);
    } else {
      g_alpha += re_dot(g_a, d.a) + re_dot(g_b0, d.b);
    }
  }
}

}  // namespace bs
