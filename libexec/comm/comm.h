// The communicator interface (docs/architecture.md, convention 9): a group of ranks that
// exchange fp32 buffers. Implementations: MPI (comm/mpi_comm.h), a
// single-process fake of size 1 and a thread-simulated group of K ranks
// (comm/fake_comm.h). A later NCCL one fits the same interface.
//
// Ordering rules (every implementation, every caller):
//  - Collectives (all_reduce_sum, all_gather, barrier) are blocking and must
//    be called by every rank of the communicator, in the same order, with
//    the same element counts. A rank that skips one deadlocks the group.
//  - all_reduce_sum gives every rank bitwise the same result.
//  - send/recv are blocking point-to-point calls between ranks of this
//    communicator. send may block until the matching recv is posted (as
//    MPI_Send may), so two ranks must not both send to each other first:
//    order exchanges (e.g. lower rank sends first) or pair them in a
//    schedule without cycles. Messages from one sender to one receiver with
//    the same tag arrive in the order sent.
//  - exchange posts several sends and receives at once and completes them
//    all, in any order: two ranks may each send to the other in one
//    exchange. Messages between two ranks still match in posting order.
//  - Buffers are host memory; a device backend stages through the host.
//  - A Comm is used by one thread at a time.
// Errors abort the whole job (docs/architecture.md, convention 10); nothing is returned.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

namespace spindle::exec {

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;  // 0 .. size()-1
  virtual int size() const = 0;

  // In place: data[i] becomes the sum over ranks of data[i].
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // recv (size() * send.size() elements) gets every rank's send buffer,
  // in rank order. send and recv must not overlap.
  virtual void all_gather(std::span<const float> send, std::span<float> recv) = 0;
  // Point-to-point to/from rank `peer` of this communicator; tag >= 0.
  virtual void send(std::span<const float> data, int peer, int tag) = 0;
  virtual void recv(std::span<float> data, int peer, int tag) = 0;
  virtual void barrier() = 0;

  struct SendBuf {
    std::span<const float> data;
    int peer = 0;
  };
  struct RecvBuf {
    std::span<float> data;
    int peer = 0;
  };
  // This rank's sends and receives of one round (e.g. one wave's transfers),
  // all with `tag`; returns when every one is complete. The default posts
  // every send, then every receive: right only for communicators whose
  // sends never block (the fakes); MPI and NCCL post them all at once.
  virtual void exchange(std::span<const SendBuf> sends, std::span<const RecvBuf> recvs, int tag) {
    for (const SendBuf& s : sends) send(s.data, s.peer, tag);
    for (const RecvBuf& r : recvs) recv(r.data, r.peer, tag);
  }

  // Non-blocking point-to-point (transfers posted early: the lowering's
  // post_send and post_recv). post_send starts sending `data` to rank
  // `peer`, post_recv starts receiving into `data` from `peer`; each
  // returns a request that wait_p2p completes (each once, in any order).
  // `data` stays alive and untouched until then. Messages match by (peer,
  // tag): give each message in flight between two ranks its own tag, in
  // [0, max_tag()]. A message of another size than the receive buffer
  // aborts. Unlike send, post_send never blocks, so two ranks may post
  // sends to each other and then wait. The default sends at once (right
  // for the fakes, whose sends never block) and receives at the wait.
  virtual int post_send(std::span<const float> data, int peer, int tag);
  virtual int post_recv(std::span<float> data, int peer, int tag);
  virtual void wait_p2p(int request);
  virtual int max_tag() const { return std::numeric_limits<int>::max(); }

  // Non-blocking all-reduce (a gradient bucket during the backward pass):
  // starts summing `data` in place, with all_reduce_sum's rules (every
  // rank, in the same order, the same counts; every rank gets bitwise the
  // same result); the result is there once wait_all_reduce(request)
  // returns. `data` stays alive and untouched until then. Each request is
  // waited for once: in the order started on MPI and NCCL (the executor
  // starts one bucket per duplicate() when buckets start out of order), in
  // any order by the default, which runs the blocking all_reduce_sum at
  // the wait (the fakes: correct, no overlap; every rank must then wait in
  // one order). MPI starts it at once (MPI_Iallreduce).
  virtual int start_all_reduce_sum(std::span<float> data);
  virtual void wait_all_reduce(int request);
  // Non-blocking reduce-scatter (a gradient bucket whose optimizer state
  // is sharded, ZeRO-1): `data` holds size() blocks of data.size() /
  // size() floats; once wait_all_reduce(request) returns, block rank()
  // holds the sum over ranks of that block (the other blocks hold anything).
  // Started and waited for in the one sequence of start_all_reduce_sum's
  // requests, with its rules. The default sums all of it
  // (start_all_reduce_sum): the same block, more bytes moved.
  virtual int start_reduce_scatter_sum(std::span<float> data) { return start_all_reduce_sum(data); }
  // Non-blocking all-gather (ZeRO-1: a bucket's values at the start of a
  // step, overlapping its forward pass): all_gather(send, recv) with its
  // rules, in the one sequence of start_all_reduce_sum's requests (waited
  // for with wait_all_reduce, in the order started on MPI and NCCL); recv
  // holds the result once the wait returns, and both buffers stay alive
  // and untouched until then. The default runs the blocking all_gather at
  // once (every rank starts them in one order) and its wait does nothing.
  virtual int start_all_gather(std::span<const float> send, std::span<float> recv);
  // A communicator over the same ranks whose collectives never match this
  // one's, for all-reduces started while this one still runs blocking
  // collectives in between (a gradient bucket's group that is also a
  // slice's, whose backward calls collectives): MPI_Comm_dup, called by
  // every rank of the group in the same order. nullptr when none is needed:
  // a communicator whose started all-reduces run at their wait, in order.
  virtual std::unique_ptr<Comm> duplicate() { return nullptr; }
  // Lets started all-reduces and posted messages advance; true once every
  // all-reduce started and not yet waited for has completed (its wait
  // returns at once). MPI moves non-blocking operations only inside MPI
  // calls, so the executor calls this between operators (polling, no
  // progress thread). The default runs them at their wait: true only when
  // none is outstanding.
  virtual bool progress();

  // Device memory. A communicator that moves buffers in the memory of the
  // current CUDA device directly (NCCL) returns true from device_memory()
  // and implements the methods below, with the same ordering rules as
  // their host versions; callers with device buffers check device_memory()
  // and otherwise stage through host memory. The defaults throw
  // std::logic_error: a caller that skipped the check is a bug.
  virtual bool device_memory() const { return false; }
  virtual void all_reduce_sum_device(float* data, int64_t count);
  virtual void all_gather_device(const float* send, float* recv, int64_t count);
  struct DeviceTransfer {
    float* data = nullptr;  // device memory
    int64_t count = 0;
    int peer = 0;
  };
  // Posts every send and receive at once and waits for all of them.
  virtual void exchange_device(std::span<const DeviceTransfer> sends, std::span<const DeviceTransfer> recvs);
  // start_all_reduce_sum / wait_all_reduce over device memory, with their
  // rules; the wait orders the device's later work after the sum and need
  // not return only once it is done (NCCL: the sum runs on the
  // communicator's own stream and the compute stream waits for it, the
  // host does not; progress() asks whether it is done).
  virtual int start_all_reduce_sum_device(float* data, int64_t count);
  virtual void wait_all_reduce_device(int request);
  // start_reduce_scatter_sum over device memory (`count` floats, a
  // multiple of size()), waited for with wait_all_reduce_device.
  virtual int start_reduce_scatter_sum_device(float* data, int64_t count) {
    return start_all_reduce_sum_device(data, count);
  }
  // start_all_gather over device memory (`count` floats from each rank into
  // recv, size() * count), waited for with wait_all_reduce_device.
  virtual int start_all_gather_device(const float* send, float* recv, int64_t count);

 private:
  // The default non-blocking all-reduce: started, not yet waited for (an
  // empty span: an all-gather, done at its start).
  std::vector<std::span<float>> deferred_;   // by request
  std::vector<char> deferred_open_;          // by request: not yet waited for
  size_t waited_ = 0;
  // The default point-to-point requests: a receive to run at its wait
  // (a send is done at once); cleared once none is open.
  struct Deferred {
    std::span<float> data;
    int peer = 0, tag = 0;
    bool receive = false;
    bool open = true;
  };
  std::vector<Deferred> p2p_;
  size_t p2p_open_ = 0;
};

}  // namespace spindle::exec
