// Per-thread scratch of the host passes. A thread keeps a buffer of up to kKeptScratchBytes between calls
// (thread_local), so a loop of small calls allocates nothing; a call that needs more gets buffers of its
// own, one per pool thread, freed when the call returns: a large call (many orders, pools or events: the
// adjoint's store grows with all three) does not leave every pool thread holding its scratch afterwards.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "thread_pool.hpp"

namespace bs {

// 8 MiB a thread: the store of an adjoint of ~250 checkpoints of 64 complex orders and one pool; at 16
// threads, 128 MiB kept at most.
constexpr size_t kKeptScratchBytes = size_t(8) << 20;

class CallScratch {
 public:
  explicit CallScratch(size_t bytes) : bytes_(bytes) {
    if (bytes_ > kKeptScratchBytes) owned_.resize(static_cast<size_t>(pool_size()));
  }
  // The scratch of pool thread `worker` (parallel_for's second argument), at least `bytes` long.
  char* get(int worker) {
    if (bytes_ <= kKeptScratchBytes) {
      thread_local std::vector<char> kept;
      if (kept.size() < bytes_) kept.resize(bytes_);
      return kept.data();
    }
    std::unique_ptr<char[]>& mine = owned_[static_cast<size_t>(worker)];
    if (!mine) mine.reset(new char[bytes_]);
    return mine.get();
  }

 private:
  size_t bytes_;
  std::vector<std::unique_ptr<char[]>> owned_;  // one per pool thread, each touched by its thread only
};

}  // namespace bs
