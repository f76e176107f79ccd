// VJP: the checkpointed adjoint at a real number type. Instantiated once per precision, each in a
// translation unit of its own (CMakeLists.txt writes the units); capi.cpp calls vjp_entry.
#pragma once

#include "epg_host.hpp"
#include "epg_lanes.hpp"

namespace bs {
template <class R>
void vjp_entry(const bs_epg_vjp_args& a) {
  if (a.program.path == BS_PATH_REAL) {
    LaneAdjointIO io;
    io.cotangent = a.cotangent;
    io.grads = a.grads;
    if (vjp_lanes<R, 0>(make_problem<R>(a.program, a.tissue, nullptr, a.tables, nullptr), a.tissue.num_voxels,
                        a.num_threads, io))
      return;
  }
  if (a.program.path == BS_PATH_REAL)
    run_vjp<R, R>(a.program, a.tissue, a.tables, nullptr, nullptr, a.num_threads, a.cotangent, nullptr, a.grads,
                  nullptr, &a.table_grads, nullptr, nullptr, nullptr);
  else
    run_vjp<R, Cx<R>>(a.program, a.tissue, a.tables, nullptr, nullptr, a.num_threads, a.cotangent, nullptr, a.grads,
                      nullptr, &a.table_grads, nullptr, nullptr, nullptr);
}
}  // namespace bs
