// Second-order adjoint: the checkpointed adjoint at Dual<R, 1> (forward over reverse).
#include "epg_host.hpp"

namespace bs {
template <class R>
void vjp_jvp_entry(const bs_epg_vjp_jvp_args& a) {
  if (a.tangents.count != 1)
    throw std::invalid_argument("tangents.count must be 1 for the second-order adjoint, got " +
                                std::to_string(a.tangents.count));
  using N = Dual<R, 1>;
  if (a.program.path == BS_PATH_REAL)
    run_vjp<N, N>(a.program, a.tissue, a.tables, &a.tangents, &a.tables_tangent, a.num_threads, a.cotangent,
                  a.cotangent_tangent, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent, a.signal,
                  a.signal_tangent);
  else
    run_vjp<N, Cx<N>>(a.program, a.tissue, a.tables, &a.tangents, &a.tables_tangent, a.num_threads, a.cotangent,
                      a.cotangent_tangent, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent,
                      a.signal, a.signal_tangent);
}
template void vjp_jvp_entry<float>(const bs_epg_vjp_jvp_args&);
template void vjp_jvp_entry<double>(const bs_epg_vjp_jvp_args&);
}  // namespace bs
