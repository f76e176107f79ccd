// Which kernel a pass of the CUDA libraries starts, on which grid and block: written once, over a launcher,
// for both libraries. The nvcc library's launcher (csrc/cuda/epg_launch.cuh) starts kernels with <<<>>>; the
// CUDA 12 package's (csrc/cuda12_launcher/launcher.cpp), built by g++, starts them through the driver API by
// name and has only the thread-per-voxel kernels. The kernels are the rows of launch_table.def; the
// thresholds and sizes the choices read are launch_rules.hpp's. Plain C++, no CUDA headers: the launcher
// zeroes memory, starts kernels and reports their errors. A launcher provides
//   kWarpKernels            whether it has the warp and group kernels and the event decoding (else a
//                           thread per voxel for every pass, and scratch sized for that)
//   EventGrad<N>            the adjoint kernels' event-gradient parameter (epg_device.cuh DeviceEventGrad)
//   zero(data, bytes)       zeroes device memory on the caller's stream
//   start(tag, shape, ...)  starts the table's kernel `tag` on `shape` with the arguments given
// and is made from the caller's stream (the ABI structs' void* stream).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <type_traits>

#include "blochsim/launch_rules.hpp"
#include "blochsim/unpack.hpp"

namespace bs {

// A tag type per row of the table: the plan names a kernel instance by its tag, the launcher starts it.
#define BS_UNPAREN(...) __VA_ARGS__
#define BS_KERNEL(tag, kernel, what, params, args) \
  template <BS_UNPAREN params>                     \
  struct tag {                                     \
    static constexpr const char* name = #kernel;   \
  };
#include "blochsim/launch_table.def"

// Grid and block of a one-dimensional launch, its dynamic shared memory (none: the kernels declare theirs),
// and the voxels a block holds (0: a kernel over events, not voxels).
struct LaunchShape {
  unsigned grid, block, shared_bytes;
  unsigned voxels_per_block;
};
// A thread per voxel (launch_rules.hpp threads_for).
inline LaunchShape thread_shape(int64_t V) {
  const auto threads = static_cast<unsigned>(threads_for(V));
  return {static_cast<unsigned>(blocks_for(V)), threads, 0, threads};
}
// `lanes` per voxel (a warp, or a group of 4 or 8), in blocks of 128 threads (launch_rules.hpp
// adjoint_threads counts them for the adjoints' scratch).
inline LaunchShape lanes_shape(int64_t V, int lanes) {
  return {static_cast<unsigned>((V * lanes + 127) / 128), 128, 0, static_cast<unsigned>(128 / lanes)};
}

// A launcher asked where a pass would run instead of running it (the C ABI's bs_epg_resident_voxels): with
// `resident_voxels` set, start() writes there the voxels a launch of that kernel keeps on the device at once
// (the blocks a multiprocessor keeps resident, times the multiprocessors, times the shape's voxels a block;
// 0 where the launcher cannot tell) and starts nothing, and zero() zeroes nothing. A pass starts its voxels'
// kernel last, after any kernel over its events (whose shapes hold no voxels and leave the answer as it is),
// so the answer is that kernel's: a launch of more voxels runs in waves of this many.
struct ResidencyQuery {
  int64_t* resident_voxels = nullptr;
};

// ---- forward and JVP ------------------------------------------------------------------------------------
// The value forward with the pool counts fixed at compile time (launch_rules.hpp with_fixed_pools), groups
// of 4 lanes. The nvcc library builds these kernels in a translation unit of their own (csrc/cuda/pools.cu).
template <class S, class Launcher>
void launch_forward_pools(const Launcher& launcher, const Problem<float>& pb, int64_t V, const SampleIO<float>& io) {
  const bool compiled = with_fixed_pools(pb.nt, pb.nl, [&](auto layout) {
    launcher.start(ForwardLanes<float, S, 8, decltype(layout)::value, 4>(), lanes_shape(V, 4), pb, V, io);
  });
  if (!compiled) throw std::logic_error("no compiled pool layout");  // fixed_pools decides first
}

// More than one lane per voxel (launch_rules.hpp forward_lanes): groups of 4 or 8 lanes for the value
// forward, else a warp (one or two orders a lane).
template <class N, class S, class Launcher, class R>
void launch_forward_lanes(const Launcher& launcher, const Problem<R>& pb, int64_t V, const SampleIO<N>& io,
                          int lanes) {
  const LaunchShape shape = lanes_shape(V, lanes);
  const bool two = warp_orders_per_lane(pb.K) == 2;
  if constexpr (std::is_same<N, float>::value) {  // groups: the value forward
    if (lanes == 4 || lanes == 8) {
      const bool plain = plain_orders(pb);
      if (lanes == 4 && fixed_pools<N>(pb))
        launch_forward_pools<S>(launcher, pb, V, io);
      else if (lanes == 4 && pb.tabulated)
        launcher.start(ForwardLanes<N, S, 8, kTables, 4>(), shape, pb, V, io);
      else if (lanes == 4 && plain)
        launcher.start(ForwardLanes<N, S, 8, kPlain, 4>(), shape, pb, V, io);
      else if (lanes == 4)
        launcher.start(ForwardLanes<N, S, 8, kModel0, 4>(), shape, pb, V, io);
      else if (pb.tabulated)
        launcher.start(ForwardLanes<N, S, 4, kTables, 8>(), shape, pb, V, io);
      else if (plain)
        launcher.start(ForwardLanes<N, S, 4, kPlain, 8>(), shape, pb, V, io);
      else
        launcher.start(ForwardLanes<N, S, 4, kModel0, 8>(), shape, pb, V, io);
      return;
    }
  }
  if constexpr (Num<N>::P > 0 && kJvpOfOneOrTwo<N>) {
    if (lanes == 8 && jvp_values<N, S>(pb, V)) {  // on the launch's decoded entries (launch_forward decoded them)
      launcher.start(ForwardValues<N, S, 4, kPlain, 8>(), shape, pb, V, io);
      return;
    }
  }
  if constexpr (!std::is_same<N, S>::value && kJvpOfOneOrTwo<N>) {
    if (lanes == 8) {  // a complex plain JVP in groups of 8 (launch_rules.hpp jvp_groups)
      launcher.start(ForwardLanes<N, S, 4, kPlain, 8>(), shape, pb, V, io);
      return;
    }
  }
  if constexpr (std::is_same<N, S>::value && kJvpOfOneOrTwo<N>) {
    if (lanes == 4 || lanes == 8) {  // a real plain JVP in groups (launch_rules.hpp jvp_groups)
      if (lanes == 4)
        launcher.start(ForwardLanes<N, S, 8, kPlain, 4>(), shape, pb, V, io);
      else
        launcher.start(ForwardLanes<N, S, 4, kPlain, 8>(), shape, pb, V, io);
      return;
    }
  }
  if constexpr (kJvpOfOneOrTwo<N>) {
    if (fixed_pool_warp<N>(pb)) {  // a JVP of one or two tangents, its pool counts compiled (up to 32 orders)
      const bool values = jvp_values<N, S>(pb, V);  // (the real path: on the launch's decoded entries)
      with_fixed_pools(pb.nt, pb.nl, [&](auto layout) {
        constexpr int L = decltype(layout)::value;
        if constexpr (std::is_same<N, S>::value) {
          if (values) {
            launcher.start(ForwardValues<N, S, 1, L, 32>(), shape, pb, V, io);
            return;
          }
        }
        launcher.start(ForwardLanes<N, S, 1, L, 32>(), shape, pb, V, io);
      });
      return;
    }
  }
  if (pb.tabulated) {
    if (two)
      launcher.start(ForwardLanes<N, S, 2, kTables, 32>(), shape, pb, V, io);
    else
      launcher.start(ForwardLanes<N, S, 1, kTables, 32>(), shape, pb, V, io);
  } else {
    if (two)
      launcher.start(ForwardLanes<N, S, 2, kModel0, 32>(), shape, pb, V, io);
    else
      launcher.start(ForwardLanes<N, S, 1, kModel0, 32>(), shape, pb, V, io);
  }
}

// The part of a pass's scratch from byte `offset` on; null where the pass has none (a launcher asked where
// its launches run, ResidencyQuery, is handed no scratch: no offset is taken from a null pointer).
template <class T>
T* scratch_from(void* scratch, int64_t offset) {
  return scratch ? reinterpret_cast<T*>(static_cast<char*>(scratch) + offset) : nullptr;
}

template <class N, class S, class Launcher, class R>
void launch_forward(const Launcher& launcher, const Problem<R>& pb_in, int64_t V, const SampleIO<N>& io,
                    void* scratch, int64_t scratch_bytes) {
  constexpr bool warp_kernels = Launcher::kWarpKernels;
  if (V == 0) return;
  if (scratch_bytes < forward_scratch_bytes<N, S>(pb_in, V, warp_kernels))
    throw std::invalid_argument("scratch is too small");
  Problem<R> pb = pb_in;
  if constexpr (warp_kernels && Num<N>::P == 0) {  // the events, decoded once (epg_device.cuh for_each_event)
    auto* const table = scratch_from<BlockEvent<N>>(scratch, forward_state_bytes<N, S>(pb, V));
    const int64_t chunks = event_chunks(pb);
    // With the profiled pulses' rotations (pulses.hpp pairs_per_launch), blocks enough that each thread
    // forms a few of them.
    R* pairs = nullptr;
    int64_t blocks = chunks;
    if (forward_pairs<N, S>(pb, V)) {
      pairs = scratch_from<R>(scratch, pulse_pairs_offset<N, S>(pb, V));
      pb.pulse_pairs = pairs;
      const int64_t per_block = kPairsPerThread * kBlockEvents;
      const int64_t pair_blocks = (pulse_pair_count(pb) + per_block - 1) / per_block;
      blocks = pair_blocks > blocks ? pair_blocks : blocks;
    }
    if (chunks > 0)  // a block of kBlockEvents threads per chunk
      launcher.start(DecodeEvents<N, S>(), LaunchShape{static_cast<unsigned>(blocks), kBlockEvents, 0, 0}, pb, table,
                     pairs);
    if (chunks > 1)  // a thread per boundary between chunks
      launcher.start(JoinChunks<N>(), LaunchShape{static_cast<unsigned>((chunks - 1 + 127) / 128), 128, 0, 0}, table,
                     chunks);
    pb.events = table;
  }
  if constexpr (warp_kernels && Num<N>::P > 0) {  // the JVP's entries, decoded once (launch_rules.hpp jvp_values)
    if (pb.E > 0 && jvp_values<N, S>(pb, V)) {
      using Path = typename std::conditional<std::is_same<N, S>::value, R, Cx<R>>::type;  // (the rotation's phase)
      auto* const codes = scratch_from<EventCode<R>>(scratch, forward_state_bytes<N, S>(pb, V));
      launcher.start(DecodeGeneralEvents<R, Path>(), LaunchShape{unsigned((pb.E + 127) / 128), 128, 0, 0}, pb, codes);
      pb.event_codes = codes;
    }
  }
  if constexpr (warp_kernels) {
    const int lanes = forward_lanes<N, S>(pb, V);
    if (lanes > 1) {
      launch_forward_lanes<N, S>(launcher, pb, V, io, lanes);
      return;
    }
  }
  const LaunchShape shape = thread_shape(V);
  if constexpr (Num<N>::P == 0) {
    if (registers_layout<N>(pb) == 32) {
      launcher.start(ForwardThread<N, S, 32>(), shape, pb, V, io, static_cast<S*>(scratch));
      return;
    }
  }
  launcher.start(ForwardThread<N, S, 0>(), shape, pb, V, io, static_cast<S*>(scratch));
}

// ---- adjoints (VJP, VJP-JVP) ----------------------------------------------------------------------------
// A general adjoint in a group or warp of lanes a voxel (vjp_warp_kernel), or at the second order, where no
// tangent reaches the events and the pulses are uniform, the same walks on the launch's decoded values
// (vjp_values_kernel: event_loop.hpp values_decodable), each kernel with the registers of its own walks.
template <class N, class S, int KPL, int L, int LANES, class Launcher, class R, class... A>
void start_adjoint_lanes(const Launcher& launcher, const LaunchShape& shape, const Problem<R>& pb, const A&... a) {
  if constexpr (launch_event_source<N, R>() == kFoldedEvents) {
    if (values_decodable(pb)) {
      launcher.start(AdjointValues<N, S, KPL, L, LANES>(), shape, pb, a...);
      return;
    }
  }
  launcher.start(AdjointLanes<N, S, KPL, L, LANES>(), shape, pb, a...);
}

// The adjoint with the pool counts fixed at compile time, a warp per voxel (launch_rules.hpp
// fixed_pool_warp: the first order, N = float, and the second, N = Dual<float, 1>; csrc/cuda/pools.cu and
// pools_dual.cu), the real first order in groups of 8 or 16 (fixed_pool_group_adjoint), or the second in
// groups of 16 (fixed_pool_second_order_groups).
template <class N, class S, class Launcher>
void launch_vjp_pools(const Launcher& launcher, const Problem<float>& pb, int64_t V, const SampleIO<N>& io,
                      const typename Launcher::template EventGrad<N>& eg, const GradOut<float>& out, S* scratch,
                      N* table_scratch, int lanes) {
  const bool compiled = with_fixed_pools(pb.nt, pb.nl, [&](auto layout) {
    constexpr int L = decltype(layout)::value;
    constexpr bool first_order = std::is_same<N, float>::value && std::is_same<S, float>::value;
    constexpr bool second_order = std::is_same<N, Dual<float, 1>>::value && std::is_same<S, N>::value;
    if constexpr (first_order) {
      if (lanes == 8) {
        start_adjoint_lanes<N, S, 4, L, 8>(launcher, lanes_shape(V, 8), pb, V, io, eg, out, scratch, table_scratch);
        return;
      }
    }
    // 2 orders a lane: the first order's small launches (launch_rules.hpp kPoolGroupOf16Voxels), the second's
    // groups (fixed_pool_second_order_groups).
    if constexpr ((first_order || second_order) && layout_planes(L) <= kPoolGroupOf16Planes) {
      if (lanes == 16) {
        start_adjoint_lanes<N, S, 2, L, 16>(launcher, lanes_shape(V, 16), pb, V, io, eg, out, scratch,
                                            table_scratch);
        return;
      }
    }
    start_adjoint_lanes<N, S, 1, L, 32>(launcher, lanes_shape(V, 32), pb, V, io, eg, out, scratch, table_scratch);
  });
  if (!compiled) throw std::logic_error("no compiled pool layout");  // fixed_pool_warp decides first
}

// Decode `entries` events for an adjoint launch (decoded_plain_events, decoded_general_events) into their part
// of the scratch with the kernel of `tag`, a thread an entry; the problem the launch then reads them from, at
// `field`.
template <class Code, class N, class S, class Tag, class Launcher, class R>
Problem<R> decoding_events(const Launcher& launcher, Tag tag, int64_t entries, const void* Problem<R>::*field,
                           const Problem<R>& pb, int64_t V, void* scratch) {
  auto* const codes = scratch_from<Code>(scratch, decoded_events_offset<N, S>(pb, V));
  launcher.start(tag, LaunchShape{unsigned((entries + 127) / 128), 128, 0, 0}, pb, codes);
  Problem<R> decoded = pb;
  decoded.*field = codes;
  return decoded;
}
// The real plain path's (entry E: the wrapped interval's), and every event of a general adjoint.
template <class N, class S, class Launcher, class R>
Problem<R> decoding_plain_events(const Launcher& launcher, const Problem<R>& pb, int64_t V, void* scratch) {
  return decoding_events<PlainCode<R>, N, S>(launcher, DecodePlainEvents<R>(), pb.E + 1, &Problem<R>::plain_events,
                                             pb, V, scratch);
}
template <class N, class S, class Launcher, class R>
Problem<R> decoding_general_events(const Launcher& launcher, const Problem<R>& pb, int64_t V, void* scratch) {
  return decoding_events<EventCode<R>, N, S>(launcher, DecodeGeneralEvents<N, S>(), pb.E, &Problem<R>::event_codes,
                                             pb, V, scratch);
}

template <class N, class S, class Launcher, class R>
void launch_vjp(const Launcher& launcher, const Problem<R>& pb, int64_t V, const SampleIO<N>& io,
                const bs_grads& grads, const bs_grads* grads_tangent, const bs_table_grads* table_grads,
                const bs_table_grads* table_grads_tangent, void* scratch, int64_t scratch_bytes) {
  constexpr bool warp_kernels = Launcher::kWarpKernels;
  if (V == 0) return;
  if (scratch_bytes < vjp_scratch_bytes<N, S>(pb, V, warp_kernels)) throw std::invalid_argument("scratch is too small");
  typename Launcher::template EventGrad<N> eg{};
  void* const outs[4] = {grads.dt_s, grads.flip_rad, grads.phase_rad, grads.dt_wrap_s};
  const int64_t counts[4] = {pb.E, pb.E, pb.E, 1};
  for (int i = 0; i < 4; ++i) {
    eg.out[i] = static_cast<R*>(outs[i]);
    if (outs[i]) launcher.zero(outs[i], sizeof(R) * counts[i]);
  }
  if (grads_tangent) {
    void* const t[4] = {grads_tangent->dt_s, grads_tangent->flip_rad, grads_tangent->phase_rad,
                        grads_tangent->dt_wrap_s};
    for (int i = 0; i < 4; ++i) {
      eg.out_tan[i] = static_cast<R*>(t[i]);
      if (t[i]) launcher.zero(t[i], sizeof(R) * counts[i]);
    }
  }
  GradOut<R> out{};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    out.tissue[j] = static_cast<R*>(grads.tissue[j]);
    out.tissue_tan[j] = grads_tangent ? static_cast<R*>(grads_tangent->tissue[j]) : nullptr;
  }
  table_grad_outputs(table_grads, out.table);
  table_grad_outputs(table_grads_tangent, out.table_tan);
  S* state_scratch = static_cast<S*>(scratch);
  N* table_scratch = scratch_from<N>(scratch, vjp_state_bytes<N, S>(pb, V, warp_kernels));
  if constexpr (warp_kernels) {
    const int lanes = adjoint_lanes<N, S>(pb, V);
    if constexpr (Num<N>::P <= 1 && std::is_same<N, S>::value) {  // the plain adjoint's scheme, 4 to 32 lanes
      if (plain_group_adjoint<N, S>(pb, lanes)) {
        const LaunchShape shape = lanes_shape(V, lanes);
        if (decoded_plain_events<N, S>(pb, V)) {  // the events decoded once, then read by every voxel
          const Problem<R> decoded = decoding_plain_events<N, S>(launcher, pb, V, scratch);
          if (lanes == 4)
            launcher.start(AdjointPlainLanes<N, S, 4, true>(), shape, decoded, V, io, eg, out, state_scratch);
          else
            launcher.start(AdjointPlainLanes<N, S, 8, true>(), shape, decoded, V, io, eg, out, state_scratch);
          return;
        }
        if (lanes == 4)
          launcher.start(AdjointPlainLanes<N, S, 4, false>(), shape, pb, V, io, eg, out, state_scratch);
        else if (lanes == 8)
          launcher.start(AdjointPlainLanes<N, S, 8, false>(), shape, pb, V, io, eg, out, state_scratch);
        else if (lanes == 16)
          launcher.start(AdjointPlainLanes<N, S, 16, false>(), shape, pb, V, io, eg, out, state_scratch);
        else
          launcher.start(AdjointPlainLanes<N, S, 32, false>(), shape, pb, V, io, eg, out, state_scratch);
        return;
      }
    }
    // The general adjoints (vjp_warp_kernel) read their events decoded once for the launch (the second order
    // their folds alone).
    Problem<R> general = pb;
    if constexpr (reads_event_codes<N, R>()) {
      if (decoded_general_events<N, S>(pb, V)) general = decoding_general_events<N, S>(launcher, pb, V, scratch);
    }
    if constexpr (std::is_same<N, float>::value || std::is_same<N, Dual<float, 1>>::value) {
      // (launch_vjp_pools is compiled for float and its dual only) the fixed pools in groups of 8 or 16
      if (fixed_pool_group_adjoint<N, S>(pb, lanes) || fixed_pool_second_order_groups<N, S>(pb, lanes)) {
        launch_vjp_pools<N, S>(launcher, general, V, io, eg, out, state_scratch, table_scratch, lanes);
        return;
      }
    }
    if (lanes == 16 || lanes == 8 || lanes == 4) {  // the general scheme in a group per voxel (up to 32 orders)
      const LaunchShape shape = lanes_shape(V, lanes);
      if constexpr (!std::is_same<N, S>::value && Num<N>::P <= 1) {  // (compiled for the complex path)
        if (plain_general_adjoint<N, S>(pb, lanes)) {  // the plain layout: 8 lanes, or 16 (the second order)
          if constexpr (Num<N>::P == 1) {
            if (lanes == 16) {
              start_adjoint_lanes<N, S, 2, kPlain, 16>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                       table_scratch);
              return;
            }
          }
          start_adjoint_lanes<N, S, 4, kPlain, 8>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                  table_scratch);
          return;
        }
      }
      if (lanes == 8)
        start_adjoint_lanes<N, S, 4, kModel0, 8>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                 table_scratch);
      else
        start_adjoint_lanes<N, S, 8, kModel0, 4>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                 table_scratch);
      return;
    }
    if (lanes == 32) {
      const LaunchShape shape = lanes_shape(V, 32);
      const bool two = warp_orders_per_lane(pb.K) == 2;
      if constexpr (std::is_same<N, float>::value || std::is_same<N, Dual<float, 1>>::value) {
        if (fixed_pool_warp<N>(pb)) {
          launch_vjp_pools<N, S>(launcher, general, V, io, eg, out, state_scratch, table_scratch, 32);
          return;
        }
      }
      if (pb.tabulated) {
        if (two)
          start_adjoint_lanes<N, S, 2, kTables, 32>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                    table_scratch);
        else
          start_adjoint_lanes<N, S, 1, kTables, 32>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                    table_scratch);
      } else {
        if constexpr (!std::is_same<N, S>::value && Num<N>::P == 1) {  // (compiled for the complex second order)
          if (plain_general_adjoint<N, S>(pb, 32)) {
            start_adjoint_lanes<N, S, 1, kPlain, 32>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                     table_scratch);
            return;
          }
        }
        if (two)
          start_adjoint_lanes<N, S, 2, kModel0, 32>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                    table_scratch);
        else
          start_adjoint_lanes<N, S, 1, kModel0, 32>(launcher, shape, general, V, io, eg, out, state_scratch,
                                                    table_scratch);
      }
      return;
    }
  }
  const LaunchShape shape = thread_shape(V);
  if constexpr (Num<N>::P == 0) {
    if (register_adjoint<N, S>(pb)) {
      if constexpr (warp_kernels && std::is_same<N, S>::value && std::is_same<N, R>::value) {
        if (decoded_plain_events<N, S>(pb, V)) {
          launcher.start(AdjointThreadDecoded<N, S, 32>(), shape, decoding_plain_events<N, S>(launcher, pb, V, scratch),
                         V, io, eg, out, state_scratch, table_scratch);
          return;
        }
      }
      launcher.start(AdjointThread<N, S, 32>(), shape, pb, V, io, eg, out, state_scratch, table_scratch);
      return;
    }
  }
  launcher.start(AdjointThread<N, S, 0>(), shape, pb, V, io, eg, out, state_scratch, table_scratch);
}

// ---- the passes of the C ABI (cuda_abi.inc): the number types each launches at ---------------------------
template <class N>
SampleIO<N> sample_io(void* signal, void* signal_tangent, int64_t tan_stride, const void* cot, const void* cot_tan) {
  SampleIO<N> io;
  io.signal = static_cast<float*>(signal);
  io.signal_tan = static_cast<float*>(signal_tangent);
  io.tan_stride = tan_stride;
  io.cot = static_cast<const float*>(cot);
  io.cot_tan = static_cast<const float*>(cot_tan);
  return io;
}

template <class Launcher>
void forward_pass(const Launcher& launcher, const bs_epg_forward_args& a) {
  const auto pb = make_problem<float>(a.program, a.tissue, nullptr, a.tables, nullptr, false);
  const auto io = sample_io<float>(a.signal, nullptr, 0, nullptr, nullptr);
  if (a.program.path == BS_PATH_REAL)
    launch_forward<float, float>(launcher, pb, a.tissue.num_voxels, io, a.scratch, a.scratch_bytes);
  else
    launch_forward<float, Cx<float>>(launcher, pb, a.tissue.num_voxels, io, a.scratch, a.scratch_bytes);
}

// JVP at P tangents.
template <int P, class Launcher>
void jvp_pass(const Launcher& launcher, const bs_epg_jvp_args& a) {
  using N = Dual<float, P>;
  const auto pb = make_problem<float>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent, false);
  const int64_t V = a.tissue.num_voxels;
  const auto io = sample_io<N>(a.signal, a.signal_tangent, V * pb.S, nullptr, nullptr);
  if (a.program.path == BS_PATH_REAL)
    launch_forward<N, N>(launcher, pb, V, io, a.scratch, a.scratch_bytes);
  else
    launch_forward<N, Cx<N>>(launcher, pb, V, io, a.scratch, a.scratch_bytes);
}

// Adjoint (VJP), checkpointed.
template <class Launcher>
void vjp_pass(const Launcher& launcher, const bs_epg_vjp_args& a) {
  const auto pb = make_problem<float>(a.program, a.tissue, nullptr, a.tables, nullptr, false);
  const auto io = sample_io<float>(nullptr, nullptr, 0, a.cotangent, nullptr);
  const int64_t V = a.tissue.num_voxels;
  if (a.program.path == BS_PATH_REAL)
    launch_vjp<float, float>(launcher, pb, V, io, a.grads, nullptr, &a.table_grads, nullptr, a.scratch,
                             a.scratch_bytes);
  else
    launch_vjp<float, Cx<float>>(launcher, pb, V, io, a.grads, nullptr, &a.table_grads, nullptr, a.scratch,
                                 a.scratch_bytes);
}

// Second-order adjoint (the adjoint at Dual<float, 1>).
template <class Launcher>
void vjp_jvp_pass(const Launcher& launcher, const bs_epg_vjp_jvp_args& a) {
  if (a.tangents.count != 1) throw std::invalid_argument("tangents.count must be 1 for the second-order adjoint");
  using N = Dual<float, 1>;
  const auto pb = make_problem<float>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent, false);
  const auto io = sample_io<N>(a.signal, a.signal_tangent, 0, a.cotangent, a.cotangent_tangent);
  const int64_t V = a.tissue.num_voxels;
  if (a.program.path == BS_PATH_REAL)
    launch_vjp<N, N>(launcher, pb, V, io, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent,
                     a.scratch, a.scratch_bytes);
  else
    launch_vjp<N, Cx<N>>(launcher, pb, V, io, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent,
                         a.scratch, a.scratch_bytes);
}

}  // namespace bs
