// JVP at one precision R and tangent count P: the forward event loop at Dual<R, P>. Each (R, P) is
// instantiated in a translation unit of its own (CMakeLists.txt writes the units: the eight together took
// 70 s in one unit at -O3); epg_jvp.cpp picks one by the call's tangent count.
#pragma once

#include "epg_host.hpp"
#include "epg_lanes.hpp"

namespace bs {
template <class R, int P>
void jvp_at(const bs_epg_jvp_args& a) {
  using N = Dual<R, P>;
  if (a.program.path == BS_PATH_REAL &&
      forward_lanes<R, P>(make_problem<R>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent),
                          a.tissue.num_voxels, a.num_threads, a.signal, a.signal_tangent))
    return;
  if (a.program.path == BS_PATH_REAL)
    run_forward<N, N>(a.program, a.tissue, a.tables, &a.tangents, &a.tables_tangent, a.num_threads, a.signal,
                      a.signal_tangent);
  else
    run_forward<N, Cx<N>>(a.program, a.tissue, a.tables, &a.tangents, &a.tables_tangent, a.num_threads, a.signal,
                          a.signal_tangent);
}
}  // namespace bs
