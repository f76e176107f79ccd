// JVP: the forward event loop at Dual<R, P>, P tangents at once (P padded up to 1, 2, 4 or 8).
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

template <class R>
void jvp_entry(const bs_epg_jvp_args& a) {
  switch (a.tangents.count) {
    case 1: return jvp_at<R, 1>(a);
    case 2: return jvp_at<R, 2>(a);
    case 4: return jvp_at<R, 4>(a);
    case 8: return jvp_at<R, 8>(a);
    default:
      throw std::invalid_argument("tangents.count must be 1, 2, 4 or 8 (pad with zero tangents), got " +
                                  std::to_string(a.tangents.count));
  }
}
template void jvp_entry<float>(const bs_epg_jvp_args&);
template void jvp_entry<double>(const bs_epg_jvp_args&);
}  // namespace bs
