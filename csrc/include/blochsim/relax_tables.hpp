// Tabulated layouts: the interval operators of coupled pools come from per-voxel tables, formed in float64
// by the engine (matrix exponentials of the Bloch-McConnell generators, Malik 2018 EPG-X) for each distinct
// interval; the kernels multiply by them and hand back a cotangent on them, through which autograd reaches
// every pool property.
//
// Tables of voxel v, interval row d (nt water-like pools with transverse states, nl >= nt longitudinal pools,
// the last nl - nt of them semisolid):
//   L   [D, nl, nl] real     Z_k -> L Z_k (every order), exp(A dt) of the longitudinal generator
//   r   [D, nl]     real     added to Z_0: (I - L) Zeq, the recovery toward equilibrium
//   T   [D, nt, nt] complex  F+_k -> T F+_k and F-_k -> conj(T) F-_k: exp(C dt), relaxation, shifts, exchange
//   zeq [nl]        real     equilibrium (fractions of M0), where washout brings fresh magnetization
//   sat [E]         real     per RF event, S * G(f_rf - B0): the semisolid Z is multiplied by exp(alpha^2 sat)
// Diffusion, flow and washout stay in the kernel: they scale every pool alike.
#pragma once

#include "blochsim/epg.hpp"

namespace bs {

constexpr int kMaxPools = 8;

// A state of nt transverse and nl longitudinal pools: planes F+(p), F-(p) for p < nt, then Z(q) for q < nl.
template <class S>
struct State {
  Ref<S> base;
  int64_t K;
  int nt, nl;
  int64_t k0 = 0;  // order of local order 0: a lane of a warp holds orders k0 .. k0 + K - 1 (epg_device.cuh)
  BS_HD int planes() const { return 2 * nt + nl; }
  BS_HD Ref<S> fp(int p) const { return base + (2 * p) * K; }
  BS_HD Ref<S> fm(int p) const { return base + (2 * p + 1) * K; }
  BS_HD Ref<S> z(int q) const { return base + (2 * nt + q) * K; }
  BS_HD Planes<S> water(int p) const { return Planes<S>{fp(p), fm(p), z(p)}; }
};

template <class S>
BS_HD void copy_state(State<S> dst, State<S> src) {
  const int64_t n = src.planes() * src.K;
  BS_UNROLL
  for (int64_t i = 0; i < n; ++i) dst.base[i] = src.base[i];
}
// Asks the card to bring a kept state into its L1 before a walk reads it (elsewhere nothing). A state in a
// thread's device scratch (epg_device.cuh thread_scratch: stride 32, the warp's lanes interleaved) is one
// block of the warp's: each lane asks for every 32nd of its 128-byte lines, one request a lane where a
// group's state spans 32 lines or fewer. The general backward walks (event_loop.hpp vjp_voxel) read each
// pass's replayed state a step after this asks for it; read cold, it came from L2 or DRAM at the head of the
// step, the warp waiting on it (H100, the complex gradient at 20k: 0.96-0.98 of its time without). The plain
// walks' launches are held by their bytes, and there it only added to them (the real gradient at 100k 1.19
// times its time without): docs/design.md, "The 25th session". Dropping each slot from L2 after its last
// read (discard.global.L2, so dead lines are not written back) was slower in every adjoint case
// (benchmarks/variants/l2-discard.patch; docs/design.md, "The 30th session").
template <class S>
BS_HD void prefetch_state(State<S> x) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
  if (x.base.st != 32) return;
  const int lane = threadIdx.x & 31;
  const char* const block = reinterpret_cast<const char*>(x.base.p - lane);
  const int64_t lines = (x.planes() * x.K * 32 * int64_t(sizeof(S)) + 127) / 128;
  for (int64_t line = lane; line < lines; line += 32)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(block + 128 * line));
#else
  (void)x;
#endif
}
template <class S>
BS_HD void zero_state(State<S> x) {
  const int64_t n = x.planes() * x.K;
  BS_UNROLL
  for (int64_t i = 0; i < n; ++i) x.base[i] = S(0);
}

template <class N>
BS_HD Cx<N> cmul(const Cx<N>& a, const Cx<N>& x) {
  return a * x;
}
template <class N>
BS_HD N cmul(const Cx<N>& a, const N& x) {  // real path: the tables are real there
  return a.re * x;
}
template <class N>
BS_HD Cx<N> cmul_conj(const Cx<N>& a, const Cx<N>& x) {  // conj(a) x
  return conj(a) * x;
}
template <class N>
BS_HD N cmul_conj(const Cx<N>& a, const N& x) {
  return a.re * x;
}

template <class N>
struct Tables {
  N L[kMaxPools][kMaxPools];
  N r[kMaxPools];
  Cx<N> T[kMaxPools][kMaxPools];
  N zeq[kMaxPools];
};

template <class N, class R>
BS_HD void load_tables(const Problem<R>& pb, int64_t v, int64_t d, Tables<N>& tb) {
  const int nt = pb.nt, nl = pb.nl;
  for (int q = 0; q < nl; ++q) {
    for (int j = 0; j < nl; ++j) tb.L[q][j] = fetch_table<N>(pb.table_L, v, (d * nl + q) * nl + j);
    tb.r[q] = fetch_table<N>(pb.table_r, v, d * nl + q);
    tb.zeq[q] = fetch_table<N>(pb.table_zeq, v, q);
  }
  for (int p = 0; p < nt; ++p)
    for (int j = 0; j < nt; ++j) {
      const int64_t i = 2 * ((d * nt + p) * nt + j);
      tb.T[p][j] = Cx<N>(fetch_table<N>(pb.table_T, v, i), fetch_table<N>(pb.table_T, v, i + 1));
    }
}

// The tables' products at order k of x: y = L Z (+ r at order 0), yp = T F+, ym = conj(T) F-.
template <class N, class S>
BS_HD void order_products(const Tables<N>& tb, State<S> x, int64_t k, bool order0, S* y, S* yp, S* ym) {
  for (int q = 0; q < x.nl; ++q) {
    S acc = S(0);
    for (int j = 0; j < x.nl; ++j) acc += x.z(j)[k] * tb.L[q][j];
    y[q] = order0 ? acc + S(tb.r[q]) : acc;
  }
  for (int p = 0; p < x.nt; ++p) {
    S accp = S(0), accm = S(0);
    for (int j = 0; j < x.nt; ++j) {
      accp += cmul(tb.T[p][j], x.fp(j)[k]);
      accm += cmul_conj(tb.T[p][j], x.fm(j)[k]);
    }
    yp[p] = accp;
    ym[p] = accm;
  }
}

// Order k of x set to the products y (longitudinal), yp (F+), ym (F-).
template <class S>
BS_HD void store_order(State<S> x, int64_t k, const S* y, const S* yp, const S* ym) {
  for (int q = 0; q < x.nl; ++q) x.z(q)[k] = y[q];
  for (int p = 0; p < x.nt; ++p) {
    x.fp(p)[k] = yp[p];
    x.fm(p)[k] = ym[p];
  }
}

template <class S>
BS_HD void load_order(State<S> x, int64_t k, S* y, S* yp, S* ym) {  // store_order's inverse
  for (int q = 0; q < x.nl; ++q) y[q] = x.z(q)[k];
  for (int p = 0; p < x.nt; ++p) {
    yp[p] = x.fp(p)[k];
    ym[p] = x.fm(p)[k];
  }
}

// The interval's order factors and washout on the products of order k (order_products), into x.
// Without diffusion, flow and washout the tables are the whole interval: the factors are 1.
template <class N>
BS_HD bool tables_only(const Interval<N>& c) {
  return !c.diffusion && !c.flow && !c.washout;
}

template <class N, class S>
BS_HD void apply_order_factors(const Interval<N>& c, const N* zeq, State<S> x, int64_t k, const S* y, const S* yp,
                               const S* ym) {
  using RR = typename Num<N>::Real;
  if (tables_only(c)) {
    store_order(x, k, y, yp, ym);
    return;
  }
  Cx<N> ap, am, az;
  order_factors(c, k + x.k0, ap, am, az);
  for (int q = 0; q < x.nl; ++q)
    x.z(q)[k] = k + x.k0 == 0 ? y[q] * c.w + S(zeq[q] * (RR(1) - c.w)) : cmul(az * c.w, y[q]);
  for (int p = 0; p < x.nt; ++p) {
    x.fp(p)[k] = cmul(ap * c.w, yp[p]);
    x.fm(p)[k] = cmul(am * c.w, ym[p]);
  }
}

// The interval of row d on x. With `keep`, the tables' products of every order are kept there too (the
// adjoint's replay: step_adjoint then neither multiplies by the tables again nor recomputes them).
// APPLY = false: the products alone, x left as it is (the last event of a replayed stretch, whose state
// after the event is not needed; c is not read).
template <bool APPLY = true, class N, class S, class R>
BS_HD void relax_tables(const Problem<R>& pb, int64_t v, int64_t d, const Interval<N>& c, State<S> x,
                        const State<S>* keep = nullptr) {
  Tables<N> tb;
  load_tables(pb, v, d, tb);
  BS_UNROLL
  for (int64_t k = 0; k < x.K; ++k) {
    S y[kMaxPools], yp[kMaxPools], ym[kMaxPools];
    order_products(tb, x, k, k + x.k0 == 0, y, yp, ym);
    if (keep) store_order(*keep, k, y, yp, ym);
    if constexpr (APPLY) apply_order_factors(c, tb.zeq, x, k, y, yp, ym);
  }
}

// The state after the interval from the kept products: the factors alone, no table products.
template <class N, class S, class R>
BS_HD void relax_from_products(const Problem<R>& pb, int64_t v, const Interval<N>& c, State<S> kept, State<S> x) {
  N zeq[kMaxPools];
  for (int q = 0; q < x.nl; ++q) zeq[q] = fetch_table<N>(pb.table_zeq, v, q);
  BS_UNROLL
  for (int64_t k = 0; k < x.K; ++k) {
    S y[kMaxPools], yp[kMaxPools], ym[kMaxPools];
    load_order(kept, k, y, yp, ym);
    apply_order_factors(c, zeq, x, k, y, yp, ym);
  }
}

// Per-voxel cotangents of the tables (accumulated over events), in the layout of the tables; element j of
// each at [j * st] (event_loop.hpp: table_grad_at): a warp's lanes keep their own, interleaved.
// The tables in the order of bs_tables: the pool tables, then the per-voxel pulses' (pulses.hpp).
constexpr int kTableCount = 8;
constexpr int kSatTable = 4;  // the semisolid pool's saturation table, [E]
template <class N>
struct TableGrad {
  Ref<N> L;       // [D, nl, nl]
  Ref<N> r;       // [D, nl]
  Ref<Cx<N>> T;   // [D, nt, nt]
  Ref<N> zeq;     // [nl]
  Ref<N> sat;     // [E]
  Ref<N> field;   // [F, 2] (pulses.hpp)
  Ref<N> spinor;  // [Rs, 4]
  bool wanted = false;  // some table's cotangent is asked for; else the L and T outer products are skipped
};

// Order k of lambda through the tables' transposes, from ly (longitudinal), lyp (F+) and lym (F-): lambda
// after the tables (their products' adjoints) -> lambda before them.
template <class N, class S>
BS_HD void transposed_products(const Tables<N>& tb, State<S> l, int64_t k, const S* ly, const S* lyp, const S* lym) {
  for (int j = 0; j < l.nl; ++j) {
    S acc = S(0);
    for (int a = 0; a < l.nl; ++a) acc += ly[a] * tb.L[a][j];
    l.z(j)[k] = acc;
  }
  for (int j = 0; j < l.nt; ++j) {
    S accp = S(0), accm = S(0);
    for (int p = 0; p < l.nt; ++p) {
      accp += cmul_conj(tb.T[p][j], lyp[p]);
      accm += cmul(tb.T[p][j], lym[p]);
    }
    l.fp(j)[k] = accp;
    l.fm(j)[k] = accm;
  }
}

template <class N, class S, class R>
BS_HD void relax_tables_adjoint(const Problem<R>& pb, int64_t v, int64_t d, const Interval<N>& c,
                                const Voxel<N>& t, State<S> l, State<S> x, State<S> kept, TableGrad<N> tg,
                                VoxelGrad<N>& g, N* g_dt) {
  using RR = typename Num<N>::Real;
  const int nt = x.nt, nl = x.nl;
  Tables<N> tb;
  load_tables(pb, v, d, tb);
  const bool plain = tables_only(c);  // factors of 1, and no interval gradient left for the kernel
  if (plain && !tg.wanted) {
    // The tables' transposes alone, a loop of its own: the general loop's per-order run-time branches (the
    // factors, the tables' cotangents) held the pooled adjoint's warps on instruction fetch and branch
    // resolution (17 % of its samples on an H100, half of them no_instruction). With this loop the pooled
    // gradient at 100k takes 0.80 of its time (H100; docs/design.md, "The 33rd session" and "The 34th").
    BS_UNROLL
    for (int64_t k = 0; k < x.K; ++k) {
      S ly[kMaxPools], lyp[kMaxPools], lym[kMaxPools];
      load_order(l, k, ly, lyp, lym);
      transposed_products(tb, l, k, ly, lyp, lym);
    }
    return;
  }
  IntervalSums<N> q;
  // Table cotangents of this interval, summed over orders here and added to tg once.
  N gL[kMaxPools][kMaxPools];
  Cx<N> gT[kMaxPools][kMaxPools];
  for (int a = 0; a < nl; ++a)
    for (int j = 0; j < nl; ++j) gL[a][j] = N(0);
  for (int p = 0; p < nt; ++p)
    for (int j = 0; j < nt; ++j) gT[p][j] = Cx<N>();
  BS_UNROLL
  for (int64_t k = 0; k < x.K; ++k) {
    Cx<N> ap, am, az;
    if (!plain) order_factors(c, k + x.k0, ap, am, az);
    const RR kk = RR(k + x.k0);
    const bool order0 = k + x.k0 == 0;
    // Longitudinal pools.
    S ly[kMaxPools];
    for (int a = 0; a < nl; ++a) {
      if (plain) {
        ly[a] = l.z(a)[k];
        continue;
      }
      const S lz = l.z(a)[k], y = kept.z(a)[k];
      Cx<N> qz;
      if (order0) {  // Z_0' = w (L Z_0 + r) + (1 - w) zeq
        ly[a] = lz * c.w;
        tg.zeq[a] += re(lz) * (RR(1) - c.w);
        qz = conj(as_cx(lz)) * as_cx(S(y - S(tb.zeq[a])));
      } else {
        ly[a] = factor_adjoint(lz, az * c.w);
        qz = conj(as_cx(lz)) * (az * as_cx(y));
      }
      q.QZ += qz;
      if (c.diffusion) q.QZc += qz * N(kk * kk);
      if (c.flow) q.QZf += qz * N(kk);
    }
    if (tg.wanted)
      for (int a = 0; a < nl; ++a) {
        for (int j = 0; j < nl; ++j) gL[a][j] += re_dot(as_cx(ly[a]), as_cx(x.z(j)[k]));
        if (order0) tg.r[d * nl + a] += re(ly[a]);
      }
    // Transverse pools: F+ -> T F+, F- -> conj(T) F-.
    S lyp[kMaxPools], lym[kMaxPools];
    for (int p = 0; p < nt; ++p) {
      if (plain) {
        lyp[p] = l.fp(p)[k];
        lym[p] = l.fm(p)[k];
        continue;
      }
      const S yp = kept.fp(p)[k], ym = kept.fm(p)[k];
      lyp[p] = factor_adjoint(l.fp(p)[k], ap * c.w);
      lym[p] = factor_adjoint(l.fm(p)[k], am * c.w);
      const Cx<N> qp = conj(as_cx(l.fp(p)[k])) * (ap * as_cx(yp));
      const Cx<N> qm = conj(as_cx(l.fm(p)[k])) * (am * as_cx(ym));
      q.QP += qp;
      q.QM += qm;
      if (c.diffusion) {
        q.QPc += qp * N(diffusion_weight(kk, c.lobes));
        q.QMc += qm * N(diffusion_weight(-kk, c.lobes));
      }
      if (c.flow) {
        q.QPf += qp * N(flow_weight(kk, c.lobes));
        q.QMf += qm * N(flow_weight(-kk, c.lobes));
      }
    }
    if (tg.wanted)
      for (int p = 0; p < nt; ++p)
        for (int j = 0; j < nt; ++j)
          gT[p][j] +=
              conj(as_cx(x.fp(j)[k])) * as_cx(lyp[p]) + conj(as_cx(lym[p])) * as_cx(x.fm(j)[k]);
    transposed_products(tb, l, k, ly, lyp, lym);
  }
  if (tg.wanted) {
    for (int a = 0; a < nl; ++a)
      for (int j = 0; j < nl; ++j) tg.L[(d * nl + a) * nl + j] += gL[a][j];
    for (int p = 0; p < nt; ++p)
      for (int j = 0; j < nt; ++j) tg.T[(d * nt + p) * nt + j] += gT[p][j];
  }
  if (!plain) interval_grads(c, t, q, g, g_dt);
}

// RF saturation of the semisolid pools: Z_s -> exp(alpha^2 sat) Z_s on every order.
template <class N, class S>
BS_HD void saturate(State<S> x, const N& alpha, const N& sat) {
  const N e = exp(alpha * alpha * sat);
  for (int q = x.nt; q < x.nl; ++q)
    BS_UNROLL
    for (int64_t k = 0; k < x.K; ++k) x.z(q)[k] = x.z(q)[k] * e;
}
// x: before saturation. Adds d/d alpha and d/d sat.
template <class N, class S>
BS_HD void saturate_adjoint(State<S> l, State<S> x, const N& alpha, const N& sat, N& g_alpha, N& g_sat) {
  using RR = typename Num<N>::Real;
  const N e = exp(alpha * alpha * sat);
  N dot = N(0);
  for (int q = x.nt; q < x.nl; ++q)
    BS_UNROLL
    for (int64_t k = 0; k < x.K; ++k) {
      dot += re_dot(as_cx(l.z(q)[k]), as_cx(x.z(q)[k]));
      l.z(q)[k] = l.z(q)[k] * e;
    }
  dot = dot * e;  // Re <lambda', Z'> with Z' = e Z
  g_alpha += dot * (RR(2) * alpha * sat);
  g_sat += dot * (alpha * alpha);
}

}  // namespace bs
