#include "libexec/comm/comm.h"

#include <stdexcept>

namespace spindle::exec {

namespace {
[[noreturn]] void no_device_memory(const char* what) {
  throw std::logic_error(std::string(what) + ": this communicator carries host buffers only (check device_memory())");
}
}  // namespace

void Comm::all_reduce_sum_device(float*, int64_t) { no_device_memory("all_reduce_sum_device"); }
void Comm::all_gather_device(const float*, float*, int64_t) { no_device_memory("all_gather_device"); }
void Comm::exchange_device(std::span<const DeviceTransfer>, std::span<const DeviceTransfer>) {
  no_device_memory("exchange_device");
}

}  // namespace spindle::exec
