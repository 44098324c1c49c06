#include "libexec/comm/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "libexec/backend/cuda/cuda_check.h"
#include "libexec/comm/mpi_check.h"
#include "libexec/comm/watchdog.h"

namespace spindle::exec {

namespace {

void sync() { CUDA_CHECK(cudaStreamSynchronize(0)); }

// cudaMalloc; when the device is full, first returns the memory the CUDA
// backend's stream-ordered pool keeps cached (it never releases it on its
// own) and tries again.
void* device_alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    int device = 0;
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    sync();
    CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
    rc = cudaMalloc(&p, bytes);
  }
  CUDA_CHECK(rc);
  return p;
}

// Every NCCL communicator of this rank not yet destroyed: a wait for the
// compute stream asks each for an asynchronous error, since the stream may
// wait for another communicator's started all-reduce. One thread uses
// the communicators (Comm's rule), so no lock.
std::vector<ncclComm_t>& live_comms() {
  static std::vector<ncclComm_t> live;
  return live;
}

// The first asynchronous error of a live communicator ("" when none):
// its error string and NCCL's last message.
std::string live_comm_error() {
  for (ncclComm_t c : live_comms()) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(c, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      return std::string(ncclGetErrorString(async)) + ": " + ncclGetLastError(c);
  }
  return {};
}
}  // namespace

// ---------------------------------------------------------------------------
// CudaStreams

CudaStreams::~CudaStreams() {
  finish();
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  if (comm_) (void)cudaStreamDestroy(comm_);
}

cudaStream_t CudaStreams::comm() {
  if (!comm_) CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  return comm_;
}

void CudaStreams::finish() noexcept {
  if (comm_) (void)cudaStreamSynchronize(comm_);
}

int CudaStreams::make_event() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  events_.push_back(e);
  return static_cast<int>(events_.size()) - 1;
}

void CudaStreams::record(int event, Stream on) {
  CUDA_CHECK(cudaEventRecord(events_.at(static_cast<size_t>(event)), stream(on)));
}

void CudaStreams::wait(Stream s, int event) {
  CUDA_CHECK(cudaStreamWaitEvent(stream(s), events_.at(static_cast<size_t>(event)), 0));
}

bool CudaStreams::done(int event) {
  const cudaError_t rc = cudaEventQuery(events_.at(static_cast<size_t>(event)));
  if (rc == cudaErrorNotReady) return false;
  CUDA_CHECK(rc);
  return true;
}

// ---------------------------------------------------------------------------
// NcclComm

NcclComm::NcclComm(ncclComm_t comm, int rank, int size, double timeout_s)
    : comm_(comm), rank_(rank), size_(size), timeout_s_(timeout_s) {
  live_comms().push_back(comm_);
}

std::unique_ptr<NcclComm> NcclComm::adopt(ncclComm_t comm, int rank, int size, double timeout_s) {
  std::unique_ptr<NcclComm> c(new NcclComm(comm, rank, size, timeout_s));
  c->barrier();  // NCCL sets up its collective buffers now, before the pool holds the device's memory
  return c;
}

std::unique_ptr<NcclComm> NcclComm::create(const MpiComm& group, double timeout_s) {
  // The collectives' connections at init, before the CUDA backend's pool
  // holds the device's memory: a connection made mid-run could find none
  // left. (Not the point-to-point ones: NCCL makes those at their first
  // send, docs/gpu.md.) A value the user set wins.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  ncclUniqueId id{};
  if (group.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, group.handle()));
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, group.size(), id, group.rank()));
  return adopt(comm, group.rank(), group.size(), timeout_s);
}

NcclComm::~NcclComm() {
  (void)cudaStreamSynchronize(0);
  streams_.finish();  // no NCCL work left in flight on this communicator's stream
  if (scratch_) (void)cudaFree(scratch_);
  std::vector<ncclComm_t>& live = live_comms();
  live.erase(std::remove(live.begin(), live.end(), comm_), live.end());
  (void)ncclCommDestroy(comm_);
}

float* NcclComm::scratch(int64_t count) {
  if (count > scratch_count_) {
    if (scratch_) CUDA_CHECK(cudaFree(scratch_));
    scratch_ = static_cast<float*>(device_alloc(static_cast<size_t>(count) * kFloatBytes));
    scratch_count_ = count;
  }
  return scratch_;
}

void NcclComm::trim_scratch() {
  if (scratch_ == nullptr || scratch_count_ * static_cast<int64_t>(kFloatBytes) <= kKeptScratchBytes) return;
  CUDA_CHECK(cudaFree(scratch_));   // the call's work is done: it waited, then copied back
  scratch_ = nullptr;
  scratch_count_ = 0;
}

// Until the stream's NCCL work is done, or a peer failed (the
// communicator's asynchronous error), or timeout_s_ passed: then the
// communicator is aborted (so no NCCL kernel waits for ever) and the job
// ends with a message naming this rank and the call.
void NcclComm::wait(const char* what) {
  const Waited w = wait_or_give_up(
      [] {
        const cudaError_t rc = cudaStreamQuery(0);
        if (rc == cudaErrorNotReady) return false;
        CUDA_CHECK(rc);
        return true;
      },
      [] { return live_comm_error(); }, timeout_s_);
  if (w.end == WaitEnd::done) return;
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  (void)ncclCommAbort(comm_);
  std::fprintf(stderr, "spindle: %s\n", gave_up_message(w, world_rank, what, size_).c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void NcclComm::all_reduce_sum_device(float* data, int64_t count) {
  if (count <= 0) return;
  NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, 0));
  wait("NCCL all-reduce");
}

void NcclComm::all_gather_device(const float* send, float* recv, int64_t count) {
  if (count <= 0) return;
  NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat32, comm_, 0));
  wait("NCCL all-gather");
}

void NcclComm::exchange_device(std::span<const Transfer> sends, std::span<const Transfer> recvs) {
  NCCL_CHECK(ncclGroupStart());
  for (const Transfer& t : sends)
    if (t.count > 0) NCCL_CHECK(ncclSend(t.data, static_cast<size_t>(t.count), ncclFloat32, t.peer, comm_, 0));
  for (const Transfer& t : recvs)
    if (t.count > 0) NCCL_CHECK(ncclRecv(t.data, static_cast<size_t>(t.count), ncclFloat32, t.peer, comm_, 0));
  NCCL_CHECK(ncclGroupEnd());
  wait("NCCL send/receive");
}

int NcclComm::start_all_reduce_sum_device(float* data, int64_t count) {
  return started_.start([&] {
    if (count > 0)
      NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, streams_.comm()));
  });
}

int NcclComm::start_reduce_scatter_sum_device(float* data, int64_t count) {
  if (count % size_ != 0) throw std::invalid_argument("NcclComm::start_reduce_scatter_sum_device: not size() blocks");
  const int64_t block = count / size_;
  return started_.start([&] {
    if (block > 0)
      NCCL_CHECK(ncclReduceScatter(data, data + block * rank_, static_cast<size_t>(block), ncclFloat32, ncclSum, comm_,
                                   streams_.comm()));
  });
}

int NcclComm::start_all_gather_device(const float* send, float* recv, int64_t count) {
  return started_.start([&] {
    if (count > 0)
      NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat32, comm_, streams_.comm()));
  });
}

void NcclComm::wait_all_reduce_device(int request) { started_.wait(request); }

bool NcclComm::progress() { return started_.complete(); }

std::unique_ptr<Comm> NcclComm::duplicate() {
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommSplit(comm_, 0, rank_, &comm, nullptr));
  return adopt(comm, rank_, size_, timeout_s_);
}

// The host-staged calls copy with cudaMemcpy, which waits for the compute
// stream without a timeout: they first wait for it under the watchdog
// (it may be waiting for a started all-reduce whose peer stalled).
void NcclComm::all_reduce_sum(std::span<float> data) {
  const auto n = static_cast<int64_t>(data.size());
  if (n == 0) return;
  wait("NCCL (the device's earlier work, before an all-reduce of host memory)");
  float* d = scratch(n);
  CUDA_CHECK(cudaMemcpy(d, data.data(), data.size() * kFloatBytes, cudaMemcpyHostToDevice));
  all_reduce_sum_device(d, n);
  CUDA_CHECK(cudaMemcpy(data.data(), d, data.size() * kFloatBytes, cudaMemcpyDeviceToHost));
  trim_scratch();
}

void NcclComm::all_gather(std::span<const float> send, std::span<float> recv) {
  const auto n = static_cast<int64_t>(send.size());
  if (recv.size() != send.size() * static_cast<size_t>(size_))
    throw std::invalid_argument("NcclComm::all_gather: recv must hold size() * send.size() floats");
  if (n == 0) return;
  wait("NCCL (the device's earlier work, before an all-gather of host memory)");
  float* d = scratch(n * (size_ + 1));
  CUDA_CHECK(cudaMemcpy(d, send.data(), send.size() * kFloatBytes, cudaMemcpyHostToDevice));
  all_gather_device(d, d + n, n);
  CUDA_CHECK(cudaMemcpy(recv.data(), d + n, recv.size() * kFloatBytes, cudaMemcpyDeviceToHost));
  trim_scratch();
}

void NcclComm::send(std::span<const float> data, int peer, int /*tag*/) {
  const auto n = static_cast<int64_t>(data.size());
  if (n == 0) return;
  wait("NCCL (the device's earlier work, before a send of host memory)");
  float* d = scratch(n);
  CUDA_CHECK(cudaMemcpy(d, data.data(), data.size() * kFloatBytes, cudaMemcpyHostToDevice));
  const Transfer t{d, n, peer};
  exchange_device({&t, 1}, {});
  trim_scratch();
}

void NcclComm::recv(std::span<float> data, int peer, int /*tag*/) {
  const auto n = static_cast<int64_t>(data.size());
  if (n == 0) return;
  float* d = scratch(n);
  const Transfer t{d, n, peer};
  exchange_device({}, {&t, 1});
  CUDA_CHECK(cudaMemcpy(data.data(), d, data.size() * kFloatBytes, cudaMemcpyDeviceToHost));
  trim_scratch();
}

void NcclComm::exchange(std::span<const SendBuf> sends, std::span<const RecvBuf> recvs, int /*tag*/) {
  int64_t total = 0;
  for (const SendBuf& s : sends) total += static_cast<int64_t>(s.data.size());
  for (const RecvBuf& r : recvs) total += static_cast<int64_t>(r.data.size());
  wait("NCCL (the device's earlier work, before an exchange of host memory)");
  float* d = scratch(std::max<int64_t>(total, 1));
  std::vector<Transfer> ds, dr;
  for (const SendBuf& s : sends) {
    if (!s.data.empty()) CUDA_CHECK(cudaMemcpy(d, s.data.data(), s.data.size() * kFloatBytes, cudaMemcpyHostToDevice));
    ds.push_back({d, static_cast<int64_t>(s.data.size()), s.peer});
    d += s.data.size();
  }
  for (const RecvBuf& r : recvs) {
    dr.push_back({d, static_cast<int64_t>(r.data.size()), r.peer});
    d += r.data.size();
  }
  exchange_device(ds, dr);
  for (size_t i = 0; i < recvs.size(); ++i)
    if (!recvs[i].data.empty())
      CUDA_CHECK(cudaMemcpy(recvs[i].data.data(), dr[i].data, recvs[i].data.size() * kFloatBytes, cudaMemcpyDeviceToHost));
  trim_scratch();
}

void NcclComm::barrier() {
  float* d = scratch(1);
  CUDA_CHECK(cudaMemset(d, 0, kFloatBytes));
  all_reduce_sum_device(d, 1);
}

std::map<std::vector<int>, std::unique_ptr<Comm>> create_nccl_group_comms(
    const NcclComm& world, const std::vector<std::vector<int>>& groups) {
  std::set<std::vector<int>> distinct;  // sorted: the same global order on every rank
  for (std::vector<int> g : groups) {
    std::sort(g.begin(), g.end());
    g.erase(std::unique(g.begin(), g.end()), g.end());
    distinct.insert(std::move(g));
  }
  std::map<std::vector<int>, std::unique_ptr<Comm>> out;
  for (const std::vector<int>& g : distinct) {
    const auto it = std::find(g.begin(), g.end(), world.rank());
    const bool member = it != g.end();
    const int key = member ? static_cast<int>(it - g.begin()) : 0;
    ncclComm_t comm = nullptr;
    NCCL_CHECK(ncclCommSplit(world.handle(), member ? 0 : NCCL_SPLIT_NOCOLOR, key, &comm, nullptr));
    if (!member) continue;
    out[g] = NcclComm::adopt(comm, key, static_cast<int>(g.size()), world.timeout_s_);
  }
  return out;
}

}  // namespace spindle::exec
