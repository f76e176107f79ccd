// Forward simulation.
#include "passes.cuh"

void bs::cuda_forward(const bs_epg_forward_args& a) {
  const auto pb = make_problem<float>(a.program, a.tissue, nullptr, a.tables, nullptr, false);
  const auto io = sample_io<float>(a.signal, nullptr, 0, nullptr, nullptr);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.program.path == BS_PATH_REAL)
    launch_forward<float, float>(pb, a.tissue.num_voxels, io, a.scratch, a.scratch_bytes, stream);
  else
    launch_forward<float, Cx<float>>(pb, a.tissue.num_voxels, io, a.scratch, a.scratch_bytes, stream);
}
