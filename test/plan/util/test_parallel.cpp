// run_on_workers and parallel_for (libplan/util/parallel.h): every worker
// and item exactly once, the pool's threads kept from one loop to the next,
// and loops started from a job or from two threads at once.
#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "libplan/util/parallel.h"

using spindle::plan::parallel_for;
using spindle::plan::run_on_workers;

namespace {

// How many jobs this thread has run (a pool thread keeps its count).
thread_local int jobs_on_this_thread = 0;

// Runs `workers` jobs; returns each worker's (thread, jobs run on that
// thread before this one) by worker index.
std::vector<std::pair<std::thread::id, int>> run_and_record(size_t workers) {
  std::vector<std::pair<std::thread::id, int>> seen(workers);
  std::vector<int> runs(workers, 0);
  run_on_workers(workers, [&](size_t w) {
    seen[w] = {std::this_thread::get_id(), jobs_on_this_thread++};
    ++runs[w];
  });
  for (size_t w = 0; w < workers; ++w) CHECK(runs[w] == 1);
  return seen;
}

}  // namespace

TEST_CASE("run_on_workers: each worker once, worker 0 on the caller, the others on threads kept between loops") {
  for (size_t workers : {size_t{1}, size_t{2}, size_t{4}}) {
    INFO("workers " << workers);
    const auto first = run_and_record(workers);
    const auto second = run_and_record(workers);
    CHECK(first[0].first == std::this_thread::get_id());
    CHECK(second[0].first == std::this_thread::get_id());
    std::set<std::thread::id> threads;
    for (size_t w = 0; w < workers; ++w) {
      threads.insert(first[w].first);
      // The same thread for the same worker, its thread_local state kept:
      // it ran the first loop's job before this one.
      CHECK(second[w].first == first[w].first);
      CHECK(second[w].second == first[w].second + 1);
    }
    CHECK(threads.size() == workers);
  }
  // Fewer workers than the pool has threads: only those run.
  const auto two = run_and_record(2);
  CHECK(two.size() == 2);
}

TEST_CASE("run_on_workers: a loop started from a job, and loops from two threads at once, all complete") {
  std::atomic<int> inner{0};
  std::mutex m;
  std::set<std::thread::id> inner_threads;
  run_on_workers(2, [&](size_t) {
    // The pool is busy with the outer loop: this one gets threads of its own.
    run_on_workers(3, [&](size_t) {
      ++inner;
      const std::lock_guard<std::mutex> lock(m);
      inner_threads.insert(std::this_thread::get_id());
    });
  });
  CHECK(inner == 6);
  CHECK(inner_threads.size() >= 3);

  std::atomic<int> items{0};
  auto loop = [&] {
    for (int round = 0; round < 50; ++round) parallel_for(7, [&](size_t, size_t) { ++items; });
  };
  std::thread a(loop), b(loop);
  a.join();
  b.join();
  CHECK(items == 2 * 50 * 7);
}

TEST_CASE("parallel_for: every item exactly once, worker indices below the workers used") {
  for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
    INFO("n " << n);
    std::vector<std::atomic<int>> hit(n);
    std::atomic<size_t> max_worker{0};
    parallel_for(n, [&](size_t w, size_t i) {
      ++hit[i];
      size_t m = max_worker.load();
      while (w > m && !max_worker.compare_exchange_weak(m, w)) {}
    });
    for (size_t i = 0; i < n; ++i) CHECK(hit[i] == 1);
    CHECK(max_worker < std::max<size_t>(spindle::plan::parallel_workers(n), 1));
  }
}
