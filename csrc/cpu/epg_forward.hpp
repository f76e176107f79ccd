// Forward simulation: the event loop at a real number type. Instantiated once per precision, each in a
// translation unit of its own (CMakeLists.txt writes the units); capi.cpp calls forward_entry.
#pragma once

#include "epg_host.hpp"
#include "epg_lanes.hpp"

namespace bs {
template <class R>
void forward_entry(const bs_epg_forward_args& a) {
  if (a.program.path == BS_PATH_REAL &&
      forward_lanes<R, 0>(make_problem<R>(a.program, a.tissue, nullptr, a.tables, nullptr), a.tissue.num_voxels,
                          a.num_threads, a.signal, nullptr))
    return;
  if (a.program.path == BS_PATH_REAL)
    run_forward<R, R>(a.program, a.tissue, a.tables, nullptr, nullptr, a.num_threads, a.signal, nullptr);
  else
    run_forward<R, Cx<R>>(a.program, a.tissue, a.tables, nullptr, nullptr, a.num_threads, a.signal, nullptr);
}
}  // namespace bs
