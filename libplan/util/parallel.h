// A parallel loop for the planner's independent work items (candidate
// schedules, scheduler variants, boundary shifts). Results must be written
// by index so that the output does not depend on which thread ran which
// item.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <thread>

namespace spindle::plan {

// SPINDLE_PLAN_THREADS as given: a number from 1 to 1024 in decimal digits
// alone, or 0 when the variable is not set or holds anything else (" 1"
// and "+1" too, as "1 " always was).
inline size_t plan_threads_env() {
  const char* env = std::getenv("SPINDLE_PLAN_THREADS");
  if (env == nullptr || !(*env >= '0' && *env <= '9')) return 0;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  return end != env && *end == '\0' && v >= 1 && v <= 1024 ? static_cast<size_t>(v) : 0;
}

// Whether SPINDLE_PLAN_THREADS is set but not to a number from 1 to 1024
// (the programs refuse it: the library alone would plan on every hardware
// thread instead of the count asked for).
inline bool plan_threads_env_invalid() {
  return std::getenv("SPINDLE_PLAN_THREADS") != nullptr && plan_threads_env() == 0;
}

// The threads the planner's parallel loops use:
// std::thread::hardware_concurrency() (at least 1), or SPINDLE_PLAN_THREADS
// when set to a number from 1 to 1024 (other values are ignored here;
// spindle-plan and spindle-profile refuse them).
inline size_t plan_threads() {
  if (const size_t env = plan_threads_env(); env > 0) return env;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Threads parallel_for uses for n items: plan_threads(), at most n.
inline size_t parallel_workers(size_t n) { return std::min(n, plan_threads()); }

// Runs job(worker) once for every worker in [0, workers): worker 0 on the
// calling thread, the others on threads of one process-wide pool, started
// on first use and kept until the process ends, so that what they keep in
// thread_local storage (the simulator's and the lowering's working memory)
// lasts from one loop to the next. Returns when every job has returned. A
// call made while the pool runs another (from one of its jobs, or from
// another thread) gets threads of its own for this call alone.
void run_on_workers(size_t workers, const std::function<void(size_t)>& job);

// Runs f(worker, i) for every i in [0, n), each exactly once, on
// parallel_workers(n) threads (the calling one is worker 0); returns when all
// are done. Items are taken in increasing order; which worker takes which is
// not fixed. f must not throw (the planner reports errors as values).
template <class F>
void parallel_for(size_t n, F f) {
  std::atomic<size_t> next{0};
  run_on_workers(parallel_workers(n), [&](size_t worker) {
    for (size_t i = next++; i < n; i = next++) f(worker, i);
  });
}

// Runs f(begin, end) over [0, n) cut into `parts` contiguous ranges (at
// most n of them; parts < 1 counts as 1), the ranges side by side on
// run_on_workers; f(0, n) on the calling thread when that makes one range.
// For work whose result does not depend on the cut (each index written by
// one range).
template <class F>
void parallel_ranges(int64_t n, int parts, F f) {
  const int64_t k = std::clamp<int64_t>(parts, 1, std::max<int64_t>(n, 1));
  if (k == 1) return f(int64_t{0}, n);
  run_on_workers(static_cast<size_t>(k), [&](size_t w) {
    const auto i = static_cast<int64_t>(w);
    f(n * i / k, n * (i + 1) / k);
  });
}

}  // namespace spindle::plan
