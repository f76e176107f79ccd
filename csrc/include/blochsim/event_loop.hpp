// The event loop: one event forward and its adjoint, whole voxels forward and checkpointed adjoint.
// Written once over N (float, double, Dual) and S (N for the real path, Cx<N> for the complex path), for
// every layout: pool model 0 (free water, closed-form interval) and the tabulated pool layouts.
#pragma once

#include "blochsim/epg.hpp"
#include "blochsim/pulses.hpp"

namespace bs {

// Where a voxel's samples go and its cotangent comes from: sample s of voxel v at index v * S + s of
// interleaved complex arrays; tangents [P, V, S] with stride tan_stride between directions.
template <class N>
struct SampleIO {
  using R = typename Num<N>::Real;
  R* signal = nullptr;
  R* signal_tan = nullptr;
  int64_t tan_stride = 0;
  const R* cot = nullptr;
  const R* cot_tan = nullptr;
  int64_t base = 0;

  BS_HD void put(int64_t s, const Cx<N>& x) const {
    const int64_t i = base + s;
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same<R, float>::value) {  // one 8-byte store: half the L2 requests of two
      reinterpret_cast<float2*>(signal)[i] = make_float2(value_of(x.re), value_of(x.im));
    } else
#endif
    {
      signal[2 * i] = value_of(x.re);
      signal[2 * i + 1] = value_of(x.im);
    }
    if constexpr (Num<N>::P > 0) {
      if (signal_tan)
        for (int p = 0; p < Num<N>::P; ++p) {
          signal_tan[2 * (p * tan_stride + i)] = x.re.d[p];
          signal_tan[2 * (p * tan_stride + i) + 1] = x.im.d[p];
        }
    }
  }
  BS_HD Cx<N> get(int64_t s) const {
    const int64_t i = base + s;
    Cx<N> x{N(cot[2 * i]), N(cot[2 * i + 1])};
    if constexpr (Num<N>::P > 0) {
      if (cot_tan) {
        x.re.d[0] = cot_tan[2 * i];
        x.im.d[0] = cot_tan[2 * i + 1];
      }
    }
    return x;
  }
};

// Event-value gradients, summed over repetitions (and, by the caller, over voxels).
enum EventGradKind { kGradDt = 0, kGradFlip = 1, kGradPhase = 2, kGradDtWrap = 3 };

// Host accumulator: per-block arrays dt [E], flip [E], phase [E], dt_wrap [1] (in that order in `acc`).
template <class N>
struct EventGrad {
  N* acc;
  int64_t E;
  BS_HD void add(int kind, int64_t e, const N& x) const {
    if (kind == kGradDtWrap)
      acc[3 * E] += x;
    else
      acc[kind * E + e] += x;
  }
  // x, the voxel's share of its table cotangent r[j] held once a voxel (table_grad_at: the saturation table).
  BS_HD void add_table(Ref<N> r, int64_t j, const N& x) const { r[j] += x; }
};

// Interval row of event (global index i): its own, or the wrap interval on later repetitions.
template <class N, class R, bool kValues>
BS_HD int64_t interval_row(const Problem<R>& pb, const EventValues<N, kValues>& ev) {
  return ev.wrap ? pb.wrap_interval : pb.interval[ev.e];
}

template <class S, class N, class R>
BS_HD void equilibrium_state(const Problem<R>& pb, int64_t v, State<S> x) {
  zero_state(x);
  if (x.k0 == 0)
    for (int q = 0; q < x.nl; ++q) x.z(q)[0] = pb.tabulated ? S(fetch_table<N>(pb.table_zeq, v, q)) : S(1);
}

// The shift of one plane pair and its adjoint, within one voxel's array (a warp's lanes shift across lanes
// instead: epg_device.cuh).
struct LocalShift {
  static constexpr bool kCounted = true;  // see shift_pools
  // The shift moves the voxel's whole array, order 0 included: the plain passes fold it into the pass
  // (relax_rotate<1> reads the neighbouring order), where a group's lane shifts across lanes first
  // (WarpShift, epg_device.cuh; step_forward_plain, step_adjoint_plain).
  static constexpr bool kWhole = true;
  template <class S>
  BS_HD void operator()(Planes<S> x, int64_t K) const {
    shift(x, K);
  }
};
struct LocalShiftAdjoint {
  template <class S>
  BS_HD void operator()(Planes<S> l, int64_t K) const {
    shift_adjoint(l, K);
  }
};

// `times` shifts (0, 1 or 2) of every pool's planes. A voxel's own array shifts in a counted loop: the
// compiler turns a branch over a shift of states in registers into selects, so an event would pay for the
// shifts it does not take (the real K = 32 thread kernel: 28.7 vs 33.4 ms at 1M voxels on the H200,
// 2026-12-03). A group's shift (shuffles across lanes) keeps its branches: 9.0-9.2 vs 9.5 ms counted, for
// the complex forward at 100k voxels in groups of 4.
template <class S, class Shift>
BS_HD void shift_pools(State<S> x, int64_t K, const Shift& shift, int times) {
  if constexpr (Shift::kCounted) {
    BS_NO_UNROLL
    for (int i = 0; i < times; ++i)
      for (int p = 0; p < x.nt; ++p) shift(x.water(p), K);
  } else {
    if (times >= 1)
      for (int p = 0; p < x.nt; ++p) shift(x.water(p), K);
    if (times >= 2)
      for (int p = 0; p < x.nt; ++p) shift(x.water(p), K);
  }
}

// `times` shifts carried by the plain path (Deferral, below) of its one pool: any count (shift_pools unrolls
// a group's two).
template <class S, class Shift>
BS_HD void shift_carried(State<S> x, int64_t K, const Shift& shift, int times) {
  if constexpr (Shift::kWhole) {
    shift_pools(x, K, shift, times);
  } else {
    for (int i = 0; i < times; ++i) shift(x.water(0), K);
  }
}

// Pool model 0 with every order relaxing alike (no diffusion, flow or washout): the layout the register
// kernels and the plain groups are compiled for (epg_device.cuh plain_layout), and the host's and the
// register kernel's real forward runs as step_forward_plain. Their order loops then hold no order-dependent
// branches: the real K = 32 thread kernel shrinks from about 21,000 instructions to 1,600 (sm_90 SASS),
// its hot loop fitting the instruction cache.
template <class R>
BS_HD bool plain_orders(const Problem<R>& pb) {
  return !pb.tabulated && !pb.diffusion && !pb.flow && !pb.washout;
}

// Shifts carried from one event into the next (value forwards of order-uniform layouts, plain_orders):
// a shift then commutes with the interval, so the next interval's products can read their states one order
// over, straight-line, in place of the shift's register moves (the register kernel and the plain groups,
// epg_device.cuh; at the end of the train a pending shift is left undone: no sample follows it).
struct Deferral {
  int pending = 0;
  bool spoiled = false;  // step_forward_plain: a spoiler carried into the next pass as E2 = 0
};

// What the general adjoint's replay (vjp_voxel) keeps of an event's sample (samples_kept): the F+(0) of
// each transverse pool, which is all the sample's adjoint reads, written by step_forward where it forms the
// sample (`at`, nt numbers; `signal` false: an event with nothing kept).
template <class S>
struct KeptPoolsF0 {
  Ref<S> at;
  bool signal;
};
// A sample of the state x (after the event's pulse) to the caller's signal, or to the replay's KeptPoolsF0.
template <class N, class S, bool kValues>
BS_HD void write_sample(const SampleIO<N>* io, const EventValues<N, kValues>& ev, const Voxel<N>& t, State<S> x) {
  Cx<N> sum;
  for (int p = 0; p < x.nt; ++p) sum += transverse(x.fp(p)[0]);
  io->put(ev.record, sum * demodulation(ev) * t.m0);
}
template <class N, class S, bool kValues>
BS_HD void write_sample(const KeptPoolsF0<S>* io, const EventValues<N, kValues>&, const Voxel<N>&, State<S> x) {
  for (int p = 0; p < x.nt; ++p) io->at[p] = x.fp(p)[0];
}

template <class N, class S, class R, bool kValues, class Shift = LocalShift, class IO = SampleIO<N>>
BS_HD void step_forward(const Problem<R>& pb, int64_t v, const Voxel<N>& t, const EventValues<N, kValues>& ev,
                        State<S> x, const IO* io, const Shift& shift = Shift(), const State<S>* keep = nullptr,
                        Deferral* defer = nullptr) {
  constexpr bool complex_path = !std::is_same<S, N>::value;
  const int64_t K = x.K;  // orders held here: pb.K, or a lane's share
  int before = ev.action & BS_CRUSH_BEFORE ? 1 : 0;  // shifts ahead of the pulse
  if (defer) {
    before += defer->pending;
    defer->pending = 0;
  }
  if (ev.action & BS_INTERVAL) {
    const Interval<N> iv = make_interval(pb, t, ev);
    if (pb.tabulated) {
      relax_tables(pb, v, interval_row(pb, ev), iv, x, keep);
    } else if (defer && before == 1) {  // the shift's moves become the products' operands
      shift(x.water(0), K);
      relax(x.water(0), K, iv, x.k0);
      before = 0;
    } else {
      relax(x.water(0), K, iv, x.k0);
    }
  }
  shift_pools(x, K, shift, before);
  if (ev.action & BS_INVERSION) {
    for (int p = 0; p < x.nt; ++p) invert(x.water(p), K, t.inv);
  } else if (ev.action & BS_ROTATE) {
    const Transmit<N> tx = transmit_of(pb, v, t, ev.e);
    const N alpha = ev.flip * tx.b1;
    if (complex_path && spinor_pulse(pb, ev.e)) {
      rotate_by_spinor(pb, v, t.position, ev.e, alpha, ev.phase + tx.b1phase, x, K);
    } else if constexpr (kValues) {  // (no tangent reaches the pulse: real coefficients)
      for (int p = 0; p < x.nt; ++p) rotate(x.water(p), K, *ev.value_rotation);
    } else {
      const Rotation<N> rot = ev.rotation && tx.field < 0 ? *ev.rotation
                                                          : make_rotation(alpha, ev.phase + tx.b1phase, complex_path);
      for (int p = 0; p < x.nt; ++p) rotate(x.water(p), K, rot);
    }
    if (x.nl > x.nt) saturate(x, alpha, fetch_table<N>(pb.table_sat, v, ev.e));
  }
  if (io && io->signal && ev.record >= 0 && ev.last_rep && x.k0 == 0) write_sample(io, ev, t, x);
  if (ev.action & BS_SPOIL_AFTER) {  // a crusher ahead of the spoiler would move states it clears
    for (int p = 0; p < x.nt; ++p) spoil(x.water(p), K);
  } else {
    const int after = (ev.action & BS_CRUSH_AFTER ? 1 : 0) + (ev.action & BS_SHIFT_AFTER ? 1 : 0);
    if (defer)
      defer->pending = after;
    else
      shift_pools(x, K, shift, after);
  }
}

// An event of the real plain path as one voxel steps it (plain_event): its interval's exponentials, its
// pulse's rotation (an inversion: ca = -inv) and, where it samples, the demodulation times M0. Taking these
// apart from the pass lets the register kernel form event j + 1's while event j's pass runs
// (epg_device.cuh for_each_plain_event), so their loads and exponentials wait on nothing.
template <class N>
struct PlainEvent {
  int32_t action, record;  // record: the sample written (-1: none, also before the last repetition)
  N E1, E2, ca, sa, s2, half_sa;
  Cx<N> turn;
  int32_t sample_at = 0;  // the event that samples, after this one (a fold's: DecodedPlainEvents)
};
template <class N>
struct Decay {  // an interval's relaxation
  N E1, E2;
};
template <class N, class R>
BS_HD Decay<N> make_decay(const Problem<R>& pb, const Voxel<N>& t, const N& dt) {
  const Interval<N> iv = make_interval(pb, t, dt, false);
  return Decay<N>{iv.E1, iv.E2};
}
// decay(): the interval's Decay; rotation(): the pulse's Rotation; turn(): the demodulation (each asked for
// only where the event needs it).
template <class N, class GetDecay, class GetRotation, class GetTurn>
BS_HD PlainEvent<N> plain_event(const Voxel<N>& t, const EventValues<N>& ev, const GetDecay& decay,
                                const GetRotation& rotation, const GetTurn& turn) {
  PlainEvent<N> pe{ev.action, ev.last_rep ? ev.record : -1, N(1), N(1), N(1), N(0), N(0), N(0), Cx<N>()};
  if (ev.action & BS_INTERVAL) {
    const Decay<N> d = decay();
    pe.E1 = d.E1;
    pe.E2 = d.E2;
  }
  if (ev.action & BS_INVERSION) {
    pe.ca = -t.inv;
  } else if (ev.action & BS_ROTATE) {
    const Rotation<N> r = rotation();
    pe.ca = r.ca;
    pe.sa = r.sa;
    pe.s2 = r.s2;
    pe.half_sa = r.half_sa;
  }
  if (pe.record >= 0) pe.turn = turn() * t.m0;
  return pe;
}
template <class N, class R>
BS_HD PlainEvent<N> plain_event(const Problem<R>& pb, const Voxel<N>& t, const EventValues<N>& ev) {
  return plain_event(
      t, ev, [&] { return make_decay(pb, t, ev.dt); },
      [&] { return ev.rotation ? *ev.rotation : make_rotation(ev.flip * t.b1, ev.phase + t.b1phase, false); },
      [&] { return demodulation(ev); });
}

// The value forward (and JVP) of the real plain path: one pool, every order relaxing alike, the whole
// array held here (the host, the register kernel). An event that touches the states is one relax_rotate
// pass; shifts are carried to the next pass (Deferral; more than one ahead of a pass: the rest shifted
// first), and a spoiler rides into it as E2 = 0 (the transverse states it would clear are multiplied by 0).
// A sample on an event that leaves the states alone takes the carried shifts first.
// io: a SampleIO, or what takes its put() (the register kernel's StagedSamples).
// Returns whether the event wrote the states. They end in x, tmp being scratch; for PassesInPlace numbers
// (the host's lanes) they end in tmp, which may be x (in place) or another array (the adjoint's sweeps keep
// the states before an event where they were), x then left as it was.
template <class N>
BS_HD void work_on(State<N>& x, State<N> tmp) {  // PassesInPlace: step on tmp from here on
  if (tmp.base.p != x.base.p) copy_state(tmp, x);
  x = tmp;
}
// A sample's value to `io`; KeptF0 takes its f0 (the real transverse state it reads) instead: the plain
// adjoint's replay keeps that one number of an event that only samples, not the state before it.
template <class N>
struct KeptF0 {
  bool signal = true;
  N f0 = N(0);
};
template <class IO, class N>
BS_HD void put_sample(IO* io, int32_t record, const N& f0, const Cx<N>& turn) {
  io->put(record, transverse(f0) * turn);
}
template <class N>
BS_HD void put_sample(KeptF0<N>* io, int32_t, const N& f0, const Cx<N>&) {
  io->f0 = f0;
}
// Whether the real plain path's event makes a pass over the orders (relaxes, rotates or inverts): what
// step_forward_plain writes, the plain adjoints keep a slot for, and checkpoint_slots counts (on the host:
// make_problem here, engine/program.py replay_slots in Python).
BS_HD bool passes_over_states(int32_t action) {
  return (action & (BS_INTERVAL | BS_INVERSION | BS_ROTATE)) != 0;
}
// Whether a group's lane (a shift across lanes: WarpShift, epg_device.cuh) writes the sample it reads: order 0's
// lane, and into the caller's signal (SampleIO) only in a group with a voxel of its own (shift.samples: a
// padding group replays the last voxel; its signal pointer stays set, so that the warp's lanes take one
// branch around the steps, whose shifts shuffle).
template <class Shift, class IO>
BS_HD bool lane_puts_sample(const Shift&, int64_t k0, const IO*) {
  return k0 == 0;
}
template <class Shift, class N>
BS_HD bool lane_puts_sample(const Shift& shift, int64_t k0, const SampleIO<N>*) {
  return k0 == 0 && shift.samples;
}
// shift: a voxel's whole array (LocalShift), or a group's lane's orders (WarpShift, epg_device.cuh
// vjp_plain_lanes_kernel): x.k0 then names the lane's first order, and the pass's shifts cross the lanes.
template <class N, class IO, class Shift = LocalShift>
BS_HD bool step_forward_plain(const PlainEvent<N>& pe, State<N> x, State<N> tmp, IO* io, Deferral& defer,
                              const Shift& shift = Shift()) {
  constexpr bool kInPlace = PassesInPlace<N>::value;
  const int64_t K = x.K;
  int ahead = (pe.action & BS_CRUSH_BEFORE ? 1 : 0) + defer.pending;
  bool wrote = false;
  if (passes_over_states(pe.action)) {
    N E2 = pe.E2;
    if (defer.spoiled) {
      E2 = N(0);
      ahead = 0;
      defer.spoiled = false;
    }
    const RelaxRotate<N> q = relax_rotate_factors(pe.E1, E2, pe.ca, pe.sa, pe.s2, pe.half_sa);
    if constexpr (Shift::kWhole) {
      if (ahead > 1) {
        if constexpr (kInPlace) work_on(x, tmp);
        shift_pools(x, K, shift, ahead - 1);
      }
      if (ahead == 0)
        relax_rotate<0>(tmp.water(0), x.water(0), K, q);
      else
        relax_rotate<1>(tmp.water(0), x.water(0), K, q);
    } else {
      // A group's lane: the pass's own shift would read a neighbour's order across the lane boundary, so
      // every shift goes ahead of it, and the recovery into Z(0) is order 0's lane's alone.
      static_assert(!kInPlace, "groups of lanes are the device's");
      shift_carried(x, K, shift, ahead);
      RelaxRotate<N> lane_q = q;
      if (x.k0 != 0) lane_q.a0 = lane_q.c0 = N(0);
      relax_rotate<0>(tmp.water(0), x.water(0), K, lane_q);
    }
    if constexpr (kInPlace)
      x = tmp;
    else
      copy_state(x, tmp);
    ahead = 0;
    wrote = true;
  }
  if (io && io->signal && pe.record >= 0) {
    if (ahead > 0 && !defer.spoiled) {  // a sample on an event that leaves the states alone: shift first
      if constexpr (kInPlace) work_on(x, tmp);
      shift_carried(x, K, shift, ahead);
      ahead = 0;
      wrote = true;
    }
    const N f0 = defer.spoiled ? N(0) : x.fp(0)[0];
    if constexpr (Shift::kWhole)
      put_sample(io, pe.record, f0, pe.turn);
    else if (lane_puts_sample(shift, x.k0, io))
      put_sample(io, pe.record, f0, pe.turn);
  }
  if (pe.action & BS_SPOIL_AFTER) {
    defer.spoiled = true;
    defer.pending = 0;
  } else {
    defer.pending = ahead + (pe.action & BS_CRUSH_AFTER ? 1 : 0) + (pe.action & BS_SHIFT_AFTER ? 1 : 0);
  }
  return wrote;
}

// Adjoint of step_forward_plain (the host's real plain VJP, csrc/cpu/epg_lanes.inc): one pass backwards over
// the orders where the forward took one (relax_rotate_adjoint), then the chain from the pass's factors to the
// interval's exponentials, the pulse's angle and the tissue. x: the state array before the event, `defer`
// what step_forward_plain was given with it (its samples written: the same shifts fall); tmp: scratch, used
// only where more than one shift was carried; l: the gradient with respect to the array after the event,
// updated in place. ev: the event's e, wrap, dt and flip; demod: its sample's cis(-phase). kept_f0: for an
// event that only samples, the f0 it read (KeptF0), where x is then not read; null: taken from x.
// shift, shift_adjoint: as step_forward_plain's. A group's lane (l.k0: its first order) adds its orders'
// share of every gradient: the pass's factor gradients are sums over the orders and all that is formed from
// them is linear in them, so the shares need no sum across lanes here (eg sums over the warp, the caller
// the tissue's over the group). The sample is order 0's lane's: the others add zero, taking part in eg's sum.
template <class N, class IO, class EG, class Shift = LocalShift, class ShiftAdjoint = LocalShiftAdjoint>
BS_HD void step_adjoint_plain(const PlainEvent<N>& pe, const EventValues<N>& ev, const Cx<N>& demod,
                              const Voxel<N>& t, State<N> x, Deferral defer, State<N> tmp, State<N> l,
                              const IO& io, VoxelGrad<N>& g, const EG& eg, const N* kept_f0 = nullptr,
                              const Shift& shift = Shift(), const ShiftAdjoint& shift_adjoint = ShiftAdjoint()) {
  using R = typename Num<N>::Real;
  const int64_t K = x.K;
  const bool order0 = Shift::kWhole || l.k0 == 0;  // this array holds order 0
  int ahead = (pe.action & BS_CRUSH_BEFORE ? 1 : 0) + defer.pending;
  const bool pass = passes_over_states(pe.action);
  if (!pass && pe.record < 0) return;  // the event only carried shifts or a spoiler forward
  const bool spoiled_before = defer.spoiled;  // the pass then took E2 = 0
  N E2 = pe.E2;
  int before = 0, A = 0;  // shifts ahead of the pass beyond its own; the pass's own (0 or 1)
  if (pass) {
    if (defer.spoiled) {
      E2 = N(0);
      ahead = 0;
      defer.spoiled = false;
    }
    before = ahead > 1 ? ahead - 1 : 0;
    A = ahead > 0 ? 1 : 0;
    ahead = 0;
  }
  State<N> in = x;  // the pass's input
  if constexpr (Shift::kWhole) {
    if (before > 0) {
      copy_state(tmp, x);
      shift_pools(tmp, K, shift, before);
      in = tmp;
    }
  } else {
    // A group's lane: the pass's own shift too goes ahead of it (step_forward_plain), in tmp, the caller's
    // registers: `in` is tmp for every event, no run-time choice between it and the store.
    before += A;
    A = 0;
    if (pass) {
      copy_state(tmp, x);
      shift_carried(tmp, K, shift, before);
    }
    in = tmp;
  }
  const RelaxRotate<N> q = relax_rotate_factors(pe.E1, E2, pe.ca, pe.sa, pe.s2, pe.half_sa);
  if (pe.record >= 0) {  // the sample, after the pass
    const bool shifted = !pass && ahead > 0 && !defer.spoiled;
    if (io.cot) {
      const Cx<N> w = io.get(pe.record);
      N f0 = N(0);
      if (!defer.spoiled) {
        if (pass) {
          f0 = A ? relax_rotate_f0<1>(in.water(0), K, q) : relax_rotate_f0<0>(in.water(0), K, q);
        } else if (kept_f0) {
          f0 = *kept_f0;
        } else if (shifted) {
          copy_state(tmp, x);
          shift_carried(tmp, K, shift, ahead);
          f0 = tmp.fp(0)[0];
        } else {
          f0 = x.fp(0)[0];
        }
        if (order0) add_sample_adjoint(l.fp(0)[0], w, pe.turn);
      }
      if (!order0) f0 = N(0);  // another lane's first order, not the sample's
      const Cx<N> u = transverse(f0) * demod;
      g.m0 += re_dot(w, u);
      eg.add(kGradPhase, ev.e + pe.sample_at, t.m0 * re_dot(w, mul_i(-u)));
    }
    if (shifted)
      for (int i = 0; i < ahead; ++i) shift_adjoint(l.water(0), K);
  }
  if (!pass) return;
  RelaxRotateGrads<N> gq;
  if (A)
    relax_rotate_adjoint<1>(l.water(0), in.water(0), K, q, gq);
  else
    relax_rotate_adjoint<0>(l.water(0), in.water(0), K, q, gq);
  if (!order0) gq.a0 = gq.c0 = N(0);  // the recovery into Z(0) is order 0's (the pass adds it at its first)
  for (int i = 0; i < before; ++i) shift_adjoint(l.water(0), K);
  // a = sa E1, b = s2 E2, c = ca E1, d = half_sa E2, a0 = sa (1 - E1), c0 = ca (1 - E1).
  const N rec = R(1) - pe.E1;
  const N g_ca = gq.c * pe.E1 + gq.c0 * rec;
  if (pe.action & BS_INTERVAL) {  // E1 = exp(-r1 dt), E2 = exp(-r2 dt)
    const N g_E1 = (gq.a - gq.a0) * pe.sa + (gq.c - gq.c0) * pe.ca;
    const N g_E2 = spoiled_before ? N(0) : gq.E2 + gq.b * pe.s2 + gq.d * pe.half_sa;
    const N d1 = g_E1 * pe.E1, d2 = g_E2 * pe.E2;
    g.r1 += -(ev.dt * d1);
    g.r2 += -(ev.dt * d2);
    eg.add(ev.wrap ? kGradDtWrap : kGradDt, ev.e, -(t.r1 * d1 + t.r2 * d2));
  }
  if (pe.action & BS_INVERSION) {  // ca = -eta
    g.inv += -g_ca;
  } else if (pe.action & BS_ROTATE) {  // ca = cos alpha, sa = sin alpha, s2 = (1 - ca) / 2, half_sa = sa / 2
    const N g_sa = gq.a * pe.E1 + gq.a0 * rec;
    const N g_alpha = g_sa * pe.ca - g_ca * pe.sa + (gq.b * pe.sa + gq.d * pe.ca) * (E2 * R(0.5));
    eg.add(kGradFlip, ev.e, g_alpha * t.b1);
    g.b1 += g_alpha * ev.flip;
  }
}

// What step_adjoint reads of the state before an event: the whole state for a pass (the relaxation, pulse or
// inversion's adjoint: vjp_voxel's replay keeps it in a slot), and of a sample only the F+(0) of each pool it
// read (samples_kept: the replay keeps them, KeptPoolsF0, where step_forward forms the sample: after the
// pulse of a decoded fold, fold_at). An event that only samples (an MRF repetition's readout, unfolded) or
// only crushes, shifts or spoils (acting on lambda alone: an MRF train's crusher) reads no state.
template <class N, bool kValues>
BS_HD bool samples_kept(const EventValues<N, kValues>& ev) {
  return ev.record >= 0 && ev.last_rep;
}

// Adjoint of one event. x_pre: state before the event, read for a pass only; sampled: where the event samples,
// on order 0's lane, the F+(0) of each pool its sample read (as the replay kept them: samples_kept);
// kept: the tables' products of its interval (tabulated layouts: step_forward's `keep`); tmp: scratch;
// l: lambda, updated in place.
// A warp lane holds orders k0 .. k0 + K - 1 of each state (K = l.K) and adds its share of every gradient.
template <class N, class S, class R, bool kValues, class EG, class Shift = LocalShift,
          class ShiftAdjoint = LocalShiftAdjoint>
BS_HD void step_adjoint(const Problem<R>& pb, int64_t v, const Voxel<N>& t, const EventValues<N, kValues>& ev,
                        State<S> x_pre, State<S> kept, Ref<S> sampled, State<S> tmp, State<S> l,
                        const SampleIO<N>& io, VoxelGrad<N>& g, const EG& eg, TableGrad<N> tg,
                        const Shift& shift = Shift(), const ShiftAdjoint& shift_adjoint = ShiftAdjoint()) {
  constexpr bool complex_path = !std::is_same<S, N>::value;
  const int64_t K = l.K;
  // Recompute the state ahead of the RF / ADC in tmp (tabulated: from the kept products, no table products).
  // The complex path relaxes x_pre into tmp, with no copy first (pool model 0, the one untabulated layout,
  // holds pool 0's planes alone: make_problem); the real path copies and relaxes in place, as the device's
  // real adjoints were measured with (the same change moved ptxas's registers and spills both ways there).
  Interval<N> iv;
  const bool from_products = pb.tabulated && (ev.action & BS_INTERVAL);
  const bool from_kept = complex_path && !pb.tabulated && (ev.action & BS_INTERVAL);
  const bool pass = passes_over_states(ev.action);
  if (!from_products && !from_kept && pass) copy_state(tmp, x_pre);
  if (ev.action & BS_INTERVAL) {
    iv = make_interval(pb, t, ev);
    if (pb.tabulated)
      relax_from_products(pb, v, iv, kept, tmp);
    else if (from_kept)
      relax_into(tmp.water(0), x_pre.water(0), K, iv, tmp.k0);
    else
      relax(tmp.water(0), K, iv, tmp.k0);
  }
  if ((ev.action & BS_CRUSH_BEFORE) && pass)  // (a sample without a pass: kept after its crusher)
    for (int p = 0; p < tmp.nt; ++p) shift(tmp.water(p), K);
  // Reverse order.
  if (ev.action & BS_SPOIL_AFTER) {
    for (int p = 0; p < l.nt; ++p) spoil(l.water(p), K);
  } else if (ev.action & BS_SHIFT_AFTER) {
    for (int p = 0; p < l.nt; ++p) shift_adjoint(l.water(p), K);
  }
  if (ev.action & BS_CRUSH_AFTER)
    for (int p = 0; p < l.nt; ++p) shift_adjoint(l.water(p), K);
  if (io.cot && samples_kept(ev)) {  // after the pulse (a fold's), ahead of the shifts after it
    const Cx<N> w = io.get(ev.record);
    const Cx<N> turn = demodulation(ev);
    Cx<N> u;  // the sample's F+(0): on the lane that holds order 0 (zero elsewhere)
    if (l.k0 == 0) {
      for (int p = 0; p < l.nt; ++p) u += transverse(sampled[p]);
      u = u * turn;
      g.m0 += re_dot(w, u);
      for (int p = 0; p < l.nt; ++p) add_sample_adjoint(l.fp(p)[0], w, turn * t.m0);
    }
    eg.add(kGradPhase, ev.e + ev.sample_at, t.m0 * re_dot(w, mul_i(-u)));
  }
  if (ev.action & BS_INVERSION) {
    for (int p = 0; p < l.nt; ++p) invert_adjoint(l.water(p), tmp.water(p), K, t.inv, g.inv);
  } else if (ev.action & BS_ROTATE) {
    const Transmit<N> tx = transmit_of(pb, v, t, ev.e);
    const N alpha = ev.flip * tx.b1, phi = ev.phase + tx.b1phase;
    N g_alpha = N(0), g_phi = N(0);
    if (l.nl > l.nt) {
      N g_sat = N(0);
      saturate_adjoint(l, tmp, alpha, fetch_table<N>(pb.table_sat, v, ev.e), g_alpha, g_sat);
      // (a group's sum and a read-modify-write of the voxel's table an event, on the chain: 5 % of the pooled
      // adjoint's warp samples on an H100 where no table's cotangent was asked; docs/design.md, "The 33rd
      // session")
      if (tg.wanted) eg.add_table(tg.sat, ev.e, g_sat);
    }
    if (complex_path && spinor_pulse(pb, ev.e)) {
      rotate_by_spinor_adjoint(pb, v, ev.e, alpha, phi, l, tmp, K, g_alpha, g_phi, tg);
    } else if constexpr (kValues) {
      for (int p = 0; p < l.nt; ++p) rotate_adjoint(l.water(p), tmp.water(p), K, *ev.value_rotation, g_alpha, g_phi);
    } else {
      const Rotation<N> rot = ev.rotation && tx.field < 0 ? *ev.rotation : make_rotation(alpha, phi, complex_path);
      for (int p = 0; p < l.nt; ++p) rotate_adjoint(l.water(p), tmp.water(p), K, rot, g_alpha, g_phi);
    }
    eg.add(kGradFlip, ev.e, g_alpha * tx.b1);
    eg.add(kGradPhase, ev.e, g_phi);
    if (tx.field < 0) {
      g.b1 += g_alpha * ev.flip;
      g.b1phase += g_phi;
    } else {  // the field row's magnitude and phase (a warp lane's share, summed at the end)
      tg.field[2 * tx.field] += g_alpha * ev.flip;
      tg.field[2 * tx.field + 1] += g_phi;
    }
  }
  if (ev.action & BS_CRUSH_BEFORE)
    for (int p = 0; p < l.nt; ++p) shift_adjoint(l.water(p), K);
  if (ev.action & BS_INTERVAL) {
    N g_dt = N(0);
    if (pb.tabulated)
      relax_tables_adjoint(pb, v, interval_row(pb, ev), iv, t, l, x_pre, kept, tg, g, &g_dt);
    else
      relax_adjoint(l.water(0), x_pre.water(0), K, iv, t, g, &g_dt, l.k0);
    eg.add(ev.wrap ? kGradDtWrap : kGradDt, ev.e, g_dt);
  }
}

// Whether event m joins the fold of the event before it in the adjoints' decoded walks (one step for both:
// step_forward and step_adjoint, or step_forward_plain and step_adjoint_plain): it makes no pass and carries
// nothing ahead of itself (no interval, crusher before or pulse), the event before carries nothing after
// itself, and it does something: a sample right after a head that acts ahead of itself (a pass, or a
// crusher before it) and samples nothing (so a fold samples at most once, after what its head does, as the
// steps order it), or a shift or spoiler after itself. An MRF repetition (pulse, sample, crusher) is one
// fold; a fold stays within a repetition (event 0 heads one) and holds at most three events. Decided from
// the two events alone, so each entry is decoded on its own.
template <class R>
BS_HD bool joins_fold(const Problem<R>& pb, int64_t m) {
  constexpr int32_t ahead = BS_INTERVAL | BS_CRUSH_BEFORE | BS_INVERSION | BS_ROTATE;
  constexpr int32_t after = BS_SPOIL_AFTER | BS_CRUSH_AFTER | BS_SHIFT_AFTER;
  if (m <= 0 || m >= pb.E) return false;
  const int32_t action = pb.action[m], before = pb.action[m - 1];
  if ((action & ahead) || (before & after)) return false;
  if (pb.record[m] >= 0) return pb.record[m - 1] < 0 && (before & ahead);
  return (action & after) != 0;
}

// What a decoded entry holds of the fold at event e (joins_fold): at a head, its events' actions together,
// its sample's record and place (sample_at, events after the head: the sample's demodulation and phase
// gradient are its own event's), the events it steps (span) and those back to the head before it (back;
// entry 0: the repetition's last head); at a folded event, its own action and record and the events to the
// next head (ahead; 0 at a head).
struct Fold {
  int32_t action, record;
  int16_t span, back, ahead, sample_at;
};
template <class R>
BS_HD Fold fold_at(const Problem<R>& pb, int64_t e) {
  Fold f{pb.action[e], pb.record[e], 1, 1, 0, 0};
  int64_t head = e + 1;  // the next head
  while (joins_fold(pb, head)) ++head;
  if (joins_fold(pb, e)) {  // a folded event: walked over, never stepped
    f.ahead = int16_t(head - e);
    return f;
  }
  for (int64_t m = e + 1; m < head; ++m) {
    f.action |= pb.action[m];
    if (pb.record[m] >= 0) {
      f.record = pb.record[m];
      f.sample_at = int16_t(m - e);
    }
  }
  f.span = int16_t(head - e);
  int64_t p = (e == 0 ? pb.E : e) - 1;  // the head before: of the repetition before, from event 0
  while (joins_fold(pb, p)) --p;
  f.back = int16_t(e == 0 ? pb.E - p : e - p);
  return f;
}
// A decoded entry's (EventCode's, PlainCode's) fields of its fold.
template <class Code>
BS_HD void put_fold(Code& c, const Fold& f) {
  c.action = f.action;
  c.record = f.record;
  c.span = f.span;
  c.back = f.back;
  c.ahead = f.ahead;
  c.sample_at = f.sample_at;
}

// An event of the general adjoint's walks (vjp_voxel) as every voxel of a launch reads it at the first order:
// its values, its sample's demodulation and, where the pulses are uniform over the voxels (pulses.hpp
// uniform_pulse), its pulse's rotation, decoded once per launch (the CUDA library's group and warp adjoints:
// epg_device.cuh decode_general_events_kernel, launch_rules.hpp decoded_general_events). Where each voxel
// loaded and formed its own, the loads (each array's presence and 64-bit index) were 18 % of the complex
// gradient's instructions and the rotation, formed in each of the three walks, 7 % (ncu, H100, 20k:
// benchmarks/results/profile/ncu-source-regions-cx20k-p5-2k-H100-2026-12-06-0380e00.txt). A head's entry
// holds its fold (fold_at: the walks step heads, an MRF repetition one step where it was three), its
// `turn` its sample's demodulation; `phase` stays the head's own (its pulse's).
template <class R>
struct alignas(16) EventCode {
  int32_t action, record;
  R dt, flip, phase;
  Rotation<R> rotation;
  Cx<R> turn;
  int16_t span, back, ahead, sample_at;
};
// Where the general adjoint's walks (vjp_voxel) read their events: each its own (load_event: the host), or
// from the EventCode entries a launch decoded (the CUDA library's group and warp kernels), the values and
// folds (kDecodedEvents: the first order, whose entries hold its numbers, the problem's reals R) or the folds
// alone, the values each voxel's own with their tangents (kFoldedEvents: the second order), or at the second
// order the values and folds where no tangent reaches an event (kDecodedValues: values_decodable).
enum EventSource { kOwnEvents, kFoldedEvents, kDecodedEvents, kDecodedValues };
template <class N, class R>
constexpr EventSource launch_event_source() {
  if constexpr (Num<N>::P == 0 && std::is_same<N, R>::value) return kDecodedEvents;
  if constexpr (Num<N>::P == 1 && std::is_same<typename Num<N>::Real, R>::value) return kFoldedEvents;
  return kOwnEvents;
}
// Whether the general adjoint's walks at number type N read EventCode entries (launch_event_source).
template <class N, class R>
constexpr bool reads_event_codes() {
  return launch_event_source<N, R>() != kOwnEvents;
}
// Whether no tangent reaches an event's values or its pulse (the intervals, the flips and phases, B1 and its
// phase), as in a Hessian-vector product of a Jacobian along tissue properties.
template <class R>
BS_HD bool events_without_tangents(const Problem<R>& pb) {
  return !pb.dt.tan && !pb.dt_wrap.tan && !pb.flip.tan && !pb.phase.tan && !pb.tissue[BS_B1].tan &&
         !pb.tissue[BS_B1_PHASE_RAD].tan;
}
// Whether the second order's general walks may read the decoded values (kDecodedValues): no tangent reaches
// the events and the pulses are uniform over the voxels. Its pulses then turn the dual states by real
// coefficients (EventValues::value_rotation): in the complex second order's groups of 16 the walks'
// rotations formed per voxel (sines and cosines of dual angles in each of the three walks), their dual
// products and the events' loads were about a third of a step's instructions (benchmarks/sass_regions.py,
// sm_90).
template <class R>
BS_HD bool values_decodable(const Problem<R>& pb) {
  return events_without_tangents(pb) && uniform_pulse(pb);
}
template <class R>
BS_HD int64_t event_code_bytes(const Problem<R>& pb) {
  return pb.E * int64_t(sizeof(EventCode<R>));
}
// Event e's entry as a voxel's own would form it (load_event on repetition 0, step_forward's rotation and
// demodulation; the rotation where the pulses are uniform) with the events folded into it (fold_at);
// complex_path: the rotation's phase factors too.
template <class R>
BS_HD EventCode<R> event_code(const Problem<R>& pb, int64_t e, bool complex_path) {
  const EventValues<R> ev = load_event<R>(pb, 0, e);
  const Fold f = fold_at(pb, e);
  EventCode<R> c{};
  put_fold(c, f);
  c.dt = ev.dt;
  c.flip = ev.flip;
  c.phase = ev.phase;
  if (uniform_pulse(pb)) {
    const R b1 = fetch<R>(pb.tissue[BS_B1], 0), b1phase = fetch<R>(pb.tissue[BS_B1_PHASE_RAD], 0);
    c.rotation = make_rotation(ev.flip * b1, ev.phase + b1phase, complex_path);
  }
  c.turn = cis(-fetch<R>(pb.phase, e + f.sample_at));
  return c;
}
// Event e of repetition rep from the decoded entries: load_event's values, with the demodulation and (uniform:
// the pulses are, uniform_pulse) the rotation that step_forward and step_adjoint read in place of their own.
template <class N, class R>
BS_HD EventValues<N, (Num<N>::P > 0)> decoded_event(const Problem<R>& pb, const EventCode<R>* codes, int64_t rep,
                                                    int64_t e, bool uniform) {
  const EventCode<R>& c = codes[e];
  EventValues<N, (Num<N>::P > 0)> ev;
  ev.e = e;
  ev.action = c.action;
  ev.record = c.record;
  ev.last_rep = rep == pb.reps - 1;
  ev.wrap = e == 0 && rep > 0;
  ev.dt = ev.wrap ? fetch<N>(pb.dt_wrap, 0) : N(c.dt);
  ev.flip = N(c.flip);
  ev.phase = N(c.phase);
  if constexpr (Num<N>::P == 0) {
    ev.rotation = uniform ? &c.rotation : nullptr;
    ev.turn = &c.turn;
  } else {  // (kDecodedValues: the values carry no tangent and the pulses are uniform, values_decodable)
    ev.value_rotation = &c.rotation;
    ev.value_turn = &c.turn;
  }
  ev.sample_at = c.sample_at;
  if (pb.diffusion || pb.flow) ev.lobes = interval_lobes(pb, rep, e);
  return ev;
}
// Event e of repetition rep with its own values (load_event, tangents and all) and the decoded entry's fold:
// the actions and sample of the events it steps, the sample demodulated by its own event's phase, formed in
// `turn` (the caller's, which ev.turn then names: set on every event, so that the steps' reads of it resolve
// to that one variable and it stays in registers) where the fold samples.
template <class N, class R>
BS_HD EventValues<N> folded_event(const Problem<R>& pb, const EventCode<R>* codes, int64_t rep, int64_t e,
                                  Cx<N>& turn) {
  const EventCode<R>& c = codes[e];
  EventValues<N> ev = load_event<N>(pb, rep, e);
  ev.action = c.action;
  ev.record = c.record;
  ev.sample_at = c.sample_at;
  if (c.record >= 0) turn = cis(-fetch<N>(pb.phase, e + c.sample_at));
  ev.turn = &turn;
  return ev;
}

// ---- whole voxels ---------------------------------------------------------------------------------------
// A voxel's scratch: `work` holds three states (current, tmp, lambda); the adjoint's `store` holds the replay
// buffer (stride states) and the checkpoints (one every stride events).
template <class R>
BS_HD int64_t state_size(const Problem<R>& pb) {
  return (2 * pb.nt + pb.nl) * pb.K;
}
// The store: the replayed stretch's states, then the checkpoints. Both adjoints keep a state per pass of the
// stretch (an event that relaxes, rotates or inverts: passes_over_states), pb.slots where the caller counted
// them (the most passes a stretch holds: an MRF train's are a third of its events), else one per event
// (stride). The general adjoint (vjp_voxel) keeps with the tabulated layouts the tables' products of each
// replayed pass as well, and after the checkpoints the F+(0) of each sample (sample_values); the plain
// adjoint (`plain`: vjp_voxel_plain) its deferrals and lambda's state.
template <class R>
BS_HD int64_t checkpoint_count(const Problem<R>& pb) {
  return (pb.E * pb.reps + pb.stride - 1) / pb.stride;
}
template <class R>
BS_HD int64_t replay_slots(const Problem<R>& pb, bool plain) {
  const int64_t passes = pb.slots > 0 ? pb.slots : pb.stride;
  return plain || !pb.tabulated ? passes : 2 * passes;
}
// The general adjoint keeps, for each sample of a stretch, its transverse pools' F+(0): nt numbers, up to a
// stride of them (a stretch's heads: vjp_voxel), after the checkpoints.
template <class R>
BS_HD int64_t sample_values(const Problem<R>& pb) {
  return int64_t(pb.stride) * pb.nt;
}
// The store also holds each checkpoint's Deferral, one scalar each, in whole states after the checkpoints,
// and one state more, lambda's while a stretch is replayed (vjp_voxel_plain).
template <class R>
BS_HD int64_t deferral_states(const Problem<R>& pb) {
  return (checkpoint_count(pb) + state_size(pb) - 1) / state_size(pb);
}
template <class R>
BS_HD int64_t store_states(const Problem<R>& pb, bool plain) {
  if (plain) return replay_slots(pb, true) + checkpoint_count(pb) + deferral_states(pb) + 1;
  return replay_slots(pb, false) + checkpoint_count(pb) + (sample_values(pb) + state_size(pb) - 1) / state_size(pb);
}
// Scratch a thread needs in device memory, in S: the work state(s) (run-time K only: one forward, three
// for an adjoint) and, for adjoints, the store (`plain`: of vjp_voxel_plain): launch_rules.hpp sizes
// launches by it, epg_device.cuh thread_scratch lays the threads out by it (here, not in launch_rules.hpp,
// which NVRTC cannot compile).
template <class R>
BS_HD int64_t device_scratch_per_voxel(const Problem<R>& pb, bool adjoint, bool in_registers, bool plain = false) {
  return (in_registers ? 0 : (adjoint ? 3 : 1) * state_size(pb)) +
         (adjoint ? store_states(pb, plain) * state_size(pb) : 0);
}
// The store of one lane of a group or warp adjoint (vjp_voxel's), in S: the whole problem's store states,
// each of the planes over the lane's `orders` (vjp_warp_kernel's KPL; launch_rules.hpp
// adjoint_orders_per_lane). `plain`: vjp_voxel_plain's in a group (epg_device.cuh vjp_plain_lanes_kernel),
// whose checkpoints' deferrals fill whole states of the lane's orders.
template <class R>
BS_HD int64_t lane_store_size(const Problem<R>& pb, int64_t orders, bool plain = false) {
  if (!plain)
    return (replay_slots(pb, false) + checkpoint_count(pb)) * (2 * pb.nt + pb.nl) * orders + sample_values(pb);
  Problem<R> lane = pb;
  lane.K = orders;
  return store_states(lane, true) * state_size(lane);
}
template <class S, class R>
BS_HD State<S> state_at(const Problem<R>& pb, Ref<S> base, int64_t index, int64_t k0 = 0) {
  return State<S>{base + state_size(pb) * index, pb.K, pb.nt, pb.nl, k0};
}

template <class N, class S, class R>
BS_HD void forward_voxel(const Problem<R>& pb, int64_t v, const Voxel<N>& t, Ref<S> work, const SampleIO<N>& io) {
  State<S> x = state_at(pb, work, 0);
  equilibrium_state<S, N>(pb, v, x);
  if constexpr (std::is_same<S, N>::value) {
    if (plain_orders(pb)) {
      const State<S> tmp = state_at(pb, work, 1);
      Deferral defer;
      for (int64_t rep = 0; rep < pb.reps; ++rep)
        for (int64_t e = 0; e < pb.E; ++e)
          step_forward_plain(plain_event(pb, t, load_event<N>(pb, rep, e)), x, tmp, &io, defer);
      return;
    }
  }
  for (int64_t rep = 0; rep < pb.reps; ++rep)
    for (int64_t e = 0; e < pb.E; ++e) step_forward(pb, v, t, load_event<N>(pb, rep, e), x, &io);
}

// Checkpointed adjoint of one voxel: the forward sweep keeps every stride-th state; the reverse sweep
// replays each stretch from its checkpoint. Writes the forward samples too when io.signal is set. A warp
// lane passes its orders (pb.K of them from k0) and the warp's shifts, and adds its share to g, eg and tg.
// kSource: where the walks read the events (launch_event_source; a choice made at run time, per event, took
// the (2, 3) pools' warp adjoint from 128 registers to 168): each loaded and formed here, its own head
// (kOwnEvents), or from the launch's decoded entries (pb.event_codes, EventCode), the walks then stepping
// their folds (fold_at: an MRF repetition one step a walk where it was three).
template <class N, class S, EventSource kSource = kOwnEvents, class R, class EG, class Shift = LocalShift,
          class ShiftAdjoint = LocalShiftAdjoint>
BS_HD void vjp_voxel(const Problem<R>& pb, int64_t v, const Voxel<N>& t, Ref<S> work, Ref<S> store, const SampleIO<N>& io,
                     VoxelGrad<N>& g, const EG& eg, TableGrad<N> tg, const Shift& shift = Shift(),
                     const ShiftAdjoint& shift_adjoint = ShiftAdjoint(), int64_t k0 = 0) {
  const int64_t n = pb.E * pb.reps, stride = pb.stride, passes = replay_slots(pb, true);
  State<S> x = state_at(pb, work, 0, k0), tmp = state_at(pb, work, 1, k0), l = state_at(pb, work, 2, k0);
  const int64_t replayed = replay_slots(pb, false);
  auto replay = [&](int64_t j) { return state_at(pb, store, j, k0); };
  auto kept = [&](int64_t j) { return state_at(pb, store, passes + j, k0); };  // tabulated layouts only
  auto checkpoint = [&](int64_t c) { return state_at(pb, store, replayed + c, k0); };
  const Ref<S> samples = store + state_size(pb) * (replayed + checkpoint_count(pb));  // sample_values
  [[maybe_unused]] const EventCode<R>* codes = static_cast<const EventCode<R>*>(pb.event_codes);
  constexpr bool kFolds = kSource != kOwnEvents;
  [[maybe_unused]] const bool uniform = kSource == kDecodedEvents && uniform_pulse(pb);  // (for every voxel)
  [[maybe_unused]] Cx<N> sample_turn;  // (kFoldedEvents: folded_event)
  auto event = [&](int64_t rep, int64_t e) {
    if constexpr (kSource == kDecodedEvents || kSource == kDecodedValues) {
      return decoded_event<N>(pb, codes, rep, e, uniform);
    } else if constexpr (kSource == kFoldedEvents) {
      return folded_event<N>(pb, codes, rep, e, sample_turn);
    } else {
      return load_event<N>(pb, rep, e);
    }
  };
  // The walks step heads: span(e) events from head e on, back(e) to the head before it (event 0: the
  // repetition's last), ahead(e) from event e to the first head at or after it.
  auto span = [&](int64_t e) -> int64_t {
    if constexpr (kFolds) return codes[e].span;
    return 1;
  };
  auto back = [&](int64_t e) -> int64_t {
    if constexpr (kFolds) return codes[e].back;
    return 1;
  };
  auto ahead = [&](int64_t e) -> int64_t {
    if constexpr (kFolds) return codes[e].ahead;
    return 0;
  };
  equilibrium_state<S, N>(pb, v, x);
  // Events by (repetition, event), counted along as vjp_voxel_plain's: load_event(pb, i) divides i by E, and
  // i % stride another 64-bit division, each about 70 instructions on the card, per event and walk.
  for (int64_t i = 0, rep = 0, e = 0, c = 0, due = 0; i < n;) {
    for (; due <= i; due += stride) copy_state(checkpoint(c++), x);
    const auto ev = event(rep, e);
    const int64_t steps = span(e);
    i += steps;
    if ((e += steps) == pb.E) {
      e = 0;
      ++rep;
    }
    step_forward(pb, v, t, ev, x, &io, shift);
  }
  zero_state(l);
  // Stretch c runs from the first head at or after event c * stride to the next stretch's first head: a
  // pass is always a head, so it holds the passes (pb.slots) and at most stride samples (sample_values) that
  // events c * stride on hold; one left empty (a fold longer than the stride) is skipped.
  for (int64_t c = (n - 1) / stride, i1 = n; c >= 0; --c) {
    int64_t i0 = c * stride, rep = i0 / pb.E, e = i0 - rep * pb.E;
    const int64_t skip = ahead(e);
    i0 += skip;
    if ((e += skip) == pb.E) {
      e = 0;
      ++rep;
    }
    if (i0 == i1) continue;
    copy_state(x, checkpoint(c));
    // A slot per pass and the F+(0) of each sample, counted along here and down again in the backward
    // (32-bit counters and a state chosen at compile time: a run-time choice between x and tmp, or the kept
    // values handed to step_adjoint by reference, put a group's register states on the stack).
    int32_t slot = 0, sampled = 0;
    for (int64_t i = i0; i < i1;) {
      const auto ev = event(rep, e);
      const int64_t steps = span(e);
      i += steps;
      if ((e += steps) == pb.E) {
        e = 0;
        ++rep;
      }
      const bool pass = passes_over_states(ev.action), sample = samples_kept(ev);
      if (pass) copy_state(replay(slot), x);
      const State<S> keep = kept(slot);
      const KeptPoolsF0<S> f0{samples + int64_t(sampled) * pb.nt, sample};
      if (i < i1 || sample)  // (the stretch's last head is stepped only where it keeps its sample)
        step_forward(pb, v, t, ev, x, &f0, shift, pb.tabulated ? &keep : nullptr);
      else if (pb.tabulated && (ev.action & BS_INTERVAL))
        relax_tables<false>(pb, v, interval_row(pb, ev), Interval<N>(), x, &keep);
      slot += pass;
      sampled += sample;
    }
    for (int64_t i = i1; i > i0;) {  // (rep, e) is i1's, a head or the train's end
      const int64_t steps = back(e);
      i -= steps;
      if ((e -= steps) < 0) {
        e += pb.E;
        --rep;
      }
      const auto ev = event(rep, e);
      if (passes_over_states(ev.action) && --slot > 0)  // (elsewhere the slot named is not read)
        prefetch_state(replay(slot - 1));  // the pass before's, read at the next pass back
      if (samples_kept(ev)) --sampled;
      step_adjoint(pb, v, t, ev, replay(slot), kept(slot), samples + int64_t(sampled) * pb.nt, tmp, l, io, g, eg, tg,
                   shift, shift_adjoint);
    }
    i1 = i0;
  }
  // Equilibrium depends on the tables' zeq: Z_q(0) starts at zeq_q.
  if (pb.tabulated && k0 == 0)
    for (int q = 0; q < l.nl; ++q) tg.zeq[q] += re(l.z(q)[0]);
}

// What step_forward_plain writes samples to where none are wanted (the plain adjoint's sweeps: vjp_voxel_plain,
// the host lanes' vjp_group): the deferred shifts then fall as they do in a forward that writes its samples,
// which step_adjoint_plain assumes.
struct DiscardSamples {
  bool signal = true;
  template <class X>
  BS_HD void put(int64_t, const X&) const {}
};

// A Deferral as one scalar of the store (exact in float: a handful of carried shifts), and back.
template <class S>
BS_HD S pack_deferral(const Deferral& d) {
  return S(2 * d.pending + (d.spoiled ? 1 : 0));
}
template <class S>
BS_HD Deferral unpack_deferral(const S& x) {
  const int code = int(value_of(x));
  return Deferral{code >> 1, (code & 1) != 0};
}

// Whether two numbers are the same, tangents included (an interval's length, to keep its exponentials).
template <class R>
BS_HD bool same_number(const R& a, const R& b) {
  return a == b;
}
template <class R, int P>
BS_HD bool same_number(const Dual<R, P>& a, const Dual<R, P>& b) {
  bool same = a.v == b.v;
  for (int p = 0; p < P; ++p) same = same && a.d[p] == b.d[p];
  return same;
}

// Whether a walk forms a sample's demodulation (PlainEvents::at's `turn`): where it reads it, and
// plain_event's record is set (the last repetition's samples only).
template <class N>
BS_HD bool turn_read(const EventValues<N>& ev, bool read) {
  return read && ev.last_rep && ev.record >= 0;
}
template <class N>
BS_HD Cx<N> sample_turn(const EventValues<N>& ev, bool read) {
  return turn_read(ev, read) ? cis(-ev.phase) : Cx<N>();
}

// The real plain path's events for one voxel: plain_event with the interval's exponentials kept while its
// length repeats (an MRF train's TR: two exponentials for the whole train, not two per interval). `turn`:
// a sample's demodulation, cis(-phase), formed by the caller where the sample's value is read (a sweep that
// writes the signal; the backward, which needs it beside the event as well), else zero: the sweeps that
// discard their samples or keep only the f0 they read form no sines for it: of the seven sines and cosines
// an MRF TR formed over the three walks, four were turns, three of them read by nothing.
// The walks of vjp_voxel_plain read an event as load(rep, e), then turn(ev, read) and at(ev, turn), each walk
// naming its first event and its direction (start(e, step): DecodedPlainEvents reads the entries ahead of
// the one stepped). A walk steps heads: span() events from the one loaded forward, back() to the head before
// it; ahead(e): events from e to the first head at or after it. Here every event is its own head;
// DecodedPlainEvents folds events into the head before them (joins_fold).
template <class N, class R>
struct PlainEvents {
  const Problem<R>& pb;
  const Voxel<N>& t;
  N held_dt = N(-1);
  Decay<N> decay{N(1), N(1)};
  BS_HD const Decay<N>& decay_of(const N& dt) {
    if (!same_number(dt, held_dt)) {
      decay = make_decay(pb, t, dt);
      held_dt = dt;
    }
    return decay;
  }
  BS_HD void start(int64_t, int) const {}
  BS_HD EventValues<N> load(int64_t rep, int64_t e) const { return load_event<N>(pb, rep, e); }
  BS_HD int span() const { return 1; }
  BS_HD int back() const { return 1; }
  BS_HD int back_from(int64_t) const { return 1; }
  BS_HD int ahead(int64_t) const { return 0; }
  BS_HD Cx<N> turn(const EventValues<N>& ev, bool read) const { return sample_turn(ev, read); }
  BS_HD PlainEvent<N> at(const EventValues<N>& ev, const Cx<N>& turn) {
    return plain_event(
        t, ev, [&] { return decay_of(ev.dt); },
        [&] { return make_rotation(ev.flip * t.b1, ev.phase + t.b1phase, false); }, [&] { return turn; });
  }
};

// The real plain path's events as every voxel of a launch reads them where its pulses are uniform
// (pulses.hpp uniform_pulse): an event's values, its pulse's rotation and its sample's demodulation, decoded
// once per launch (the CUDA library's plain adjoints: epg_device.cuh decode_plain_events_kernel); entry E
// holds the wrapped interval's length (dt_wrap). Where each voxel loaded and formed its own, an event's loads
// (each array's presence and 64-bit index), sine and cosine were about 60 % of the 2k real gradient's
// instructions (ncu, H100: 111 a lane, event and walk of 617 in all). A head's entry holds its fold
// (joins_fold): the events' actions together, the sample's record, demodulation and place (sample_at), and
// the events it steps (span); back: events to the head before it (entry 0: the repetition's last head);
// ahead: a folded event's to the next head (0 at a head). 16-byte aligned: three vector loads an entry.
template <class R>
struct alignas(16) PlainCode {
  int32_t action, record;
  R dt, flip, ca, sa, s2, half_sa, turn_re, turn_im;
  int16_t span, back, ahead, sample_at;
};
template <class R>
BS_HD int64_t plain_code_bytes(const Problem<R>& pb) {
  return (pb.E + 1) * int64_t(sizeof(PlainCode<R>));
}
// Event e's entry as a voxel's own would form it (load_event, plain_event's rotation, sample_turn) with the
// events folded into it (fold_at), or e = E: the wrapped interval's.
template <class R>
BS_HD PlainCode<R> plain_code(const Problem<R>& pb, int64_t e) {
  PlainCode<R> c{};
  c.span = c.back = 1;
  if (e == pb.E) {
    c.dt = fetch<R>(pb.dt_wrap, 0);
    return c;
  }
  const EventValues<R> ev = load_event<R>(pb, 0, e);  // repetition 0: dt, not dt_wrap
  const Fold f = fold_at(pb, e);
  put_fold(c, f);
  c.dt = ev.dt;
  c.flip = ev.flip;
  const R b1 = fetch<R>(pb.tissue[BS_B1], 0), b1phase = fetch<R>(pb.tissue[BS_B1_PHASE_RAD], 0);
  const Rotation<R> r = make_rotation(ev.flip * b1, ev.phase + b1phase, false);
  c.ca = r.ca;
  c.sa = r.sa;
  c.s2 = r.s2;
  c.half_sa = r.half_sa;
  const Cx<R> turn = cis(-fetch<R>(pb.phase, e + f.sample_at));
  c.turn_re = turn.re;
  c.turn_im = turn.im;
  return c;
}
// PlainEvents over the decoded entries (`codes`, as the voxel's own: the event's phase, read only through its
// demodulation, is left 0), its walks stepping heads. The entries a walk reads next are read while the
// present one is stepped, two ahead for the first order: read where it was used, an entry's load stood in
// every event's chain (ncu, H100, the 2k real gradient in groups of 8 at four warps a multiprocessor: a third
// of the stall samples), and one ahead it still did (a fifth of them on one instruction, the sweep's: two of an
// MRF repetition's three events stepped nothing, before they were folded). Where the entry after next lies
// is read from next's span or back, loaded a step before. The second order keeps one ahead (its dual states
// fill the registers).
template <class N, class R>
struct DecodedPlainEvents : PlainEvents<N, R> {
  static constexpr bool kTwoAhead = Num<N>::P == 0;
  const PlainCode<R>* codes;
  R dt_wrap;
  PlainCode<R> held, next, after;  // the entry load() read; the next one; (kTwoAhead) the one after it
  int64_t next_e = 0, after_e = 0;  // where next and after lie
  int step = 1;                     // the walk's direction
  BS_HD int64_t following(int64_t e, const PlainCode<R>& c) const {  // the head a walk reaches after head e
    if (step > 0) {
      e += c.span;
      return e == this->pb.E ? 0 : e;
    }
    e -= c.back;
    return e < 0 ? e + this->pb.E : e;
  }
  BS_HD void start(int64_t e, int walk_step) {
    step = walk_step;
    next = codes[e];
    next_e = e;
    if constexpr (kTwoAhead) {
      after_e = following(e, next);
      after = codes[after_e];
    }
  }
  BS_HD EventValues<N> load(int64_t rep, int64_t e) {  // e: the head start() or the last load() led to
    held = next;
    if constexpr (kTwoAhead) {
      next = after;
      next_e = after_e;
      after_e = following(next_e, next);
      after = codes[after_e];  // (past the walk's end: an entry of the train all the same, read and not used)
    } else {
      next_e = following(next_e, held);
      next = codes[next_e];
    }
    EventValues<N> ev;
    ev.e = e;
    ev.action = held.action;
    ev.record = held.record;
    ev.last_rep = rep == this->pb.reps - 1;
    ev.wrap = e == 0 && rep > 0;
    ev.dt = N(ev.wrap ? dt_wrap : held.dt);
    ev.flip = N(held.flip);
    ev.phase = N(0);
    return ev;
  }
  BS_HD int span() const { return held.span; }
  BS_HD int back() const { return held.back; }
  BS_HD int back_from(int64_t e) const { return codes[e].back; }
  BS_HD int ahead(int64_t e) const { return codes[e].ahead; }
  BS_HD Cx<N> turn(const EventValues<N>& ev, bool read) const {
    return turn_read(ev, read) ? Cx<N>(N(held.turn_re), N(held.turn_im)) : Cx<N>();
  }
  BS_HD PlainEvent<N> at(const EventValues<N>& ev, const Cx<N>& turn) {
    PlainEvent<N> pe = plain_event(
        this->t, ev, [&] { return this->decay_of(ev.dt); },
        [&] {
          Rotation<N> r;
          r.ca = N(held.ca);
          r.sa = N(held.sa);
          r.s2 = N(held.s2);
          r.half_sa = N(held.half_sa);
          return r;
        },
        [&] { return turn; });
    pe.sample_at = held.sample_at;
    return pe;
  }
};

// The stretch the plain adjoint replays at most (its deferrals and slot indices are the voxel's own arrays).
constexpr int64_t kPlainMaxStride = 64;
// Whether vjp_voxel_out runs vjp_voxel_plain: the real plain path (plain_orders) at a real number type or
// its dual along one tangent (the second-order adjoint), with no table cotangents and a stretch within
// kPlainMaxStride.
template <class N, class S, class R>
BS_HD bool plain_adjoint(const Problem<R>& pb) {
  if constexpr (std::is_same<S, N>::value && Num<N>::P <= 1) {
    return plain_orders(pb) && !table_cotangents(pb) && pb.stride <= kPlainMaxStride;
  } else {
    return false;
  }
}

// Checkpointed adjoint of one voxel of the real plain path on the plain step pair (step_forward_plain,
// step_adjoint_plain: one pass over the orders per event that touches the states; an event that only
// samples or shifts carries its shift), vjp_voxel's scheme as the host's lanes run it (epg_lanes.inc
// vjp_group), with the working states x, tmp and l where the caller keeps them (a CUDA thread's registers
// at a compile-time K). The sweep keeps the state before every stride-th event and its deferral; each
// stretch is replayed from its checkpoint, keeping the state before each pass once per write (passes after
// events that leave the states alone share the slot before them) and, of an event that only samples, the
// f0 it read (a number, not a slot: half of an MRF train's slots), and walked back. Store: the slots
// (replay_slots: one per pass where the caller counted them, else one per event), the checkpoints, the
// checkpoints' deferrals, then lambda while a stretch is replayed, so a thread's registers hold two states
// at a time, not three (store_states). The sweep's samples go to io where it writes the signal, else
// nowhere, with the shifts falling alike (DiscardSamples).
// A group's lane (epg_device.cuh vjp_plain_lanes_kernel) passes its shifts across the lanes and x, tmp and l
// over its orders (pb.K of them from k0), keeps a store of its own over them, and adds its share of g and
// eg (step_adjoint_plain). Its states fit its registers through the replay: lambda stays there, and tmp
// (not l_kept's slot) takes the backward's shifted input.
// `events`: where the walks read the events (PlainEvents, or DecodedPlainEvents where a launch decoded them).
template <class N, class S, class R, class EG, class Events, class Shift = LocalShift,
          class ShiftAdjoint = LocalShiftAdjoint>
BS_HD void vjp_voxel_plain(const Problem<R>& pb, int64_t v, const Voxel<N>& t, State<S> x, State<S> tmp, State<S> l,
                           Ref<S> store, const SampleIO<N>& io, VoxelGrad<N>& g, const EG& eg, Events& events,
                           const Shift& shift = Shift(), const ShiftAdjoint& shift_adjoint = ShiftAdjoint()) {
  const int64_t n = pb.E * pb.reps, stride = pb.stride, checkpoints = checkpoint_count(pb);
  const int64_t slots = replay_slots(pb, true);
  auto slot = [&](int64_t j) { return state_at(pb, store, j); };
  auto checkpoint = [&](int64_t c) { return state_at(pb, store, slots + c); };
  const Ref<S> deferral_at = store + state_size(pb) * (slots + checkpoints);
  const State<S> l_kept = state_at(pb, store, slots + checkpoints + deferral_states(pb));
  const DiscardSamples discard;
  Deferral defer;
  equilibrium_state<S, N>(pb, v, x);
  // Events by (repetition, event), counted along: a 64-bit division per event (load_event's i / E) is
  // about 70 instructions on the card. The walks step heads (Events::span): stretch c starts at the first
  // head at or after event c * stride (events folded into a head stay in its stretch), so a stretch holds
  // the passes that its events hold (a pass is always a head) and pb.slots counts them as before; a stretch
  // left empty (a fold longer than the stride) is skipped, its checkpoint written and never read.
  events.start(0, 1);
  for (int64_t i = 0, rep = 0, e = 0, c = 0, due = 0; i < n;) {
    for (; due <= i; due += stride) {
      copy_state(checkpoint(c), x);
      deferral_at[c++] = pack_deferral<S>(defer);
    }
    const EventValues<N> ev = events.load(rep, e);
    i += events.span();
    if ((e += events.span()) == pb.E) {
      e = 0;
      ++rep;
    }
    const PlainEvent<N> pe = events.at(ev, events.turn(ev, io.signal != nullptr));
    if (io.signal)
      step_forward_plain(pe, x, tmp, &io, defer, shift);
    else
      step_forward_plain(pe, x, tmp, &discard, defer, shift);
  }
  zero_state(l);
  int slot_of[kPlainMaxStride];
  S deferral_of[kPlainMaxStride], f0_of[kPlainMaxStride];
  for (int64_t c = checkpoints - 1, i1 = n; c >= 0; --c) {
    int64_t i0 = c * stride, rep = i0 / pb.E, e = i0 - rep * pb.E;
    const int64_t skip = events.ahead(e);  // to the stretch's first head
    i0 += skip;
    if ((e += skip) == pb.E) {
      e = 0;
      ++rep;
    }
    if (i0 == i1) continue;
    if constexpr (Shift::kWhole) copy_state(l_kept, l);
    copy_state(x, checkpoint(c));
    defer = unpack_deferral(S(deferral_at[c]));
    int last = -1, heads = 0;
    bool written = true;  // x differs from every slot
    events.start(e, 1);
    for (int64_t i = i0; i < i1; ++heads) {
      const EventValues<N> ev = events.load(rep, e);
      i += events.span();
      if ((e += events.span()) == pb.E) {
        e = 0;
        ++rep;
      }
      const PlainEvent<N> pe = events.at(ev, Cx<N>());  // KeptF0 reads no turn
      const bool pass = passes_over_states(pe.action);
      // An event that only samples names slot 0, which its backward does not read: choosing between two
      // states there put the register kernel's states on the stack (ptxas: a 2,224-byte frame).
      slot_of[heads] = 0;
      if (pass) {
        if (written) {
          copy_state(slot(++last), x);
          written = false;
        }
        slot_of[heads] = last;
      }
      deferral_of[heads] = pack_deferral<S>(defer);
      // An event that only samples is stepped even last (its backward needs the f0 it read, not a slot);
      // one call site: a third inlined copy of the step put the register kernel's states on the stack.
      const bool sample_only = !pass && pe.record >= 0;
      KeptF0<S> sample;
      if ((sample_only || i < i1) && step_forward_plain(pe, x, tmp, &sample, defer, shift)) written = true;
      if (sample_only) f0_of[heads] = sample.f0;
    }
    if constexpr (Shift::kWhole) copy_state(l, l_kept);
    // (rep, e) is i1's: the stretch's last head lies back() from it.
    const int64_t back = events.back_from(e);
    if ((e -= back) < 0) {
      e += pb.E;
      --rep;
    }
    events.start(e, -1);
    for (int j = heads - 1; j >= 0; --j) {
      const EventValues<N> ev = events.load(rep, e);
      if ((e -= events.back()) < 0) {
        e += pb.E;
        --rep;
      }
      const Cx<N> demod = events.turn(ev, true);
      const PlainEvent<N> pe = events.at(ev, demod);
      const bool pass = passes_over_states(pe.action);
      if (!pass && pe.record < 0) continue;  // nothing to undo
      // Its scratch state (shifts carried ahead of a pass) is l_kept's, free here: in the store beside the
      // state it shifts, not in the caller's registers, which a runtime choice between the two
      // (step_adjoint_plain's `in`) would put in memory. An event that only samples reads its kept f0.
      step_adjoint_plain(pe, ev, demod, t, slot(slot_of[j]), unpack_deferral(deferral_of[j]),
                         Shift::kWhole ? l_kept : tmp, l, io, g, eg, pass ? nullptr : &f0_of[j], shift,
                         shift_adjoint);
    }
    i1 = i0;
  }
}

// Table cotangent sizes of a voxel, in N: L, r, T (complex: 2 per entry), zeq, sat, field, spinor, profile (a
// constant: none).
template <class R>
BS_HD void table_sizes(const Problem<R>& pb, int64_t sizes[kTableCount]) {
  const int64_t D = pb.tabulated ? pb.num_intervals : 0, nl = pb.nl, nt = pb.nt;
  sizes[0] = D * nl * nl;
  sizes[1] = D * nl;
  sizes[2] = 2 * D * nt * nt;
  sizes[3] = pb.tabulated ? nl : 0;
  sizes[4] = pb.tabulated && pb.nl > pb.nt ? pb.E : 0;  // sat: a semisolid pool's
  sizes[5] = pb.field_row ? 2 * pb.num_field_rows : 0;
  sizes[6] = pb.spinor_row ? 4 * pb.num_spinor_rows : 0;
  sizes[7] = 0;
}
// Whether a voxel has table cotangents to write: pool tables, or per-voxel pulses.
template <class R>
BS_HD bool table_cotangents(const Problem<R>& pb) {
  return pb.tabulated || pb.field_row || pb.spinor_row;
}

// Where a voxel's gradients go: tissue [V] per property, tables [V, size] per table (values and tangents).
template <class R>
struct GradOut {
  R* tissue[BS_NUM_TISSUE];
  R* tissue_tan[BS_NUM_TISSUE];
  R* table[kTableCount];
  R* table_tan[kTableCount];
};

// Table cotangent scratch, in N, of `threads` threads holding `lanes` lanes a voxel (1: a thread per voxel,
// or the host's voxel): each thread's share of every table but the saturation table, interleaved by thread,
// then the saturation table once a voxel, interleaved by voxel: its event's cotangent is summed over the
// voxel's lanes where it is formed (EventGrad add_table; each event is stepped once a backward sweep), so a
// lane needs no copy of it (a warp per voxel kept 32: 38 KB a voxel of a 301-event train in float).
template <class R>
BS_HD int64_t table_scratch_size(const Problem<R>& pb, int64_t threads, int lanes) {
  int64_t sizes[kTableCount];
  table_sizes(pb, sizes);
  int64_t per_thread = 0;
  for (int i = 0; i < kTableCount; ++i) per_thread += i == kSatTable ? 0 : sizes[i];
  return threads * per_thread + threads / lanes * sizes[kSatTable];
}

// Thread `thread`'s table cotangents in `scratch` (of `threads` threads, `lanes` a voxel: the device
// interleaves them; the host's voxel is thread 0 of 1), laid out as table_scratch_size counts, zeroed: the
// saturation table by the voxel's first lane, which alone adds to it (add_table) and writes it.
template <class N, class R>
BS_HD TableGrad<N> table_grad_at(const Problem<R>& pb, const GradOut<R>& out, N* scratch, int64_t thread,
                                 int64_t threads, int lanes = 1) {
  int64_t sizes[kTableCount];
  table_sizes(pb, sizes);
  N* region[kTableCount];
  int64_t off = 0;
  for (int i = 0; i < kTableCount; ++i) {
    if (i == kSatTable) continue;
    region[i] = scratch + threads * off;
    off += sizes[i];
  }
  region[kSatTable] = scratch + threads * off;
  const int64_t st = threads;
  TableGrad<N> tg{Ref<N>{region[0] + thread, st}, Ref<N>{region[1] + thread, st},
                  Ref<Cx<N>>{reinterpret_cast<Cx<N>*>(region[2]) + thread, st}, Ref<N>{region[3] + thread, st},
                  Ref<N>{region[4] + thread / lanes, threads / lanes}, Ref<N>{region[5] + thread, st},
                  Ref<N>{region[6] + thread, st}};
  for (int i = 0; i < 5; ++i) tg.wanted = tg.wanted || out.table[i] || out.table_tan[i];  // the pool tables'
  const bool holder = thread % lanes == 0;
  const Ref<N> plain[6] = {tg.L, tg.r, tg.zeq, tg.sat, tg.field, tg.spinor};
  const int64_t count[6] = {sizes[0], sizes[1], sizes[3], holder ? sizes[4] : 0, sizes[5], sizes[6]};
  for (int i = 0; i < 6; ++i)
    for (int64_t j = 0; j < count[i]; ++j) plain[i][j] = N(0);
  for (int64_t j = 0; j < sizes[2] / 2; ++j) tg.T[j] = Cx<N>();
  return tg;
}

// Write voxel v's table cotangents where asked: `total` sums a number over whatever holds shares of it (a
// warp's lanes; the identity on the host) and is called alike everywhere; `writer` writes (on a card the
// voxel's first lane, which holds the saturation table's sums: add_table).
template <class N, class R, class Total>
BS_HD void write_table_grads(const Problem<R>& pb, int64_t v, const TableGrad<N>& tg, const GradOut<R>& out,
                             const Total& total, bool writer) {
  int64_t sizes[kTableCount];
  table_sizes(pb, sizes);
  auto put = [&](int i, int64_t j, const N& x) {
    if (!writer) return;
    if (out.table[i]) out.table[i][v * sizes[i] + j] = value_of(x);
    if constexpr (Num<N>::P > 0) {
      if (out.table_tan[i]) out.table_tan[i][v * sizes[i] + j] = x.d[0];
    }
  };
  const Ref<N> plain[kTableCount] = {tg.L, tg.r, Ref<N>{}, tg.zeq, tg.sat, tg.field, tg.spinor, Ref<N>{}};
  for (int i = 0; i < kTableCount; ++i) {
    if (!out.table[i] && !out.table_tan[i]) continue;
    if (i == 2) {
      for (int64_t j = 0; j < sizes[2] / 2; ++j) {
        const Cx<N> x = tg.T[j];
        put(2, 2 * j, total(x.re));
        put(2, 2 * j + 1, total(x.im));
      }
      continue;
    }
    for (int64_t j = 0; j < sizes[i]; ++j) put(i, j, i == kSatTable ? plain[i][j] : total(plain[i][j]));
  }
}

// A voxel's tissue gradients in the ABI's order and units: times in ms, d/dT = d/d(rate) * d(rate)/dT.
template <class N>
BS_HD void tissue_gradients(const VoxelGrad<N>& g, const Voxel<N>& t, N per_param[BS_NUM_TISSUE]) {
  const N all[BS_NUM_TISSUE] = {g.r1 * drate_dms(t.t1_ms), g.r2 * drate_dms(t.t2_ms), g.m0, g.b1, g.b1phase,
                                g.b0, g.inv, g.D, g.v};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) per_param[j] = all[j];
}

struct Itself {
  template <class N>
  BS_HD N operator()(const N& x) const {
    return x;
  }
};

// The whole adjoint of voxel v: gradients of tissue and tables written, event values through eg. `tg`
// holds the voxel's table cotangents (table_grad_at). kOnlyPlain: the caller runs only problems that
// plain_adjoint takes (the register kernel, launch_rules.hpp register_adjoint), so the general path is not
// compiled beside it. kDecoded: the plain walks read pb.plain_events (DecodedPlainEvents).
template <class N, class S, bool kOnlyPlain = false, bool kDecoded = false, class R, class EG>
BS_HD void vjp_voxel_out(const Problem<R>& pb, int64_t v, Ref<S> work, Ref<S> store, TableGrad<N> tg,
                         const SampleIO<N>& io, const EG& eg, const GradOut<R>& out) {
  const Voxel<N> t = load_voxel<N>(pb, v);
  VoxelGrad<N> g;
  bool plain = false;
  if constexpr (std::is_same<S, N>::value && Num<N>::P <= 1) {
    plain = plain_adjoint<N, S>(pb);
    if (plain) {
      if constexpr (kDecoded) {
        const auto* const codes = static_cast<const PlainCode<R>*>(pb.plain_events);
        DecodedPlainEvents<N, R> events{{pb, t}, codes, codes[pb.E].dt, {}, {}, {}};
        vjp_voxel_plain<N, S>(pb, v, t, state_at(pb, work, 0), state_at(pb, work, 1), state_at(pb, work, 2), store,
                              io, g, eg, events);
      } else {
        PlainEvents<N, R> events{pb, t};
        vjp_voxel_plain<N, S>(pb, v, t, state_at(pb, work, 0), state_at(pb, work, 1), state_at(pb, work, 2), store,
                              io, g, eg, events);
      }
    }
  }
  if constexpr (!kOnlyPlain) {
    if (!plain) vjp_voxel<N, S>(pb, v, t, work, store, io, g, eg, tg);
  }
  N per_param[BS_NUM_TISSUE];
  tissue_gradients(g, t, per_param);
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    if (out.tissue[j]) out.tissue[j][v] = value_of(per_param[j]);
    if constexpr (Num<N>::P > 0) {
      if (out.tissue_tan[j]) out.tissue_tan[j][v] = per_param[j].d[0];
    }
  }
  if (table_cotangents(pb)) write_table_grads(pb, v, tg, out, Itself{}, true);
}

}  // namespace bs
