// The NCCL communicator's wait (libexec/comm/watchdog.h) with a fake
// stream, error query and clock: a stalled or failed peer ends the wait
// with the reason, never a hang.
#include <catch2/catch.hpp>

#include <string>

#include "libexec/comm/watchdog.h"

using namespace spindle::exec;

namespace {
// A clock that moves `step` seconds at every reading.
struct FakeClock {
  double t = 0, step = 1;
  double operator()() { return t += step; }
};
}  // namespace

TEST_CASE("watchdog: work that completes is waited for, however slowly", "[watchdog]") {
  int polls = 0, asked = 0;
  FakeClock clock{0, 0.5};
  const Waited w = wait_or_give_up([&] { return ++polls == 5; }, [&] { return ++asked, std::string(); }, 10.0,
                                   std::ref(clock), [] {});
  CHECK(w.end == WaitEnd::done);
  CHECK(polls == 5);
  CHECK(asked == 4);   // before every poll but the first
  CHECK(w.error.empty());
}

TEST_CASE("watchdog: a peer's asynchronous error ends the wait with it", "[watchdog]") {
  int polls = 0, asked = 0;
  FakeClock clock;
  const Waited w = wait_or_give_up([&] { return ++polls, false; },
                                   [&] { return ++asked == 3 ? std::string("remote process exited") : std::string(); },
                                   600.0, std::ref(clock), [] {});
  CHECK(w.end == WaitEnd::failed);
  CHECK(w.error == "remote process exited");
  CHECK(polls == 3);
  const std::string m = gave_up_message(w, 5, "NCCL all-reduce", 4);
  CHECK_THAT(m, Catch::Contains("rank 5: NCCL all-reduce over a group of 4 ranks failed"));
  CHECK_THAT(m, Catch::Contains("remote process exited"));
}

TEST_CASE("watchdog: a peer that never arrives times out instead of hanging", "[watchdog]") {
  int polls = 0;
  FakeClock clock{0, 1};
  const Waited w = wait_or_give_up([&] { return ++polls, false; }, [] { return std::string(); }, 30.0,
                                   std::ref(clock), [] {});
  CHECK(w.end == WaitEnd::timed_out);
  // The clock reads 1 at the start and k + 1 at the k-th check; the first
  // poll needs no check, each later one follows one: the 31st check (31 s)
  // is past 30 s, after 31 polls.
  CHECK(polls == 31);
  CHECK(w.waited_s > 30.0);
  const std::string m = gave_up_message(w, 2, "NCCL send/receive", 8);
  CHECK_THAT(m, Catch::Contains("rank 2: NCCL send/receive over a group of 8 ranks did not complete within"));
  CHECK_THAT(m, Catch::Contains("--comm-timeout"));
}

TEST_CASE("watchdog: the real clock and pause give up after the timeout", "[watchdog]") {
  const Waited w = wait_or_give_up([] { return false; }, [] { return std::string(); }, 0.05);
  CHECK(w.end == WaitEnd::timed_out);
  CHECK(w.waited_s >= 0.05);
  CHECK(w.waited_s < 5.0);
}
