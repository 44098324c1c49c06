// NCCL's rules over another communicator, for tests on machines without a
// GPU (docs/gpu.md, "The device paths on the CPU").
//
// With a CUDA backend and NCCL, the executor takes branches of its own: the
// inter-wave exchanges post every send and receive as one NCCL group
// (exchange_device), buckets are all-reduced, reduce-scattered and
// all-gathered in device memory (start_*_device, wait_all_reduce_device),
// the tensor-parallel all-gathers run on device memory, and the programs are
// lowered without early transfers. NcclEmulation lets a CPU run take every
// one of them:
//  - device_memory() is true, and the device-memory calls take host
//    pointers (the emulated backend's memory is host memory:
//    backend/cpu/device_emulation.h) and run the inner communicator's host
//    calls on them;
//  - point-to-point messages match as NCCL matches them: between two ranks,
//    in the order each side posted them, whatever the tag (NCCL has none).
//    The n-th message a rank sends to a peer meets the n-th receive that
//    peer posts from it (host send, recv and exchange included, as
//    NcclComm stages them through exchange_device). Two ranks that post
//    one exchange's transfers in different orders get each other's
//    messages crossed: the inner communicator aborts on the sizes, or the
//    values land in the wrong tensors. MPI, which matches by tag, would
//    hide that. Messages of 0 floats are skipped on both sides, as
//    NcclComm skips them.
// Collectives keep the inner communicator's rules (comm.h), which are
// NCCL's. What is not emulated: streams (the compute is synchronous here,
// so a read before its stream wait cannot show), NCCL's own code and
// device memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "libexec/comm/comm.h"

namespace spindle::exec {

// The device-memory calls made, summed over every NcclEmulation that shares
// it (a world, its groups and their duplicates): what shows that a run took
// the device branches.
struct DeviceCalls {
  int64_t exchanges = 0;     // exchange_device
  int64_t collectives = 0;   // all_reduce_sum_device, all_gather_device, start_*_device
};

class NcclEmulation final : public Comm {
 public:
  // Over `inner` (not null), owned; `calls` (not null) counts the
  // device-memory calls of this communicator and its duplicates.
  NcclEmulation(std::unique_ptr<Comm> inner, std::shared_ptr<DeviceCalls> calls);
  // Over `inner`, not owned: it must outlive this communicator.
  NcclEmulation(Comm& inner, std::shared_ptr<DeviceCalls> calls);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce_sum(std::span<float> data) override { inner_->all_reduce_sum(data); }
  void all_gather(std::span<const float> send, std::span<float> recv) override { inner_->all_gather(send, recv); }
  // Through exchange_device, in the pair's order (the tag is ignored).
  void send(std::span<const float> data, int peer, int tag) override;
  void recv(std::span<float> data, int peer, int tag) override;
  void exchange(std::span<const SendBuf> sends, std::span<const RecvBuf> recvs, int tag) override;
  void barrier() override { inner_->barrier(); }

  bool device_memory() const override { return true; }
  void all_reduce_sum_device(float* data, int64_t count) override;
  void all_gather_device(const float* send, float* recv, int64_t count) override;
  void exchange_device(std::span<const DeviceTransfer> sends, std::span<const DeviceTransfer> recvs) override;
  int start_all_reduce_sum_device(float* data, int64_t count) override;
  int start_reduce_scatter_sum_device(float* data, int64_t count) override;
  int start_all_gather_device(const float* send, float* recv, int64_t count) override;
  void wait_all_reduce_device(int request) override { inner_->wait_all_reduce(request); }
  bool progress() override { return inner_->progress(); }
  // The inner communicator's duplicate, emulated too (same counts).
  std::unique_ptr<Comm> duplicate() override;

 private:
  // The tag of the next message to or from `peer`: its position in that
  // direction's order, modulo the inner communicator's tags.
  int next_tag(std::vector<int64_t>& count, int peer) const;

  std::unique_ptr<Comm> owned_;   // null when not owned
  Comm* inner_;
  std::shared_ptr<DeviceCalls> calls_;
  std::vector<int64_t> sent_, received_;   // by peer: messages of > 0 floats so far
};

}  // namespace spindle::exec
