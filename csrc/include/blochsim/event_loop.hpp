// The event loop: one event forward and its adjoint, whole voxels forward and checkpointed adjoint.
// Written once over N (float, double, Dual) and S (N for the real path, Cx<N> for the complex path), for
// every layout: pool model 0 (free water, closed-form interval) and the tabulated pool layouts.
#pragma once

#include "blochsim/epg.hpp"
#include "blochsim/relax_tables.hpp"

namespace bs {

// Interval row of event (global index i): its own, or the wrap interval on later repetitions.
template <class N, class R>
BS_HD int64_t interval_row(const Problem<R>& pb, const EventValues<N>& ev) {
  return ev.wrap ? pb.wrap_interval : pb.interval[ev.e];
}

template <class S, class N, class R>
BS_HD void equilibrium_state(const Problem<R>& pb, int64_t v, State<S> x) {
  zero_state(x);
  for (int q = 0; q < x.nl; ++q) x.z(q)[0] = pb.tabulated ? S(fetch_table<N>(pb.table_zeq, v, q)) : S(1);
}

template <class N, class S, class R>
BS_HD void step_forward(const Problem<R>& pb, int64_t v, const Voxel<N>& t, const EventValues<N>& ev, State<S> x,
                        Cx<N>* samples) {
  constexpr bool complex_path = !std::is_same<S, N>::value;
  const int64_t K = pb.K;
  if (ev.action & BS_INTERVAL) {
    const Interval<N> iv = make_interval(pb, t, ev.dt, pb.offres);
    if (pb.tabulated)
      relax_tables(pb, v, interval_row(pb, ev), iv, x);
    else
      relax(x.water(0), K, iv);
  }
  if (ev.action & BS_CRUSH_BEFORE)
    for (int p = 0; p < x.nt; ++p) shift(x.water(p), K);
  if (ev.action & BS_INVERSION) {
    for (int p = 0; p < x.nt; ++p) invert(x.water(p), K, t.inv);
  } else if (ev.action & BS_ROTATE) {
    const N alpha = ev.flip * t.b1;
    const Rotation<N> rot = make_rotation(alpha, ev.phase + t.b1phase, complex_path);
    for (int p = 0; p < x.nt; ++p) rotate(x.water(p), K, rot);
    if (x.nl > x.nt) saturate(x, alpha, fetch_table<N>(pb.table_sat, v, ev.e));
  }
  if (samples && ev.record >= 0 && ev.last_rep) {
    Cx<N> sum;
    for (int p = 0; p < x.nt; ++p) sum += transverse(x.fp(p)[0]);
    samples[ev.record] = sum * cis(-ev.phase) * t.m0;
  }
  if (ev.action & BS_CRUSH_AFTER)
    for (int p = 0; p < x.nt; ++p) shift(x.water(p), K);
  if (ev.action & BS_SPOIL_AFTER) {
    for (int p = 0; p < x.nt; ++p) spoil(x.water(p), K);
  } else if (ev.action & BS_SHIFT_AFTER) {
    for (int p = 0; p < x.nt; ++p) shift(x.water(p), K);
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

// Adjoint of one event. x_pre: state before the event; tmp: scratch; l: lambda, updated in place.
template <class N, class S, class R>
BS_HD void step_adjoint(const Problem<R>& pb, int64_t v, const Voxel<N>& t, const EventValues<N>& ev,
                        State<S> x_pre, State<S> tmp, State<S> l, const Cx<N>* cot, VoxelGrad<N>& g,
                        EventGrad<N> eg, TableGrad<N> tg) {
  constexpr bool complex_path = !std::is_same<S, N>::value;
  const int64_t K = pb.K;
  // Recompute the state ahead of the RF / ADC.
  copy_state(tmp, x_pre);
  Interval<N> iv;
  if (ev.action & BS_INTERVAL) {
    iv = make_interval(pb, t, ev.dt, pb.offres);
    if (pb.tabulated)
      relax_tables(pb, v, interval_row(pb, ev), iv, tmp);
    else
      relax(tmp.water(0), K, iv);
  }
  if (ev.action & BS_CRUSH_BEFORE)
    for (int p = 0; p < tmp.nt; ++p) shift(tmp.water(p), K);
  // Reverse order.
  if (ev.action & BS_SPOIL_AFTER) {
    for (int p = 0; p < l.nt; ++p) spoil(l.water(p), K);
  } else if (ev.action & BS_SHIFT_AFTER) {
    for (int p = 0; p < l.nt; ++p) shift_adjoint(l.water(p), K);
  }
  if (ev.action & BS_CRUSH_AFTER)
    for (int p = 0; p < l.nt; ++p) shift_adjoint(l.water(p), K);
  if (cot && ev.record >= 0 && ev.last_rep) {  // ADC events carry no RF: the sample reads tmp
    const Cx<N> w = cot[ev.record];
    const Cx<N> turn = cis(-ev.phase);
    Cx<N> u;
    for (int p = 0; p < tmp.nt; ++p) u += transverse(tmp.fp(p)[0]);
    u = u * turn;
    g.m0 += re_dot(w, u);
    eg.phase[ev.e] += t.m0 * re_dot(w, mul_i(-u));
    for (int p = 0; p < l.nt; ++p) add_sample_adjoint(l.fp(p)[0], w, turn * t.m0);
  }
  if (ev.action & BS_INVERSION) {
    for (int p = 0; p < l.nt; ++p) invert_adjoint(l.water(p), tmp.water(p), K, t.inv, g.inv);
  } else if (ev.action & BS_ROTATE) {
    const N alpha = ev.flip * t.b1;
    N g_alpha = N(0), g_phi = N(0);
    if (l.nl > l.nt) saturate_adjoint(l, tmp, alpha, fetch_table<N>(pb.table_sat, v, ev.e), g_alpha, tg.sat[ev.e]);
    const Rotation<N> rot = make_rotation(alpha, ev.phase + t.b1phase, complex_path);
    for (int p = 0; p < l.nt; ++p) rotate_adjoint(l.water(p), tmp.water(p), K, rot, g_alpha, g_phi);
    eg.flip[ev.e] += g_alpha * t.b1;
    g.b1 += g_alpha * ev.flip;
    eg.phase[ev.e] += g_phi;
    g.b1phase += g_phi;
  }
  if (ev.action & BS_CRUSH_BEFORE)
    for (int p = 0; p < l.nt; ++p) shift_adjoint(l.water(p), K);
  if (ev.action & BS_INTERVAL) {
    N* g_dt = ev.wrap ? eg.dt_wrap : eg.dt + ev.e;
    if (pb.tabulated)
      relax_tables_adjoint(pb, v, interval_row(pb, ev), iv, t, l, x_pre, tg, g, g_dt);
    else
      relax_adjoint(l.water(0), x_pre.water(0), K, iv, t, g, g_dt);
  }
}

// ---- whole voxels ---------------------------------------------------------------------------------------
// Scratch a voxel needs, in states: the current state, tmp, lambda, the replay buffer (stride states) and
// the checkpoints (one every stride events).
template <class R>
BS_HD int64_t scratch_states(const Problem<R>& pb, bool adjoint) {
  const int64_t n = pb.E * pb.reps;
  return adjoint ? 3 + pb.stride + (n + pb.stride - 1) / pb.stride : 1;
}
template <class R>
BS_HD int64_t state_size(const Problem<R>& pb) {
  return (2 * pb.nt + pb.nl) * pb.K;
}
template <class S, class R>
BS_HD State<S> state_at(const Problem<R>& pb, S* base, int64_t index) {
  return State<S>{base + state_size(pb) * index, pb.K, pb.nt, pb.nl};
}

template <class N, class S, class R>
BS_HD void forward_voxel(const Problem<R>& pb, int64_t v, const Voxel<N>& t, S* scratch, Cx<N>* samples) {
  State<S> x = state_at(pb, scratch, 0);
  equilibrium_state<S, N>(pb, v, x);
  const int64_t n = pb.E * pb.reps;
  for (int64_t i = 0; i < n; ++i) step_forward(pb, v, t, load_event<N>(pb, i), x, samples);
}

// Checkpointed adjoint of one voxel: the forward sweep keeps every stride-th state; the reverse sweep
// replays each stretch from its checkpoint. Writes the forward samples too when `samples` is given.
template <class N, class S, class R>
BS_HD void vjp_voxel(const Problem<R>& pb, int64_t v, const Voxel<N>& t, S* scratch, const Cx<N>* cot,
                     Cx<N>* samples, VoxelGrad<N>& g, EventGrad<N> eg, TableGrad<N> tg) {
  const int64_t n = pb.E * pb.reps, stride = pb.stride;
  State<S> x = state_at(pb, scratch, 0), tmp = state_at(pb, scratch, 1), l = state_at(pb, scratch, 2);
  auto replay = [&](int64_t j) { return state_at(pb, scratch, 3 + j); };
  auto checkpoint = [&](int64_t c) { return state_at(pb, scratch, 3 + stride + c); };
  equilibrium_state<S, N>(pb, v, x);
  for (int64_t i = 0; i < n; ++i) {
    if (i % stride == 0) copy_state(checkpoint(i / stride), x);
    step_forward(pb, v, t, load_event<N>(pb, i), x, samples);
  }
  zero_state(l);
  for (int64_t c = (n - 1) / stride; c >= 0; --c) {
    const int64_t i0 = c * stride, i1 = i0 + stride < n ? i0 + stride : n;
    copy_state(x, checkpoint(c));
    for (int64_t i = i0; i < i1; ++i) {
      copy_state(replay(i - i0), x);
      if (i + 1 < i1) step_forward(pb, v, t, load_event<N>(pb, i), x, static_cast<Cx<N>*>(nullptr));
    }
    for (int64_t i = i1 - 1; i >= i0; --i)
      step_adjoint(pb, v, t, load_event<N>(pb, i), replay(i - i0), tmp, l, cot, g, eg, tg);
  }
  // Equilibrium depends on the tables' zeq: Z_q(0) starts at zeq_q.
  if (pb.tabulated)
    for (int q = 0; q < l.nl; ++q) tg.zeq[q] += re(l.z(q)[0]);
}

}  // namespace bs
