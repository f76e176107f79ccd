// Launch rules of the CUDA kernels, read by the launch plan of both CUDA libraries (launch_plan.hpp: the nvcc
// library and the CUDA 12 package's launcher built by g++): block size, the compile-time layout a launch
// uses, and the device scratch it needs. Plain C++: no CUDA headers.
#pragma once

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "blochsim/event_loop.hpp"
#include "blochsim/layouts.hpp"

namespace bs {

// Threads per block: 128, or 32 when there are too few voxels to give every multiprocessor several
// blocks of 128 (a thread per voxel leaves small problems latency-bound; smaller blocks spread them).
inline int threads_for(int64_t V) { return V < 128 * 264 ? 32 : 128; }
inline int64_t blocks_for(int64_t V) { return (V + threads_for(V) - 1) / threads_for(V); }
inline int64_t padded_voxels(int64_t V) { return blocks_for(V) * threads_for(V); }

// The pool counts compiled fixed (csrc/cuda/pools.cu), for the tabulated value forward in groups of 4
// lanes and the tabulated float adjoint with a warp per voxel: semisolid only (1, 2), two exchanging pools
// (2, 2), two pools and a semisolid (2, 3), four pools and a semisolid (4, 5). Calls
// f(std::integral_constant<int, layout>()) when (nt, nl) is one of them and says whether it was.
template <class F>
inline bool with_fixed_pools(int nt, int nl, const F& f) {
  switch (pools_layout(nt, nl)) {
    case pools_layout(1, 2): f(std::integral_constant<int, pools_layout(1, 2)>()); return true;
    case pools_layout(2, 2): f(std::integral_constant<int, pools_layout(2, 2)>()); return true;
    case pools_layout(2, 3): f(std::integral_constant<int, pools_layout(2, 3)>()); return true;
    case pools_layout(4, 5): f(std::integral_constant<int, pools_layout(4, 5)>()); return true;
    default: return false;
  }
}

// Whether the fixed-pool kernels (pools.cu) take the problem: a compiled pool layout at a float number type
// and up to 32 orders (8 per lane in a group of 4 forward, one per lane in the warp adjoint).
template <class R>
inline bool compiled_pools(const Problem<R>& pb) {
  return pb.K <= 32 && pb.tabulated && with_fixed_pools(pb.nt, pb.nl, [](auto) {});
}
template <class N, class R>
inline bool fixed_pools(const Problem<R>& pb) {
  return std::is_same<N, float>::value && compiled_pools(pb);
}
// The number type of a JVP of one or two tangents (a Jacobian of one or two properties), the widths the
// fixed-pool and group JVP kernels are compiled for.
template <class N>
constexpr bool kJvpOfOneOrTwo = std::is_same<N, Dual<float, 1>>::value || std::is_same<N, Dual<float, 2>>::value;
// Whether a warp kernel of number type N (a voxel a warp, an order a lane) has its pool counts compiled: the
// float adjoint (pools.cu), the second order's adjoint (N = Dual<float, 1>: pools_dual.cu) and the JVP of one
// or two tangents (jvp_1.cu, jvp_2.cu). With run-time pool counts the lane's states and the voxel's tables
// sit in a local array indexed at run time: ptxas (sm_90) gave the second order's adjoint a 4,256-byte stack
// frame a thread for pools (2, 3), 432 fixed.
template <class N, class R>
inline bool fixed_pool_warp(const Problem<R>& pb) {
  return (std::is_same<N, float>::value || kJvpOfOneOrTwo<N>) && compiled_pools(pb);
}

// The compile-time order count a launch uses: 32 (states in registers) for the plain layout at a real
// number type, else 0 (run-time K and physics, states in device scratch). Dual types are not specialised:
// unrolled, their kernels take ptxas minutes and spill anyway.
template <class N, class R>
inline int registers_layout(const Problem<R>& pb) {
  return Num<N>::P == 0 && plain_orders(pb) && pb.K == 32 ? 32 : 0;
}
// Whether a thread adjoint takes the register kernel (vjp_kernel at K = 32), which compiles the plain
// adjoint alone: with the general path beside it, its plain loops spilled (ptxas sm_90: 1,068 bytes of
// spill stores against 128). Other adjoints of the plain layout take the scratch kernel (a forced thread
// mapping, or a stretch over kPlainMaxStride).
template <class N, class S, class R>
inline bool register_adjoint(const Problem<R>& pb) {
  return registers_layout<N>(pb) == 32 && plain_adjoint<N, S>(pb);
}

// Forward and JVP: a warp per voxel (orders across lanes, epg_device.cuh) while the problem is small; the
// value forward then takes groups of 8 or 4 lanes per voxel (4 or 8 orders per lane, up to 32 orders), and
// a thread per voxel past that. Measured on the H200 (docs/design.md, benchmarks/results/mapping/forward-*;
// thread / warp / lanes4 / lanes8 ms): real path 5k 1.45/2.11/1.10/1.11, 20k 1.85/6.87/1.56/2.51, 100k
// 4.45/32.7/6.60/10.4, 1M 40.4/-/61.5/98.5; complex path 5k 4.04/2.56/1.50/1.31, 20k 5.19/8.51/3.10/3.72,
// 100k 21.9/40.1/11.9/16.1; pooled (3 pools, tables) 5k 5.03/3.73/1.67/1.47, 20k 7.38/13.2/4.63/5.55, 100k
// 25.9/63.7/21.3/24.7; pooled5 5k 13.9/7.80/5.17/4.83, 20k 32.7/28.2/20.5/24.8. A warp does 32x the
// per-event work of a thread per voxel; a thread holds all 32 orders and spills (complex path) or keeps
// its states in device scratch (tables); a group amortises the per-event work over 4 or 8 orders.
// With the events decoded per block (epg_device.cuh for_each_event), 2026-12-03, thread / lanes4 ms: real
// 20k 1.15/1.02, 100k 3.05/3.83, 1M 28.9/35.1; complex 20k 3.65/2.24 (lanes8 2.25), 100k 11.1/9.34 (9.59).
// With the events folded and the complex groups of 4 capped at 96 registers (same day, later;
// benchmarks/results/mapping/forward-folded-*): real thread / lanes4 5k 0.91/0.86, 10k 0.96/0.91, 20k
// 1.07/1.48, 40k 1.30/2.07; complex warp / lanes8 / lanes4 2k 0.79/0.82/1.01, 5k 1.52/1.04/1.10, 10k
// 2.79/1.61/1.19, 20k 4.92/2.41/1.52. So the real path's thread from 12k voxels (was 40k) and the
// complex path's groups of 4 from 5k (was 8k; the run-time pool layouts were not re-measured and keep 8k).
// With the register kernel's values read ahead and samples staged (epg_device.cuh; 2026-12-03, fourth
// session, benchmarks/results/mapping/real-thread-lanes4-*): real thread / lanes4, two rounds, 3k
// 0.46,0.48/0.44,0.50, 6k 0.44,0.44/0.47,0.55, 9k 0.45,0.52/0.54,0.63, 12k 0.44,0.51/0.53,0.70, 20k
// 0.54,0.61/0.76,0.76: the real path's thread from 6k voxels (was 12k; applied the fifth session, with the
// GPU tests run on it).
// BLOCHSIM_CUDA_MAPPING=thread|warp|lanes4|lanes8 forces one (where it applies), so benchmarks can compare.
// -1: not forced; else the lanes per voxel (1: a thread).
inline int forced_mapping() {
  const char* forced = std::getenv("BLOCHSIM_CUDA_MAPPING");
  if (!forced) return -1;
  if (std::strcmp(forced, "thread") == 0) return 1;
  if (std::strcmp(forced, "warp") == 0) return 32;
  if (std::strcmp(forced, "lanes8") == 0) return 8;
  if (std::strcmp(forced, "lanes4") == 0) return 4;
  return -1;
}
// BLOCHSIM_CUDA_ADJOINT_LANES=4|8|16|32 forces the plain group adjoint's lanes per voxel where it applies
// (plain_group_adjoint), and 8 or 16 the fixed-pool group adjoint (fixed_pool_group_adjoint), leaving the
// forwards their own mapping. -1: not forced.
inline int forced_adjoint_plain_lanes() {
  const char* forced = std::getenv("BLOCHSIM_CUDA_ADJOINT_LANES");
  if (!forced) return -1;
  const int lanes = std::atoi(forced);
  return lanes == 4 || lanes == 8 || lanes == 16 || lanes == 32 ? lanes : -1;
}

// Whether a JVP runs in groups of 4 or 8 lanes per voxel (forward_warp_kernel<N, N, 8 | 4, kPlain, 4 | 8>):
// the real plain layout at up to 32 orders, one or two tangents (Dual<float, 1 | 2>: a Jacobian of one or
// two properties). Past 3,000 voxels the JVP took a thread per voxel, its dual states in device scratch
// (Dual types have no register kernel): the 20k real HVP's JVP ran 13.9 ms there, 31 % of the call (H100,
// benchmarks/results/profile/torch-profiler-timelines-H100-2026-12-05-6bce3e6.txt).
// The complex plain JVPs too where no pulse is played per voxel, in groups of 8 only (4 orders a lane:
// Cx<Dual<float, 2>> 255 registers and no stack, ptxas sm_90; epg_device.cuh forward_warp_kernel), where
// they took a warp per voxel to 10,000 voxels (the complex HVP's Jacobian at 5k: 6.21 ms of the call's 22.81
// on an H100, 9.5 times the forward; benchmarks/adjoint_bounds.py) and a thread past it, its dual states in
// device scratch.
template <class N, class S, class R>
inline bool jvp_groups(const Problem<R>& pb) {
  const bool complex_plain = std::is_same<S, Cx<N>>::value && !per_voxel_pulses(pb);
  return (std::is_same<N, S>::value || complex_plain) && kJvpOfOneOrTwo<N> && !pb.tabulated && pb.K <= 32 &&
         plain_orders(pb);
}

// Lanes per voxel of a forward or JVP launch: 32, 8, 4, or 1 (a thread per voxel). Groups of 4 or 8 are
// compiled for the value forward (N = float) and the real plain JVPs of jvp_groups (a dual state of 8 orders
// a lane in general would spill).
template <class N, class S, class R>
inline int forward_lanes(const Problem<R>& pb, int64_t V) {
  if (pb.K > 64) return 1;
  const bool groups = (Num<N>::P == 0 && pb.K <= 32) || jvp_groups<N, S>(pb);
  const int forced = forced_mapping();
  const bool complex_jvp = Num<N>::P > 0 && !std::is_same<N, S>::value;  // (groups of 8 only: jvp_groups)
  if (forced > 1 && forced < 32) return groups && pb.K <= 8 * forced && !(complex_jvp && forced != 8) ? forced : 1;
  if (forced >= 0) return forced;
  // Pools fixed at compile time: groups of 4 at any size (H200, 2026-12-03, ms lanes4 / lanes8 with run-time
  // pools: pooled 5k 0.50/1.50, 20k 0.69/6.17, 50k 1.41/13.0; pooled5 5k 1.57/5.09, 20k 3.88/25.0, 50k
  // 7.89/54.2; the 32-lane warp with run-time pools took 1.56 ms for pooled at 2k).
  if (fixed_pools<N>(pb)) return 4;
  // A JVP whose events carry no tangent (values_decodable) takes the groups of 8 on the launch's decoded
  // entries (jvp_values) at every size: the warp's crossing at 3,000 voxels was measured before they read them.
  // H100, the Jacobian alone at 2k through the API, two rounds alternated, ms, the warp / the groups
  // (benchmarks/results/mapping/api_cases-NVIDIA_H100_80GB_HBM3-2026-12-07-s27-{H,R}-small-r*.json): real
  // 1.89-1.97 / 0.83-0.88, complex 3.63-3.65 / 1.15-1.20, every peak within 0.2 MiB.
  if (jvp_groups<N, S>(pb) && values_decodable(pb)) return 8;
  if (V <= 3000) return 32;
  // Groups of 8 at every size, 4 orders a lane, their dual states in registers (forward_warp_kernel makes the
  // lane's state with a literal order count). H100, the Jacobian alone, ms, groups whose states ptxas kept in
  // a local array (8 to 5,000 voxels, 4 above) / in registers: 20k 10.66-10.72 / 3.89, 200k 92.6-92.9 /
  // 34.7-34.8 (benchmarks/results/mapping/jacobian-H100-2026-12-05-s16.txt; a thread per voxel took 13.7
  // and 140 in the 15th session's record, ...-s15.txt).
  if (jvp_groups<N, S>(pb)) return 8;
  if (!groups) return V <= (pb.tabulated ? 20000 : !std::is_same<N, S>::value ? 10000 : 3000) ? 32 : 1;
  // Real path: a thread past 6k voxels, where it holds its states in registers (plain_orders).
  if (!pb.tabulated && std::is_same<N, S>::value) return V <= 6000 || !plain_orders(pb) ? 4 : 1;
  return V <= (pb.tabulated ? 8000 : 5000) ? 8 : 4;
}
// Whether a JVP launch in the plain groups of 8 (jvp_groups) or, on the real path, the fixed pools' warp
// (fixed_pool_warp) reads the entries the launch decoded once (epg_device.cuh forward_values_kernel;
// event_loop.hpp EventCode): in the library with the warp kernels, where no tangent reaches the events and
// the pulses are uniform over the voxels (event_loop.hpp values_decodable: a Jacobian along tissue
// properties, B1 uniform). Its dual states are then turned by real rotations and an MRF repetition is one
// step, where each voxel loaded every event and formed its rotation from dual angles.
template <class N, class S, class R>
inline bool jvp_values(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  if constexpr (Num<N>::P > 0 && kJvpOfOneOrTwo<N>) {
    if (!warp_kernels || !values_decodable(pb)) return false;
    const int lanes = forward_lanes<N, S>(pb, V);
    return (lanes == 8 && jvp_groups<N, S>(pb)) || (lanes == 32 && std::is_same<N, S>::value && fixed_pool_warp<N>(pb));
  } else {
    return false;
  }
}
inline int warp_orders_per_lane(int64_t K) { return K <= 32 ? 1 : 2; }

// Adjoints (VJP, VJP-JVP) take a warp per voxel too (each lane its own checkpoints and, with pool tables,
// its own table cotangents but the saturation table's: event_loop.hpp table_scratch_size). Measured on the
// H200 (docs/design.md), thread/warp ms: real VJP at 2k, 20k, 100k voxels 31/18, 45/48, 139/187; complex VJP
// 63/25, 159/73, 600/264; real VJP-JVP (hvp) 129/33, 325/139, 1384/595. So warp up to 15,000 voxels for a
// real float adjoint, at any size for complex or dual ones.
// Tabulated, thread/warp ms (2026-12-03): pooled_grad 2k 38.9/12.2, 20k 83.7/97.8; pooled5_grad 2k
// 116/24.3, 20k 260/202; pooled_hvp 2k 139/85, 20k 302/484; pooledb_hvp 2k 107/77, 20k 247/448: warp up to
// 6,000 voxels (the dual ones cross near 6k; pooled5_grad, still faster by warp at 20k, is rarely that big).
// With the pool counts fixed at compile time (float adjoint, up to 32 orders: pools.cu), warp/thread ms
// (2026-12-03): pooled_grad 2k 4.56/39.3, 20k 26.8/83.4; pooled5_grad 2k 7.88/117, 20k 62.5/259: warp up to
// 20,000 voxels (measured no further).
// Whether an adjoint of `lanes` lanes per voxel takes the fixed-pool layout in a group (vjp_warp_kernel<float, float,
// 4, layout, 8>: 4 orders a lane, a warp carrying 4 voxels, each lane its own table cotangents but the saturation
// table's, which add_table sums over the group): the real float adjoint in groups of 8, by rule (adjoint_lanes;
// BLOCHSIM_CUDA_MAPPING=warp forces the warp). H100, pools (2, 3), ms, the warp per voxel (126 registers) / groups of 8
// (240): pooled gradient 2k 2.40-2.74 / 2.59-2.94, 5k 4.65-5.40 / 4.36-4.43, 20k 13.3-14.0 / 13.4-13.5
// (benchmarks/results/mapping/api_cases-*-s16g-*): the warp stayed the rule. Since both read the events as the launch
// decoded them the groups win from 20k voxels a call. H100, through the API, two rounds alternated, ms (peak MiB), the
// rule before (a warp to 20,000 voxels a launch, a thread past) / groups of 8 forced
// (benchmarks/results/mapping/fixed_pool_adjoint-NVIDIA_H100_80GB_HBM3-2026-12-07-1b32fd8.json and *-2026-12-07-s29-*):
// pools (1, 2) 2k 2.09-2.43 (88) / 2.00-2.35 (84), 5k 2.94-3.03 (111) / 2.16-2.47 (92), 20k 6.51-6.55 (108) / 4.46-4.66
// (130), 50k 12.96-13.23 / 7.85-8.12; (2, 2) 2k 1.75-2.32 (129) / 2.32-2.52 (122), 5k 2.95-3.43 (70) / 2.79-3.09 (130),
// 20k 6.49-7.29 (87) / 5.36-5.59 (128), 50k 13.54-13.87 / 10.34-11.45, 200k 46.5-46.6 / 37.5-37.7; (2, 3) 2k 2.04-2.70
// (78) / 2.32-2.74 (63), 5k 3.34-4.09 (84) / 3.44-3.72 (134), 20k 7.62-8.04 (103) / 6.17-6.90 (154), 50k 15.96-16.43 /
// 12.40-13.17, 200k 57.6 / 45.5-46.2; (4, 5) 2k 3.19-3.42 (82) / 2.92-3.16 (118), 5k 4.88-5.66 (90) / 5.23-5.99 (253),
// 20k 14.02-14.79 / 12.54-12.65, 50k 31.5-32.0 / 27.9-28.1. Level or mixed to 5k, 10-40 % faster past it, so the rule
// takes them at every size. Not past a crossing of the launch's voxels: the chunker (engine/chunks.py) cuts an adjoint
// to launches whose scratch fits the cap, which held the pooled gradient's warp launches at 20k to about 2,100 voxels
// (one wave of the warp), so with the groups past 5,000 voxels a launch the (2, 2), (2, 3) and (4, 5) calls of 20k-50k
// kept the warp (1b32fd8's record: 20k 6.73-7.65 by the rule against 5.51-6.90 forced).
//
// Groups of 16 (2 orders a lane; compiled, as the second order's, for the layouts of up to seven planes) hold
// fewer registers a lane: ptxas (sm_90), groups of 8 / 16, pools (1, 2) 168 (40 bytes spilled) / 154, (2, 2)
// 202 / 162, (2, 3) 230 / 168 (36 bytes spilled): three blocks a multiprocessor where the groups of 8 keep
// two, 24 voxels a multiprocessor against 32. H100, through the API, two rounds alternated in one call, ms
// (peak MiB), groups of 8 (the rule) / 16 (forced; benchmarks/results/mapping/api_cases-NVIDIA_H100_80GB_HBM3-
// 2026-12-07-s31-{G,V16f}-pool16-r*.json): pooled gradient (2, 3) 2k 2.04-2.41 / 1.92-1.96, 20k 6.40-6.52
// (154.3) / 6.30-6.67 (127.2), 100k 23.46-23.49 / 24.06; pooledb gradient (2, 2) 2k 2.09-2.27 / 1.74-1.80, 20k
// 5.22-5.87 / 5.12-5.42, 100k 19.33-19.69 / 19.94-20.03. So the groups of 16 take a launch of up to
// kPoolGroupOf16Voxels, under a wave of either (4,224 voxels of the groups of 8 on an H100, 3,168 of 16), where
// their extra warps a scheduler fill a card the groups of 8 leave half empty; from a wave on the chunker's
// launches are whole waves and the groups of 8 are level or ahead.
constexpr int64_t kPoolGroupOf16Voxels = 3000;
// The layouts compiled in groups of 16, the first order's and the second's (launch_plan.hpp launch_vjp_pools).
constexpr int kPoolGroupOf16Planes = 7;
template <class R>
inline int pool_planes(const Problem<R>& pb) {  // planes of the fixed-pool layout's state array
  return layout_planes(pools_layout(pb.nt, pb.nl));
}
template <class R>
inline bool pool_groups_of_16_compiled(const Problem<R>& pb) {
  return compiled_pools(pb) && pool_planes(pb) <= kPoolGroupOf16Planes;
}
template <class N, class S, class R>
inline bool fixed_pool_group_adjoint(const Problem<R>& pb, int lanes) {
  const bool compiled = lanes == 8 ? compiled_pools(pb) : lanes == 16 && pool_groups_of_16_compiled(pb);
  return compiled && std::is_same<N, float>::value && std::is_same<S, float>::value;
}
// Whether the second order's adjoint (Dual<float, 1>) takes the fixed-pool layout in groups of 16 lanes
// (vjp_warp_kernel<Dual<float, 1>, Dual<float, 1>, 2, layout, 16>: 2 orders a lane, 2 voxels a warp), where
// BLOCHSIM_CUDA_ADJOINT_LANES=16 asks for it: compiled for the layouts of up to seven planes (pools (1, 2),
// (2, 2), (2, 3)). ptxas (sm_90), the warp / groups of 16: pools (1, 2) 168 / 238 registers, (2, 2) 214 /
// 255, (2, 3) 233 / 255 and 176 bytes spilled; the groups two blocks of 128 a multiprocessor (8 voxels a
// block where the warp holds 4), at 0.76 of the warp's instructions a voxel and event
// (benchmarks/sass_regions.py). H100, through the API, two rounds alternated, ms, warp / groups of 16
// (benchmarks/results/mapping/api_cases-NVIDIA_H100_80GB_HBM3-2026-12-06-s22d-*.json): pooledb HVP (2, 2) 2k
// 5.72-5.93 / 5.22-5.35, 5k 11.67-11.74 / 11.10-11.46, 20k 43.77-43.85 / 39.87-39.98 (peaks at 2k and 5k 73
// and 87 MiB / 118 and 135); pooled HVP (2, 3), whose groups spill, 2k 6.14-6.64 / 6.89-7.14, 5k 12.70-12.79
// / 15.08-15.24, 20k 47.70-47.99 / 54.22-54.66. So the rule (adjoint_lanes) takes them where they do not
// spill, up to kSecondOrderPoolGroupRulePlanes planes, and BLOCHSIM_CUDA_ADJOINT_LANES=16 forces them for
// (2, 3) as well (BLOCHSIM_CUDA_MAPPING=warp forces the warp). The rule against the warp, H100, two rounds, ms
// (mapping/api_cases-NVIDIA_H100_80GB_HBM3-2026-12-06-s23a-f1{6,7}-*.json): pools (1, 2) 2k 6.64-6.73 /
// 5.39-5.71, 20k 42.47-42.71 / 39.04-39.21; (2, 2) 2k 6.03-6.30 / 6.48-6.53, 20k 43.63-44.22 / 40.70-41.03.
constexpr int kSecondOrderPoolGroupRulePlanes = 6;  // pools (1, 2) and (2, 2)
template <class N, class S, class R>
inline bool fixed_pool_second_order_groups(const Problem<R>& pb, int lanes) {
  return lanes == 16 && std::is_same<N, Dual<float, 1>>::value && std::is_same<S, N>::value &&
         pool_groups_of_16_compiled(pb);
}
template <class N, class S, class R>
inline bool warp_adjoint(const Problem<R>& pb, int64_t V) {
  if (pb.K > 64) return false;
  if (fixed_pools<N>(pb)) return V <= 20000;  // complex states: the real ones take groups (fixed_pool_group_adjoint)
  if (pb.tabulated) return V <= 6000;  // the second order's fixed pools too (their crossing not measured)
  return Num<N>::P > 0 || !std::is_same<N, S>::value || V <= 15000;
}
// Whether an adjoint can take a group of 4 or 8 lanes per voxel (vjp_warp_kernel with LANES 4 or 8: 8 or 4
// orders a lane, each warp carrying 8 or 4 voxels, so each event's scalar work and reductions are shared):
// compiled for pool model 0 up to 32 orders, at every number type of the adjoints.
template <class R>
inline bool group_adjoint(const Problem<R>& pb) {
  return !pb.tabulated && pb.K <= 32;
}
// Whether an adjoint of `lanes` lanes per voxel runs the plain adjoint's scheme in groups
// (vjp_plain_lanes_kernel, its lanes' stores vjp_voxel_plain's) rather than the general one (vjp_warp_kernel):
// the real plain layout at 32 orders, first order (register_adjoint's problems) and second (Dual<float, 1>,
// which took the general groups at every size: their states fit a group's registers, as a thread's do not).
template <class N, class S, class R>
inline bool plain_group_adjoint(const Problem<R>& pb, int lanes) {
  // 32 lanes (one order a lane) only where BLOCHSIM_CUDA_ADJOINT_LANES asks: a forced warp keeps the general one.
  const bool compiled = lanes == 4 || lanes == 8 || lanes == 16 || (lanes == 32 && forced_adjoint_plain_lanes() == 32);
  return compiled && pb.K == 32 && plain_adjoint<N, S>(pb);
}
// Whether the general adjoint of `lanes` lanes per voxel (vjp_warp_kernel) takes the plain layout rather than
// pool model 0: the complex path where every order relaxes alike (plain_orders: no diffusion, flow or
// washout), the first order in groups of 8 (4 orders a lane) and the second in groups of 16 (2 orders a lane;
// adjoint_lanes), 8 (forced: BLOCHSIM_CUDA_ADJOINT_LANES=8) or a warp (one order a lane). The plain layout
// holds those facts at compile time, so relaxation, its adjoint and the interval's factors lose their
// order-dependent branches, as the value forwards' did.
template <class N, class S, class R>
inline bool plain_general_adjoint(const Problem<R>& pb, int lanes) {
  constexpr bool complex_path = !std::is_same<N, S>::value;
  const bool second_order_groups = Num<N>::P == 1 && (lanes == 8 || lanes == 16);
  const bool compiled = (Num<N>::P == 0 && lanes == 8) || (Num<N>::P == 1 && lanes == 32) || second_order_groups;
  return complex_path && compiled && pb.K <= 32 && plain_orders(pb);
}
// Lanes per voxel of an adjoint launch: 32 (a warp), 16, 8 or 4 (a group), or 1 (a thread per voxel). Groups
// of 8 wherever they are compiled, but for the complex second order: pool model 0's groups of 8 spill
// (Cx<Dual>: 496 bytes a thread, none on the warp; H100, through the API, 5fa5820, ms, warp / groups of 8 /
// of 4: complex HVP 2k 15.28-15.79 / 21.33-21.55 / 25.99, 5k 35.03-35.10 / 39.91-40.16 / 55.67, 20k
// 137.35-137.78 / 134.46-134.95 / 205.37, the groups' peaks higher: benchmarks/results/mapping/
// api_cases-NVIDIA_H100_80GB_HBM3-2026-12-06-s21f-*.json), so where its orders relax alike (plain_orders) it
// takes the plain layout in groups of 16 (ptxas, sm_90: 255 registers, no spill, two blocks of 128 a
// multiprocessor; 2 voxels a warp, each event's scalar work on 16 lanes where the warp repeats it on 32),
// else the warp. H100, through the API, alternated, two rounds (mapping/api_cases-NVIDIA_H100_80GB_HBM3-
// 2026-12-06-s22b-*.json), ms (peak MiB), warp / plain groups of 16 / of 8: complex HVP 2k 15.17-15.26 (185)
// / 12.55-12.67 (208) / 10.99-11.09 (342), 5k 34.17-34.84 (242) / 28.79-28.89 (265) / 26.94-27.20 (417, the
// incumbent's 410), 20k 138.51-139.05 (611) / 118.19-118.45 (611) / 103.47-103.98 (702). Groups of 8 are the
// fastest, but each of their launches fills a wave of 4,224 voxels' stores (255 registers, 280 bytes
// spilled): over the incumbent's peak at 5k; groups of 16 stay within 23 MiB of the warp's peak.
// H200, 2026-12-04, ms per call through the API under the default scratch cap (adjoint launches of ~4,300
// voxels; benchmarks/results/mapping/adjoint_mapping-NVIDIA_H200-2026-12-04-99ed754.json), lanes8 / warp /
// thread: real gradient 2k 8.1 / 8.8 /
// 12.8, 20k 25.9 / 43.7 / 48.7, 100k 105 / 241 / 202; complex gradient 2k 9.2 / 9.4 / 36.2, 20k 52.9 / 57.6 /
// 311; real HVP 20k 137 / 219 / 1512 (its lanes8 row with its Jacobian forced to lanes8 as well, 4.5 ms
// slower than auto's). Launches of 20k-100k voxels (a 1 GiB budget): lanes8 within 10% of the best (lanes4 or
// the thread) on the real gradient and the fastest on the complex one and the HVP. A forced group where none
// is compiled takes a thread per voxel, as the forward's does.
// The real plain path's first-order adjoint at 32 orders takes a thread per voxel past kPlainGroupVoxels
// (register_adjoint): vjp_voxel_plain, one pass over the orders per event, its working states in registers
// (event_loop.hpp; ptxas, sm_90: 255 registers, 128 bytes of spill stores since its scratch is in warp
// tiles and it compiles alone). H200, through the API, ms, thread / groups of 8 at 4d252d8 (benchmarks/
// results/mapping/api_cases-{thread,lanes8}-NVIDIA_H200-2026-12-04-4d252d8.json): real gradient 2k 5.8 /
// 6.7, 5k 8.9 / 10.6, 10k 12.2 / 15.8, 20k 18.8 / 25.0 (at 100k and 1M the thread took 36.5 / 205 where
// groups took 75 / 773 before). Below 2k both are a voxel's latency: the thread's 1,501 events in series
// against a group's, whose lanes repeat each event's scalar work. Limited to two blocks of 128 a
// multiprocessor by its registers: held to three (168 registers) it spilled again and took 58.1 / 363 ms
// at 100k / 1M against 36.5 / 205 (mapping/api_cases-blocks-{2,3}-NVIDIA_H200-2026-12-04-4d252d8{,-2}.json).
// Its second order (dual numbers, states in device scratch) and the complex gradient stay in groups: at
// 20k, thread / groups, real HVP 457 / 127 ms, complex gradient 647 / 53 (the same records' -2 files).
// Below it the register adjoint's problems take the same scheme in groups of lanes (vjp_plain_lanes_kernel:
// vjp_voxel_plain with 4 or 8 orders a lane and no sum across the group per event): 8 lanes up to
// kPlainGroupVoxels, 4 up to kPlainGroupOf4Voxels; the real second order (Dual<float, 1>, which the general
// groups ran at every size) takes them at every size, 8 lanes up to kPlainSecondOrderOf8Voxels and 4 above.
// H200, through the API, ms, 13th session (benchmarks/results/mapping/api_cases-NVIDIA_H200-2026-12-05-s13*,
// two rounds at 2k-20k, one at 50k-200k): first order, groups of 8 / groups of 4 / thread: 2k 3.38-3.56 /
// 3.68-3.83 / 4.09-4.53, 10k 7.24-7.28 / 7.35-7.53 / 8.01-8.23, 20k 11.3-11.6 (the rule before: 8 lanes to 10k) /
// 10.3-11.0 / 11.7-12.0, 50k 23.2 / 21.3 / 13.7, 100k 45.9 / 34.1 / 19.6 (the thread's grid fills the card
// there); second order, groups of 8 / of 4 (the general groups before): 2k 7.67-7.90 / 12.7-12.9 (18.6-18.8),
// 5k 23.6-23.8 / 20.0-20.5 (39.7), 20k 66.0-66.4 / 59.9-60.5 (111.3), 100k 260 / 216 (362), 200k 491 / 391
// (669). Groups of 8 win while their launch is about a wave (ptxas, sm_90: the first order's 120 registers
// keep 4 blocks of 128 a multiprocessor, 8.4k voxels a wave in groups of 8; the second order's 204, 2 blocks,
// 4.2k voxels), groups of 4 past it, and the first order's thread once its launches fill the card. The
// rules read a launch's voxels: a call split under the scratch cap takes them per launch.
constexpr int64_t kPlainGroupVoxels = 10000;
constexpr int64_t kPlainGroupOf4Voxels = 20000;
constexpr int64_t kPlainSecondOrderOf8Voxels = 4000;
template <class N, class S, class R>
inline int adjoint_lanes(const Problem<R>& pb, int64_t V) {
  if (pb.K > 64) return 1;
  const int plain_lanes = forced_adjoint_plain_lanes();
  const bool forced_groups = plain_group_adjoint<N, S>(pb, plain_lanes) ||
                             fixed_pool_group_adjoint<N, S>(pb, plain_lanes) ||
                             fixed_pool_second_order_groups<N, S>(pb, plain_lanes) ||
                             (Num<N>::P == 1 && plain_general_adjoint<N, S>(pb, plain_lanes));
  if (plain_lanes > 0 && forced_groups) return plain_lanes;
  const int forced = forced_mapping();
  if (forced > 1 && forced < 32) return group_adjoint(pb) ? forced : 1;
  if (forced >= 0) return forced;
  constexpr bool complex_second_order = !std::is_same<N, S>::value && Num<N>::P > 0;
  if (register_adjoint<N, S>(pb)) return V <= kPlainGroupVoxels ? 8 : V <= kPlainGroupOf4Voxels ? 4 : 1;
  if (plain_group_adjoint<N, S>(pb, 4)) return V <= kPlainSecondOrderOf8Voxels ? 8 : 4;
  if (complex_second_order && plain_general_adjoint<N, S>(pb, 16)) return 16;
  const bool pool_groups =
      fixed_pool_second_order_groups<N, S>(pb, 16) && pool_planes(pb) <= kSecondOrderPoolGroupRulePlanes;
  if (pool_groups) return warp_adjoint<N, S>(pb, V) ? 16 : 1;  // where the warp ran (the thread past its crossing)
  if (group_adjoint(pb) && !complex_second_order) return 8;
  if (fixed_pool_group_adjoint<N, S>(pb, 16) && V <= kPoolGroupOf16Voxels) return 16;
  if (fixed_pool_group_adjoint<N, S>(pb, 8)) return 8;
  return warp_adjoint<N, S>(pb, V) ? 32 : 1;
}
// Orders a lane holds in an adjoint of `lanes` lanes per voxel (vjp_warp_kernel's KPL).
inline int adjoint_orders_per_lane(int64_t K, int lanes) { return lanes == 32 ? warp_orders_per_lane(K) : 32 / lanes; }
// Threads an adjoint launches: `lanes` per voxel in blocks of 128 (a warp per voxel: blocks of four voxels),
// or one per voxel.
template <class N, class S, class R>
inline int64_t adjoint_threads(const Problem<R>& pb, int64_t V) {
  const int lanes = adjoint_lanes<N, S>(pb, V);
  return lanes > 1 ? 128 * ((V * lanes + 127) / 128) : padded_voxels(V);
}

// `warp_kernels`: the library has the warp kernels (the CUDA 12 launcher does not: a thread per voxel).
template <class N, class S, class R>
inline int64_t forward_state_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  if (warp_kernels && forward_lanes<N, S>(pb, V) > 1) return 0;
  const int64_t bytes = int64_t(sizeof(S)) * padded_voxels(V) * device_scratch_per_voxel(pb, false, registers_layout<N>(pb) > 0);
  return (bytes + 255) / 256 * 256;
}
// Whether a forward launch forms its profiled pulses' rotations once (pulses.hpp pairs_per_launch): the value
// forward of the library with the warp kernels (decode_events_kernel forms them).
template <class N, class S, class R>
inline bool forward_pairs(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  return warp_kernels && std::is_same<N, R>::value && !std::is_same<S, N>::value && pairs_per_launch(pb, V);
}
constexpr int64_t kPairsPerThread = 4;  // of decode_events_kernel: its grid spans them
// Where they start: after the states and the decoded events, 256-byte aligned.
template <class N, class S, class R>
inline int64_t pulse_pairs_offset(const Problem<R>& pb, int64_t V) {
  return forward_state_bytes<N, S>(pb, V) + (event_table_bytes<N>(pb) + 255) / 256 * 256;
}
// The states, then (the library with the warp kernels, value forwards) the decoded events and the pulses'
// rotations, or (jvp_values) the JVP's decoded entries.
template <class N, class S, class R>
inline int64_t forward_scratch_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  const bool table = warp_kernels && Num<N>::P == 0;
  if (forward_pairs<N, S>(pb, V, warp_kernels))
    return pulse_pairs_offset<N, S>(pb, V) + int64_t(sizeof(R)) * kPairReals * pulse_pair_count(pb);
  if (jvp_values<N, S>(pb, V, warp_kernels)) return forward_state_bytes<N, S>(pb, V) + event_code_bytes(pb);
  return forward_state_bytes<N, S>(pb, V, warp_kernels) + (table ? event_table_bytes<N>(pb) : 0);
}

template <class N, class S, class R>
inline int64_t vjp_state_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  const int lanes = warp_kernels ? adjoint_lanes<N, S>(pb, V) : 1;
  if (lanes > 1) {  // a store per lane, of the planes x KPL
    // Sized by the threads launched (whole blocks of 128), not lanes x V: sized by 32 V, the last lanes'
    // store ran past its end into the table cotangents behind it when V % 4 != 0 (static shims at 13 voxels
    // on the H200: gradients 0.138 off the host).
    const int64_t per_lane =
        lane_store_size(pb, adjoint_orders_per_lane(pb.K, lanes), plain_group_adjoint<N, S>(pb, lanes));
    return (int64_t(sizeof(S)) * adjoint_threads<N, S>(pb, V) * per_lane + 255) / 256 * 256;
  }
  const int64_t per_voxel = device_scratch_per_voxel(pb, true, register_adjoint<N, S>(pb), plain_adjoint<N, S>(pb));
  return (int64_t(sizeof(S)) * padded_voxels(V) * per_voxel + 255) / 256 * 256;
}

// Whether an adjoint launch reads the events as the launch decoded them (event_loop.hpp PlainCode): the
// real plain scheme in groups of 4 or 8 (plain_group_adjoint) or on the register thread (register_adjoint),
// its pulses uniform over the voxels, in the library with the warp kernels; the second order in groups where
// no event value carries a tangent (event_loop.hpp events_without_tangents: the entries, real numbers, are
// its events' values).
template <class N, class S, class R>
inline bool decoded_plain_events(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  if constexpr (std::is_same<S, N>::value && Num<N>::P <= 1) {
    if (!warp_kernels || !uniform_pulse(pb)) return false;
    const int lanes = adjoint_lanes<N, S>(pb, V);
    if (lanes == 1) return Num<N>::P == 0 && register_adjoint<N, S>(pb);  // the register thread per voxel
    return (lanes == 4 || lanes == 8) && plain_group_adjoint<N, S>(pb, lanes) &&
           (Num<N>::P == 0 || events_without_tangents(pb));
  } else {
    return false;
  }
}
// Whether an adjoint launch is of the general scheme in a group or warp per voxel (vjp_warp_kernel, pool
// model 0 or the pool tables), whose walks read the events as the launch decoded them (event_loop.hpp
// EventCode, launch_event_source: values and folds at the first order, folds at the second): in the library
// with the warp kernels, every launch of vjp_warp_kernel.
template <class N, class S, class R>
inline bool decoded_general_events(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  if constexpr (reads_event_codes<N, R>()) {
    if (!warp_kernels) return false;
    const int lanes = adjoint_lanes<N, S>(pb, V);
    return lanes > 1 && !plain_group_adjoint<N, S>(pb, lanes);
  } else {
    return false;
  }
}
// The adjoint's scratch: its states, its table cotangents' scratch, then (decoded_plain_events,
// decoded_general_events) the decoded events from decoded_events_offset, 256-byte aligned.
template <class N, class S, class R>
inline int64_t vjp_states_and_tables_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels) {
  const int lanes = warp_kernels ? adjoint_lanes<N, S>(pb, V) : 1;
  const int64_t threads = lanes > 1 ? adjoint_threads<N, S>(pb, V) : padded_voxels(V);
  return vjp_state_bytes<N, S>(pb, V, warp_kernels) + int64_t(sizeof(N)) * table_scratch_size(pb, threads, lanes);
}
template <class N, class S, class R>
inline int64_t decoded_events_offset(const Problem<R>& pb, int64_t V) {
  return (vjp_states_and_tables_bytes<N, S>(pb, V, true) + 255) / 256 * 256;
}
template <class N, class S, class R>
inline int64_t vjp_scratch_bytes(const Problem<R>& pb, int64_t V, bool warp_kernels = true) {
  if (decoded_plain_events<N, S>(pb, V, warp_kernels)) return decoded_events_offset<N, S>(pb, V) + plain_code_bytes(pb);
  if (decoded_general_events<N, S>(pb, V, warp_kernels))
    return decoded_events_offset<N, S>(pb, V) + event_code_bytes(pb);
  return vjp_states_and_tables_bytes<N, S>(pb, V, warp_kernels);
}

}  // namespace bs
