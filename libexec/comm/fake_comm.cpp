#include "libexec/comm/fake_comm.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace spindle::exec {

namespace {
[[noreturn]] void fail(const std::string& what) { throw std::logic_error("fake comm: " + what); }
}  // namespace

void SelfComm::all_gather(std::span<const float> send, std::span<float> recv) {
  if (recv.size() != send.size()) fail("all_gather: recv must hold size() * send elements");
  std::copy(send.begin(), send.end(), recv.begin());
}

void SelfComm::send(std::span<const float> data, int peer, int tag) {
  if (peer != 0) fail("send to rank " + std::to_string(peer) + " of a size-1 group");
  queued_[tag].emplace_back(data.begin(), data.end());
}

void SelfComm::recv(std::span<float> data, int peer, int tag) {
  if (peer != 0) fail("recv from rank " + std::to_string(peer) + " of a size-1 group");
  auto& q = queued_[tag];
  if (q.empty()) fail("recv with no matching send (would block forever)");
  if (q.front().size() != data.size()) fail("recv size differs from the matching send");
  std::copy(q.front().begin(), q.front().end(), data.begin());
  q.pop_front();
}

namespace {

// Shared state of one simulated group.
struct Group {
  explicit Group(int n) : size(n), slots(static_cast<size_t>(n)) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<const float*> slots;  // each rank's buffer during a collective
  std::map<std::tuple<int, int, int>, std::deque<std::vector<float>>> mail;  // (src, dst, tag)

  void barrier() {
    std::unique_lock lock(mu);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(Group& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size; }

  void all_reduce_sum(std::span<float> data) override {
    std::vector<float> sum(data.size(), 0.0f);
    publish(data.data());
    for (int r = 0; r < g_.size; ++r)
      for (size_t i = 0; i < data.size(); ++i) sum[i] += g_.slots[static_cast<size_t>(r)][i];
    g_.barrier();  // everyone has read every slot
    std::copy(sum.begin(), sum.end(), data.begin());
  }

  void all_gather(std::span<const float> send, std::span<float> recv) override {
    if (recv.size() != send.size() * static_cast<size_t>(g_.size))
      fail("all_gather: recv must hold size() * send elements");
    publish(send.data());
    for (int r = 0; r < g_.size; ++r)
      std::copy(g_.slots[static_cast<size_t>(r)], g_.slots[static_cast<size_t>(r)] + send.size(),
                recv.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * send.size()));
    g_.barrier();
  }

  void send(std::span<const float> data, int peer, int tag) override {
    check_peer(peer);
    std::lock_guard lock(g_.mu);
    g_.mail[{rank_, peer, tag}].emplace_back(data.begin(), data.end());
    g_.cv.notify_all();
  }

  void recv(std::span<float> data, int peer, int tag) override {
    check_peer(peer);
    std::unique_lock lock(g_.mu);
    auto& q = g_.mail[{peer, rank_, tag}];
    g_.cv.wait(lock, [&] { return !q.empty(); });
    if (q.front().size() != data.size()) fail("recv size differs from the matching send");
    std::copy(q.front().begin(), q.front().end(), data.begin());
    q.pop_front();
  }

  void barrier() override { g_.barrier(); }

 private:
  // Publishes this rank's buffer and waits until every rank has published.
  void publish(const float* p) {
    {
      std::lock_guard lock(g_.mu);
      g_.slots[static_cast<size_t>(rank_)] = p;
    }
    g_.barrier();
  }
  void check_peer(int peer) const {
    if (peer < 0 || peer >= g_.size) fail("peer " + std::to_string(peer) + " out of range");
  }

  Group& g_;
  const int rank_;
};

}  // namespace

void run_thread_group(int size, const std::function<void(Comm&)>& body) {
  if (size < 1) fail("group size must be >= 1");
  Group group(size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ThreadComm comm(group, r);
      try {
        body(comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace spindle::exec
