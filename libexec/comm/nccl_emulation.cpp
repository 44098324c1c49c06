#include "libexec/comm/nccl_emulation.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace spindle::exec {

namespace {
size_t floats(int64_t count) { return static_cast<size_t>(count); }

Comm* not_null(Comm* inner) {
  if (!inner) throw std::invalid_argument("NcclEmulation: no inner communicator");
  return inner;
}
}  // namespace

NcclEmulation::NcclEmulation(Comm& inner, std::shared_ptr<DeviceCalls> calls)
    : inner_(&inner),
      calls_(std::move(calls)),
      sent_(static_cast<size_t>(inner.size()), 0),
      received_(static_cast<size_t>(inner.size()), 0) {
  if (!calls_) throw std::invalid_argument("NcclEmulation: no call counts");
}

NcclEmulation::NcclEmulation(std::unique_ptr<Comm> inner, std::shared_ptr<DeviceCalls> calls)
    : NcclEmulation(*not_null(inner.get()), std::move(calls)) {
  owned_ = std::move(inner);
}

int NcclEmulation::next_tag(std::vector<int64_t>& count, int peer) const {
  if (peer < 0 || peer >= size())
    throw std::invalid_argument("NcclEmulation: peer " + std::to_string(peer) + " outside a group of " +
                                std::to_string(size()));
  const int64_t tags = static_cast<int64_t>(inner_->max_tag()) + 1;
  return static_cast<int>(count[static_cast<size_t>(peer)]++ % tags);
}

void NcclEmulation::exchange_device(std::span<const DeviceTransfer> sends, std::span<const DeviceTransfer> recvs) {
  for (const auto* list : {&sends, &recvs})
    for (const DeviceTransfer& t : *list)
      if (t.count < 0) throw std::invalid_argument("NcclEmulation: a message of " + std::to_string(t.count) + " floats");
  ++calls_->exchanges;
  std::vector<int> requests;
  for (const DeviceTransfer& r : recvs)
    if (r.count > 0) requests.push_back(inner_->post_recv({r.data, floats(r.count)}, r.peer, next_tag(received_, r.peer)));
  for (const DeviceTransfer& s : sends)
    if (s.count > 0) requests.push_back(inner_->post_send({s.data, floats(s.count)}, s.peer, next_tag(sent_, s.peer)));
  for (int request : requests) inner_->wait_p2p(request);
}

void NcclEmulation::send(std::span<const float> data, int peer, int /*tag*/) {
  const DeviceTransfer t{const_cast<float*>(data.data()), static_cast<int64_t>(data.size()), peer};
  exchange_device({&t, 1}, {});
}

void NcclEmulation::recv(std::span<float> data, int peer, int /*tag*/) {
  const DeviceTransfer t{data.data(), static_cast<int64_t>(data.size()), peer};
  exchange_device({}, {&t, 1});
}

void NcclEmulation::exchange(std::span<const SendBuf> sends, std::span<const RecvBuf> recvs, int /*tag*/) {
  std::vector<DeviceTransfer> ds, dr;
  for (const SendBuf& s : sends)
    ds.push_back({const_cast<float*>(s.data.data()), static_cast<int64_t>(s.data.size()), s.peer});
  for (const RecvBuf& r : recvs) dr.push_back({r.data.data(), static_cast<int64_t>(r.data.size()), r.peer});
  exchange_device(ds, dr);
}

void NcclEmulation::all_reduce_sum_device(float* data, int64_t count) {
  ++calls_->collectives;
  inner_->all_reduce_sum({data, floats(count)});
}

void NcclEmulation::all_gather_device(const float* send, float* recv, int64_t count) {
  ++calls_->collectives;
  inner_->all_gather({send, floats(count)}, {recv, floats(count) * static_cast<size_t>(size())});
}

int NcclEmulation::start_all_reduce_sum_device(float* data, int64_t count) {
  ++calls_->collectives;
  return inner_->start_all_reduce_sum({data, floats(count)});
}

int NcclEmulation::start_reduce_scatter_sum_device(float* data, int64_t count) {
  if (count % size() != 0)
    throw std::invalid_argument("NcclEmulation::start_reduce_scatter_sum_device: not size() blocks");
  ++calls_->collectives;
  return inner_->start_reduce_scatter_sum({data, floats(count)});
}

int NcclEmulation::start_all_gather_device(const float* send, float* recv, int64_t count) {
  ++calls_->collectives;
  return inner_->start_all_gather({send, floats(count)}, {recv, floats(count) * static_cast<size_t>(size())});
}

std::unique_ptr<Comm> NcclEmulation::duplicate() {
  std::unique_ptr<Comm> dup = inner_->duplicate();
  if (!dup) return nullptr;
  return std::make_unique<NcclEmulation>(std::move(dup), calls_);
}

}  // namespace spindle::exec
