// The plain adjoint in groups of lanes (epg_device.cuh vjp_plain_lanes_kernel: the real first order, and the
// second at Dual<float, 1>), emulated on the host: each lane of a group runs as a thread of its own, and a
// shuffle is a write, a barrier, a read of the neighbour's value and a barrier. What it holds to the host's
// adjoints is event_loop.hpp's group path (the shifts across lanes, order 0's lane's recovery and sample,
// each lane's share of the gradients and its store); the kernel's launch, its scratch interleaving, the
// warp's sums and the padding groups are the card's to check.
//
// Build and run: run.sh (beside this file), which applies ../plain-group-adjoint.patch to a copy of the tree,
// builds this with AddressSanitizer and UBSan and runs check.py.
#include <barrier>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "blochsim/event_loop.hpp"
#include "blochsim/unpack.hpp"
#include "capi.h"

namespace bs {
namespace {

// The group's shuffles: lane l reads lane l - 1's `up` source and lane l + 1's `down` source (the group's
// first lane its own up, its last lane its own down), as __shfl_up_sync and __shfl_down_sync of width LANES,
// every float of the number (a Dual's value and tangent) at once, as the device's each_float.
struct Exchange {
  static constexpr int kFloats = 2;  // float or Dual<float, 1>
  int lanes;
  std::barrier<> sync;
  std::vector<float> up, down;
  explicit Exchange(int n) : lanes(n), sync(n), up(n * kFloats), down(n * kFloats) {}
  template <class S>
  void swap(int lane, S& from_below, S& from_above) {
    static_assert(sizeof(S) <= kFloats * sizeof(float), "a float or a Dual<float, 1>");
    constexpr int n = sizeof(S) / sizeof(float);
    std::memcpy(&up[lane * kFloats], &from_below, sizeof(S));
    std::memcpy(&down[lane * kFloats], &from_above, sizeof(S));
    sync.arrive_and_wait();
    const int below = lane == 0 ? lane : lane - 1, above = lane == lanes - 1 ? lane : lane + 1;
    float b[n], a[n];
    std::memcpy(b, &up[below * kFloats], sizeof(S));
    std::memcpy(a, &down[above * kFloats], sizeof(S));
    sync.arrive_and_wait();
    std::memcpy(&from_below, b, sizeof(S));
    std::memcpy(&from_above, a, sizeof(S));
  }
};

// epg_device.cuh WarpShift and WarpShiftAdjoint, line for line, their shuffles through Exchange.
struct HostWarpShift {
  static constexpr bool kCounted = false;
  static constexpr bool kWhole = false;
  Exchange* ex;
  int lane;
  int64_t K;
  int lanes;
  bool samples = true;
  template <class S>
  void operator()(Planes<S> x, int64_t kpl) const {
    S up = x.p[kpl - 1], down = x.m[0];
    ex->swap(lane, up, down);
    for (int64_t j = kpl - 1; j > 0; --j) x.p[j] = x.p[j - 1];
    x.p[0] = up;
    for (int64_t j = 0; j < kpl - 1; ++j) x.m[j] = x.m[j + 1];
    x.m[kpl - 1] = lane == lanes - 1 ? S(0) : down;
    for (int64_t j = 0; j < kpl; ++j)
      if (lane * kpl + j >= K) x.p[j] = x.m[j] = S(0);
    if (lane == 0) x.p[0] = conj(x.m[0]);
  }
};
struct HostWarpShiftAdjoint {
  Exchange* ex;
  int lane;
  int64_t K;
  int lanes;
  template <class S>
  void operator()(Planes<S> l, int64_t kpl) const {
    if (lane == 0) {
      l.m[0] += conj(l.p[0]);
      l.p[0] = S(0);
    }
    for (int64_t j = 0; j < kpl; ++j)
      if (lane * kpl + j >= K) l.p[j] = l.m[j] = S(0);
    // FromLaneAbove of l.p[0], FromLaneBelow of l.m[kpl - 1]: swap's `down` is read from above.
    S up = l.m[kpl - 1], down = l.p[0];
    ex->swap(lane, up, down);
    for (int64_t j = 0; j < kpl - 1; ++j) l.p[j] = l.p[j + 1];
    l.p[kpl - 1] = lane == lanes - 1 ? S(0) : down;
    for (int64_t j = kpl - 1; j > 0; --j) l.m[j] = l.m[j - 1];
    l.m[0] = lane == 0 ? S(0) : up;
  }
};

std::string last_error;

// One group: vjp_plain_lanes_kernel's body for voxel v, each lane in its own thread (N = float: the first
// order; Dual<float, 1>: the second). Each lane's event gradients go to its own accumulator (the card sums
// the warp), its tissue gradients to `tissue`; order 0's lane writes the samples where io asks.
template <class N>
void run_group(const Problem<float>& pb_in, int64_t v, int lanes, const SampleIO<N>& io_in,
               std::vector<std::vector<N>>& event_acc, std::vector<std::vector<N>>& tissue,
               std::vector<std::vector<N>>& stores) {
  constexpr int KC = 32;
  const int kpl = KC / lanes;
  Exchange ex(lanes);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(lanes);
  for (int lane = 0; lane < lanes; ++lane) {
    threads.emplace_back([&, lane] {
      try {
        Problem<float> pb = pb_in;
        pb.K = kpl;
        SampleIO<N> io = io_in;
        io.base = v * pb.S;
        const Voxel<N> t = load_voxel<N>(pb, v);
        std::vector<N> work(3 * 3 * kpl);
        const Ref<N> states{work.data(), 1};
        const int64_t k0 = int64_t(lane) * kpl;
        VoxelGrad<N> g;
        std::vector<N>& store = stores[lane];
        std::fill(store.begin(), store.end(), N(std::nanf("")));  // every read of the store follows its write
        const EventGrad<N> eg{event_acc[lane].data(), pb.E};
        vjp_voxel_plain<N, N>(pb, v, t, state_at(pb, states, 0, k0), state_at(pb, states, 1, k0),
                              state_at(pb, states, 2, k0), Ref<N>{store.data(), 1}, io, g, eg,
                              HostWarpShift{&ex, lane, KC, lanes}, HostWarpShiftAdjoint{&ex, lane, KC, lanes});
        N per_param[BS_NUM_TISSUE];
        tissue_gradients(g, t, per_param);
        for (int j = 0; j < BS_NUM_TISSUE; ++j) tissue[lane][j] = per_param[j];
      } catch (...) {
        errors[lane] = std::current_exception();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The adjoint of every voxel by groups: gradients written to `grads` (values) and `grads_tangent` (N's
// tangent, the second order), event gradients summed over lanes and voxels in double.
template <class N>
void emulate(const Problem<float>& pb, int64_t V, int lanes, const SampleIO<N>& io, const bs_grads& grads,
             const bs_grads* grads_tangent) {
  if (pb.K != 32 || !plain_adjoint<N, N>(pb))
    throw std::invalid_argument("not the plain adjoint's problem (32 orders, plain_adjoint)");
  const int64_t E = pb.E, nev = 3 * E + 1;
  std::vector<double> events(nev, 0.0), events_tan(nev, 0.0);
  const int64_t store_size = lane_store_size(pb, 32 / lanes, true);
  std::vector<std::vector<N>> stores(lanes, std::vector<N>(store_size));
  for (int64_t v = 0; v < V; ++v) {
    std::vector<std::vector<N>> event_acc(lanes, std::vector<N>(nev, N(0)));
    std::vector<std::vector<N>> tissue(lanes, std::vector<N>(BS_NUM_TISSUE, N(0)));
    run_group<N>(pb, v, lanes, io, event_acc, tissue, stores);
    for (int j = 0; j < BS_NUM_TISSUE; ++j) {
      N total(0);
      for (int lane = 0; lane < lanes; ++lane) total += tissue[lane][j];
      if (grads.tissue[j]) static_cast<float*>(grads.tissue[j])[v] = value_of(total);
      if constexpr (Num<N>::P > 0) {
        if (grads_tangent && grads_tangent->tissue[j]) static_cast<float*>(grads_tangent->tissue[j])[v] = total.d[0];
      }
    }
    for (int lane = 0; lane < lanes; ++lane)
      for (int64_t i = 0; i < nev; ++i) {
        events[i] += value_of(event_acc[lane][i]);
        if constexpr (Num<N>::P > 0) events_tan[i] += event_acc[lane][i].d[0];
      }
  }
  auto write = [&](const bs_grads& out, const std::vector<double>& from) {
    auto put = [&](void* p, int64_t offset, int64_t count) {
      if (p)
        for (int64_t i = 0; i < count; ++i) static_cast<float*>(p)[i] = float(from[offset + i]);
    };
    put(out.dt_s, 0, E);
    put(out.flip_rad, E, E);
    put(out.phase_rad, 2 * E, E);
    put(out.dt_wrap_s, 3 * E, 1);
  };
  write(grads, events);
  if (grads_tangent) write(*grads_tangent, events_tan);
}

}  // namespace
}  // namespace bs

extern "C" const char* emul_last_error() { return bs::last_error.c_str(); }

// The first-order real VJP of `a` (float32, 32 orders, a problem plain_adjoint takes) by the group
// emulation: 0 on success, 1 with emul_last_error's message otherwise.
extern "C" int32_t emul_vjp_lanes(const bs_epg_vjp_args* a, int32_t lanes) {
  using namespace bs;
  try {
    if (a->dtype != 0 || a->program.path != BS_PATH_REAL) throw std::invalid_argument("float32, the real path");
    if (lanes != 4 && lanes != 8) throw std::invalid_argument("lanes must be 4 or 8");
    SampleIO<float> io;
    io.cot = static_cast<const float*>(a->cotangent);
    emulate<float>(make_problem<float>(a->program, a->tissue, nullptr, a->tables, nullptr), a->tissue.num_voxels,
                   lanes, io, a->grads, nullptr);
    return 0;
  } catch (const std::exception& e) {
    bs::last_error = e.what();
    return 1;
  }
}

// The second-order adjoint (the VJP at Dual<float, 1> along the call's one tangent) likewise, the signal and
// its tangent written where asked.
extern "C" int32_t emul_vjp_jvp_lanes(const bs_epg_vjp_jvp_args* a, int32_t lanes) {
  using namespace bs;
  try {
    if (a->dtype != 0 || a->program.path != BS_PATH_REAL) throw std::invalid_argument("float32, the real path");
    if (lanes != 4 && lanes != 8) throw std::invalid_argument("lanes must be 4 or 8");
    using N = Dual<float, 1>;
    SampleIO<N> io;
    io.cot = static_cast<const float*>(a->cotangent);
    io.cot_tan = static_cast<const float*>(a->cotangent_tangent);
    io.signal = static_cast<float*>(a->signal);
    io.signal_tan = static_cast<float*>(a->signal_tangent);
    emulate<N>(make_problem<float>(a->program, a->tissue, &a->tangents, a->tables, &a->tables_tangent),
               a->tissue.num_voxels, lanes, io, a->grads, &a->grads_tangent);
    return 0;
  } catch (const std::exception& e) {
    bs::last_error = e.what();
    return 1;
  }
}
