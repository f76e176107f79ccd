// CUDA on the host, for the emulation only: enough of the runtime's device vocabulary for csrc/cuda/epg_device.cuh
// to compile with g++, and a grid run with every warp at once, each of its 32 lanes a thread, so that a
// kernel's own source runs here: its shuffles exchange through the warp's slots between two barriers (every
// lane of a warp calls them together, as the kernels' convergent code does on the card), atomicAdd is an
// atomic add, and the block-wide operations the emulated kernels do not use abort. Included in place of
// <cuda_runtime.h> (this directory first on the include path).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__

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
// A warp's meeting point: its 32 lanes wait for each other at every shuffle. Lanes that stop calling the same
// shuffles (the card's lanes diverging at one: undefined there) would wait for ever; past a minute the
// emulation says so and aborts.
class WarpBarrier {
 public:
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned generation = generation_;
    if (++arrived_ == 32) {
      arrived_ = 0;
      ++generation_;
      met_.notify_all();
      return;
    }
    if (!met_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; })) {
      std::fprintf(stderr, "cuda_on_host: a warp's lanes did not all reach a shuffle within a minute (diverged)\n");
      std::abort();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable met_;
  unsigned arrived_ = 0, generation_ = 0;
};
struct Warp {
  WarpBarrier sync;
  float slot[32];
};
inline thread_local Warp* warp = nullptr;
inline thread_local unsigned lane = 0;
inline thread_local dim3 thread_index, block_index;
inline dim3 block_dim, grid_dim;

// Every lane's value, then each lane's source (its own where the source falls outside its group of `width`).
template <class Source>
float exchange(float x, Source source) {
  warp->slot[lane] = x;
  warp->sync.arrive_and_wait();
  const int from = source(static_cast<int>(lane));
  const float y = warp->slot[from];
  warp->sync.arrive_and_wait();
  return y;
}

// Runs kernel() over the grid: every warp at once (as a card runs its resident warps, so that warps sharing
// memory by mistake, a scratch tile too small, write over each other), each warp's 32 lanes threads of
// their own.
inline void run_grid(unsigned blocks, unsigned threads_per_block, const std::function<void()>& kernel) {
  if (threads_per_block % 32 != 0) std::abort();
  block_dim = dim3{threads_per_block, 1, 1};
  grid_dim = dim3{blocks, 1, 1};
  const unsigned warps_per_block = threads_per_block / 32;
  std::vector<Warp> warps(static_cast<size_t>(blocks) * warps_per_block);
  std::vector<std::thread> lanes;
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned w = 0; w < warps_per_block; ++w)
      for (unsigned l = 0; l < 32; ++l)
        lanes.emplace_back([&, b, w, l] {
          warp = &warps[b * warps_per_block + w];
          lane = l;
          thread_index = dim3{w * 32 + l, 0, 0};
          block_index = dim3{b, 0, 0};
          try {
            kernel();
          } catch (...) {
            std::abort();  // the other lanes would wait at the next shuffle
          }
        });
  for (auto& t : lanes) t.join();
}
}  // namespace cuda_on_host

#define threadIdx (cuda_on_host::thread_index)
#define blockIdx (cuda_on_host::block_index)
#define blockDim (cuda_on_host::block_dim)
#define gridDim (cuda_on_host::grid_dim)

inline float __shfl_xor_sync(unsigned, float x, int mask, int width = 32) {
  return cuda_on_host::exchange(x, [&](int l) { return ((l ^ mask) / width == l / width) ? (l ^ mask) : l; });
}
inline float __shfl_up_sync(unsigned, float x, unsigned delta, int width = 32) {
  return cuda_on_host::exchange(x, [&](int l) { return l % width >= static_cast<int>(delta) ? l - static_cast<int>(delta) : l; });
}
inline float __shfl_down_sync(unsigned, float x, unsigned delta, int width = 32) {
  return cuda_on_host::exchange(
      x, [&](int l) { return l % width + static_cast<int>(delta) < width ? l + static_cast<int>(delta) : l; });
}
inline float atomicAdd(float* p, float x) { return std::atomic_ref<float>(*p).fetch_add(x); }
// Block-wide and mask operations: compiled, never run by the emulated kernels.
inline void __syncthreads() { std::abort(); }
inline void __syncwarp(unsigned = 0xffffffffu) { std::abort(); }
inline unsigned __ballot_sync(unsigned, int) { std::abort(); }
inline unsigned __activemask() { std::abort(); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline size_t __cvta_generic_to_shared(const void*) { std::abort(); }
using cudaStream_t = void*;
