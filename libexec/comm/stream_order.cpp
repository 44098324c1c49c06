#include "libexec/comm/stream_order.h"

#include <stdexcept>
#include <string>

namespace spindle::exec {

int StartedCollectives::start(const std::function<void()>& enqueue) {
  if (ready_ < 0) {
    ready_ = ops_.make_event();
    ++events_;
  }
  ops_.record(ready_, Stream::compute);
  ops_.wait(Stream::comm, ready_);  // captured now: ready_ may be recorded again at the next start
  enqueue();
  int end = -1;
  if (free_.empty()) {
    end = ops_.make_event();
    ++events_;
  } else {
    end = free_.back();
    free_.pop_back();
  }
  ops_.record(end, Stream::comm);
  open_.push_back(end);
  return static_cast<int>(first_open_ + static_cast<int64_t>(open_.size()) - 1);
}

void StartedCollectives::wait(int request) {
  if (open_.empty() || request != first_open_)
    throw std::logic_error("StartedCollectives::wait: request " + std::to_string(request) +
                           " is not the oldest started and not yet waited for");
  ops_.wait(Stream::compute, open_.front());
  free_.push_back(open_.front());  // the compute stream's wait captured it: free to record again
  open_.pop_front();
  ++first_open_;
  if (open_.empty()) first_open_ = 0;  // numbering restarts, as Comm's default requests do
}

bool StartedCollectives::complete() {
  for (int e : open_)
    if (!ops_.done(e)) return false;
  return true;
}

}  // namespace spindle::exec
