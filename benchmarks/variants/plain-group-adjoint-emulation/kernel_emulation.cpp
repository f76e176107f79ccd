// The plain group adjoint's own kernel source (csrc/cuda/epg_device.cuh vjp_plain_lanes_kernel, with the
// warp's sums, atomics, padding groups and interleaved scratch), compiled by g++ against cuda_on_host/ and run
// on the host: every warp of the launch grid as 32 threads (cuda_runtime.h there). The entry points take the
// engine's argument structs, as group_emulation.cpp's, so check.py routes the engine's adjoints to either.
// Build and run: run.sh (beside this file).
#include "epg_device.cuh"

#include <cmath>
#include <string>

namespace bs {
namespace {
std::string last_error;

// launch_vjp's part for this kernel: outputs zeroed, the event gradients' and the tissue's destinations,
// the scratch of the threads launched (whole blocks of 128) x a lane's store, filled with NaN (the card's is
// uninitialised), and the grid.
template <class N, int LANES>
void launch(const Problem<float>& pb, int64_t V, const SampleIO<N>& io, const bs_grads& grads,
            const bs_grads* grads_tangent) {
  if (pb.K != 32 || !plain_adjoint<N, N>(pb))
    throw std::invalid_argument("not the plain adjoint's problem (32 orders, plain_adjoint)");
  DeviceEventGrad<N> eg{};
  void* const outs[4] = {grads.dt_s, grads.flip_rad, grads.phase_rad, grads.dt_wrap_s};
  const int64_t counts[4] = {pb.E, pb.E, pb.E, 1};
  for (int i = 0; i < 4; ++i) {
    eg.out[i] = static_cast<float*>(outs[i]);
    if (outs[i]) std::memset(outs[i], 0, sizeof(float) * counts[i]);
    if (grads_tangent) {
      void* const t[4] = {grads_tangent->dt_s, grads_tangent->flip_rad, grads_tangent->phase_rad,
                          grads_tangent->dt_wrap_s};
      eg.out_tan[i] = static_cast<float*>(t[i]);
      if (t[i]) std::memset(t[i], 0, sizeof(float) * counts[i]);
    }
  }
  GradOut<float> out{};
  for (int j = 0; j < BS_NUM_TISSUE; ++j) {
    out.tissue[j] = static_cast<float*>(grads.tissue[j]);
    out.tissue_tan[j] = grads_tangent ? static_cast<float*>(grads_tangent->tissue[j]) : nullptr;
  }
  const int64_t threads = 128 * ((V * LANES + 127) / 128);
  std::vector<N> scratch(static_cast<size_t>(threads * lane_store_size(pb, 32 / LANES, true)), N(std::nanf("")));
  cuda_on_host::run_grid(static_cast<unsigned>(threads / 128), 128, [&] {
    vjp_plain_lanes_kernel<N, N, LANES>(pb, V, io, eg, out, scratch.data());
  });
}

template <class N>
void launch_lanes(int lanes, const Problem<float>& pb, int64_t V, const SampleIO<N>& io, const bs_grads& grads,
                  const bs_grads* grads_tangent) {
  if (lanes == 8)
    launch<N, 8>(pb, V, io, grads, grads_tangent);
  else if (lanes == 4)
    launch<N, 4>(pb, V, io, grads, grads_tangent);
  else
    throw std::invalid_argument("lanes must be 4 or 8");
}
}  // namespace
}  // namespace bs

extern "C" const char* emul_last_error() { return bs::last_error.c_str(); }

extern "C" int32_t emul_vjp_lanes(const bs_epg_vjp_args* a, int32_t lanes) {
  using namespace bs;
  try {
    if (a->dtype != 0 || a->program.path != BS_PATH_REAL) throw std::invalid_argument("float32, the real path");
    SampleIO<float> io;
    io.cot = static_cast<const float*>(a->cotangent);
    launch_lanes<float>(lanes, make_problem<float>(a->program, a->tissue, nullptr, a->tables, nullptr),
                        a->tissue.num_voxels, io, a->grads, nullptr);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" int32_t emul_vjp_jvp_lanes(const bs_epg_vjp_jvp_args* a, int32_t lanes) {
  using namespace bs;
  try {
    if (a->dtype != 0 || a->program.path != BS_PATH_REAL) throw std::invalid_argument("float32, the real path");
    using N = Dual<float, 1>;
    SampleIO<N> io;
    io.cot = static_cast<const float*>(a->cotangent);
    io.cot_tan = static_cast<const float*>(a->cotangent_tangent);
    io.signal = static_cast<float*>(a->signal);
    io.signal_tan = static_cast<float*>(a->signal_tangent);
    launch_lanes<N>(lanes, make_problem<float>(a->program, a->tissue, &a->tangents, a->tables, &a->tables_tangent),
                    a->tissue.num_voxels, io, a->grads, &a->grads_tangent);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}
