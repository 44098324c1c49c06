// Communicators for tests without MPI.
//  - SelfComm: size 1. Collectives copy; send to self is queued for a later
//    recv from self.
//  - run_thread_group(K, body): runs body(comm) on K threads, each with a
//    Comm of rank 0..K-1 of one simulated group (shared memory, same
//    ordering rules as comm.h; sends are buffered so never block). Sums are
//    taken in rank order, so every rank gets bitwise the same result.
//    An exception in any body is rethrown (the first one) after all threads
//    end; a body that throws while others wait in a collective deadlocks, so
//    tests check with REQUIRE only after the last collective.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "libexec/comm/comm.h"

namespace spindle::exec {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(std::span<float>) override {}
  void all_gather(std::span<const float> send, std::span<float> recv) override;
  void send(std::span<const float> data, int peer, int tag) override;
  void recv(std::span<float> data, int peer, int tag) override;
  void barrier() override {}

 private:
  std::map<int, std::deque<std::vector<float>>> queued_;  // by tag
};

void run_thread_group(int size, const std::function<void(Comm&)>& body);

}  // namespace spindle::exec
