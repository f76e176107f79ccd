#include "thread_pool.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace bs {
namespace {

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int64_t num_tasks, int threads, const std::function<void(int64_t, int)>& task) {
    std::lock_guard<std::mutex> serial(run_mutex_);  // one parallel region at a time
    if (threads <= 0 || threads > size()) threads = size();
    if (threads > num_tasks) threads = static_cast<int>(num_tasks > 0 ? num_tasks : 1);
    task_ = &task;
    num_tasks_ = num_tasks;
    next_.store(0);
    error_ = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_ = threads - 1;
      pending_ = threads - 1;
      ++generation_;
    }
    wake_.notify_all();
    work(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(int worker) {
    for (;;) {
      const int64_t t = next_.fetch_add(1);
      if (t >= num_tasks_) return;
      try {
        (*task_)(t, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }
  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index > active_) continue;  // not needed in this region
      }
      work(index);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_, run_mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int)>* task_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  uint64_t generation_ = 0;
  int active_ = 0, pending_ = 0;
  bool stop_ = false;
};

int configured_size() {
  if (const char* env = std::getenv("BLOCHSIM_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

Pool& pool() {
  static Pool instance(configured_size());
  return instance;
}

}  // namespace

void parallel_for(int64_t num_tasks, int threads, const std::function<void(int64_t, int)>& task) {
  if (num_tasks <= 0) return;
  pool().run(num_tasks, threads, task);
}

int pool_size() { return pool().size(); }

}  // namespace bs
