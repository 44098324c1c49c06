// NcclEmulation (libexec/comm/nccl_emulation.h): NCCL's matching of
// point-to-point messages (by order between two ranks, tags ignored) and
// the device-memory calls over host buffers, on the thread-simulated group.
#include <catch2/catch.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "libexec/backend/cpu/cpu_backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/comm/nccl_emulation.h"

using namespace spindle::exec;

TEST_CASE("nccl emulation: messages between two ranks match in posting order, whatever their tags") {
  std::vector<std::vector<float>> got(2);
  // One count per rank: each thread is a rank of its own.
  const std::vector calls{std::make_shared<DeviceCalls>(), std::make_shared<DeviceCalls>()};
  run_thread_group(2, [&](Comm& inner) {
    NcclEmulation c(inner, calls[static_cast<size_t>(inner.rank())]);
    std::vector<float>& in = got[static_cast<size_t>(c.rank())];
    in.assign(11, -1.0f);
    if (c.rank() == 0) {
      // One exchange: 3 floats, nothing (skipped on both sides, as NCCL's
      // 0-count calls), 2 floats; then two sends of equal size.
      std::vector<float> a{1, 2, 3}, b{4, 5}, p{7, 7}, q{8, 8};
      const Comm::DeviceTransfer sends[] = {{a.data(), 3, 1}, {b.data(), 0, 1}, {b.data(), 2, 1}};
      c.exchange_device(sends, {});
      c.send(p, 1, /*tag*/ 5);
      c.send(q, 1, /*tag*/ 6);
      c.recv(std::span(in).first(1), 1, /*tag*/ 123);
    } else {
      // The receives of that exchange, split over two exchanges; then the
      // two equal sends received with the tags swapped: by order, the first
      // receive gets the first message (MPI, by tag, would cross them).
      const Comm::DeviceTransfer r1[] = {{in.data(), 3, 0}, {in.data() + 3, 0, 0}};
      const Comm::DeviceTransfer r2[] = {{in.data() + 3, 2, 0}};
      c.exchange_device({}, r1);
      c.exchange_device({}, r2);
      c.recv(std::span(in).subspan(5, 2), 0, /*tag*/ 6);
      c.recv(std::span(in).subspan(7, 2), 0, /*tag*/ 5);
      const std::vector<float> back{9};
      c.send(back, 0, /*tag*/ 0);
    }
  });
  CHECK(got[1] == std::vector<float>{1, 2, 3, 4, 5, 7, 7, 8, 8, -1, -1});
  CHECK(got[0][0] == 9);
  // Every host message went through exchange_device: 1 + 2 + 1 on rank 0,
  // 2 + 2 + 1 on rank 1.
  CHECK(calls[0]->exchanges == 4);
  CHECK(calls[1]->exchanges == 5);
  CHECK(calls[0]->collectives + calls[1]->collectives == 0);
}

TEST_CASE("nccl emulation: device-memory collectives run the inner ones on the same buffers") {
  std::vector<std::vector<float>> sums(3), gathered(3), started(3), scattered(3);
  std::vector<char> device(3, 0);   // Catch2 asserts on the main thread only
  const std::vector calls{std::make_shared<DeviceCalls>(), std::make_shared<DeviceCalls>(),
                          std::make_shared<DeviceCalls>()};
  run_thread_group(3, [&](Comm& inner) {
    NcclEmulation c(inner, calls[static_cast<size_t>(inner.rank())]);
    const auto r = static_cast<float>(c.rank());
    const auto i = static_cast<size_t>(c.rank());
    device[i] = c.device_memory();
    sums[i] = {r, 10 * r};
    c.all_reduce_sum_device(sums[i].data(), 2);
    const std::vector<float> mine{r, r + 0.5f};
    gathered[i].assign(6, -1);
    c.all_gather_device(mine.data(), gathered[i].data(), 2);
    started[i] = {1, r};
    const int request = c.start_all_reduce_sum_device(started[i].data(), 2);
    c.wait_all_reduce_device(request);
    scattered[i] = {r, 1, 2 * r};
    c.wait_all_reduce_device(c.start_reduce_scatter_sum_device(scattered[i].data(), 3));
  });
  for (size_t i = 0; i < 3; ++i) {
    CHECK(sums[i] == std::vector<float>{3, 30});
    CHECK(gathered[i] == std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f});
    CHECK(started[i] == std::vector<float>{3, 3});
    CHECK(device[i]);
    CHECK(calls[i]->collectives == 4);
    CHECK(calls[i]->exchanges == 0);
  }
  // Block r of 3 holds the sum of block r (the thread group's default sums
  // it all).
  CHECK(scattered[0][0] == 3);
  CHECK(scattered[1][1] == 3);
  CHECK(scattered[2][2] == 6);
}

TEST_CASE("nccl emulation: a peer outside the group, a negative count and a reduce-scatter of unequal blocks are refused") {
  SelfComm self;
  auto calls = std::make_shared<DeviceCalls>();
  NcclEmulation c(self, calls);
  std::vector<float> x{1, 2};
  const Comm::DeviceTransfer to_peer_1[] = {{x.data(), 2, 1}};
  CHECK_THROWS_AS(c.exchange_device(to_peer_1, {}), std::invalid_argument);
  const Comm::DeviceTransfer negative[] = {{x.data(), -1, 0}};
  CHECK_THROWS_AS(c.exchange_device({}, negative), std::invalid_argument);
  // To itself, in order: the first receive gets the first message.
  std::vector<float> y(2, 0);
  const Comm::DeviceTransfer to_self[] = {{x.data(), 2, 0}};
  const Comm::DeviceTransfer from_self[] = {{y.data(), 2, 0}};
  c.exchange_device(to_self, from_self);
  CHECK(y == x);
  // A group of 1 splits anything into 1 block; the thread group of 2 below
  // refuses 3 floats.
  CHECK_NOTHROW(c.wait_all_reduce_device(c.start_reduce_scatter_sum_device(x.data(), 2)));
  CHECK(x == std::vector<float>{1, 2});   // the one member's block is its own sum
  bool refused = false;
  run_thread_group(2, [&](Comm& inner) {
    NcclEmulation two(inner, std::make_shared<DeviceCalls>());
    std::vector<float> odd(3, 1);
    if (two.rank() == 0) {
      try {
        two.start_reduce_scatter_sum_device(odd.data(), 3);
      } catch (const std::invalid_argument&) {
        refused = true;
      }
    }
  });
  CHECK(refused);
  CHECK_THROWS_AS(NcclEmulation(std::unique_ptr<Comm>(), calls), std::invalid_argument);
  CHECK_THROWS_AS(NcclEmulation(self, nullptr), std::invalid_argument);
}

TEST_CASE("nccl emulation: the CPU backend as a device's says cuda and keeps host tensors") {
  auto be = make_cpu_backend_as_device();
  CHECK(be->device() == Device::cuda);
  CHECK(std::string(be->name()) == "cpu");
  Tensor t = be->allocate({2, 2});
  CHECK(t.device() == Device::host);
  be->copy(Tensor::from({2, 2}, {1, 2, 3, 4}), t);
  CHECK(t[3] == 4);
  CHECK(make_cpu_backend()->device() == Device::host);
}
