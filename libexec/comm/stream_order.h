// Collectives started on a communication stream and ordered against the
// compute stream by events, with no host wait inside a step: the NCCL
// communicator's started all-reduces (gradient buckets during the
// backward pass). Written against four stream primitives
// (StreamOps) so that the ordering is plain C++: NcclComm runs it over
// CUDA streams and events, test_stream_order.cpp over a fake that records
// which work happens before which.
//
// What it guarantees, for a request r (start, then wait):
//  - r's collective runs after every piece of compute-stream work enqueued
//    before start(r) (the buffer it reduces is final there);
//  - compute-stream work enqueued between start(r) and wait(r) is not
//    ordered against r's collective in either direction: they overlap;
//  - compute-stream work enqueued after wait(r) runs after r's collective
//    (the optimizer reads the sums), and the host has not waited for it;
//  - collectives of one communicator run on its stream in the order
//    started (NCCL needs every rank to call them in one order).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

namespace spindle::exec {

enum class Stream { compute, comm };

// The primitives, as CUDA defines them (cudaEventRecord,
// cudaStreamWaitEvent, cudaEventQuery): record(e, s) makes event e stand
// for the work enqueued on s so far; wait(s, e) makes the work enqueued on s
// from now on wait for what e stood for at this call (recording e again
// later does not change that); done(e) asks, without waiting, whether the
// work e stands for has completed (an event never recorded: true). Events
// are small ints from make_event, recorded again and again.
class StreamOps {
 public:
  virtual ~StreamOps() = default;
  virtual int make_event() = 0;
  virtual void record(int event, Stream on) = 0;
  virtual void wait(Stream s, int event) = 0;
  virtual bool done(int event) = 0;
};

// The started collectives of one communicator. Requests are numbered from
// 0 in the order started, and waited for in that order, each once (Comm's
// start_all_reduce_sum contract).
class StartedCollectives {
 public:
  explicit StartedCollectives(StreamOps& ops) : ops_(ops) {}

  // Orders the comm stream after the compute stream's work so far, calls
  // `enqueue` (which puts the collective on the comm stream) and records
  // the collective's end. Returns the request.
  int start(const std::function<void()>& enqueue);
  // The compute stream's work enqueued from now on waits for `request`'s
  // collective; the host goes on at once. std::logic_error unless
  // `request` is the oldest started and not yet waited for.
  void wait(int request);
  // True once the collective of every request not yet waited for has
  // completed on the device (asks; never waits). Waited-for requests are
  // the compute stream's business.
  bool complete();
  // Started and not yet waited for.
  int open() const { return static_cast<int>(open_.size()); }
  // Events made so far: one orders comm after compute, the others mark
  // collectives' ends and are reused once waited for (so at most 1 + the
  // most requests ever open at once).
  int events() const { return events_; }

 private:
  StreamOps& ops_;
  int ready_ = -1;            // compute stream -> comm stream, recorded at every start
  std::vector<int> free_;     // end events not in use
  std::deque<int> open_;      // end event of each open request, oldest first
  int64_t first_open_ = 0;    // request number of open_.front()
  int events_ = 0;
};

}  // namespace spindle::exec
