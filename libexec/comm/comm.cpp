#include "libexec/comm/comm.h"

#include <stdexcept>
#include <string>

namespace spindle::exec {

namespace {
[[noreturn]] void no_device_memory(const char* what) {
  throw std::logic_error(std::string(what) + ": this communicator carries host buffers only (check device_memory())");
}
}  // namespace

int Comm::start_all_reduce_sum(std::span<float> data) {
  deferred_.push_back(data);
  return static_cast<int>(deferred_.size()) - 1;
}

void Comm::wait_all_reduce(int request) {
  if (request < 0 || static_cast<size_t>(request) != next_wait_ || next_wait_ >= deferred_.size())
    throw std::logic_error("Comm::wait_all_reduce: request " + std::to_string(request) +
                           " is not the next one started and not yet waited for");
  all_reduce_sum(deferred_[next_wait_++]);
  if (next_wait_ == deferred_.size()) {
    deferred_.clear();
    next_wait_ = 0;
  }
}

bool Comm::progress() { return next_wait_ == deferred_.size(); }

void Comm::all_reduce_sum_device(float*, int64_t) { no_device_memory("all_reduce_sum_device"); }
void Comm::all_gather_device(const float*, float*, int64_t) { no_device_memory("all_gather_device"); }
void Comm::exchange_device(std::span<const DeviceTransfer>, std::span<const DeviceTransfer>) {
  no_device_memory("exchange_device");
}

}  // namespace spindle::exec
