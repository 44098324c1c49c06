// MpiComm and create_group_comms under mpiexec -n 2 or 4: closed-form
// all-reduce, all-gather, send/recv, exchange and posted messages on the world and on device groups,
// and a tensor-parallel transformer layer over an MPI group equal to the
// unsplit layer (1e-5 relative); started all-reduces completed by progress()
// alone. Prints one line per failed check and
// exits 1 if any failed.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "libexec/comm/mpi_comm.h"
#include "libexec/ops/op.h"
#include "libexec/rng.h"

using namespace spindle::exec;

namespace {
int failures = 0;
int world_rank = 0;

void expect(bool ok, const char* what, int line) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "[rank %d] test_mpi_comm.cpp:%d: FAILED: %s\n", world_rank, line, what);
}
#define EXPECT(cond) expect((cond), #cond, __LINE__)

// Closed forms on a communicator whose members have world ranks `members`
// (ascending; this rank is members[c.rank()]).
void check_collectives(Comm& c, const std::vector<int>& members) {
  const int n = c.size(), r = c.rank();
  EXPECT(n == static_cast<int>(members.size()));
  EXPECT(members[static_cast<size_t>(r)] == world_rank);
  // all_reduce: [1, world rank] sums to [n, sum of members].
  std::vector<float> a{1.0f, static_cast<float>(world_rank)};
  c.all_reduce_sum(a);
  float member_sum = 0;
  for (int m : members) member_sum += static_cast<float>(m);
  EXPECT(a[0] == static_cast<float>(n) && a[1] == member_sum);
  // all_gather: rank order.
  const std::vector<float> mine{static_cast<float>(world_rank), static_cast<float>(100 + r)};
  std::vector<float> all(static_cast<size_t>(2 * n));
  c.all_gather(mine, all);
  for (int q = 0; q < n; ++q)
    EXPECT(all[static_cast<size_t>(2 * q)] == static_cast<float>(members[static_cast<size_t>(q)]) &&
           all[static_cast<size_t>(2 * q + 1)] == static_cast<float>(100 + q));
  // send/recv on a ring, even ranks sending first (no cycle of blocked sends).
  if (n > 1) {
    const std::vector<float> out(1000, static_cast<float>(r));  // beyond eager sizes is fine too
    std::vector<float> in(1000, -1.0f);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      c.send(out, next, 7);
      c.recv(in, prev, 7);
    } else {
      c.recv(in, prev, 7);
      c.send(out, next, 7);
    }
    EXPECT(in.front() == static_cast<float>(prev) && in.back() == static_cast<float>(prev));
  }
  // exchange: every rank sends two messages to every other rank at once,
  // far beyond eager sizes (blocking sends in this order would deadlock);
  // the two messages of a pair arrive in posting order.
  if (n > 1) {
    const size_t big = size_t{1} << 18;
    std::vector<std::vector<float>> out, in;
    std::vector<Comm::SendBuf> sends;
    std::vector<Comm::RecvBuf> recvs;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      for (int k = 0; k < 2; ++k) {
        out.emplace_back(big, static_cast<float>(100 * r + 10 * q + k));
        in.emplace_back(big, -1.0f);
      }
    }
    size_t i = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      for (int k = 0; k < 2; ++k, ++i) {
        sends.push_back({out[i], q});
        recvs.push_back({in[i], q});
      }
    }
    c.exchange(sends, recvs, 9);
    i = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      for (int k = 0; k < 2; ++k, ++i)
        EXPECT(in[i].front() == static_cast<float>(100 * q + 10 * r + k) &&
               in[i].back() == static_cast<float>(100 * q + 10 * r + k));
    }
  }
  c.barrier();
}

// Messages posted early (the executor's post_send and post_recv): every
// rank posts two sends to every other rank before any receive, far beyond
// eager sizes (blocking sends would deadlock), and posts its receives in
// the other order of tags; each matches by its tag, whatever the posting
// order, and a wait in any order completes it.
void check_posted_messages(Comm& c) {
  const int n = c.size(), r = c.rank();
  if (n < 2) return;
  const size_t big = size_t{1} << 18;
  auto tag = [](int from, int to, int k) { return 100 * from + 10 * to + k; };
  std::vector<std::vector<float>> out, in;
  std::vector<int> sends, recvs, recv_from, recv_k;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    for (int k = 0; k < 2; ++k) {
      out.emplace_back(big, static_cast<float>(tag(r, q, k)));
      sends.push_back(c.post_send(out.back(), q, tag(r, q, k)));
    }
  }
  in.reserve(2 * static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    for (int k = 1; k >= 0; --k) {
      in.emplace_back(big, -1.0f);
      recvs.push_back(c.post_recv(in.back(), q, tag(q, r, k)));
      recv_from.push_back(q);
      recv_k.push_back(k);
    }
  }
  EXPECT(c.max_tag() >= 32767);
  for (size_t i = recvs.size(); i-- > 0;) c.wait_p2p(recvs[i]);
  for (size_t i = 0; i < in.size(); ++i) {
    const float want = static_cast<float>(tag(recv_from[i], r, recv_k[i]));
    EXPECT(in[i].front() == want && in[i].back() == want);
  }
  for (int s : sends) c.wait_p2p(s);
  c.barrier();
}

// A send posted right after a compute leaves at once (kMpiDefaults: eager
// up to 64 KiB over shared memory), as the simulation prices it: rank 0 has
// posted its receive of 16 KiB; rank 1 posts the send and then makes no MPI
// call for 200 ms (a long compute). The receive completes long before
// that. Under rendezvous (Open MPI's 4 KiB default) the data would move
// only at rank 1's next MPI call, after the 200 ms.
void check_eager_send(Comm& c) {
  if (c.size() < 2 || c.rank() > 1) {
    c.barrier();
    c.barrier();
    return;
  }
  std::vector<float> buf(4096, static_cast<float>(c.rank()));
  int request = -1;
  if (c.rank() == 0) request = c.post_recv(buf, 1, 9);
  c.barrier();
  if (c.rank() == 1) {
    request = c.post_send(buf, 0, 9);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    c.wait_p2p(request);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    c.wait_p2p(request);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT(ms < 100.0);
    EXPECT(buf.front() == 1.0f && buf.back() == 1.0f);
  }
  c.barrier();
}

// Started all-reduces (gradient buckets during the backward pass), on a
// duplicate of `c` as the executor runs them: the sums are right, waited
// for in start order; and progress() alone completes them. Rank 0 never
// waits until progress() says done, and the sum must be in its buffer by
// then: a progress() that did not move the reduction (MPI moves it only
// inside MPI calls) would time out or leave the buffer unsummed. The other
// ranks wait at once, as a member that reached its wait would.
void check_started_all_reduce(Comm& group) {
  std::unique_ptr<Comm> dup = group.duplicate();
  EXPECT(dup != nullptr);
  if (!dup) return;
  Comm& c = *dup;
  const int n = c.size(), r = c.rank();
  const float sum_ranks = static_cast<float>(n * (n - 1) / 2);
  // Two at once, 4 MiB each (beyond eager sizes), waited for in order.
  const size_t count = size_t{1} << 20;
  std::vector<float> a(count, static_cast<float>(r)), b(count, 1.0f);
  const int ra = c.start_all_reduce_sum(a);
  const int rb = c.start_all_reduce_sum(b);
  if (r == 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool done = false;
    while (!done && std::chrono::steady_clock::now() < deadline) done = c.progress();
    EXPECT(done);
    EXPECT(a.front() == sum_ranks && a.back() == sum_ranks);   // summed before any wait
    EXPECT(b.front() == static_cast<float>(n) && b.back() == static_cast<float>(n));
  }
  c.wait_all_reduce(ra);
  c.wait_all_reduce(rb);
  EXPECT(c.progress());   // nothing outstanding
  EXPECT(a.front() == sum_ranks && a.back() == sum_ranks);
  EXPECT(b.front() == static_cast<float>(n) && b.back() == static_cast<float>(n));
  c.barrier();
}

// A TP group's transformer layer equals the unsplit one computed locally.
void check_tp_layer(Comm& tp) {
  OpConfig cfg;
  cfg.kind = OpKind::transformer_layer;
  cfg.dims = {{"hidden", 8}, {"heads", 4}, {"ffn", 8}, {"causal", true}};
  Tensor x = Tensor::zeros({2, 3, 8}), dy = Tensor::zeros({2, 3, 8});
  for (int64_t i = 0; i < x.numel(); ++i) {
    x[i] = uniform_pm1(1, 1, i);
    dy[i] = uniform_pm1(2, 2, i);
  }
  ParamSet ref_params = make_params(cfg, "t/1.0", 5);
  Op ref = make_op(cfg, ref_params);
  const Tensor y_ref = op_forward(ref, std::span(&x, 1));
  const Tensor dx_ref = op_backward(ref, dy)[0];

  cfg.use_tp(&tp);
  ParamSet params = make_params(cfg, "t/1.0", 5);
  Op op = make_op(cfg, params);
  const Tensor y = op_forward(op, std::span(&x, 1));
  const Tensor dx = op_backward(op, dy)[0];
  double err = 0;
  for (int64_t i = 0; i < y.numel(); ++i)
    err = std::max({err, double(std::abs(y[i] - y_ref[i])), double(std::abs(dx[i] - dx_ref[i]))});
  EXPECT(err < 1e-5);
}
}  // namespace

int main(int argc, char** argv) {
  // A value the user set wins over kMpiDefaults (here a larger send size);
  // the others are set.
  setenv(kMpiDefaults[1].name, "131072", /*overwrite=*/1);
  MpiSession session(&argc, &argv);
  EXPECT(std::string(std::getenv(kMpiDefaults[0].name)) == kMpiDefaults[0].value);
  EXPECT(std::string(std::getenv(kMpiDefaults[1].name)) == "131072");
  auto world = MpiComm::world();
  world_rank = world->rank();
  const int n = world->size();

  std::vector<int> everyone;
  for (int r = 0; r < n; ++r) everyone.push_back(r);
  check_collectives(*world, everyone);

  // Device groups: everyone (listed twice, once reversed), pairs, singletons.
  std::vector<std::vector<int>> groups{everyone, {everyone.rbegin(), everyone.rend()}};
  for (int r = 0; r + 1 < n; r += 2) groups.push_back({r + 1, r});
  for (int r = 0; r < n; ++r) groups.push_back({r});
  if (n >= 4) groups.push_back({0, 2, 3});
  auto comms = create_group_comms(*world, groups);
  // The groups this rank belongs to, in one order shared by all ranks.
  const int pair0 = world_rank - world_rank % 2;
  std::set<std::vector<int>> expected{everyone, {pair0, pair0 + 1}, {world_rank}};
  if (n >= 4 && world_rank != 1) expected.insert({0, 2, 3});
  for (const std::vector<int>& g : expected) {
    auto it = comms.find(g);
    EXPECT(it != comms.end());
    if (it != comms.end()) check_collectives(*it->second, g);
  }
  EXPECT(comms.size() == expected.size());

  // Tensor parallel over the pair groups and over everyone.
  check_tp_layer(*comms.at({pair0, pair0 + 1}));
  check_tp_layer(*comms.at(everyone));

  check_posted_messages(*world);
  check_eager_send(*world);
  check_started_all_reduce(*world);
  check_started_all_reduce(*comms.at({pair0, pair0 + 1}));

  float f = static_cast<float>(failures);
  world->all_reduce_sum({&f, 1});
  if (world_rank == 0) std::printf("test_exec_mpi: %d ranks, %s\n", n, f == 0 ? "all passed" : "FAILED");
  return f == 0 ? 0 : 1;
}
