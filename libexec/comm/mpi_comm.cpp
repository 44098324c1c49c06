#include "libexec/comm/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "libexec/comm/mpi_check.h"

namespace spindle::exec {

[[noreturn]] void mpi_fail(int code, const char* call, const char* file, int line) {
  int rank = -1, initialized = 0, len = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char msg[MPI_MAX_ERROR_STRING] = {0};
  MPI_Error_string(code, msg, &len);
  std::fprintf(stderr, "[rank %d] %s:%d: MPI error %d in %s: %s\n", rank, file, line, code, call,
               msg);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; keeps [[noreturn]] honest
}

namespace {
// Aborts with a message for a misuse that is not an MPI error code.
[[noreturn]] void usage_fail(const char* what, const char* file, int line) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank, file, line, what);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}
#define SPINDLE_MPI_REQUIRE(cond, what) \
  do {                                  \
    if (!(cond)) usage_fail(what, __FILE__, __LINE__); \
  } while (0)

int count_of(size_t n) {
  SPINDLE_MPI_REQUIRE(n <= static_cast<size_t>(INT_MAX), "message larger than INT_MAX floats");
  return static_cast<int>(n);
}
}  // namespace

void set_mpi_defaults() {
  for (const MpiSetting& s : kMpiDefaults) setenv(s.name, s.value, /*overwrite=*/0);
}

int node_local_rank() {
  int world_rank = 0, local = 0;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  return local;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  set_mpi_defaults();
  MPI_CHECK(MPI_Init(argc, argv));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiSession::~MpiSession() { MPI_Finalize(); }

MpiComm::MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  int* ub = nullptr;
  int has = 0;
  MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &has));
  if (has && ub != nullptr) tag_ub_ = *ub;
}

MpiComm::~MpiComm() {
  if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiComm> MpiComm::world() {
  MPI_Comm dup;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::make_unique<MpiComm>(dup, true);
}

void MpiComm::all_reduce_sum(std::span<float> data) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), count_of(data.size()), MPI_FLOAT, MPI_SUM,
                          comm_));
}

std::unique_ptr<Comm> MpiComm::duplicate() {
  MPI_Comm dup;
  MPI_CHECK(MPI_Comm_dup(comm_, &dup));
  return std::make_unique<MpiComm>(dup, true);
}

int MpiComm::start_all_reduce_sum(std::span<float> data) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count_of(data.size()), MPI_FLOAT, MPI_SUM, comm_, &request));
  started_.push_back(request);
  scattered_.emplace_back();
  return static_cast<int>(started_.size()) - 1;
}

int MpiComm::start_reduce_scatter_sum(std::span<float> data) {
  SPINDLE_MPI_REQUIRE(data.size() % static_cast<size_t>(size_) == 0,
                      "start_reduce_scatter_sum: the buffer is not size() equal blocks");
  const size_t block = data.size() / static_cast<size_t>(size_);
  Scattered s;
  s.block.resize(block);
  s.into = data.data() + block * static_cast<size_t>(rank_);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ireduce_scatter_block(data.data(), s.block.data(), count_of(block), MPI_FLOAT, MPI_SUM, comm_,
                                      &request));
  started_.push_back(request);
  scattered_.push_back(std::move(s));
  return static_cast<int>(started_.size()) - 1;
}

int MpiComm::start_all_gather(std::span<const float> send, std::span<float> recv) {
  SPINDLE_MPI_REQUIRE(recv.size() == send.size() * static_cast<size_t>(size_),
                      "start_all_gather: recv must hold size() * send elements");
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallgather(send.data(), count_of(send.size()), MPI_FLOAT, recv.data(), count_of(send.size()),
                           MPI_FLOAT, comm_, &request));
  started_.push_back(request);
  scattered_.emplace_back();
  return static_cast<int>(started_.size()) - 1;
}

void MpiComm::wait_all_reduce(int request) {
  SPINDLE_MPI_REQUIRE(request >= 0 && static_cast<size_t>(request) == next_wait_ && next_wait_ < started_.size(),
                      "wait_all_reduce: not the next request started and not yet waited for");
  MPI_CHECK(MPI_Wait(&started_[next_wait_], MPI_STATUS_IGNORE));
  Scattered& s = scattered_[next_wait_++];
  std::copy(s.block.begin(), s.block.end(), s.into);
  s = Scattered{};
  if (next_wait_ == started_.size()) {
    started_.clear();
    scattered_.clear();
    next_wait_ = 0;
  }
}

int MpiComm::post_send(std::span<const float> data, int peer, int tag) {
  SPINDLE_MPI_REQUIRE(tag >= 0 && tag <= tag_ub_, "post_send: tag outside [0, MPI_TAG_UB] (a plan with more transfers "
                                                  "than this MPI has tags: run with --no-overlap)");
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Isend(data.data(), count_of(data.size()), MPI_FLOAT, peer, tag, comm_, &request));
  p2p_.push_back(request);
  p2p_count_.push_back(-1);
  ++p2p_open_;
  return static_cast<int>(p2p_.size()) - 1;
}

int MpiComm::post_recv(std::span<float> data, int peer, int tag) {
  SPINDLE_MPI_REQUIRE(tag >= 0 && tag <= tag_ub_, "post_recv: tag outside [0, MPI_TAG_UB] (a plan with more transfers "
                                                  "than this MPI has tags: run with --no-overlap)");
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Irecv(data.data(), count_of(data.size()), MPI_FLOAT, peer, tag, comm_, &request));
  p2p_.push_back(request);
  p2p_count_.push_back(count_of(data.size()));
  ++p2p_open_;
  return static_cast<int>(p2p_.size()) - 1;
}

void MpiComm::wait_p2p(int request) {
  SPINDLE_MPI_REQUIRE(request >= 0 && static_cast<size_t>(request) < p2p_.size() &&
                          p2p_count_[static_cast<size_t>(request)] != -2,
                      "wait_p2p: not an open request");
  MPI_Status status;
  MPI_CHECK(MPI_Wait(&p2p_[static_cast<size_t>(request)], &status));
  if (const int want = p2p_count_[static_cast<size_t>(request)]; want >= 0) {
    int got = 0;
    MPI_CHECK(MPI_Get_count(&status, MPI_FLOAT, &got));
    SPINDLE_MPI_REQUIRE(got == want, "wait_p2p: message size differs from the receive buffer");
  }
  p2p_count_[static_cast<size_t>(request)] = -2;   // waited for
  if (--p2p_open_ == 0) {
    p2p_.clear();
    p2p_count_.clear();
  }
}

bool MpiComm::progress() {
  if (p2p_open_ > 0) {
    // Drives the progress engine for the posted messages. One that
    // completes here becomes MPI_REQUEST_NULL, so its received count is
    // checked now (its wait then has an empty status).
    int index = MPI_UNDEFINED, flag = 0;
    MPI_Status status;
    MPI_CHECK(MPI_Testany(static_cast<int>(p2p_.size()), p2p_.data(), &index, &flag, &status));
    if (flag && index != MPI_UNDEFINED) {
      int& want = p2p_count_[static_cast<size_t>(index)];
      if (want >= 0) {
        int got = 0;
        MPI_CHECK(MPI_Get_count(&status, MPI_FLOAT, &got));
        SPINDLE_MPI_REQUIRE(got == want, "progress: message size differs from the receive buffer");
        want = -1;   // checked
      }
    }
  }
  if (next_wait_ == started_.size()) return true;
  // All done: the requests become MPI_REQUEST_NULL, their waits return at once.
  int done = 0;
  MPI_CHECK(MPI_Testall(static_cast<int>(started_.size() - next_wait_), started_.data() + next_wait_, &done,
                        MPI_STATUSES_IGNORE));
  return done != 0;
}

void MpiComm::all_gather(std::span<const float> send, std::span<float> recv) {
  SPINDLE_MPI_REQUIRE(recv.size() == send.size() * static_cast<size_t>(size_),
                      "all_gather: recv must hold size() * send elements");
  MPI_CHECK(MPI_Allgather(send.data(), count_of(send.size()), MPI_FLOAT, recv.data(),
                          count_of(send.size()), MPI_FLOAT, comm_));
}

void MpiComm::send(std::span<const float> data, int peer, int tag) {
  MPI_CHECK(MPI_Send(data.data(), count_of(data.size()), MPI_FLOAT, peer, tag, comm_));
}

void MpiComm::recv(std::span<float> data, int peer, int tag) {
  MPI_Status status;
  MPI_CHECK(MPI_Recv(data.data(), count_of(data.size()), MPI_FLOAT, peer, tag, comm_, &status));
  int got = 0;
  MPI_CHECK(MPI_Get_count(&status, MPI_FLOAT, &got));
  SPINDLE_MPI_REQUIRE(got == count_of(data.size()), "recv: message size differs from the buffer");
}

void MpiComm::exchange(std::span<const SendBuf> sends, std::span<const RecvBuf> recvs, int tag) {
  std::vector<MPI_Request> requests(recvs.size() + sends.size());
  for (size_t i = 0; i < recvs.size(); ++i)
    MPI_CHECK(MPI_Irecv(recvs[i].data.data(), count_of(recvs[i].data.size()), MPI_FLOAT, recvs[i].peer, tag, comm_,
                        &requests[i]));
  for (size_t i = 0; i < sends.size(); ++i)
    MPI_CHECK(MPI_Isend(sends[i].data.data(), count_of(sends[i].data.size()), MPI_FLOAT, sends[i].peer, tag, comm_,
                        &requests[recvs.size() + i]));
  std::vector<MPI_Status> status(requests.size());
  MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), status.data()));
  for (size_t i = 0; i < recvs.size(); ++i) {
    int got = 0;
    MPI_CHECK(MPI_Get_count(&status[i], MPI_FLOAT, &got));
    SPINDLE_MPI_REQUIRE(got == count_of(recvs[i].data.size()), "exchange: message size differs from the buffer");
  }
}

void MpiComm::barrier() { MPI_CHECK(MPI_Barrier(comm_)); }

std::map<std::vector<int>, std::unique_ptr<Comm>> create_group_comms(
    const MpiComm& parent, const std::vector<std::vector<int>>& groups) {
  std::set<std::vector<int>> distinct;
  for (std::vector<int> g : groups) {
    std::sort(g.begin(), g.end());
    g.erase(std::unique(g.begin(), g.end()), g.end());
    SPINDLE_MPI_REQUIRE(!g.empty(), "create_group_comms: empty device group");
    SPINDLE_MPI_REQUIRE(g.front() >= 0 && g.back() < parent.size(),
                        "create_group_comms: rank outside the parent communicator");
    distinct.insert(std::move(g));
  }
  MPI_Group parent_group;
  MPI_CHECK(MPI_Comm_group(parent.handle(), &parent_group));
  std::map<std::vector<int>, std::unique_ptr<Comm>> out;
  int tag = 0;
  for (const std::vector<int>& g : distinct) {
    const int my_tag = tag++;  // same on every rank: position in the global order
    if (!std::binary_search(g.begin(), g.end(), parent.rank())) continue;
    MPI_Group sub;
    MPI_CHECK(MPI_Group_incl(parent_group, static_cast<int>(g.size()), g.data(), &sub));
    MPI_Comm comm;
    MPI_CHECK(MPI_Comm_create_group(parent.handle(), sub, my_tag, &comm));
    MPI_CHECK(MPI_Group_free(&sub));
    out.emplace(g, std::make_unique<MpiComm>(comm, true));
  }
  MPI_CHECK(MPI_Group_free(&parent_group));
  return out;
}

}  // namespace spindle::exec
