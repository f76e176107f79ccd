// Second-order adjoint at one precision R on one state path: the checkpointed adjoint at Dual<R, 1>
// (forward over reverse), state scalar Dual<R, 1> (real path) or Cx<Dual<R, 1>> (complex). Each (R, path)
// is instantiated in a translation unit of its own (CMakeLists.txt writes the units); epg_vjp_jvp.cpp
// picks one by the program's path.
#pragma once

#include "epg_host.hpp"
#include "epg_lanes.hpp"

namespace bs {
template <class R, bool kComplex>
void vjp_jvp_at(const bs_epg_vjp_jvp_args& a) {
  if constexpr (!kComplex) {  // the real plain path runs in voxel lanes (epg_lanes.inc)
    LaneAdjointIO io;
    io.cotangent = a.cotangent;
    io.cotangent_tangent = a.cotangent_tangent;
    io.grads = a.grads;
    io.grads_tangent = &a.grads_tangent;
    io.signal = a.signal;
    io.signal_tangent = a.signal_tangent;
    if (vjp_lanes<R, 1>(make_problem<R>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent),
                        a.tissue.num_voxels, a.num_threads, io))
      return;
  }
  using N = Dual<R, 1>;
  using S = typename std::conditional<kComplex, Cx<N>, N>::type;
  run_vjp<N, S>(a.program, a.tissue, a.tables, &a.tangents, &a.tables_tangent, a.num_threads, a.cotangent,
                a.cotangent_tangent, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent, a.signal,
                a.signal_tangent);
}
}  // namespace bs
