// The NCCL communicator (built with the CUDA backend when NCCL is found;
// docs/gpu.md). One NcclComm per device group, on the CUDA device bound by
// cuda_bind_device (one distinct GPU per rank of a group: NCCL refuses two
// ranks on one GPU).
//
// Comm's host-buffer methods stage through a device buffer (upload, NCCL on
// the default stream, download), so the executor's host code works
// unchanged; the *_device methods take device pointers and skip the
// staging (the CUDA backend's TP all-reduces use them). Every blocking call
// returns after the NCCL work is complete, as Comm's blocking contract
// requires.
//
// Started all-reduces (gradient buckets during the backward pass,
// start_all_reduce_sum_device) run on this communicator's own stream (made
// at the first, non-blocking: the legacy default stream the CUDA backend
// computes on does not serialise with it), ordered by events
// (stream_order.h): after the compute stream's work so far, and the
// compute stream's work after wait_all_reduce_device after the sum. The
// host never waits for them inside a step: the next blocking call (at the
// latest the step's loss all-reduce) waits for the compute stream, which
// waits for them, under the watchdog below. The executor gives started
// all-reduces a communicator of their own (duplicate(): ncclCommSplit), so
// they never interleave with the blocking collectives of the same group on
// the compute stream; every rank starts them in the lowering's one global
// bucket order. NCCL kernels of several communicators then run side by
// side, as PyTorch DDP's do: NCCL documents that this needs them to fit on
// the GPU together (a handful of blocks each; an H200 has 132 SMs).
//
// send/recv: NCCL has no tags: messages between two ranks match in the order
// posted (the executor's schedule posts them in one global order, so this is
// equivalent to its per-wave tags). send blocks until the peer receives.
// exchange_device posts several sends and receives as one NCCL group
// (ncclGroupStart/End): the inter-wave transfers of one rank need no order.
//
// Errors: every NCCL and CUDA call is checked (NCCL_CHECK / CUDA_CHECK):
// rank, file, line and the error string, then the whole job aborts. A call
// does not wait for ever on a peer that stalled or died: completion is
// polled (cudaStreamQuery) with ncclCommGetAsyncError between polls, and
// after the timeout (spindle-run --comm-timeout, 600 s by default) or on
// an asynchronous error of any live NCCL communicator of this rank (the
// compute stream may be waiting for another one's started all-reduce) the
// communicator is aborted and the job ends with a message naming the rank
// and the call (watchdog.h). Connections are made
// at creation (NCCL_RUNTIME_CONNECT=0 unless the user set it).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "libexec/backend/cuda/cuda_check.h"
#include "libexec/comm/comm.h"
#include "libexec/comm/mpi_comm.h"
#include "libexec/comm/stream_order.h"

#define NCCL_CHECK(call)                                                                                \
  do {                                                                                                  \
    const ncclResult_t spindle_nccl_rc_ = (call);                                                       \
    if (spindle_nccl_rc_ != ncclSuccess)                                                                \
      ::spindle::exec::cuda_fail("NCCL", ncclGetErrorString(spindle_nccl_rc_), #call, __FILE__, __LINE__); \
  } while (0)

namespace spindle::exec {

// StreamOps over CUDA: Stream::compute is the legacy default stream (the
// CUDA backend's only one), Stream::comm a non-blocking stream made at the
// first use. Owns both its stream and its events.
class CudaStreams final : public StreamOps {
 public:
  CudaStreams() = default;
  CudaStreams(const CudaStreams&) = delete;
  CudaStreams& operator=(const CudaStreams&) = delete;
  ~CudaStreams() override;
  int make_event() override;
  void record(int event, Stream on) override;
  void wait(Stream s, int event) override;
  bool done(int event) override;
  cudaStream_t comm();
  void finish() noexcept;  // until the comm stream's work is done (if it was made; errors ignored)

 private:
  cudaStream_t stream(Stream s) { return s == Stream::compute ? cudaStream_t{nullptr} : comm(); }
  cudaStream_t comm_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

class NcclComm final : public Comm {
 public:
  // Collective over `group` (an MPI communicator of the same ranks): rank 0
  // makes the NCCL unique id, MPI broadcasts it, every rank joins with
  // ncclCommInitRank. Group rank i is NCCL rank i. timeout_s (> 0): how
  // long any call waits for its peers (this communicator and the group
  // communicators split from it).
  static std::unique_ptr<NcclComm> create(const MpiComm& group, double timeout_s);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const float> send, std::span<float> recv) override;
  void send(std::span<const float> data, int peer, int tag) override;
  void recv(std::span<float> data, int peer, int tag) override;
  void barrier() override;
  // Staged: every buffer uploaded, one exchange_device, receives downloaded.
  void exchange(std::span<const SendBuf> sends, std::span<const RecvBuf> recvs, int tag) override;

  // Device-memory versions (pointers into the current device's memory).
  bool device_memory() const override { return true; }
  void all_reduce_sum_device(float* data, int64_t count) override;
  void all_gather_device(const float* send, float* recv, int64_t count) override;
  using Transfer = Comm::DeviceTransfer;
  // Posts every send and receive as one group and waits for all of them.
  void exchange_device(std::span<const Transfer> sends, std::span<const Transfer> recvs) override;
  // On this communicator's stream (above); the wait makes the compute
  // stream wait, the host goes on.
  int start_all_reduce_sum_device(float* data, int64_t count) override;
  // ncclReduceScatter in place (this rank's block of `data` receives it).
  int start_reduce_scatter_sum_device(float* data, int64_t count) override;
  int start_all_gather_device(const float* send, float* recv, int64_t count) override;
  void wait_all_reduce_device(int request) override;
  bool progress() override;   // every started all-reduce done? (asks the events, never waits)
  // The same ranks, another NCCL communicator (ncclCommSplit, by every rank
  // of this one, in one order): for started all-reduces.
  std::unique_ptr<Comm> duplicate() override;

  ncclComm_t handle() const { return comm_; }

 private:
  friend std::map<std::vector<int>, std::unique_ptr<Comm>> create_nccl_group_comms(
      const NcclComm& world, const std::vector<std::vector<int>>& groups);
  NcclComm(ncclComm_t comm, int rank, int size, double timeout_s);  // joins the live set
  // A communicator split from this one (create_nccl_group_comms, duplicate): made ready to use.
  static std::unique_ptr<NcclComm> adopt(ncclComm_t comm, int rank, int size, double timeout_s);
  float* scratch(int64_t count);  // device buffer of at least count floats
  // After a host-staged call: a scratch buffer over kKeptScratchBytes is
  // freed, so a checkpoint's gather (a whole shard's value, m and v) does
  // not keep that much device memory from training for the rest of the run.
  void trim_scratch();
  static constexpr int64_t kKeptScratchBytes = int64_t{64} << 20;
  void wait(const char* what);    // the default stream's work done, or the job ends

  ncclComm_t comm_;
  int rank_, size_;
  double timeout_s_;
  float* scratch_ = nullptr;
  int64_t scratch_count_ = 0;
  CudaStreams streams_;
  StartedCollectives started_{streams_};
};

// create_group_comms (mpi_comm.h) with NCCL communicators split from one
// world communicator: one ncclCommSplit of `world` per distinct group, in
// the groups' sorted order, by every rank of `world` (members with color 0
// and key = their position in the ascending group, the others with
// NCCL_SPLIT_NOCOLOR). Every rank calls it with the same list. Returns the
// groups this rank belongs to; group rank i is the i-th smallest member.
std::map<std::vector<int>, std::unique_ptr<Comm>> create_nccl_group_comms(
    const NcclComm& world, const std::vector<std::vector<int>>& groups);

}  // namespace spindle::exec
