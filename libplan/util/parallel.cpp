#include "libplan/util/parallel.h"

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace spindle::plan {
namespace {

// Threads that wait for a job between loops. One loop at a time: `busy` is
// held while one runs.
class WorkerPool {
 public:
  ~WorkerPool() {
    {
      const std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Runs job on workers 1 .. workers - 1 of the pool and job(0) here;
  // false (nothing run) when the pool is running another loop.
  bool try_run(size_t workers, const std::function<void(size_t)>& job) {
    const std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      const std::lock_guard<std::mutex> lock(m_);
      while (threads_.size() + 1 < workers) threads_.emplace_back([this, w = threads_.size() + 1] { serve(w); });
      job_ = &job;
      wanted_ = workers - 1;
      done_ = 0;
      ++generation_;
    }
    work_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(m_);
    done_cv_.wait(lock, [&] { return done_ == wanted_; });
    job_ = nullptr;
    return true;
  }

 private:
  // Pool thread `worker` (1, 2, ...): runs each loop's job when the loop
  // wants that many workers.
  void serve(size_t worker) {
    uint64_t seen = 0;   // a thread started for a loop takes part in it
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (worker > wanted_) continue;
      const std::function<void(size_t)>* job = job_;
      lock.unlock();
      (*job)(worker);
      lock.lock();
      if (++done_ == wanted_) done_cv_.notify_one();
    }
  }

  std::mutex busy_;
  std::mutex m_;   // guards everything below
  std::condition_variable work_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t wanted_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

WorkerPool& pool() {
  static WorkerPool p;
  return p;
}

}  // namespace

void run_on_workers(size_t workers, const std::function<void(size_t)>& job) {
  if (workers <= 1) {
    job(0);
    return;
  }
  if (pool().try_run(workers, job)) return;
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(job, w);
  job(0);
  for (std::thread& t : threads) t.join();
}

}  // namespace spindle::plan
