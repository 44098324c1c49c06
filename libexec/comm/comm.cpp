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
  deferred_open_.push_back(1);
  return static_cast<int>(deferred_.size()) - 1;
}

int Comm::start_all_gather(std::span<const float> send, std::span<float> recv) {
  all_gather(send, recv);
  deferred_.emplace_back();   // nothing left for the wait
  deferred_open_.push_back(1);
  return static_cast<int>(deferred_.size()) - 1;
}

void Comm::wait_all_reduce(int request) {
  if (request < 0 || static_cast<size_t>(request) >= deferred_.size() || deferred_open_[static_cast<size_t>(request)] == 0)
    throw std::logic_error("Comm::wait_all_reduce: request " + std::to_string(request) +
                           " was not started or was waited for already");
  deferred_open_[static_cast<size_t>(request)] = 0;
  if (!deferred_[static_cast<size_t>(request)].empty()) all_reduce_sum(deferred_[static_cast<size_t>(request)]);
  if (++waited_ == deferred_.size()) {
    deferred_open_.clear();
    deferred_.clear();
    waited_ = 0;
  }
}

bool Comm::progress() { return waited_ == deferred_.size(); }

int Comm::post_send(std::span<const float> data, int peer, int tag) {
  send(data, peer, tag);
  p2p_.push_back({{}, peer, tag, false, true});
  ++p2p_open_;
  return static_cast<int>(p2p_.size()) - 1;
}

int Comm::post_recv(std::span<float> data, int peer, int tag) {
  p2p_.push_back({data, peer, tag, true, true});
  ++p2p_open_;
  return static_cast<int>(p2p_.size()) - 1;
}

void Comm::wait_p2p(int request) {
  if (request < 0 || static_cast<size_t>(request) >= p2p_.size() || !p2p_[static_cast<size_t>(request)].open)
    throw std::logic_error("Comm::wait_p2p: request " + std::to_string(request) + " is not open");
  Deferred& r = p2p_[static_cast<size_t>(request)];
  r.open = false;
  if (r.receive) recv(r.data, r.peer, r.tag);
  if (--p2p_open_ == 0) p2p_.clear();
}

void Comm::all_reduce_sum_device(float*, int64_t) { no_device_memory("all_reduce_sum_device"); }
void Comm::all_gather_device(const float*, float*, int64_t) { no_device_memory("all_gather_device"); }
void Comm::exchange_device(std::span<const DeviceTransfer>, std::span<const DeviceTransfer>) {
  no_device_memory("exchange_device");
}
int Comm::start_all_reduce_sum_device(float*, int64_t) { no_device_memory("start_all_reduce_sum_device"); }
void Comm::wait_all_reduce_device(int) { no_device_memory("wait_all_reduce_device"); }
int Comm::start_all_gather_device(const float*, float*, int64_t) { no_device_memory("start_all_gather_device"); }

}  // namespace spindle::exec
