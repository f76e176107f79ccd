// CUDA on the host, for tests without a card: enough of the CUDA runtime's device vocabulary for
// csrc/cuda/epg_device.cuh to compile with g++, and a launch that runs a kernel's grid on host threads, one
// per CUDA thread, so the kernels' own source runs here (library.cpp builds the CUDA library's C ABI over it;
// tests/test_cuda_on_host.py holds it to the host library). Included in place of <cuda_runtime.h> (this
// directory first on the include path).
//
// What runs as on a card: a warp's shuffles, ballots and __syncwarp are meetings of its 32 lanes (each lane
// leaves its value in the warp's slots, all meet, each reads its source); __syncthreads is a meeting of the
// block's threads that have not returned; atomicAdd is atomic; __activemask() is the set of lanes that meet
// at it, the others being parked at a block barrier or returned (a lane that is elsewhere in the kernel is
// waited for: convergent code meets there). What is reported, and aborts the process: a warp meeting that
// one of its lanes cannot reach (returned, parked at a block barrier, or at another meeting: lanes that
// diverge around a shuffle, undefined on a card), and any meeting not met within a minute.
//
// Blocks: a grid whose kernel may use shared memory (`__shared__`, here a static) runs one block at a time,
// every thread of it at once; a grid without runs every block at once (as a card runs its resident warps,
// so warps that share scratch by mistake write over each other). The launcher says which (library.cpp).
//
// __CUDA_ARCH__ is 700 here: the shared headers take their device branches (sincosf, 8-byte sample stores,
// 16-byte loads), but cp.async (sm_80 on) is a plain copy.
#pragma once

#define __CUDA_ARCH__ 700

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct uint4 {
  unsigned x, y, z, w;
};
template <class A, class B>
inline auto min(A a, B b) {
  return a < b ? a : b;
}
inline float2 make_float2(float x, float y) { return float2{x, y}; }

namespace cuda_on_host {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_on_host: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

constexpr auto kPatience = std::chrono::seconds(60);

// Where a lane is, as its warp's meetings see it.
enum class Lane : unsigned char { running, meeting, parked, returned };

// A warp: its lanes' whereabouts and the meeting in progress (one at a time: `open` names its kind).
class Warp {
 public:
  // Every lane of the warp leaves `value` and, once all 32 are here, reads `source(lane)`'s.
  template <class T, class Source>
  T exchange(unsigned lane, T value, Source source) {
    static_assert(sizeof(T) <= sizeof(std::uint64_t), "a slot holds 8 bytes");
    std::uint64_t word = 0;
    std::memcpy(&word, &value, sizeof(T));
    std::unique_lock<std::mutex> lock(mutex_);
    arrive(lock, lane, Meeting::all);
    slot_[lane] = word;
    wait_for_all(lock, lane);
    T out;
    std::memcpy(&out, &slot_[source(static_cast<int>(lane))], sizeof(T));
    leave(lock, lane);
    return out;
  }
  // Bit l set where lane l's predicate is; every lane of the warp takes part.
  unsigned ballot(unsigned lane, bool predicate) {
    std::unique_lock<std::mutex> lock(mutex_);
    arrive(lock, lane, Meeting::all);
    slot_[lane] = predicate ? 1 : 0;
    wait_for_all(lock, lane);
    unsigned word = 0;
    for (int l = 0; l < 32; ++l) word |= static_cast<unsigned>(slot_[l]) << l;
    leave(lock, lane);
    return word;
  }
  // The lanes that meet here; the warp's other lanes are parked at a block barrier or have returned.
  unsigned active(unsigned lane) {
    std::unique_lock<std::mutex> lock(mutex_);
    arrive(lock, lane, Meeting::active);
    const unsigned generation = generation_;
    const auto everyone_else_away = [&] {
      if (generation_ != generation) return true;
      for (int l = 0; l < 32; ++l)
        if (state_[l] == Lane::running) return false;
      return true;
    };
    if (!cv_.wait_for(lock, kPatience, everyone_else_away)) fail("__activemask: a lane was not seen within a minute");
    if (generation_ == generation) close(lock);
    const unsigned mask = met_mask_;
    leave(lock, lane);
    return mask;
  }
  // A block barrier released: its parked lanes run again (before any of them can reach a meeting).
  void unpark() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& l : state_)
      if (l == Lane::parked) l = Lane::running;
    cv_.notify_all();
  }
  void set(unsigned lane, Lane where) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_ == Meeting::all && where != Lane::running) fail("a lane left its warp's shuffle (diverged)");
    state_[lane] = where;
    cv_.notify_all();
  }

 private:
  enum class Meeting : unsigned char { none, all, active };

  void arrive(std::unique_lock<std::mutex>& lock, unsigned lane, Meeting kind) {
    // A lane arriving while the previous meeting's lanes are still reading waits for them to leave it.
    if (!cv_.wait_for(lock, kPatience, [&] { return leaving_ == 0; })) fail("a warp meeting was not left");
    if (open_ == Meeting::none) {
      open_ = kind;
      arrived_mask_ = 0;
      if (kind == Meeting::all)
        for (int l = 0; l < 32; ++l)
          if (state_[l] == Lane::parked || state_[l] == Lane::returned)
            fail("a warp shuffle that a lane cannot reach (returned or at a block barrier: diverged)");
    } else if (open_ != kind) {
      fail("lanes of a warp at two different meetings (a shuffle and __activemask: diverged)");
    }
    arrived_mask_ |= 1u << lane;
    state_[lane] = Lane::meeting;
    // Only __activemask's lanes wait on who is still running; a shuffle's wait for its generation (close) and
    // an arrival's wait for the last meeting's lanes to leave (leave) are woken where those change. Waking
    // all 32 at each arrival made a shuffle ~500 wake-ups: on a 2-core host the JVP tests of 3,100 voxels
    // and on decoded entries (8) took 62 s (105 s in the kernel), 36 s (56 s) without.
    if (kind == Meeting::active) cv_.notify_all();
  }
  void wait_for_all(std::unique_lock<std::mutex>& lock, unsigned) {
    const unsigned generation = generation_;
    if (arrived_mask_ == 0xffffffffu) {
      close(lock);
      return;
    }
    if (!cv_.wait_for(lock, kPatience, [&] { return generation_ != generation; }))
      fail("a warp's lanes did not all reach a shuffle within a minute (diverged)");
  }
  // The meeting is complete: its lanes read, then leave.
  void close(std::unique_lock<std::mutex>&) {
    met_mask_ = arrived_mask_;
    leaving_ = __builtin_popcount(arrived_mask_);
    open_ = Meeting::none;
    ++generation_;
    cv_.notify_all();
  }
  void leave(std::unique_lock<std::mutex>&, unsigned lane) {
    state_[lane] = Lane::running;
    if (--leaving_ == 0) cv_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  Lane state_[32] = {};
  Meeting open_ = Meeting::none;
  unsigned arrived_mask_ = 0, met_mask_ = 0, generation_ = 0;
  int leaving_ = 0;
  std::uint64_t slot_[32] = {};
};

// A block: its barrier, met by the threads that have not returned.
class Block {
 public:
  Block(unsigned threads, Warp* warps) : live_(threads), warps_(warps), num_warps_(threads / 32) {}
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned generation = generation_;
    if (++arrived_ == live_) {
      release();
      return;
    }
    if (!cv_.wait_for(lock, kPatience, [&] { return generation_ != generation; }))
      fail("a block's threads did not all reach __syncthreads within a minute");
  }
  void returned() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--live_ == arrived_ && arrived_ > 0) release();
  }

 private:
  void release() {  // (the block's lock, then each warp's: no warp lock is held when a block's is taken)
    for (unsigned w = 0; w < num_warps_; ++w) warps_[w].unpark();
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  unsigned live_;
  Warp* warps_;
  unsigned num_warps_, arrived_ = 0, generation_ = 0;
};

inline thread_local Warp* warp = nullptr;
inline thread_local Block* block = nullptr;
inline thread_local unsigned lane = 0;
inline thread_local dim3 thread_index, block_index;
inline dim3 block_dim, grid_dim;

// Runs kernel() over the grid, each CUDA thread a host thread: every block at once, or (where the kernel
// may declare shared memory) one block at a time.
inline void run_grid(unsigned blocks, unsigned threads_per_block, bool at_once, const std::function<void()>& kernel) {
  if (threads_per_block % 32 != 0 || threads_per_block == 0) fail("blocks of whole warps");
  block_dim = dim3{threads_per_block, 1, 1};
  grid_dim = dim3{blocks, 1, 1};
  const unsigned warps_per_block = threads_per_block / 32;
  const auto run = [&](unsigned first, unsigned count) {
    std::vector<Warp> warps(static_cast<size_t>(count) * warps_per_block);
    std::vector<std::unique_ptr<Block>> group;
    for (unsigned i = 0; i < count; ++i)
      group.push_back(std::make_unique<Block>(threads_per_block, &warps[static_cast<size_t>(i) * warps_per_block]));
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(count) * threads_per_block);
    for (unsigned b = 0; b < count; ++b)
      for (unsigned t = 0; t < threads_per_block; ++t)
        threads.emplace_back([&, b, t] {
          warp = &warps[b * warps_per_block + t / 32];
          block = group[b].get();
          lane = t % 32;
          thread_index = dim3{t, 0, 0};
          block_index = dim3{first + b, 0, 0};
          try {
            kernel();
          } catch (...) {
            fail("a kernel threw");
          }
          warp->set(lane, Lane::returned);
          block->returned();
        });
    for (auto& t : threads) t.join();
  };
  if (at_once) {
    run(0, blocks);
  } else {
    for (unsigned b = 0; b < blocks; ++b) run(b, 1);
  }
}

inline void sync_block() {
  warp->set(lane, Lane::parked);
  block->barrier();  // (its release sets the lane running)
}

}  // namespace cuda_on_host

#define __shared__ static  // one block at a time (run_grid)

#define threadIdx (cuda_on_host::thread_index)
#define blockIdx (cuda_on_host::block_index)
#define blockDim (cuda_on_host::block_dim)
#define gridDim (cuda_on_host::grid_dim)

template <class T>
inline T __shfl_xor_sync(unsigned, T x, int mask, int width = 32) {
  return cuda_on_host::warp->exchange(cuda_on_host::lane, x,
                                      [&](int l) { return ((l ^ mask) / width == l / width) ? (l ^ mask) : l; });
}
template <class T>
inline T __shfl_up_sync(unsigned, T x, unsigned delta, int width = 32) {
  return cuda_on_host::warp->exchange(cuda_on_host::lane, x, [&](int l) {
    return l % width >= static_cast<int>(delta) ? l - static_cast<int>(delta) : l;
  });
}
template <class T>
inline T __shfl_down_sync(unsigned, T x, unsigned delta, int width = 32) {
  return cuda_on_host::warp->exchange(cuda_on_host::lane, x, [&](int l) {
    return l % width + static_cast<int>(delta) < width ? l + static_cast<int>(delta) : l;
  });
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  if (mask != 0xffffffffu) cuda_on_host::fail("__ballot_sync with a partial mask");
  return cuda_on_host::warp->ballot(cuda_on_host::lane, predicate != 0);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) cuda_on_host::fail("__syncwarp with a partial mask");
  cuda_on_host::warp->exchange(cuda_on_host::lane, 0, [](int l) { return l; });
}
inline unsigned __activemask() { return cuda_on_host::warp->active(cuda_on_host::lane); }
inline void __syncthreads() { cuda_on_host::sync_block(); }
inline float atomicAdd(float* p, float x) { return std::atomic_ref<float>(*p).fetch_add(x); }
inline double atomicAdd(double* p, double x) { return std::atomic_ref<double>(*p).fetch_add(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
using cudaStream_t = void*;
