// Device kernels: the host's event loop (csrc/include/blochsim), compiled by nvcc: a thread, a group of 4
// or 8 lanes, or a warp per voxel (launch_rules.hpp chooses).
//
// Thread per voxel: for the plain layout at K = 32 (plain_layout) the order count, pool counts and physics
// switches are compile-time constants, so the state arrays live in registers (the loops over orders
// unroll); any other K and the tabulated layouts keep their states in device scratch. Value forwards read
// their events decoded and folded once per launch (decode_events_kernel, for_each_event, fold_events), and
// plain layouts carry a shift into the next interval (Deferral, event_loop.hpp); the real register kernel
// runs each event as one pass over its orders (step_forward_plain), reading the next event's values ahead
// (for_each_plain_event) and writing its samples in bursts (StagedSamples). Adjoints keep their replay
// buffer and checkpoints (every stride-th state) in device scratch, and sum event-value gradients over
// voxels with a warp reduction and one atomic per warp.
#pragma once

#include <cuda_runtime.h>

#include "blochsim/layouts.hpp"
#include "blochsim/unpack.hpp"

namespace bs {

// Warp-wide operations on a float, applied to every float of a number (value and tangents, re and im).
// The sum over an aligned group of LANES lanes (the whole warp at 32): the xor partners below LANES stay in
// the group, so a warp of groups sums each of its voxels at once.
template <int LANES>
struct LanesSum {
  __device__ float operator()(float x) const {
    for (int o = LANES / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
};
using WarpSum = LanesSum<32>;
struct GroupSum {  // LanesSum over a run-time group of `lanes` (a power of 2, the same on every lane of the warp)
  int lanes;
  __device__ float operator()(float x) const {
    for (int o = lanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
};
struct FromLaneBelow {  // lane l gets lane l - 1's value (lane 0 of each group of `width` its own)
  int width = 32;
  __device__ float operator()(float x) const { return __shfl_up_sync(0xffffffffu, x, 1, width); }
};
struct FromLaneAbove {  // lane l gets lane l + 1's value (the group's last lane its own)
  int width = 32;
  __device__ float operator()(float x) const { return __shfl_down_sync(0xffffffffu, x, 1, width); }
};
template <class F>
__device__ __forceinline__ float each_float(float x, F f) {
  return f(x);
}
template <class R, int P, class F>
__device__ __forceinline__ Dual<R, P> each_float(Dual<R, P> x, F f) {
  x.v = f(x.v);
  for (int p = 0; p < P; ++p) x.d[p] = f(x.d[p]);
  return x;
}
template <class T, class F>
__device__ __forceinline__ Cx<T> each_float(Cx<T> x, F f) {
  return Cx<T>{each_float(x.re, f), each_float(x.im, f)};
}
template <class N>
__device__ __forceinline__ N warp_sum(N x) {
  return each_float(x, WarpSum{});
}

// Event-value gradients: each warp reduces its voxels' terms and adds them with one atomic. A warp holds one
// voxel (32 lanes), a group's 4 or 8 voxels, or 32 voxels (a thread each): the warp's sum is theirs alike.
template <class N>
struct DeviceEventGrad {
  using R = typename Num<N>::Real;
  R* out[4];      // dt [E], flip [E], phase [E], dt_wrap [1]
  R* out_tan[4];  // the same, tangents (second-order adjoint), or null
  bool active;    // false for the padding threads (or groups of lanes) of the last warp
  int voxel_lanes = 1;  // lanes a voxel: vjp_warp_kernel's 32 (a warp) or 8 (a group), else 1 (add_table)
  __device__ void add(int kind, int64_t e, const N& x) const {
    // Gradients not asked for cost no reduction (the same on every lane: the warp skips it together).
    bool wanted = out[kind] != nullptr;
    if constexpr (Num<N>::P > 0) wanted = wanted || out_tan[kind] != nullptr;
    if (!wanted) return;
    const N y = warp_sum(active ? x : N(0));
    if ((threadIdx.x & 31) != 0) return;
    const int64_t i = kind == kGradDtWrap ? 0 : e;
    if (out[kind]) atomicAdd(out[kind] + i, value_of(y));
    if constexpr (Num<N>::P > 0) {
      if (out_tan[kind]) atomicAdd(out_tan[kind] + i, y.d[0]);
    }
  }
  // x, a lane's share of r[j], a table cotangent held once a voxel (table_grad_at: the saturation table's):
  // a warp or group per voxel sums its lanes' shares and its first lane adds them (every lane of the warp
  // calls this at the same event: the train is the same for every voxel); a thread per voxel adds its own.
  __device__ void add_table(Ref<N> r, int64_t j, const N& x) const {
    if (voxel_lanes == 1) {
      r[j] += x;
      return;
    }
    const N y = each_float(x, GroupSum{voxel_lanes});
    if ((threadIdx.x & (voxel_lanes - 1)) == 0 && active) r[j] += y;
  }
};

// Pool model 0 as a compile-time fact (one pool, no tables); physics still read at run time.
template <class R>
__device__ __forceinline__ void model0_layout(Problem<R>& pb) {
  pb.nt = 1;
  pb.nl = 1;
  pb.tabulated = false;
}
// Model 0 with every order relaxing alike (no diffusion, flow or washout: plain_orders) as compile-time
// facts, so the order loops lose their order-dependent branches (launches take these kernels only for such
// problems).
template <class R>
__device__ __forceinline__ void plain_layout(Problem<R>& pb) {
  model0_layout(pb);
  pb.diffusion = pb.flow = pb.washout = false;
}

// A warp or group kernel's compile-time layout (launch_rules.hpp kModel0 ...) on the problem it reads.
template <int LAYOUT, class R>
__device__ __forceinline__ void apply_layout(Problem<R>& pb) {
  if constexpr (LAYOUT == kModel0) {
    model0_layout(pb);
  } else if constexpr (LAYOUT == kPlain) {
    plain_layout(pb);
  } else if constexpr (LAYOUT > kTables) {
    pb.nt = layout_nt(LAYOUT);
    pb.nl = layout_nl(LAYOUT);
  }
  // The pool layouts are launched for tabulated problems only: a compile-time fact, so the steps' and
  // equilibrium_state's table reads lose their run-time branch.
  if constexpr (tabulated_layout(LAYOUT)) pb.tabulated = true;
}

// Fix the layout at compile time where it is: plain model 0 with KC orders (KC = 0: keep the runtime
// count and physics).
template <int KC, class R>
__device__ __forceinline__ Problem<R> specialise(Problem<R> pb) {
  if constexpr (KC > 0) {
    pb.K = KC;
    plain_layout(pb);
  }
  return pb;
}

__device__ __forceinline__ int64_t launched_threads() { return int64_t(gridDim.x) * blockDim.x; }
// A thread's states in device scratch (launch_rules.hpp sizes it: per_thread elements for each thread
// launched, whole warps): a warp's threads interleave in a tile of their own, element i of lane l at 32 i + l
// of it, so a warp touches 32 consecutive elements and a thread's element i lies a compile-time 32 i
// elements from its first. Interleaved over every thread launched (element i at i * threads + t, a run-time
// stride) the K = 32 register adjoint held a 64-bit address per element of a state in registers, and
// spilled: sm_90, 5,492 -> 1,068 bytes of spill stores (and 2,316 -> 184 without the general path).
template <class S>
__device__ __forceinline__ Ref<S> thread_scratch(S* scratch, int64_t thread, int64_t per_thread) {
  const int64_t lane = thread & 31;
  return Ref<S>{scratch + (thread - lane) * per_thread + lane, 32};
}

// ---- events decoded once per launch (the value forward) ------------------------------------------------
// Before a value forward, decode_events_kernel decodes the train kBlockEvents events at a time (BlockEvent,
// layouts.hpp): the event's values and what every voxel would compute alike, the ADC's demodulation
// and, where B1 and its phase are uniform over the voxels, the RF rotation (its sine and cosine), and
// folds them. A voxel's event then costs its order work and its relaxation factors. Without the table (the
// CUDA 12 launcher) each block decodes and folds the chunks itself, in shared memory: on the real 1M forward
// the block's warps then waited at its barriers a third of their cycles (ncu, H200, 2026-12-03). Tangent
// types (JVP) load their events per voxel.

// Whether event `next` can join the events folded into `head` (one step_forward then does both): it has
// no interval, crusher ahead or pulse, `head` nothing after its sample, and at most one of them samples.
// step_forward's order (interval, crusher, pulse, sample, what follows) is then that of the two events.
template <class N>
__device__ __forceinline__ bool folds_into(const EventValues<N>& head, const EventValues<N>& next) {
  constexpr int ahead = BS_INTERVAL | BS_CRUSH_BEFORE | BS_INVERSION | BS_ROTATE;
  constexpr int after = BS_SPOIL_AFTER | BS_CRUSH_AFTER | BS_SHIFT_AFTER;
  return !(next.action & ahead) && !(head.action & after) && (head.record < 0 || next.record < 0);
}

// Fold each run of events that folds_into its first into that first event, in place: a sample, or a
// crusher after the readout, rides on the pulse before it (an MRF repetition: 3 events become 1). Returns
// the events left. One thread runs it.
template <class N>
__device__ __forceinline__ void fold_into(BlockEvent<N>& head, const BlockEvent<N>& next) {
  head.ev.action |= next.ev.action;
  if (next.ev.record >= 0) {
    head.ev.record = next.ev.record;
    head.ev.last_rep = next.ev.last_rep;
    head.turn = next.turn;
  }
}
template <class N>
__device__ int fold_events(BlockEvent<N>* table, int count) {
  int heads = 0;
  for (int j = 0; j < count; ++j) {
    if (heads > 0 && folds_into(table[heads - 1].ev, table[j].ev)) {
      fold_into(table[heads - 1], table[j]);
    } else {
      if (heads != j) table[heads] = table[j];
      ++heads;
    }
  }
  return heads;
}

// One event decoded: its values, the ADC's demodulation and, with B1 uniform, the RF rotation.
template <class N, class S, class R>
__device__ __forceinline__ void decode_event(const Problem<R>& pb, int64_t i, BlockEvent<N>& b) {
  constexpr bool complex_path = !std::is_same<S, N>::value;
  b.ev = load_event<N>(pb, i);
  if (uniform_pulse(pb)) {
    const N b1 = fetch<N>(pb.tissue[BS_B1], 0), b1phase = fetch<N>(pb.tissue[BS_B1_PHASE_RAD], 0);
    b.rotation = make_rotation(b.ev.flip * b1, b.ev.phase + b1phase, complex_path);
  }
  b.turn = cis(-b.ev.phase);
}

template <class N>
__device__ __forceinline__ const int* event_counts(const BlockEvent<N>* table, int64_t chunks) {
  return reinterpret_cast<const int*>(table + chunks * kBlockEvents);
}
template <class N>
__device__ __forceinline__ const int* event_starts(const BlockEvent<N>* table, int64_t chunks) {
  return event_counts(table, chunks) + chunks;
}

// Decode the chunk of events from i0 into shared memory and fold it (`folded`: the events left, in shared
// memory). Every thread of the block calls it; it ends on a barrier.
template <class N, class S, class R>
__device__ __forceinline__ void decode_chunk(const Problem<R>& pb, int64_t i0, BlockEvent<N>* chunk, int& folded) {
  const int64_t n = pb.E * pb.reps;
  const int count = n - i0 < kBlockEvents ? int(n - i0) : kBlockEvents;
  for (int j = threadIdx.x; j < count; j += blockDim.x) decode_event<N, S>(pb, i0 + j, chunk[j]);
  __syncthreads();
  if (threadIdx.x == 0) folded = fold_events(chunk, count);
  __syncthreads();
}

// Decode and fold the train once for a launch: a block of kBlockEvents threads per chunk. With `pulse_pairs`
// (pb.pulse_pairs, pulses.hpp pairs_per_launch) every thread of the grid, which may hold blocks past the
// chunks, also forms its share of the profiled pulses' rotations, a row per (event, position).
template <class N, class S, class R>
__global__ void __launch_bounds__(kBlockEvents)
    decode_events_kernel(const Problem<R> pb, BlockEvent<N>* table, R* pulse_pairs) {
  alignas(16) __shared__ unsigned char raw[kBlockEvents * sizeof(BlockEvent<N>)];  // no constructors in shared
  __shared__ int folded;
  if (pulse_pairs) {
    const int64_t threads = int64_t(gridDim.x) * blockDim.x, rows = pulse_pair_count(pb);
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows; i += threads)
      decode_pulse_pair(pb, i / pb.num_positions, i % pb.num_positions, pulse_pairs);
  }
  if (int64_t(blockIdx.x) >= event_chunks(pb)) return;  // (the whole block)
  BlockEvent<N>* const chunk = reinterpret_cast<BlockEvent<N>*>(raw);
  const int64_t i0 = int64_t(blockIdx.x) * kBlockEvents;
  decode_chunk<N, S>(pb, i0, chunk, folded);
  if (threadIdx.x == 0) {
    const_cast<int*>(event_counts(table, event_chunks(pb)))[blockIdx.x] = folded;
    const_cast<int*>(event_starts(table, event_chunks(pb)))[blockIdx.x] = 0;
  }
  if (int(threadIdx.x) < folded) table[i0 + threadIdx.x] = chunk[threadIdx.x];
}

// After decode_events_kernel: where chunk c's first event folds into chunk c - 1's last (a repetition cut by
// the chunk boundary: 64 events hold 21 MRF repetitions and a third), fold it there and start chunk c a slot
// later. A thread per boundary c; it writes chunk c - 1's last slot and chunk c's start, and reads chunk
// c's first: with two events or more in each chunk no other thread touches those. A boundary left as it is
// costs its chunk's consumers an event the register kernel takes for other than a shot.
template <class N>
__global__ void join_chunks_kernel(BlockEvent<N>* table, int64_t chunks) {
  const int64_t c = 1 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= chunks) return;
  const int* const counts = event_counts(table, chunks);
  const int before = counts[c - 1];
  if (before < 2 || counts[c] < 2) return;
  BlockEvent<N>& head = table[(c - 1) * kBlockEvents + before - 1];
  const BlockEvent<N>& first = table[c * kBlockEvents];
  if (!folds_into(head.ev, first.ev)) return;
  fold_into(head, first);
  const_cast<int*>(event_starts(table, chunks))[c] = 1;
}

// Before a real plain adjoint in groups with its pulses uniform: the train's events decoded once for the
// launch (event_loop.hpp PlainCode, plain_code), a thread an entry.
template <class N, class R>
__global__ void __launch_bounds__(128) decode_plain_events_kernel(const Problem<R> pb, PlainCode<N>* codes) {
  static_assert(std::is_same<N, R>::value, "entries in the problem's reals");
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e <= pb.E) codes[e] = plain_code(pb, e);
}

// Before a general adjoint in a group or warp per voxel (vjp_warp_kernel): every event decoded once for the
// launch (event_loop.hpp EventCode, event_code), a thread an entry; the second order reads their folds alone.
template <class N, class S, class R>
__global__ void __launch_bounds__(128) decode_general_events_kernel(const Problem<R> pb, EventCode<R>* codes) {
  static_assert(reads_event_codes<N, R>(), "entries in the problem's reals: the first order and the second");
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e < pb.E) codes[e] = event_code(pb, e, !std::is_same<S, N>::value);
}

// Chunk c of the launch's table (its `count` folded events from slot `start`) into shared memory at `to`,
// without waiting: cp.async (sm_80 on), so the copy runs behind the previous chunk's steps;
// async_copies_wait() ends it.
template <class N>
__device__ __forceinline__ void copy_chunk_async(const BlockEvent<N>* table, int64_t c, int start, int count,
                                                 void* to) {
  using Word = uint4;
  static_assert(sizeof(BlockEvent<N>) % sizeof(Word) == 0, "events copy in 16-byte words");
  const auto* from = reinterpret_cast<const Word*>(table + c * kBlockEvents + start);
  auto* words_to = static_cast<Word*>(to);
  const int words = count * int(sizeof(BlockEvent<N>) / sizeof(Word));
  for (int w = threadIdx.x; w < words; w += blockDim.x) {
#if __CUDA_ARCH__ >= 800
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(words_to + w));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(from + w) : "memory");
#else
    words_to[w] = from[w];
#endif
  }
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void async_copies_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// Run body(chunk, count) on the train's folded events (fold_events), a chunk at a time in shared memory:
// from the launch's table where there is one (chunk c + 1 copied while chunk c is stepped: two buffers),
// else decoded and folded by the block. Every thread of the block calls it (it synchronises the block).
template <class N, class S, class R, class Body>
__device__ __forceinline__ void for_each_chunk(const Problem<R>& pb, const Body& body) {
  alignas(16) __shared__ unsigned char raw[2][kBlockEvents * sizeof(BlockEvent<N>)];  // no constructors
  __shared__ int folded;
  const int64_t chunks = event_chunks(pb);
  const BlockEvent<N>* const table = static_cast<const BlockEvent<N>*>(pb.events);
  const int* const counts = table ? event_counts(table, chunks) : nullptr;
  const int* const starts = table ? event_starts(table, chunks) : nullptr;
  // The events of chunks c and c + 1 and the first slot of c + 1 (read a chunk before their use).
  int count = 0, after = 0, after_start = 0;
  if (table) {  // events read from global memory stall each voxel's step on their latency: a copy
    count = counts[0];  // (chunk 0 starts at its slot 0)
    after_start = chunks > 1 ? starts[1] : 0;
    after = chunks > 1 ? counts[1] - after_start : 0;
    copy_chunk_async(table, 0, 0, count, raw[0]);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const BlockEvent<N>* chunk = reinterpret_cast<const BlockEvent<N>*>(raw[table ? c & 1 : 0]);
    int next = 0;
    if (table) {
      next = after;
      const int next_start = after_start;
      after_start = c + 2 < chunks ? starts[c + 2] : 0;
      after = c + 2 < chunks ? counts[c + 2] - after_start : 0;
      async_copies_wait();
      __syncthreads();  // chunk c is in, and every step of chunk c - 1 (the other buffer) is done
      if (next > 0) copy_chunk_async(table, c + 1, next_start, next, raw[(c + 1) & 1]);
    } else {
      __syncthreads();  // the previous chunk is read
      decode_chunk<N, S>(pb, c * kBlockEvents, reinterpret_cast<BlockEvent<N>*>(raw[0]), folded);
      count = folded;
    }
    body(chunk, count);
    count = next;
  }
}

template <class N>
__device__ __forceinline__ EventValues<N> chunk_event(const BlockEvent<N>* chunk, int j, bool uniform) {
  EventValues<N> ev = chunk[j].ev;
  ev.rotation = uniform ? &chunk[j].rotation : nullptr;
  ev.turn = &chunk[j].turn;
  return ev;
}

// Run step(ev) on the train's events in order, folded (fold_events) on the value forward, a chunk at a time
// in shared memory (for_each_chunk). Every thread of the block calls it; `active`: whether this thread
// steps.
template <class N, class S, class R, class Step>
__device__ __forceinline__ void for_each_event(const Problem<R>& pb, bool active, const Step& step) {
  if constexpr (Num<N>::P > 0) {
    if (!active) return;
    for (int64_t rep = 0; rep < pb.reps; ++rep)
      for (int64_t e = 0; e < pb.E; ++e) step(load_event<N>(pb, rep, e));
  } else {
    const bool uniform = uniform_pulse(pb);
    for_each_chunk<N, S>(pb, [&](const BlockEvent<N>* chunk, int count) {
      if (!active) return;
      for (int j = 0; j < count; ++j) step(chunk_event(chunk, j, uniform));
    });
  }
}

// What plain_event reads of a chunk's event, copied into registers (the rotation's four factors the real
// path uses, with B1 uniform).
template <class N>
struct HeldEvent {
  EventValues<N> ev;
  Rotation<N> rotation;
  Cx<N> turn;
};
template <class N>
__device__ __forceinline__ HeldEvent<N> hold_event(const BlockEvent<N>* chunk, int j, bool uniform) {
  HeldEvent<N> h;
  h.ev = chunk[j].ev;
  if (uniform) {
    const Rotation<N>& r = chunk[j].rotation;
    h.rotation.ca = r.ca;
    h.rotation.sa = r.sa;
    h.rotation.s2 = r.s2;
    h.rotation.half_sa = r.half_sa;
  }
  h.turn = chunk[j].turn;
  return h;
}

// A shot: an interval, a pulse and one shift after it (a crusher or a gradient), nothing else but a sample:
// each repetition of an MRF or FISP train, once folded (fold_events). After a shot the carried state is one
// shift and no spoiler (Deferral{1, false}), so a shot after a shot is one shifted pass and its sample
// (step_shot): no branch on the event's action or on the carried shifts.
__device__ __forceinline__ bool shot_event(const int32_t action) {
  constexpr int32_t kPass = BS_INTERVAL | BS_ROTATE;
  constexpr int32_t kOther = BS_INVERSION | BS_CRUSH_BEFORE | BS_SPOIL_AFTER;
  const int32_t after = action & (BS_CRUSH_AFTER | BS_SHIFT_AFTER);
  return (action & (kPass | kOther)) == kPass && (after == BS_CRUSH_AFTER || after == BS_SHIFT_AFTER);
}
template <class N, class IO>
__device__ __forceinline__ void step_shot(const PlainEvent<N>& pe, State<N> x, State<N> tmp, IO* io) {
  const RelaxRotate<N> q = relax_rotate_factors(pe.E1, pe.E2, pe.ca, pe.sa, pe.s2, pe.half_sa);
  relax_rotate<1>(tmp.water(0), x.water(0), x.K, q);
  copy_state(x, tmp);
  if (io->signal && pe.record >= 0) io->put(pe.record, transverse(x.fp(0)[0]) * pe.turn);
}

// Which of a chunk's events step_forward_plain takes (bit j: event j), step_shot the rest: those that are
// not shots, the shot after each of those (it meets the state that event left), and the first unless the
// chunk before ended on a shot (`after_shot`). Every thread of the block calls it (it synchronises the
// block; blocks of whole warps).
template <class N>
__device__ __forceinline__ uint64_t events_not_shot(const BlockEvent<N>* chunk, int count, bool after_shot) {
  static_assert(kBlockEvents == 64, "a bit per event of a chunk");
  __shared__ unsigned others[2];  // a bit per event that is not a shot
  for (int j = threadIdx.x; j < kBlockEvents; j += blockDim.x) {
    const unsigned word = __ballot_sync(0xffffffffu, j < count && !shot_event(chunk[j].ev.action));
    if ((j & 31) == 0) others[j / 32] = word;
  }
  __syncthreads();
  const uint64_t other = others[0] | uint64_t(others[1]) << 32;
  return other | other << 1 | (after_shot ? 0 : 1);
}
// The first event at or after `from` whose bit is set (count: none).
__device__ __forceinline__ int next_event(uint64_t events, int from, int count) {
  const uint64_t after = from < 64 ? events & ~uint64_t(0) << from : 0;
  return after ? min(__ffsll(static_cast<long long>(after)) - 1, count) : count;
}

// The real register kernel's events, pipelined: event j + 1's values are read from shared memory before
// event j's pass and taken apart (plain_event) after it, so the loads' latency hides behind the pass.
// Read and used at once, the warps (three per scheduler) waited on those loads for a fifth of their cycles
// (ncu source counters, 2026-12-03). step(pe, shot): shot is std::true_type for a shot after a shot
// (events_not_shot; with B1 uniform), whose loop asks nothing of an event's action.
template <class N, class R, class Step>
__device__ __forceinline__ void for_each_plain_event(const Problem<R>& pb, const Voxel<N>& t, bool active,
                                                     const Step& step) {
  static_assert(Num<N>::P == 0, "the register kernel runs the value forward (launch_rules.hpp registers_layout)");
  const bool uniform = uniform_pulse(pb);
  const auto values = [&](const HeldEvent<N>& h) {
    const EventValues<N>& ev = h.ev;
    return plain_event(
        t, ev, [&] { return make_decay(pb, t, ev.dt); },
        [&] { return uniform ? h.rotation : make_rotation(ev.flip * t.b1, ev.phase + t.b1phase, false); },
        [&] { return h.turn; });
  };
  bool after_shot = false;  // the chunk before ended on a shot (the same on every thread)
  for_each_chunk<N, N>(pb, [&](const BlockEvent<N>* chunk, int count) {
    const uint64_t general = uniform ? events_not_shot(chunk, count, after_shot) : ~uint64_t(0);
    if (count > 0) after_shot = shot_event(chunk[count - 1].ev.action);
    if (!active || count == 0) return;
    for (int j = 0; j < count;) {  // a run of other events (none at a chunk that goes on shooting), then shots
      HeldEvent<N> held = hold_event(chunk, j, uniform);
      PlainEvent<N> pe = values(held);  // (the run of shots before took this event for a shot)
      for (const int shots = next_event(~general, j, count); j < shots; ++j) {
        held = hold_event(chunk, min(j + 1, count - 1), uniform);
        step(pe, std::false_type());
        pe = values(held);
      }
      // The shots' exponentials, taken again while the interval's length repeats (one TR through a train):
      // the two exponentials were a twentieth of an event's instructions (sm_90 SASS, K = 32). Kept for a
      // run of shots alone: held through the other events too, they left the register kernel registers
      // short (spilled).
      N dt_held = N(NAN);
      Decay<N> decay_held{};
      const auto shot_values = [&](const HeldEvent<N>& h) {  // plain_event of a shot, B1 uniform
        if (!(h.ev.dt == dt_held)) {
          dt_held = h.ev.dt;
          decay_held = make_decay(pb, t, h.ev.dt);
        }
        const Rotation<N>& r = h.rotation;
        const int32_t record = h.ev.last_rep ? h.ev.record : -1;
        return PlainEvent<N>{h.ev.action, record, decay_held.E1, decay_held.E2, r.ca, r.sa, r.s2, r.half_sa,
                             h.turn * t.m0};
      };
      for (const int others = next_event(general, j, count); j < others; ++j) {
        held = hold_event(chunk, min(j + 1, count - 1), true);
        step(pe, std::true_type());
        pe = shot_values(held);
      }
    }
  });
}

// The real register kernel's samples, kept in shared memory and written kStaged at a time. A global store
// holds its registers until the memory pipeline takes it, a warp's 32 voxels' samples lying 8 S bytes apart,
// and the next event's values reused them at once: a twelfth of the warps' cycles waited there (ncu source
// counters, 2026-12-03). A burst of stores waits once. Shared: [kStaged][kRow], a column per thread.
// A whole warp's burst of consecutive samples (a train's, one per event) is written across the warp: each
// store covers 32 / kStaged voxels' kStaged samples, whole 32-byte sectors, where a thread's own stores put 8
// bytes into each of 32 sectors (the L2 at 73 % of its throughput at 1M voxels, ncu 2026-12-03).
// It is the kernel's SampleIO with put() kept back (step_forward_plain reads its `signal` as it is).
struct StagedSamples : SampleIO<float> {
  static constexpr int kStaged = 8;
  static constexpr int kMaxThreads = 128;  // the kernel's largest block (threads_for)
  // A row's stride: 4 float2 over the block, so the warp's read of kStaged rows of 4 columns meets every
  // bank once per 256 bytes.
  static constexpr int kRow = kMaxThreads + 4;
  float2* values;  // this thread's column
  int* records;
  int64_t samples;  // a voxel's (its row of the signal)
  int n = 0, first = 0;
  bool consecutive = true;  // records first, first + 1, ... (the same on every thread: one train)
  __device__ void put(int64_t s, const Cx<float>& x) {
    values[n * kRow] = make_float2(x.re, x.im);
    records[n * kRow] = int(s);
    if (n == 0) first = int(s);
    consecutive = consecutive && int(s) == first + n;
    if (++n == kStaged) {
      if (consecutive && __activemask() == 0xffffffffu) {
        write_across_warp();
      } else {
        BS_UNROLL
        for (int i = 0; i < kStaged; ++i) write(i);
      }
      n = 0;
      consecutive = true;
    }
  }
  // Every lane of the warp is here, each voxel v = its thread's (forward_kernel), base = v * samples.
  __device__ void write_across_warp() const {
    constexpr int kVoxels = 32 / kStaged;  // per store
    const int lane = threadIdx.x & 31, voxel = lane / kStaged, i = lane % kStaged;
    const float2* from = values - lane + i * kRow + voxel;
    float2* to = reinterpret_cast<float2*>(signal) + (base + (voxel - lane) * samples + first + i);
    const int64_t step = kVoxels * samples;
    __syncwarp();  // the warp's columns are written
    BS_UNROLL
    for (int q = 0; q < kStaged; ++q, to += step) to[0] = from[q * kVoxels];
    __syncwarp();  // read before the next burst writes them
  }
  __device__ void write(int i) const {
    const float2 v = values[i * kRow];
    SampleIO<float>::put(records[i * kRow], Cx<float>(v.x, v.y));
  }
  __device__ void flush() {
    for (int i = 0; i < n; ++i) write(i);
    n = 0;
  }
};

// Threads past the last voxel (the last block's padding) take part in the block's event copies and step
// nothing. The real register kernel (K = 32) is held to 168 registers, three blocks per multiprocessor:
// 27.2 vs 28.9 ms at 1M voxels on the H200 (2026-12-03), against 211 registers and two. Four blocks (128
// registers) spill: 54 vs 21 ms once events were folded; with one pass per event and the launch's event
// table, 14.2-14.4 vs 13.1-13.4 ms (benchmarks/results/mapping/plain-pass-variants-*).
template <class N, class S, int KC>
constexpr int forward_blocks_per_sm() {
  return KC > 0 && std::is_same<N, S>::value ? 3 : 1;
}
template <class N, class S, int KC, class R>
__global__ void __launch_bounds__(128, (forward_blocks_per_sm<N, S, KC>()))
    forward_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io, S* scratch) {
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const bool active = thread < V;
  const int64_t v = active ? thread : V - 1;
  const Problem<R> pb = specialise<KC>(pb_in);
  io.base = v * pb.S;
  S work[KC > 0 ? 6 * KC : 1];  // the state and step_forward_plain's second
  const Ref<S> states = KC > 0 ? Ref<S>{work, 1} : thread_scratch(scratch, thread, state_size(pb));
  const State<S> x = state_at(pb, states, 0);
  equilibrium_state<S, N>(pb, v, x);
  const Voxel<N> t = load_voxel<N>(pb, v);
  Deferral defer;  // the register kernel's layout is plain (specialise): its shifts commute with intervals
  Deferral* const deferred = KC > 0 ? &defer : nullptr;
  if constexpr (KC > 0 && std::is_same<N, S>::value) {
    const auto run = [&](auto* samples) {
      for_each_plain_event(pb, t, active, [&](const PlainEvent<N>& pe, auto shot) {
        if constexpr (decltype(shot)::value)
          step_shot(pe, x, state_at(pb, states, 1), samples);
        else
          step_forward_plain(pe, x, state_at(pb, states, 1), samples, defer);
      });
    };
    if constexpr (std::is_same<N, float>::value) {
      constexpr int kSlots = StagedSamples::kStaged * StagedSamples::kRow;
      __shared__ float2 staged_values[kSlots];
      __shared__ int staged_records[kSlots];
      StagedSamples staged{{io}, staged_values + threadIdx.x, staged_records + threadIdx.x, pb.S};
      run(&staged);
      if (active) staged.flush();
    } else {
      run(&io);
    }
  } else {
    for_each_event<N, S>(pb, active, [&](const EventValues<N>& ev) {
      step_forward(pb, v, t, ev, x, &io, LocalShift(), static_cast<const State<S>*>(nullptr), deferred);
    });
  }
}

// A thread per voxel. DECODED (vjp_decoded_kernel): the register adjoint (KC = 32, the real plain path) reading
// the events as the launch decoded them (pb.plain_events; launch_rules.hpp decoded_plain_events).
template <class N, class S, int KC, bool DECODED, class R>
__device__ __forceinline__ void vjp_thread(const Problem<R>& pb_in, int64_t V, SampleIO<N> io, DeviceEventGrad<N> eg,
                                           GradOut<R> out, S* scratch, N* table_scratch) {
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const bool active = thread < V;
  const int64_t v = active ? thread : V - 1;  // padding threads replay the last voxel and write nothing
  const Problem<R> pb = specialise<KC>(pb_in);
  eg.active = active;
  io.base = v * pb.S;
  if (!active) {
    io.signal = nullptr;
    out = GradOut<R>{};
  }
  const Ref<S> mine = thread_scratch(scratch, thread, device_scratch_per_voxel(pb, true, KC > 0, plain_adjoint<N, S>(pb)));
  const TableGrad<N> tg = table_grad_at(pb, out, table_scratch, thread, launched_threads());
  if constexpr (KC > 0) {
    S work[3 * 3 * KC];
    vjp_voxel_out<N, S, true, DECODED>(pb, v, Ref<S>{work, 1}, mine, tg, io, eg, out);
  } else {
    vjp_voxel_out<N, S>(pb, v, mine, mine + 3 * state_size(pb), tg, io, eg, out);
  }
}
template <class N, class S, int KC, class R>
__global__ void __launch_bounds__(128) vjp_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io,
                                                  DeviceEventGrad<N> eg, GradOut<R> out, S* scratch,
                                                  N* table_scratch) {
  vjp_thread<N, S, KC, false>(pb_in, V, io, eg, out, scratch, table_scratch);
}
template <class N, class S, int KC, class R>
__global__ void __launch_bounds__(128) vjp_decoded_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io,
                                                          DeviceEventGrad<N> eg, GradOut<R> out, S* scratch,
                                                          N* table_scratch) {
  static_assert(KC == 32 && std::is_same<N, R>::value && std::is_same<N, S>::value, "the register adjoint");
  vjp_thread<N, S, KC, true>(pb_in, V, io, eg, out, scratch, table_scratch);
}

// ---- warp per voxel: orders across lanes ---------------------------------------------------------------
// A warp simulates one voxel; lane l holds orders l * KPL .. l * KPL + KPL - 1 of every plane, in registers
// (pool model 0) or in the lane's own local array (tabulated layouts, whose plane count is read at run time).
// Per-event values and per-voxel tables are read by all lanes at one address (a broadcast); the shift moves
// one order between neighbouring lanes with a shuffle. Forward and JVP (N a Dual) for every layout; the
// adjoints (VJP, and VJP-JVP with N a Dual) for pool model 0, each lane keeping its own checkpoints.
// F+(k) -> F+(k+1), F-(k) -> F-(k-1) across the warp; orders >= K drop out; new F+(0) = conj(new F-(0)).
// A voxel may also take a group of `lanes` (4, 8: the value forward, and the pool-model-0 adjoints, with
// several orders per lane, see forward_warp_kernel and vjp_warp_kernel); lane is then the lane within the
// group.
struct WarpShift {
  static constexpr bool kCounted = false;  // see shift_pools
  static constexpr bool kWhole = false;    // a lane's orders (event_loop.hpp LocalShift)
  int lane;
  int64_t K;  // orders of the voxel
  int lanes = 32;
  bool samples = true;  // the plain steps' (event_loop.hpp lane_puts_sample): false in a padding group
  template <class S>
  __device__ void operator()(Planes<S> x, int64_t kpl) const {
    const S up = each_float(x.p[kpl - 1], FromLaneBelow{lanes});
    const S down = each_float(x.m[0], FromLaneAbove{lanes});
    BS_UNROLL
    for (int64_t j = kpl - 1; j > 0; --j) x.p[j] = x.p[j - 1];
    x.p[0] = up;
    BS_UNROLL
    for (int64_t j = 0; j < kpl - 1; ++j) x.m[j] = x.m[j + 1];
    x.m[kpl - 1] = lane == lanes - 1 ? S(0) : down;
    BS_UNROLL
    for (int64_t j = 0; j < kpl; ++j)
      if (lane * kpl + j >= K) x.p[j] = x.m[j] = S(0);
    if (lane == 0) x.p[0] = conj(x.m[0]);
  }
};

// The adjoint of WarpShift: lambda(F+(0)) feeds lambda(F-(0)) (conjugated) and leaves; orders >= K hold no
// lambda; lambda(F+) moves down an order and lambda(F-) up, across the lanes of the voxel's warp or group
// (`lanes`; lane is then the lane within the group).
struct WarpShiftAdjoint {
  int lane;
  int64_t K;
  int lanes = 32;
  template <class S>
  __device__ void operator()(Planes<S> l, int64_t kpl) const {
    if (lane == 0) {
      l.m[0] += conj(l.p[0]);
      l.p[0] = S(0);
    }
    BS_UNROLL
    for (int64_t j = 0; j < kpl; ++j)
      if (lane * kpl + j >= K) l.p[j] = l.m[j] = S(0);
    const S up = each_float(l.p[0], FromLaneAbove{lanes});
    const S down = each_float(l.m[kpl - 1], FromLaneBelow{lanes});
    BS_UNROLL
    for (int64_t j = 0; j < kpl - 1; ++j) l.p[j] = l.p[j + 1];
    l.p[kpl - 1] = lane == lanes - 1 ? S(0) : up;
    BS_UNROLL
    for (int64_t j = kpl - 1; j > 0; --j) l.m[j] = l.m[j - 1];
    l.m[0] = lane == 0 ? S(0) : down;
  }
};

// The complex plain kernel in groups of 4 is held to 96 registers, five blocks per multiprocessor: 6.4 vs
// 9.2 ms for the complex forward at 100k voxels on the H200 (2026-12-03, events folded), against 128
// registers and four (six blocks, 80 registers: 6.7 ms).
template <class N, class S, int LAYOUT, int LANES>
constexpr int group_blocks_per_sm() {
  return LAYOUT == kPlain && LANES == 4 && !std::is_same<N, S>::value ? 5 : 1;
}

// LANES lanes per voxel (32: a warp; 4 or 8: a group of a warp, several orders per lane). Groups past the
// last voxel replay it and write nothing: every lane of a warp takes part in its shuffles. LAYOUT: see
// apply_layout.
template <class N, class S, int KPL, int LAYOUT, int LANES, class R>
__global__ void __launch_bounds__(128, (group_blocks_per_sm<N, S, LAYOUT, LANES>()))
    forward_warp_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io) {
  const int lane = threadIdx.x & (LANES - 1);
  const int64_t group = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / LANES;
  const bool active = group - (threadIdx.x & 31) / LANES < V;  // whole warps past the last voxel only decode
  const int64_t v = group < V ? group : V - 1;
  if (group >= V) io.signal = io.signal_tan = nullptr;
  Problem<R> pb = pb_in;
  apply_layout<LAYOUT>(pb);
  S work[layout_planes(LAYOUT) * KPL];
  const State<S> x{Ref<S>{work, 1}, KPL, pb.nt, pb.nl, int64_t(lane) * KPL};
  equilibrium_state<S, N>(pb, v, x);
  io.base = v * pb.S;
  const Voxel<N> t = load_voxel<N>(pb, v);
  const WarpShift shift{lane, pb.K, LANES};
  Deferral defer;  // plain: the shifts commute with intervals
  Deferral* const deferred = LAYOUT == kPlain ? &defer : nullptr;
  for_each_event<N, S>(pb, active, [&](const EventValues<N>& ev) {
    if constexpr (Num<N>::P > 0 && LAYOUT == kPlain && (KPL == 4 || KPL == 8)) {
      // The dual JVP in groups of 8: the lane's state made here with its order count a literal, so the
      // step's order loops unroll and the state stays in registers (ptxas sm_90, Dual<float, 2>: 128
      // registers and no stack, against 89 registers and a 176-byte local array with x's count, which
      // nvcc does not carry through the event loop's lambda for a dual number). The Jacobian alone at
      // 20k / 200k voxels: 3.9 / 34.7 ms against 10.7 / 92.7 (H100, launch_rules.hpp forward_lanes).
      const State<S> y{x.base, KPL, x.nt, x.nl, x.k0};
      if constexpr (!std::is_same<N, S>::value || KPL == 8) {
        // nvcc keeps this lambda a function of its own for the complex dual and for 8 orders a lane, and the
        // kernel's constants do not reach through its reference to pb: the layout's are set on a problem of
        // its own, and the complex JVP's absent per-voxel pulse rows (launch_rules.hpp jvp_groups), so the
        // pool tables', spinor and field branches compile out (ptxas sm_90, Dual<float, 2>: the complex
        // groups of 8 255 registers and no stack where 127 and a 5,040-byte frame; the real groups of 4, 8
        // orders a lane, 209 and none where 123 and a 4,752-byte local array). The real groups of 8 step pb
        // (their lambda inlined: a problem of their own moved their registers, 1,792 -> 1,784 instructions).
        Problem<R> plain = pb;
        apply_layout<LAYOUT>(plain);
        if constexpr (!std::is_same<N, S>::value) drop_pulse_rows(plain);
        step_forward(plain, v, t, ev, y, &io, shift, static_cast<const State<S>*>(nullptr), deferred);
      } else {
        step_forward(pb, v, t, ev, y, &io, shift, static_cast<const State<S>*>(nullptr), deferred);
      }
    } else {
      step_forward(pb, v, t, ev, x, &io, shift, static_cast<const State<S>*>(nullptr), deferred);
    }
  });
}

// A JVP in groups of lanes or a warp where no tangent reaches the events and the pulses are uniform over the voxels
// (event_loop.hpp values_decodable; chosen by the launch plan: launch_rules.hpp jvp_values): each voxel
// steps the entries the launch decoded once (EventCode: values, folds, the pulse's rotation, the sample's
// demodulation) and turns its dual states by real rotations (kValues), where forward_warp_kernel's voxels
// load each event's values and form its rotation from dual angles, an MRF repetition three steps where a
// fold is one. No block barrier: whole warps past the last voxel return.
template <class N, class S, int KPL, int LAYOUT, int LANES, class R>
__global__ void __launch_bounds__(128, (group_blocks_per_sm<N, S, LAYOUT, LANES>()))
    forward_values_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io) {
  static_assert(Num<N>::P > 0, "a JVP (launch_rules.hpp jvp_values)");
  const int lane = threadIdx.x & (LANES - 1);
  const int64_t group = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / LANES;
  if (group - (threadIdx.x & 31) / LANES >= V) return;  // whole warps
  const int64_t v = group < V ? group : V - 1;
  if (group >= V) io.signal = io.signal_tan = nullptr;
  Problem<R> pb = pb_in;
  apply_layout<LAYOUT>(pb);
  drop_pulse_rows(pb);  // (values_decodable)
  S work[layout_planes(LAYOUT) * KPL];
  const State<S> x{Ref<S>{work, 1}, KPL, pb.nt, pb.nl, int64_t(lane) * KPL};
  equilibrium_state<S, N>(pb, v, x);
  io.base = v * pb.S;
  const Voxel<N> t = load_voxel<N>(pb, v);
  const WarpShift shift{lane, pb.K, LANES};
  Deferral defer;  // plain: the shifts commute with intervals
  Deferral* const deferred = LAYOUT == kPlain ? &defer : nullptr;
  const auto* const codes = static_cast<const EventCode<R>*>(pb.event_codes);
  for (int64_t i = 0, rep = 0, e = 0, n = pb.E * pb.reps; i < n;) {  // the folds' heads (event 0 is one)
    const auto ev = decoded_event<N>(pb, codes, rep, e, true);
    const int64_t steps = codes[e].span;
    i += steps;
    if ((e += steps) == pb.E) {
      e = 0;
      ++rep;
    }
    step_forward(pb, v, t, ev, x, &io, shift, static_cast<const State<S>*>(nullptr), deferred);
  }
}

// Adjoint with LANES lanes per voxel: a warp (32, one or two orders a lane) or a group of 8 or 4 lanes (pool
// model 0 up to 32 orders: 4 or 8 orders a lane, so a warp carries 4 or 8 voxels and each event's scalar
// work, relaxation factors and rotation, is shared by them where a warp per voxel repeats it on 32 lanes
// for one). Each lane runs the checkpointed adjoint on its orders (its work states in registers, or for
// the tabulated layouts in its local array; its checkpoints, replay buffer and table cotangents interleaved
// in device scratch by lane, but the saturation table's, summed over the warp as each event forms it and
// held once a voxel: DeviceEventGrad add_table), the event-value gradients are summed over the warp by
// DeviceEventGrad, the tissue and table gradients over the voxel's lanes here. Groups past the last voxel
// replay it and write nothing (every lane of a warp takes part in its shuffles); whole warps past it return.
template <int LANES>
struct LanesTotal {
  template <class N>
  __device__ N operator()(const N& x) const {
    return each_float(x, LanesSum<LANES>{});
  }
};

// A group's tissue gradients of voxel v: each lane's share summed over the group's LANES lanes, written by
// `writer` (the group's first lane, where the group holds a voxel). Every lane calls it (the sums shuffle).
template <int LANES, class N, class R>
__device__ __forceinline__ void write_group_tissue_gradients(const VoxelGrad<N>& g, const Voxel<N>& t,
                                                             const GradOut<R>& out, int64_t v, bool writer) {
  N per_param[BS_NUM_TISSUE];
  tissue_gradients(g, t, per_param);
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    if (!out.tissue[j] && !out.tissue_tan[j]) continue;  // the same on every lane
    const N total = LanesTotal<LANES>{}(per_param[j]);
    if (!writer) continue;
    if (out.tissue[j]) out.tissue[j][v] = value_of(total);
    if constexpr (Num<N>::P > 0) {
      if (out.tissue_tan[j]) out.tissue_tan[j][v] = total.d[0];
    }
  }
}

// The complex adjoint a voxel a warp (one order a lane, pool model 0) is held to the 128 registers and four
// blocks a multiprocessor it was measured at: its rotation adjoint from nine sums over the orders (epg.hpp)
// asked ptxas for 149 (three blocks), and fits 128 without spilling. Its second order (Cx<Dual<float, 1>>)
// is held to three blocks: 168 registers and 408 bytes of spill stores against 255 and two blocks (1,584
// voxels resident against 1,056 on an H100), and 13-14 % faster for it (H100, through the API, alternated:
// complex HVP 5k 63.4-63.9 -> 55.5 ms, 20k 257.3-257.7 -> 222.1-222.3; peak at 5k 216.7 -> 276.7 MiB, the
// incumbent's 410; benchmarks/results/mapping/api_cases-NVIDIA_H100_80GB_HBM3-2026-12-05-s17c-*). 0: no
// minimum, ptxas's own choice (as with no second argument; an explicit 1 lets it take up to 255 registers,
// which it then does).
// The real first order's warp over the pool tables (the pooled gradient) is held to the 128 registers and four
// blocks ptxas chose for it before its walks read decoded events (without a bound 168 and three blocks for the
// (2, 3) pools); not with more than seven planes (the (4, 5) pools' took 255 registers, and spilled at 128).
template <class N, class S, int KPL, int LAYOUT, int LANES>
constexpr int adjoint_lanes_blocks_per_sm() {
  constexpr bool warp_of_model0 = KPL == 1 && (LAYOUT == kModel0 || LAYOUT == kPlain) && LANES == 32;
  constexpr bool complex_first = std::is_same<N, float>::value && std::is_same<S, Cx<float>>::value;
  constexpr bool complex_second = Num<N>::P == 1 && !std::is_same<N, S>::value;
  constexpr bool real_first_of_tables = KPL == 1 && tabulated_layout(LAYOUT) && LANES == 32 &&
                                        std::is_same<N, float>::value && std::is_same<S, float>::value;
  if (real_first_of_tables && (LAYOUT == kTables || layout_planes(LAYOUT) <= 7)) return 4;
  return !warp_of_model0 ? 0 : complex_first ? 4 : complex_second ? 3 : 0;
}

// A general adjoint's voxel in a group or warp of lanes (vjp_warp_kernel, vjp_values_kernel), its walks
// reading the events from kSource.
template <EventSource kSource, class N, class S, int KPL, int LAYOUT, int LANES, class R>
__device__ __forceinline__ void adjoint_lanes(const Problem<R>& pb_in, int64_t V, SampleIO<N>& io,
                                              DeviceEventGrad<N>& eg, const GradOut<R>& out, S* scratch,
                                              N* table_scratch) {
  static_assert(LANES == 32 || LAYOUT == kModel0 || LAYOUT == kPlain || LAYOUT > kTables,
                "groups of lanes are compiled for pool model 0 (plain or not) and the fixed pool layouts");
  const int lane = threadIdx.x & (LANES - 1);
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t group = thread / LANES;
  if (group - (threadIdx.x & 31) / LANES >= V) return;  // whole warps
  const bool active = group < V;
  const int64_t v = active ? group : V - 1;
  constexpr bool TAB = tabulated_layout(LAYOUT);
  Problem<R> pb = pb_in;
  pb.K = KPL;  // the lane's orders
  apply_layout<LAYOUT>(pb);
  if constexpr (kSource == kDecodedValues) drop_pulse_rows(pb);  // (values_decodable)
  const int64_t K = pb_in.K;
  eg.active = active;
  eg.voxel_lanes = LANES;
  io.base = v * pb.S;
  if (!active) io.signal = io.signal_tan = nullptr;
  const Voxel<N> t = load_voxel<N>(pb, v);
  S work[3 * layout_planes(LAYOUT) * KPL];
  VoxelGrad<N> g;
  const bool tables = TAB || table_cotangents(pb);  // pool tables, or per-voxel pulses (pulses.hpp)
  const TableGrad<N> tg =
      tables ? table_grad_at(pb, out, table_scratch, thread, launched_threads(), LANES) : TableGrad<N>{};
  const Ref<S> store = thread_scratch(scratch, thread, lane_store_size(pb_in, KPL));  // as vjp_state_bytes
  const WarpShift shift{lane, K, LANES};
  const WarpShiftAdjoint shift_adjoint{lane, K, LANES};
  vjp_voxel<N, S, kSource>(pb, v, t, Ref<S>{work, 1}, store, io, g, eg, tg, shift, shift_adjoint,
                           int64_t(lane) * KPL);
  const bool writer = lane == 0 && active;
  write_group_tissue_gradients<LANES>(g, t, out, v, writer);
  if (tables) write_table_grads(pb, v, tg, out, LanesTotal<LANES>{}, writer);
}

// The general adjoint in a group or warp of lanes a voxel, its walks reading the events as the launch decoded
// them (launch_rules.hpp decoded_general_events: the first order's values and folds, the second order's folds
// alone with each voxel's own values and their tangents).
template <class N, class S, int KPL, int LAYOUT, int LANES, class R>
__global__ void __launch_bounds__(128, (adjoint_lanes_blocks_per_sm<N, S, KPL, LAYOUT, LANES>()))
    vjp_warp_kernel(const Problem<R> pb, int64_t V, SampleIO<N> io, DeviceEventGrad<N> eg, GradOut<R> out,
                    S* scratch, N* table_scratch) {
  adjoint_lanes<launch_event_source<N, R>(), N, S, KPL, LAYOUT, LANES>(pb, V, io, eg, out, scratch, table_scratch);
}

// The second order's general adjoint where no tangent reaches the events and the pulses are uniform
// (values_decodable, tested by the launch plan: launch_plan.hpp start_adjoint_lanes): the walks read the
// launch's decoded values and turn the dual states by real rotations (kDecodedValues). A kernel of its own,
// not a branch of vjp_warp_kernel's: a kernel holding both walks takes the registers of the larger (the
// complex groups of 16: 255, two blocks a multiprocessor; these walks alone 168, three blocks, 4 bytes
// spilled; sm_90, benchmarks/sass_regions.py).
template <class N, class S, int KPL, int LAYOUT, int LANES, class R>
__global__ void __launch_bounds__(128, (adjoint_lanes_blocks_per_sm<N, S, KPL, LAYOUT, LANES>()))
    vjp_values_kernel(const Problem<R> pb, int64_t V, SampleIO<N> io, DeviceEventGrad<N> eg, GradOut<R> out,
                      S* scratch, N* table_scratch) {
  static_assert(launch_event_source<N, R>() == kFoldedEvents, "the second order's general adjoint");
  adjoint_lanes<kDecodedValues, N, S, KPL, LAYOUT, LANES>(pb, V, io, eg, out, scratch, table_scratch);
}

// The real register adjoint's scheme (vjp_voxel_plain: one pass over the orders per event, K = 32, plain
// layout) with LANES = 8 or 4 lanes per voxel, 4 or 8 orders a lane: each lane steps its orders and keeps its
// own store (checkpoints, replay slots, deferrals) in device scratch, interleaved by thread as
// vjp_warp_kernel's. A thread per voxel (vjp_kernel<N, S, 32>) walks a voxel's whole chain of passes, 32
// orders long each, in series; at a few thousand voxels its few warps leave the card waiting on that chain
// (2k voxels: 63 one-warp blocks, 2.79 ms, where the forward a warp per voxel took 0.30). A lane's pass is
// 4 or 8 orders and a shift's shuffles. The pass's gradients need no sum across the group per event: each
// lane adds its orders' share (step_adjoint_plain), DeviceEventGrad sums the warp, and the tissue's are
// summed over the group once, here. Groups past the last voxel replay it and write nothing (every lane of a
// warp takes part in its shuffles); whole warps past it return. The real adjoints of the plain layout at 32
// orders come here (launch_rules.hpp plain_group_adjoint: no pool or pulse tables, so no table cotangents):
// the first order (N = float), and the second (N = Dual<float, 1>: the VJP along one tangent, its sweep
// writing the signal and its tangent where asked, on order 0's lane of each group with a voxel).
// DECODED: the events as the launch decoded them (pb.plain_events, decode_plain_events_kernel; launch_rules.hpp
// decoded_plain_events).
template <class N, class S, int LANES, bool DECODED, class R>
__global__ void __launch_bounds__(128) vjp_plain_lanes_kernel(const Problem<R> pb_in, int64_t V, SampleIO<N> io,
                                                              DeviceEventGrad<N> eg, GradOut<R> out, S* scratch) {
  static_assert(std::is_same<N, S>::value && Num<N>::P <= 1, "the real plain adjoints (plain_group_adjoint)");
  static_assert(LANES == 4 || LANES == 8 || LANES == 16 || LANES == 32, "groups of 4 to 32 lanes");
  constexpr int KC = 32, KPL = KC / LANES;
  const int lane = threadIdx.x & (LANES - 1);
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t group = thread / LANES;
  if (group - (threadIdx.x & 31) / LANES >= V) return;  // whole warps
  const bool active = group < V;
  const int64_t v = active ? group : V - 1;
  Problem<R> pb = specialise<KC>(pb_in);
  pb.K = KPL;  // the lane's orders
  eg.active = active;
  io.base = v * pb.S;  // io.signal stays set in a padding group (WarpShift::samples keeps it from writing)
  const Voxel<N> t = load_voxel<N>(pb, v);
  S work[3 * 3 * KPL];
  const Ref<S> states{work, 1};
  const int64_t k0 = int64_t(lane) * KPL;
  VoxelGrad<N> g;
  const Ref<S> store = thread_scratch(scratch, thread, lane_store_size(pb_in, KPL, true));  // as vjp_state_bytes
  const WarpShift shift{lane, KC, LANES, active};
  const WarpShiftAdjoint shift_adjoint{lane, KC, LANES};
  if constexpr (DECODED) {
    // Made here: returned by a function of event_loop.hpp, ptxas put the second order's states on the stack
    // (Dual<float, 1> in groups of 8: 128 registers and a 1,664-byte frame against 204 and 1,360; the real
    // HVP twice as slow, H100, benchmarks/results/mapping/api_cases-*-s17f-new-s17lib3-*).
    const auto* const codes = static_cast<const PlainCode<R>*>(pb.plain_events);
    DecodedPlainEvents<N, R> events{{pb, t}, codes, codes[pb.E].dt, {}, {}, {}};
    vjp_voxel_plain<N, S>(pb, v, t, state_at(pb, states, 0, k0), state_at(pb, states, 1, k0),
                          state_at(pb, states, 2, k0), store, io, g, eg, events, shift, shift_adjoint);
  } else {
    PlainEvents<N, R> events{pb, t};
    vjp_voxel_plain<N, S>(pb, v, t, state_at(pb, states, 0, k0), state_at(pb, states, 1, k0),
                          state_at(pb, states, 2, k0), store, io, g, eg, events, shift, shift_adjoint);
  }
  const bool writer = lane == 0 && active;
  write_group_tissue_gradients<LANES>(g, t, out, v, writer);
}

}  // namespace bs
