// Second-order adjoint (the adjoint at Dual<float, 1>).
#include "passes.cuh"

void bs::cuda_vjp_jvp(const bs_epg_vjp_jvp_args& a) {
  if (a.tangents.count != 1) throw std::invalid_argument("tangents.count must be 1 for the second-order adjoint");
  using N = Dual<float, 1>;
  const auto pb = make_problem<float>(a.program, a.tissue, &a.tangents, a.tables, &a.tables_tangent, false);
  const auto io = sample_io<N>(a.signal, a.signal_tangent, 0, a.cotangent, a.cotangent_tangent);
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int64_t V = a.tissue.num_voxels;
  if (a.program.path == BS_PATH_REAL)
    launch_vjp<N, N>(pb, V, io, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent, a.scratch,
                     a.scratch_bytes, stream);
  else
    launch_vjp<N, Cx<N>>(pb, V, io, a.grads, &a.grads_tangent, &a.table_grads, &a.table_grads_tangent, a.scratch,
                         a.scratch_bytes, stream);
}
