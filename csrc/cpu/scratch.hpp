// Per-thread scratch of the host passes. A thread keeps a buffer of up to kKeptScratchBytes between calls
// (thread_local), so a loop of small calls allocates nothing; a call that needs more gets buffers of its
// own, one per pool thread, freed when the call returns: a large call (many orders, pools or events: the
// adjoint's store grows with all three) does not leave every pool thread holding its scratch afterwards.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

#include "thread_pool.hpp"

namespace bs {

// 8 MiB a thread: the store of an adjoint of ~250 checkpoints of 64 complex orders and one pool; at 16
// threads, 128 MiB kept at most.
constexpr size_t kKeptScratchBytes = size_t(8) << 20;

// A call's own buffer, mapped from the system and unmapped when the call returns. Not malloc: glibc raises its
// mmap threshold to the size of a freed mapping, so the next call of that size is served from an arena that
// keeps the pages (15 MiB resident after a second 1024-order adjoint, measured).
class MappedBuffer {
 public:
  explicit MappedBuffer(size_t bytes) : bytes_(bytes) {
#if defined(__unix__) || defined(__APPLE__)
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(p);
#else
    data_ = new char[bytes_];
#endif
  }
  ~MappedBuffer() {
#if defined(__unix__) || defined(__APPLE__)
    munmap(data_, bytes_);
#else
    delete[] data_;
#endif
  }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  char* data() const { return data_; }

 private:
  size_t bytes_;
  char* data_;
};

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
    std::unique_ptr<MappedBuffer>& mine = owned_[static_cast<size_t>(worker)];
    if (!mine) mine = std::make_unique<MappedBuffer>(bytes_);
    return mine->data();
  }

 private:
  size_t bytes_;
  std::vector<std::unique_ptr<MappedBuffer>> owned_;  // one per pool thread, each touched by its thread only
};

}  // namespace bs
