// A persistent pool of host threads. Work is cut into tasks whose results do not depend on which
// thread ran them, so every output is bitwise identical for any thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace bs {

// Runs task(t, worker) for t in [0, num_tasks) on up to `threads` threads (<= 0: all of the pool).
// worker is in [0, threads). Exceptions from a task are rethrown on the calling thread.
void parallel_for(int64_t num_tasks, int threads, const std::function<void(int64_t, int)>& task);

// Threads the pool holds: BLOCHSIM_NUM_THREADS if set, else the hardware's count.
int pool_size();

}  // namespace bs
