// Waiting for asynchronous communication without hanging on a peer that
// stalled or died: a CUDA stream's NCCL calls complete on the
// device, and a peer that never joins leaves cudaStreamSynchronize waiting
// for ever. wait_or_give_up polls instead, asks the communicator for an
// asynchronous error between polls (ncclCommGetAsyncError), and gives up
// after a timeout; the caller then aborts the communicator and ends the job
// with a message naming its rank. Plain C++ (the NCCL communicator passes
// lambdas over CUDA and NCCL), so its logic is tested on the CPU with fakes.
#pragma once

#include <functional>
#include <string>

namespace spindle::exec {

// How a wait ended: the work completed, the communicator reported an error
// (`error` holds it), or `timeout_s` passed first.
enum class WaitEnd { done, failed, timed_out };
struct Waited {
  WaitEnd end = WaitEnd::done;
  std::string error;    // failed: the communicator's error
  double waited_s = 0;  // seconds from the first poll to the last
};

// Polls `done` (true: the work completed) until it says so. Before each
// poll after the first it asks `error` (an empty string: none) and then
// compares now_s() with the start plus timeout_s (seconds, > 0); between
// polls it calls `pause` (e.g. a yield: a wait costs a polling CPU thread,
// as cudaStreamSynchronize's default spin does). Defaults: steady_clock
// seconds, std::this_thread::yield.
Waited wait_or_give_up(const std::function<bool()>& done, const std::function<std::string()>& error,
                       double timeout_s, const std::function<double()>& now_s = {},
                       const std::function<void()>& pause = {});

// The message a rank prints when it gives up: names the rank (of the
// world), the call, the group size, what happened and what to check.
std::string gave_up_message(const Waited& w, int world_rank, const std::string& what, int group_size);

}  // namespace spindle::exec
