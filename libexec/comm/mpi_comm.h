// The MPI communicator (Open MPI 4.1, not CUDA-aware: host buffers only).
//
// Lifetime: MpiSession initialises MPI (MPI_Init) in its constructor and
// finalises it in its destructor; create exactly one, in main, before any
// MpiComm. Every MPI call is checked with MPI_CHECK (abort on error).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include <mpi.h>

#include "libexec/comm/comm.h"

namespace spindle::exec {

// Open MPI settings MpiSession starts MPI with, each unless the environment
// already has it (the user's OMPI_MCA_* variable, or mpirun --mca, which
// passes one): the shared-memory transport (vader) sends a message of up to
// 64 KiB eagerly, so a send posted right after a compute leaves at once, as
// the simulation prices it (docs/runtime.md, "Messages and MPI progress").
// Above the eager limit Open MPI hands a message over by rendezvous, which
// moves only inside its sender's MPI calls: the receiver waits for the
// sender's next poll, after its next slice (tiny-clip on 2 CPU ranks: 0.7-0.9
// ms of waiting per step and rank with 4 KiB, Open MPI 4.1's default).
struct MpiSetting {
  const char* name;
  const char* value;
};
inline constexpr MpiSetting kMpiDefaults[] = {{"OMPI_MCA_btl_vader_eager_limit", "65536"},
                                              {"OMPI_MCA_btl_vader_max_send_size", "65536"}};
// Sets each of kMpiDefaults that the environment lacks (before MPI_Init).
void set_mpi_defaults();

// This rank's index among the ranks of its node (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED, ordered by world rank): the local rank, and so the
// GPU, where no launcher variable gives one (MPICH's or a PBS mpiexec
// placing ranks cyclically over nodes; the world rank would make ranks of
// two nodes share a GPU). Collective over MPI_COMM_WORLD.
int node_local_rank();

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

class MpiComm final : public Comm {
 public:
  // Wraps `comm`; frees it on destruction when `owned` (never MPI_COMM_WORLD).
  MpiComm(MPI_Comm comm, bool owned);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  // A duplicate of MPI_COMM_WORLD (so library traffic never mixes with others').
  static std::unique_ptr<MpiComm> world();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const float> send, std::span<float> recv) override;
  void send(std::span<const float> data, int peer, int tag) override;
  void recv(std::span<float> data, int peer, int tag) override;
  void barrier() override;
  // MPI_Irecv every receive, MPI_Isend every send, MPI_Waitall.
  void exchange(std::span<const SendBuf> sends, std::span<const RecvBuf> recvs, int tag) override;

  // MPI_Isend, MPI_Irecv; MPI_Wait (and the received count checked). A tag
  // above MPI_TAG_UB aborts naming it.
  int post_send(std::span<const float> data, int peer, int tag) override;
  int post_recv(std::span<float> data, int peer, int tag) override;
  void wait_p2p(int request) override;
  int max_tag() const override { return tag_ub_; }

  // MPI_Iallreduce in place; MPI_Wait; MPI_Testall over the started ones.
  int start_all_reduce_sum(std::span<float> data) override;
  // MPI_Ireduce_scatter_block into a block of its own, copied into this
  // rank's block of `data` at the wait.
  int start_reduce_scatter_sum(std::span<float> data) override;
  int start_all_gather(std::span<const float> send, std::span<float> recv) override;   // MPI_Iallgather
  std::unique_ptr<Comm> duplicate() override;   // MPI_Comm_dup
  void wait_all_reduce(int request) override;
  bool progress() override;   // MPI_Testall (all-reduces), MPI_Testany (messages)

  MPI_Comm handle() const { return comm_; }

 private:
  MPI_Comm comm_;
  bool owned_;
  std::vector<MPI_Request> started_;   // by request; MPI_REQUEST_NULL once complete
  size_t next_wait_ = 0;
  // By request: a reduce-scatter's received block and where it goes at
  // the wait (empty for an all-reduce).
  struct Scattered {
    std::vector<float> block;
    float* into = nullptr;
  };
  std::vector<Scattered> scattered_;
  // Posted messages by request (MPI_REQUEST_NULL once complete), their
  // receive sizes (-1: a send); cleared once none is open.
  std::vector<MPI_Request> p2p_;
  std::vector<int> p2p_count_;
  size_t p2p_open_ = 0;
  int tag_ub_ = 32767;   // MPI_TAG_UB of comm_ (the standard's minimum until read)
  int rank_ = 0;
  int size_ = 0;
};

// Device groups: lists of ranks of `parent` (e.g. a slice's devices, a
// param group's devices). Creates one communicator per distinct group (the
// order of ranks within a group is ignored: group rank i is the i-th
// smallest), each exactly once, with MPI_Comm_create_group, which is
// collective only over the group's members; groups are created in one
// global sorted order, so ranks in several groups cannot deadlock.
// Every rank of `parent` must call this with the same list. Returns the
// communicators of the groups that contain this rank, keyed by the sorted
// group; other groups are absent. Duplicates and order in `groups` do not
// matter. A group with a rank outside 0..parent.size()-1 aborts.
std::map<std::vector<int>, std::unique_ptr<Comm>> create_group_comms(
    const MpiComm& parent, const std::vector<std::vector<int>>& groups);

}  // namespace spindle::exec
