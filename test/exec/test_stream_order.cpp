// The ordering of started collectives against the compute stream
// (libexec/comm/stream_order.h), over a fake of CUDA's streams and events
// that records which work happens before which: what NcclComm's started
// all-reduces rely on, checked without a GPU.
#include <catch2/catch.hpp>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "libexec/comm/stream_order.h"

using namespace spindle::exec;

namespace {

// Two streams as CUDA runs them: the work of one stream runs in the order
// enqueued; an event stands for the point of a stream where it was last
// recorded; a wait puts a point on a stream that depends on the event's
// point at the time of the wait. Work is a node of a graph whose edges are
// those dependencies; "a before b" is a path from a to b.
class FakeStreams final : public StreamOps {
 public:
  int make_event() override {
    at_.push_back(-1);
    return static_cast<int>(at_.size()) - 1;
  }
  void record(int event, Stream on) override { at_.at(static_cast<size_t>(event)) = last(on); }
  void wait(Stream s, int event) override {
    const int point = at_.at(static_cast<size_t>(event));
    if (point >= 0) add(s, "wait", {point});
  }
  bool done(int event) override {
    const int point = at_.at(static_cast<size_t>(event));
    return point < 0 || nodes_[static_cast<size_t>(point)].finished;
  }

  // Enqueues work named `name` on `s`; returns its node.
  int work(Stream s, const std::string& name) { return add(s, name, {}); }
  // a runs before b: b (transitively) depends on a.
  bool before(int a, int b) const {
    std::vector<int> todo{b};
    std::vector<bool> seen(nodes_.size(), false);
    while (!todo.empty()) {
      const int n = todo.back();
      todo.pop_back();
      for (int d : nodes_[static_cast<size_t>(n)].deps) {
        if (d == a) return true;
        if (!seen[static_cast<size_t>(d)]) seen[static_cast<size_t>(d)] = true, todo.push_back(d);
      }
    }
    return false;
  }
  // The device finishes `n` and everything it depends on.
  void finish(int n) {
    for (int d : nodes_[static_cast<size_t>(n)].deps) finish(d);
    nodes_[static_cast<size_t>(n)].finished = true;
  }

 private:
  struct Node {
    std::vector<int> deps;
    bool finished = false;
  };
  int& last(Stream s) { return last_[s == Stream::compute ? 0 : 1]; }
  int add(Stream s, const std::string& /*name*/, std::vector<int> deps) {
    if (last(s) >= 0) deps.push_back(last(s));
    nodes_.push_back({std::move(deps)});
    return last(s) = static_cast<int>(nodes_.size()) - 1;
  }
  std::vector<Node> nodes_;
  std::vector<int> at_;  // by event: the node it stands for, -1 none
  int last_[2] = {-1, -1};
};

}  // namespace

TEST_CASE("stream order: a started all-reduce follows its gradients and overlaps the backward after it",
          "[stream_order]") {
  FakeStreams s;
  StartedCollectives started(s);
  const int grads = s.work(Stream::compute, "backward wave 2");
  int reduce = -1;
  const int r = started.start([&] { reduce = s.work(Stream::comm, "all-reduce bucket 0"); });
  CHECK(r == 0);
  const int more = s.work(Stream::compute, "backward wave 1");
  started.wait(r);
  const int step = s.work(Stream::compute, "optimizer bucket 0");

  CHECK(s.before(grads, reduce));   // the buffer is final before it is summed
  CHECK_FALSE(s.before(reduce, more));  // the backward goes on meanwhile ...
  CHECK_FALSE(s.before(more, reduce));  // ... and the sum does not wait for it
  CHECK(s.before(reduce, step));    // the optimizer reads the sum
  CHECK(started.open() == 0);
}

TEST_CASE("stream order: two buckets run in the order started, each optimizer waits for its own",
          "[stream_order]") {
  FakeStreams s;
  StartedCollectives started(s);
  int reduce0 = -1, reduce1 = -1;
  const int grads0 = s.work(Stream::compute, "backward wave 3");
  const int r0 = started.start([&] { reduce0 = s.work(Stream::comm, "all-reduce bucket 0"); });
  const int grads1 = s.work(Stream::compute, "backward wave 2");
  const int r1 = started.start([&] { reduce1 = s.work(Stream::comm, "all-reduce bucket 1"); });
  CHECK(r1 == r0 + 1);
  CHECK(started.open() == 2);
  CHECK_THROWS_AS(started.wait(r1), std::logic_error);  // waits in the order started
  started.wait(r0);
  const int step0 = s.work(Stream::compute, "optimizer bucket 0");
  started.wait(r1);
  const int step1 = s.work(Stream::compute, "optimizer bucket 1");
  CHECK_THROWS_AS(started.wait(r1), std::logic_error);  // once each

  CHECK(s.before(grads0, reduce0));
  CHECK(s.before(reduce0, reduce1));   // one communicator, one order
  CHECK(s.before(grads1, reduce1));
  CHECK_FALSE(s.before(grads1, reduce0));
  CHECK(s.before(reduce0, step0));
  CHECK_FALSE(s.before(reduce1, step0));   // bucket 0's step need not wait for bucket 1's sum
  CHECK(s.before(reduce1, step1));
}

TEST_CASE("stream order: complete() asks whether open sums are done, without waiting", "[stream_order]") {
  FakeStreams s;
  StartedCollectives started(s);
  CHECK(started.complete());  // nothing started
  int reduce = -1;
  s.work(Stream::compute, "backward wave 1");
  const int r = started.start([&] { reduce = s.work(Stream::comm, "all-reduce bucket 0"); });
  CHECK_FALSE(started.complete());
  CHECK_FALSE(started.complete());  // asking again changes nothing
  s.finish(reduce);
  CHECK(started.complete());
  started.wait(r);
  CHECK(started.complete());
}

TEST_CASE("stream order: end events are reused once waited for, and reuse keeps each wait's meaning",
          "[stream_order]") {
  FakeStreams s;
  StartedCollectives started(s);
  // Step after step of three buckets each: 1 ordering event + 3 end events.
  for (int step = 0; step < 50; ++step) {
    std::vector<int> r;
    for (int b = 0; b < 3; ++b) r.push_back(started.start([&] { s.work(Stream::comm, "all-reduce"); }));
    CHECK(r == std::vector<int>{0, 1, 2});  // numbered from 0 again once none is open
    for (int q : r) started.wait(q);
  }
  CHECK(started.events() == 4);

  // Bucket 1 records the end event bucket 0 had: the optimizer of bucket 0,
  // enqueued after the wait for bucket 0, still waits for bucket 0 only.
  int reduce0 = -1, reduce1 = -1;
  const int r0 = started.start([&] { reduce0 = s.work(Stream::comm, "all-reduce bucket 0"); });
  started.wait(r0);
  const int step0 = s.work(Stream::compute, "optimizer bucket 0");
  const int r1 = started.start([&] { reduce1 = s.work(Stream::comm, "all-reduce bucket 1"); });
  const int between = s.work(Stream::compute, "forward of the next step");
  started.wait(r1);
  const int step1 = s.work(Stream::compute, "optimizer bucket 1");
  CHECK(started.events() == 4);
  CHECK(s.before(reduce0, step0));
  CHECK_FALSE(s.before(reduce1, step0));
  CHECK(s.before(step0, reduce1));   // started after the compute stream's work so far
  CHECK_FALSE(s.before(reduce1, between));
  CHECK(s.before(reduce1, step1));
}
