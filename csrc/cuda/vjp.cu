// Adjoint (VJP), checkpointed.
#include "passes.cuh"

void bs::cuda_vjp(const bs_epg_vjp_args& a) {
  const auto pb = make_problem<float>(a.program, a.tissue, nullptr, a.tables, nullptr, false);
  const auto io = sample_io<float>(nullptr, nullptr, 0, a.cotangent, nullptr);
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int64_t V = a.tissue.num_voxels;
  if (a.program.path == BS_PATH_REAL)
    launch_vjp<float, float>(pb, V, io, a.grads, nullptr, &a.table_grads, nullptr, a.scratch, a.scratch_bytes,
                             stream);
  else
    launch_vjp<float, Cx<float>>(pb, V, io, a.grads, nullptr, &a.table_grads, nullptr, a.scratch,
                                 a.scratch_bytes, stream);
}
