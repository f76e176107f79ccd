// The plain register adjoint in groups of lanes (epg_device.cuh vjp_plain_lanes_kernel), emulated on the host:
// each lane of a group runs as a thread of its own, and a shuffle is a write, a barrier, a read of the
// neighbour's value and a barrier. What it holds to the host's VJP is event_loop.hpp's group path (the
// shifts across lanes, order 0's lane's recovery and sample, each lane's share of the gradients and its
// store); the kernel's launch, its scratch interleaving and the warp's sums are the card's to check.
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
// first lane its own up, its last lane its own down), as __shfl_up_sync and __shfl_down_sync of width LANES.
struct Exchange {
  int lanes;
  std::barrier<> sync;
  std::vector<float> up, down;
  explicit Exchange(int n) : lanes(n), sync(n), up(n), down(n) {}
  void swap(int lane, float& from_below, float& from_above) {
    up[lane] = from_below;
    down[lane] = from_above;
    sync.arrive_and_wait();
    const float below = lane == 0 ? up[lane] : up[lane - 1];
    const float above = lane == lanes - 1 ? down[lane] : down[lane + 1];
    sync.arrive_and_wait();
    from_below = below;
    from_above = above;
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

// One group: vjp_plain_lanes_kernel's body for voxel v, each lane in its own thread. Each lane's event
// gradients go to its own accumulator (the card sums the warp), its tissue gradients to `tissue`.
void run_group(const Problem<float>& pb_in, int64_t v, int lanes, const SampleIO<float>& io_in,
               std::vector<std::vector<float>>& event_acc, std::vector<std::vector<float>>& tissue,
               std::vector<std::vector<float>>& stores) {
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
        SampleIO<float> io = io_in;
        io.base = v * pb.S;
        io.signal = nullptr;
        const Voxel<float> t = load_voxel<float>(pb, v);
        std::vector<float> work(3 * 3 * kpl);
        const Ref<float> states{work.data(), 1};
        const int64_t k0 = int64_t(lane) * kpl;
        VoxelGrad<float> g;
        std::vector<float>& store = stores[lane];
        std::fill(store.begin(), store.end(), std::nanf(""));  // every read of the store follows its write
        const EventGrad<float> eg{event_acc[lane].data(), pb.E};
        vjp_voxel_plain<float, float>(pb, v, t, state_at(pb, states, 0, k0), state_at(pb, states, 1, k0),
                                      state_at(pb, states, 2, k0), Ref<float>{store.data(), 1}, io, g, eg,
                                      HostWarpShift{&ex, lane, KC, lanes}, HostWarpShiftAdjoint{&ex, lane, KC, lanes});
        float per_param[BS_NUM_TISSUE];
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

}  // namespace
}  // namespace bs

extern "C" const char* emul_last_error() { return bs::last_error.c_str(); }

// The first-order real VJP of `a` (float32, 32 orders, a problem plain_adjoint takes) by the group
// emulation: 0 on success, 1 with emul_last_error's message otherwise.
extern "C" int32_t emul_vjp_lanes(const bs_epg_vjp_args* a, int32_t lanes) {
  using namespace bs;
  try {
    if (a->dtype != 0) throw std::invalid_argument("float32 only");
    if (a->program.path != BS_PATH_REAL) throw std::invalid_argument("the real path only");
    if (lanes != 4 && lanes != 8) throw std::invalid_argument("lanes must be 4 or 8");
    const Problem<float> pb = make_problem<float>(a->program, a->tissue, nullptr, a->tables, nullptr);
    if (pb.K != 32 || !plain_adjoint<float, float>(pb))
      throw std::invalid_argument("not the register adjoint's problem (32 orders, plain_adjoint)");
    const int64_t V = a->tissue.num_voxels, E = pb.E, nev = 3 * E + 1;
    std::vector<double> events(nev, 0.0);
    SampleIO<float> io;
    io.cot = static_cast<const float*>(a->cotangent);
    const int64_t store_size = lane_store_size(pb, 32 / lanes, true);
    std::vector<std::vector<float>> stores(lanes, std::vector<float>(store_size));
    for (int64_t v = 0; v < V; ++v) {
      std::vector<std::vector<float>> event_acc(lanes, std::vector<float>(nev, 0.0f));
      std::vector<std::vector<float>> tissue(lanes, std::vector<float>(BS_NUM_TISSUE, 0.0f));
      run_group(pb, v, lanes, io, event_acc, tissue, stores);
      for (int j = 0; j < BS_NUM_TISSUE; ++j) {
        float total = 0;
        for (int lane = 0; lane < lanes; ++lane) total += tissue[lane][j];
        if (a->grads.tissue[j]) static_cast<float*>(a->grads.tissue[j])[v] = total;
      }
      for (int lane = 0; lane < lanes; ++lane)
        for (int64_t i = 0; i < nev; ++i) events[i] += event_acc[lane][i];
    }
    auto put = [&](void* p, int64_t offset, int64_t count) {
      if (p)
        for (int64_t i = 0; i < count; ++i) static_cast<float*>(p)[i] = float(events[offset + i]);
    };
    put(a->grads.dt_s, 0, E);
    put(a->grads.flip_rad, E, E);
    put(a->grads.phase_rad, 2 * E, E);
    put(a->grads.dt_wrap_s, 3 * E, 1);
    return 0;
  } catch (const std::exception& e) {
    bs::last_error = e.what();
    return 1;
  }
}
