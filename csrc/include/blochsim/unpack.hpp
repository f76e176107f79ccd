// Host-side unpacking of the C ABI structs into the kernels' Problem, with validation (throws
// std::invalid_argument; the entry points turn that into a status and bs_last_error()). Shared by the host
// and the CUDA libraries.
#pragma once

#include <stdexcept>
#include <string>

#include "blochsim/event_loop.hpp"
#include "capi.h"

namespace bs {

// The per-voxel pulses of a program (pulses.hpp), checked: each row array with its table, rows in range
// (host arrays), the complex path.
template <class R>
void unpack_pulses(const bs_program& pg, const bs_tables& tb, bool host_arrays, Problem<R>& pb) {
  pb.field_row = pg.field_row;
  pb.profile_row = pg.profile_row;
  pb.spinor_row = pg.spinor_row;
  if (!per_voxel_pulses(pb)) return;
  if (pg.path != BS_PATH_COMPLEX) throw std::invalid_argument("per-voxel pulses need the complex path");
  pb.num_field_rows = pg.num_field_rows;
  pb.num_spinor_rows = pg.num_spinor_rows;
  pb.num_profile_rows = pg.num_profile_rows;
  pb.num_positions = pg.num_positions;
  pb.voxel_offset = pg.voxel_offset;
  pb.profile_bins = pg.profile_bins;
  pb.profile_theta_max = pg.profile_theta_max;
  if (pb.num_positions < 1 || pb.voxel_offset < 0) throw std::invalid_argument("num_positions must be >= 1");
  if ((pb.field_row && !tb.field) || (pb.spinor_row && !tb.spinor) || (pb.profile_row && !tb.profile))
    throw std::invalid_argument("a row array (field, spinor, profile) needs its table");
  if (pb.profile_row && (pb.profile_bins < 2 || !(pb.profile_theta_max > 0)))
    throw std::invalid_argument("profiles need profile_bins >= 2 and profile_theta_max > 0");
  if (!host_arrays) return;
  const int32_t* rows[3] = {pb.field_row, pb.profile_row, pb.spinor_row};
  const int64_t counts[3] = {pb.num_field_rows, pb.num_profile_rows, pb.num_spinor_rows};
  for (int i = 0; i < 3; ++i)
    if (rows[i])
      for (int64_t e = 0; e < pb.E; ++e)
        if (rows[i][e] >= counts[i]) throw std::invalid_argument("pulse table row out of range");
}

template <class R>
// `host_arrays`: the program's int arrays are host memory and are checked here; the CUDA build passes
// device arrays (false), which the engine's compiler has already checked.
Problem<R> make_problem(const bs_program& pg, const bs_tissue& ts, const bs_tangents* tg, const bs_tables& tb,
                        const bs_tables* tb_tan, bool host_arrays = true) {
  Problem<R> pb;
  pb.E = pg.num_events;
  pb.reps = pg.num_repetitions;
  pb.S = pg.num_samples;
  pb.K = pg.num_states;
  pb.stride = pg.checkpoint_stride;
  pb.slots = pg.checkpoint_slots;
  if (pb.E < 1) throw std::invalid_argument("num_events must be >= 1");
  if (pb.reps < 1) throw std::invalid_argument("num_repetitions must be >= 1");
  if (pb.K < 1) throw std::invalid_argument("num_states must be >= 1");
  if (pb.stride < 1) throw std::invalid_argument("checkpoint_stride must be >= 1");
  if (pb.slots < 0 || pb.slots > pb.stride)
    throw std::invalid_argument("checkpoint_slots must be in [0, checkpoint_stride], got " + std::to_string(pb.slots));
  if (pg.path != BS_PATH_REAL && pg.path != BS_PATH_COMPLEX) throw std::invalid_argument("path must be 0 or 1");
  pb.action = pg.action;
  pb.record = pg.record;
  auto event_input = [&](const void* data, const void* tan, int64_t tan_stride_p) {
    Input<R> in;
    in.data = static_cast<const R*>(data);
    in.stride = 1;
    in.tan = static_cast<const R*>(tan);
    in.tan_stride_p = tan_stride_p;
    in.tan_stride = 1;
    return in;
  };
  pb.dt = event_input(pg.dt_s, tg ? tg->dt_s : nullptr, pb.E);
  pb.dt_wrap = event_input(pg.dt_wrap_s, tg ? tg->dt_wrap_s : nullptr, 1);
  pb.flip = event_input(pg.flip_rad, tg ? tg->flip_rad : nullptr, pb.E);
  pb.phase = event_input(pg.phase_rad, tg ? tg->phase_rad : nullptr, pb.E);
  if (!pb.dt.data || !pb.dt_wrap.data || !pb.flip.data || !pb.phase.data || !pb.action || !pb.record)
    throw std::invalid_argument("program arrays must not be null");
  static const double identity[BS_NUM_TISSUE] = {0, 0, 1, 1, 0, 0, 1, 0, 0};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    Input<R>& in = pb.tissue[j];
    in.data = static_cast<const R*>(ts.data[j]);
    in.stride = ts.stride[j];
    in.identity = R(identity[j]);
    if (tg) {
      in.tan = static_cast<const R*>(tg->tissue[j]);
      in.tan_stride_p = tg->tissue_stride_p[j];
      in.tan_stride = tg->tissue_stride_v[j];
    }
  }
  if (!pb.tissue[BS_T1_MS].data || !pb.tissue[BS_T2_MS].data)
    throw std::invalid_argument("tissue T1 and T2 are required");
  pb.dk = pg.crusher_dk_rad_per_m;
  pb.voxel_m = pg.voxel_size_m;
  const bool moving = ts.data[BS_VELOCITY_M_PER_S] != nullptr;
  pb.diffusion = pb.dk != 0 && ts.data[BS_DIFFUSION_UM2_PER_MS] != nullptr;
  pb.flow = pb.dk != 0 && moving;
  pb.washout = pb.voxel_m > 0 && moving;
  pb.offres = ts.data[BS_B0_HZ] != nullptr;
  if (pg.path == BS_PATH_REAL && (pb.offres || moving || ts.data[BS_B1_PHASE_RAD]))
    throw std::invalid_argument("the real path cannot take B0, B1phase or v: compile for the complex path");
  if (host_arrays)
    for (int64_t e = 0; e < pb.E; ++e)
      if (pb.record[e] >= pb.S) throw std::invalid_argument("record slot out of range");
  if (host_arrays && pb.slots > 0)  // a stretch writing past its slots would overwrite the checkpoints
    for (int64_t i0 = 0, n = pb.E * pb.reps; i0 < n; i0 += pb.stride) {
      int64_t passes = 0;
      for (int64_t i = i0; i < i0 + pb.stride && i < n; ++i)
        passes += passes_over_states(pb.action[i % pb.E]) ? 1 : 0;
      if (passes > pb.slots)
        throw std::invalid_argument("checkpoint_slots " + std::to_string(pb.slots) + " is fewer than the " +
                                    std::to_string(passes) + " events that touch the states in the stretch from event " +
                                    std::to_string(i0));
    }
  pb.nt = pg.num_transverse_pools;
  pb.nl = pg.num_longitudinal_pools;
  pb.tabulated = pg.tabulated != 0;
  if (!pb.tabulated && (pb.nt != 1 || pb.nl != 1))
    throw std::invalid_argument("pool model 0 has one transverse and one longitudinal pool");
  if (pb.nt < 1 || pb.nl < pb.nt || pb.nl > kMaxPools)
    throw std::invalid_argument("pools: need 1 <= num_transverse_pools <= num_longitudinal_pools <= 8");
  if (pb.tabulated) {
    pb.num_intervals = pg.num_intervals;
    pb.interval = pg.interval;
    pb.wrap_interval = pg.wrap_interval;
    if (!pb.interval || !tb.L || !tb.r || !tb.T || !tb.zeq || (pb.nl > pb.nt && !tb.sat))
      throw std::invalid_argument("a tabulated layout needs its interval rows and tables L, r, T, zeq (and sat)");
    if (host_arrays)
      for (int64_t e = 0; e < pb.E; ++e)
        if ((pb.action[e] & BS_INTERVAL) && (pb.interval[e] < 0 || pb.interval[e] >= pb.num_intervals))
          throw std::invalid_argument("interval row out of range");
  }
  Input<R>* tables[kTableCount] = {&pb.table_L,   &pb.table_r,     &pb.table_T,      &pb.table_zeq,
                                   &pb.table_sat, &pb.table_field, &pb.table_spinor, &pb.table_profile};
  const void* data[kTableCount] = {tb.L, tb.r, tb.T, tb.zeq, tb.sat, tb.field, tb.spinor, tb.profile};
  const void* tans[kTableCount] = {};
  if (tb_tan) {
    const void* given[kTableCount] = {tb_tan->L,   tb_tan->r,     tb_tan->T,      tb_tan->zeq,
                                      tb_tan->sat, tb_tan->field, tb_tan->spinor, tb_tan->profile};
    for (int i = 0; i < kTableCount; ++i) tans[i] = given[i];
  }
  for (int i = 0; i < kTableCount; ++i) {
    if (i < 5 && !pb.tabulated) continue;
    tables[i]->data = static_cast<const R*>(data[i]);
    tables[i]->stride = tb.stride_v[i];
    tables[i]->tan = static_cast<const R*>(tans[i]);
    if (tb_tan) {
      tables[i]->tan_stride_p = tb_tan->stride_p[i];
      tables[i]->tan_stride = tb_tan->stride_v[i];
    }
  }
  unpack_pulses(pg, tb, host_arrays, pb);
  return pb;
}

// Where a pass writes its table cotangents (null where not asked), in the order of kTableCount.
template <class R>
void table_grad_outputs(const bs_table_grads* g, R* out[kTableCount]) {
  void* const given[kTableCount] = {g ? g->L : nullptr,     g ? g->r : nullptr,   g ? g->T : nullptr,
                                    g ? g->zeq : nullptr,   g ? g->sat : nullptr, g ? g->field : nullptr,
                                    g ? g->spinor : nullptr, nullptr};
  for (int i = 0; i < kTableCount; ++i) out[i] = static_cast<R*>(given[i]);
}

}  // namespace bs
