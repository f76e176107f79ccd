// Compile-time layouts of the warp and group kernels, shared by the device code (csrc/cuda/epg_device.cuh,
// also compiled by NVRTC for the CUDA 12 package: no standard headers here) and the launch rules.
#pragma once

#include "blochsim/relax_tables.hpp"

namespace bs {

// Compile-time layouts of the warp and group kernels (epg_device.cuh apply_layout): pool model 0 with its
// physics read at run time, the plain layout, pool tables with run-time pool counts, or pool tables with
// nt transverse and nl longitudinal pools fixed (pools_layout(nt, nl)): the lane's states and the voxel's
// tables then sit in registers, not in a local array indexed at run time.
constexpr int kModel0 = 0, kPlain = 1, kTables = 2;
constexpr int pools_layout(int nt, int nl) { return 16 * nt + nl; }
constexpr int layout_nt(int layout) { return layout / 16; }
constexpr int layout_nl(int layout) { return layout % 16; }
constexpr bool tabulated_layout(int layout) { return layout >= kTables; }
constexpr int layout_planes(int layout) {  // planes of a kernel's state array
  return layout == kTables ? 3 * kMaxPools : layout > kTables ? 2 * layout_nt(layout) + layout_nl(layout) : 3;
}

// A value forward's events as the device reads them, decoded (epg_device.cuh decode_events_kernel), in
// chunks of kBlockEvents: chunk c holds its folded events first, counts[c] of them, from slot starts[c] (1
// where its first event was folded into the chunk before: join_chunks_kernel); the counts follow the chunks,
// the starts the counts.
template <class N>
struct BlockEvent {
  EventValues<N> ev;
  Rotation<N> rotation;
  Cx<N> turn;
};
constexpr int kBlockEvents = 64;
template <class R>
BS_HD int64_t event_chunks(const Problem<R>& pb) {
  return (pb.E * pb.reps + kBlockEvents - 1) / kBlockEvents;
}
template <class N, class R>
inline int64_t event_table_bytes(const Problem<R>& pb) {
  return event_chunks(pb) * (kBlockEvents * int64_t(sizeof(BlockEvent<N>)) + 2 * int64_t(sizeof(int)));
}

}  // namespace bs
