// The discrete-event simulation of the lowered programs (libplan/sim/sim.h):
// hand-built programs whose timelines are worked out by hand, and properties
// of the simulation of every shipped workload.
#include <cmath>
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libplan/cost/cost_model.h"
#include "libplan/io/profile.h"
#include "libplan/lower/lower.h"
#include "libplan/planner/planner.h"
#include "libplan/report/trace.h"
#include "libplan/report/utilisation.h"
#include "libplan/rules/memory.h"
#include "libplan/sim/sim.h"
#include "test/plan/shipped_fixture.h"

namespace sp = spindle::plan;
namespace fs = std::filesystem;

namespace {

// Links for hand computation: inside an island 1 GB/s (1e6 bytes: 1 ms),
// across islands 0.5 GB/s (1e6 bytes: 2 ms), no latency unless given.
sp::Cluster hand_cluster(int islands, int per_island, double intra_latency_us = 0) {
  sp::Cluster c;
  c.name = "hand";
  c.islands = islands;
  c.devices_per_island = per_island;
  c.memory_gib = 80;
  c.peak_tflops = 100;
  c.memory_gbytes_per_s = 1000;
  c.intra_island = {1, intra_latency_us};
  c.inter_island = {0.5, 0};
  return c;
}

// Programs written by hand, instruction by instruction.
struct Programs {
  sp::Lowered l;
  std::vector<double> slice_ms;

  explicit Programs(int devices) {
    l.devices = devices;
    for (int d = 0; d < devices; ++d) l.programs.push_back({d, {}, {}, {}});
  }
  int slice(int wave, std::vector<int> devices, double ms) {
    sp::LoweredSlice s;
    s.wave = wave;
    s.devices = std::move(devices);
    l.slices.push_back(s);
    slice_ms.push_back(ms);
    return static_cast<int>(l.slices.size()) - 1;
  }
  int transfer(sp::Direction dir, int wave, int src, int dst, int64_t bytes) {
    sp::Transfer t;
    t.dir = dir;
    t.wave = wave;
    t.src = src;
    t.dst = dst;
    t.bytes = src == dst ? 0 : bytes;
    t.values = bytes / sp::kWireBytesPerValue;
    l.transfers.push_back(t);
    return static_cast<int>(l.transfers.size()) - 1;
  }
  int bucket(std::vector<int> devices, int64_t bytes) {
    sp::Bucket b;
    b.devices = std::move(devices);
    b.bytes = bytes;
    l.buckets.push_back(b);
    return static_cast<int>(l.buckets.size()) - 1;
  }
  void add(int d, sp::Instr in) { l.programs[static_cast<size_t>(d)].instrs.push_back(std::move(in)); }
  void compute(int d, sp::InstrKind kind, int slice) {
    sp::Instr in;
    in.kind = kind;
    in.slice = slice;
    in.wave = l.slices[static_cast<size_t>(slice)].wave;
    add(d, in);
  }
  void fwd(int d, int slice) { compute(d, sp::InstrKind::forward, slice); }
  void bwd(int d, int slice) { compute(d, sp::InstrKind::backward, slice); }
  // Adds `in` to device d's program with `transfers` as its range.
  void add_with(int d, sp::Instr in, const std::vector<int>& transfers) {
    std::vector<int>& all = l.programs[static_cast<size_t>(d)].transfers;
    in.transfers_begin = static_cast<int>(all.size());
    all.insert(all.end(), transfers.begin(), transfers.end());
    in.transfers_end = static_cast<int>(all.size());
    add(d, in);
  }
  void exchange(int d, sp::Direction dir, int wave, const std::vector<int>& transfers) {
    sp::Instr in;
    in.kind = sp::InstrKind::exchange;
    in.dir = dir;
    in.wave = wave;
    add_with(d, in, transfers);
  }
  // A post_send (of slice `slice_or_wave`'s rows) or post_recv (of wave
  // `slice_or_wave`'s exchange) of `transfers`, as lowering makes them.
  void post(int d, sp::InstrKind kind, sp::Direction dir, int slice_or_wave, const std::vector<int>& transfers) {
    sp::Instr in;
    in.kind = kind;
    in.dir = dir;
    const bool send = kind == sp::InstrKind::post_send;
    in.slice = send ? slice_or_wave : -1;
    in.wave = send ? l.slices[static_cast<size_t>(slice_or_wave)].wave : slice_or_wave;
    add_with(d, in, transfers);
  }
  void allreduce(int d, int bucket) {
    sp::Instr in;
    in.kind = sp::InstrKind::allreduce;
    in.bucket = bucket;
    add(d, in);
  }
  void reduction(int d, sp::InstrKind kind, int bucket) {
    sp::Instr in;
    in.kind = kind;
    in.bucket = bucket;
    add(d, in);
  }
  void start(int d, int bucket) { reduction(d, sp::InstrKind::allreduce_start, bucket); }
  void wait(int d, int bucket) { reduction(d, sp::InstrKind::allreduce_wait, bucket); }
  // On d: the forward and backward of `slice`, then `bucket`'s all-reduce
  // started and waited for.
  void train_and_reduce(int d, int slice, int bucket) {
    fwd(d, slice);
    bwd(d, slice);
    start(d, bucket);
    wait(d, bucket);
  }
  // The all-gather of bucket `bucket`'s stepped values (sharded optimizer state).
  void gather(int d, int bucket) { reduction(d, sp::InstrKind::allgather, bucket); }
  // With overlap: the all-gather started as the program opens, and the wait for it.
  void gather_start(int d, int bucket) { reduction(d, sp::InstrKind::allgather_start, bucket); }
  void gather_wait(int d, int bucket) { reduction(d, sp::InstrKind::allgather_wait, bucket); }
  // The gradient norm as lowering makes it (the programs then have one
  // each: Lowered::grad_norm): the sum of squares of `values` gradient
  // values on d (norm_sum), then the all-reduce over every device.
  void norm(int d, int64_t values = 0) {
    l.grad_norm = true;
    l.all_devices = sp::first_devices(l.devices);
    sp::Instr sum;
    sum.kind = sp::InstrKind::norm_sum;
    sum.values = values;
    add(d, sum);
    sp::Instr in;
    in.kind = sp::InstrKind::grad_norm;
    add(d, in);
  }
  // An optimizer step of bucket `bucket`'s shards (-1: the rest), `values` values.
  void optimizer(int d, int bucket = -1, int64_t values = 0) {
    sp::Instr in;
    in.kind = sp::InstrKind::optimizer;
    in.bucket = bucket;
    in.values = values;
    add(d, in);
  }
  // With `optimizer_gbytes_per_s` > 0 the optimizer steps are priced at it.
  sp::Simulation run(const sp::Cluster& cluster, const sp::SimOptions& options = {},
                     const sp::CommOverhead& overhead = {}, double optimizer_gbytes_per_s = 0) const {
    sp::TableCostModel cost(cluster);
    cost.set_overhead(overhead);
    cost.set_optimizer_rate(optimizer_gbytes_per_s);
    auto sim = sp::simulate(l, slice_ms, cost, cluster.devices_per_island, options);
    REQUIRE(sim.ok());
    return *sim;
  }
};

const sp::SimBox& box(const sp::Simulation& sim, int device, int instr, const std::string& cat) {
  for (const sp::SimBox& b : sim.boxes)
    if (b.device == device && b.instr == instr && b.cat == cat) return b;
  FAIL("no box " << cat << " of instruction " << instr << " on device " << device);
  return sim.boxes.front();
}

// Device 0 runs slice A (3 ms: forward 1, backward 2), device 1 slice B
// (6 ms: forward 2, backward 4) on A's output; 2e6 bytes each way. With
// `optimizer`, each program ends with an optimizer step.
Programs one_transfer_each_way(bool optimizer) {
  Programs p(2);
  const int a = p.slice(0, {0}, 3.0), b = p.slice(1, {1}, 6.0);
  const int f = p.transfer(sp::Direction::forward, 1, 0, 1, 2'000'000);
  const int g = p.transfer(sp::Direction::backward, 1, 1, 0, 2'000'000);
  p.fwd(0, a);
  p.exchange(0, sp::Direction::forward, 1, {f});
  p.exchange(0, sp::Direction::backward, 1, {g});
  p.bwd(0, a);
  if (optimizer) p.optimizer(0);
  p.exchange(1, sp::Direction::forward, 1, {f});
  p.fwd(1, b);
  p.bwd(1, b);
  p.exchange(1, sp::Direction::backward, 1, {g});
  if (optimizer) p.optimizer(1);
  return p;
}

// Device 0 runs slice A (wave 0, 3 ms: forward 1, backward 2), then slice
// C (wave 1, 6 ms) of its own; device 1 runs B (wave 2, 6 ms) on A's output,
// 2e6 bytes each way (2 ms at 1 GB/s). `early`: A's output is sent right
// after A's forward (post_send) and B's input gradient right after B's
// backward, receives posted ahead; else each in its wave's exchange.
Programs send_before_other_work(bool early) {
  Programs p(2);
  const int a = p.slice(0, {0}, 3.0), c = p.slice(1, {0}, 6.0), b = p.slice(2, {1}, 6.0);
  const int f = p.transfer(sp::Direction::forward, 2, 0, 1, 2'000'000);
  const int g = p.transfer(sp::Direction::backward, 2, 1, 0, 2'000'000);
  p.fwd(0, a);
  if (early) p.post(0, sp::InstrKind::post_send, sp::Direction::forward, a, {f});
  p.fwd(0, c);
  if (early) {
    p.post(0, sp::InstrKind::post_recv, sp::Direction::backward, 2, {g});
    p.exchange(0, sp::Direction::backward, 2, {g});
  } else {
    p.exchange(0, sp::Direction::forward, 2, {f});
    p.exchange(0, sp::Direction::backward, 2, {g});
  }
  p.bwd(0, c);
  p.bwd(0, a);
  if (early) p.post(1, sp::InstrKind::post_recv, sp::Direction::forward, 2, {f});
  p.exchange(1, sp::Direction::forward, 2, {f});
  p.fwd(1, b);
  p.bwd(1, b);
  if (early) p.post(1, sp::InstrKind::post_send, sp::Direction::backward, b, {g});
  else p.exchange(1, sp::Direction::backward, 2, {g});
  if (early)
    for (int d : {0, 1}) {
      sp::Instr wait;
      wait.kind = sp::InstrKind::wait_sends;
      p.add(d, wait);
    }
  return p;
}

// d0 runs a slice of ms[0], d1 one of ms[1], then both all-reduce one
// 1e6-byte bucket: blocking, or `started` and then waited for; then the
// optimizer (0 ms).
Programs one_bucket(std::array<double, 2> ms, bool started) {
  Programs p(2);
  const int a = p.slice(0, {0}, ms[0]), b = p.slice(0, {1}, ms[1]);
  const int k = p.bucket({0, 1}, 1'000'000);
  for (auto [d, s] : {std::pair{0, a}, std::pair{1, b}}) {
    p.fwd(d, s);
    p.bwd(d, s);
    if (started) {
      p.start(d, k);
      p.wait(d, k);
    } else {
      p.allreduce(d, k);
    }
    p.optimizer(d);
  }
  return p;
}

// d0 runs a 3 ms slice, d1 a 9 ms one: the all-reduce waits for d1.
Programs slow_member(bool started) { return one_bucket({3.0, 9.0}, started); }

// Both devices run s1 (wave 0, 3 ms: forward 1, backward 2) and s2 (wave 1,
// 6 ms: 2 + 4). Bucket k2 (index 0: 1e6 bytes, 1 ms over 2 devices at 1
// GB/s) holds s2's parameters, k1 (index 1: 2e6 bytes, 2 ms) s1's.
// blocking: both all-reduced after the backward pass; each_when_ready: k2
// started after the backward of s2, k1 after that of s1, both waited for
// at the end; both_early: both started after the backward of s2.
// Three devices, one slice each (ms[d], forward 1/3, backward 2/3); bucket
// X over {0, 1} (x_bytes) and Y over {0, 2} (y_bytes). d0 starts X then Y
// after its backward, then waits for both; d1 starts and waits for X, d2
// for Y.
Programs two_groups(const std::array<double, 3>& ms, int64_t x_bytes, int64_t y_bytes) {
  Programs p(3);
  std::array<int, 3> s{};
  for (int d = 0; d < 3; ++d) s[static_cast<size_t>(d)] = p.slice(0, {d}, ms[static_cast<size_t>(d)]);
  const int x = p.bucket({0, 1}, x_bytes), y = p.bucket({0, 2}, y_bytes);
  const std::array<std::vector<int>, 3> mine{std::vector<int>{x, y}, {x}, {y}};
  for (int d = 0; d < 3; ++d) {
    p.fwd(d, s[static_cast<size_t>(d)]);
    p.bwd(d, s[static_cast<size_t>(d)]);
    for (int b : mine[static_cast<size_t>(d)]) p.start(d, b);
    for (int b : mine[static_cast<size_t>(d)]) p.wait(d, b);
    p.optimizer(d);
  }
  return p;
}

enum class Reduce { blocking, each_when_ready, both_early };
Programs two_buckets(Reduce how) {
  Programs p(2);
  const int s1 = p.slice(0, {0, 1}, 3.0), s2 = p.slice(1, {0, 1}, 6.0);
  const int k2 = p.bucket({0, 1}, 1'000'000), k1 = p.bucket({0, 1}, 2'000'000);
  for (int d : {0, 1}) {
    p.fwd(d, s1);
    p.fwd(d, s2);
    p.bwd(d, s2);
    if (how != Reduce::blocking) p.start(d, k2);
    if (how == Reduce::both_early) p.start(d, k1);
    p.bwd(d, s1);
    if (how == Reduce::each_when_ready) p.start(d, k1);
    if (how == Reduce::blocking) {
      p.allreduce(d, k2);
      p.allreduce(d, k1);
    } else {
      p.wait(d, k2);
      p.wait(d, k1);
    }
    p.optimizer(d);
  }
  return p;
}


// `events` (communication unpriced, with a timeline) simulated by the event
// loop and, without a timeline, in one pass (docs/simulation.md, "Compute
// alone, in one pass"): the same makespan and device finishes, to the bit.
// Returns the one-pass simulation's options and result, for more checks.
std::pair<sp::SimOptions, sp::Simulation> one_pass_equals_events(const sp::Lowered& lowered,
                                                                 const std::vector<double>& slice_ms,
                                                                 const sp::CostModel& cost, int per_island,
                                                                 const sp::SimOptions& events) {
  sp::SimOptions one_pass = events;
  one_pass.timeline = false;
  auto a = sp::simulate(lowered, slice_ms, cost, per_island, events);
  auto b = sp::simulate(lowered, slice_ms, cost, per_island, one_pass);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(b->iteration_ms == a->iteration_ms);
  REQUIRE(b->devices.size() == a->devices.size());
  bool same = true;
  for (size_t d = 0; d < a->devices.size(); ++d) same = same && b->devices[d].finish_ms == a->devices[d].finish_ms;
  CHECK(same);
  return {one_pass, std::move(*b)};
}

}  // namespace

TEST_CASE("one transfer each way between two devices: the makespan by hand", "[sim]") {
  // Device 0 runs slice A (3 ms: forward 1, backward 2), device 1 slice B
  // (6 ms: forward 2, backward 4) on A's output; 2e6 bytes each way at 1 GB/s
  // (2 ms).
  //   d0: fwd A [0,1], exchange fwd [1,3], exchange bwd [3,11], bwd A [11,13]
  //   d1: exchange fwd [0,3], fwd B [3,5], bwd B [5,9], exchange bwd [9,11]
  Programs p = one_transfer_each_way(true);

  const sp::Simulation sim = p.run(hand_cluster(1, 2));
  CHECK(sim.iteration_ms == Approx(13.0));
  CHECK(sim.devices[0].finish_ms == Approx(13.0));
  CHECK(sim.devices[1].finish_ms == Approx(11.0));
  // Device 0: compute 3, moving 2 + 2, waiting 8 - 2 in the backward exchange.
  CHECK(sim.devices[0].compute_ms == Approx(3.0));
  CHECK(sim.devices[0].transfer_ms == Approx(4.0));
  CHECK(sim.devices[0].sync_ms == 0);
  CHECK(sim.devices[0].wait_ms == Approx(6.0));
  CHECK(sim.devices[0].idle_ms == Approx(6.0));
  // Device 1: compute 6, moving 2 + 2, waiting 1 for device 0 to send, 2 at the end.
  CHECK(sim.devices[1].compute_ms == Approx(6.0));
  CHECK(sim.devices[1].transfer_ms == Approx(4.0));
  CHECK(sim.devices[1].wait_ms == Approx(1.0));
  CHECK(sim.devices[1].idle_ms == Approx(3.0));
  CHECK(box(sim, 1, 1, "forward").start_ms == Approx(3.0));
  CHECK(box(sim, 0, 3, "backward").start_ms == Approx(11.0));
  const sp::SimBox& ex = box(sim, 0, 1, "exchange");
  CHECK(ex.track == sp::SimTrack::communication);
  CHECK(ex.sent_bytes == 2'000'000);
  CHECK(ex.start_ms == Approx(1.0));
  CHECK(ex.dur_ms == Approx(2.0));
  REQUIRE(sim.messages.size() == 2);
  CHECK(sim.messages[0].ready_ms == Approx(1.0));
  CHECK(sim.messages[1].start_ms == Approx(9.0));

  // Latency adds to every message: 10 us each way.
  CHECK(p.run(hand_cluster(1, 2, 10)).iteration_ms == Approx(13.02));
  // Forward and backward split by forward_share; compute or communication priced at zero.
  sp::SimOptions half;
  half.forward_share = 0.5;
  // d0 fwd [0,1.5], send [1.5,3.5]; d1 fwd [3.5,6.5], bwd [6.5,9.5], send [9.5,11.5]; d0 bwd [11.5,13]
  CHECK(p.run(hand_cluster(1, 2), half).iteration_ms == Approx(13.0));
  sp::SimOptions no_comm;
  no_comm.price_communication = false;
  CHECK(p.run(hand_cluster(1, 2), no_comm).iteration_ms == Approx(9.0));   // 1 + 2 + 4 + 2
  sp::SimOptions no_compute;
  no_compute.price_compute = false;
  CHECK(p.run(hand_cluster(1, 2), no_compute).iteration_ms == Approx(4.0));
}

TEST_CASE("transfers posted early leave when their rows are made, not at their wave's exchange", "[sim]") {
  // At the exchanges:
  //   d0: fwd A [0,1], fwd C [1,3], exchange fwd [3,5], exchange bwd [5,13], bwd C [13,17], bwd A [17,19]
  //   d1: exchange fwd [0,5], fwd B [5,7], bwd B [7,11], exchange bwd [11,13]
  const sp::Simulation late = send_before_other_work(false).run(hand_cluster(1, 2));
  CHECK(late.iteration_ms == Approx(19.0));
  CHECK(late.messages[0].start_ms == Approx(3.0));
  // Posted early: A's rows leave at 1 and move while d0 runs C.
  //   d0: fwd A [0,1], post_send, fwd C [1,3], exchange bwd [3,11], bwd C [11,15], bwd A [15,17],
  //       wait_sends (A's rows were delivered at 3)
  //   d1: exchange fwd [0,3], fwd B [3,5], bwd B [5,9], post_send (the gradient moves [9,11]),
  //       wait_sends [9,11]
  const sp::Simulation early = send_before_other_work(true).run(hand_cluster(1, 2));
  CHECK(early.iteration_ms == Approx(17.0));
  REQUIRE(early.messages.size() == 2);
  CHECK(early.messages[0].ready_ms == Approx(1.0));
  CHECK(early.messages[0].end_ms == Approx(3.0));
  CHECK(early.messages[1].start_ms == Approx(9.0));
  CHECK(early.devices[1].finish_ms == Approx(11.0));   // its last instruction waits for its send
  CHECK(early.devices[0].finish_ms == Approx(17.0));
  CHECK(box(early, 1, 2, "forward").start_ms == Approx(3.0));
  CHECK(box(early, 0, 5, "backward").start_ms == Approx(11.0));
  const sp::SimBox& sends_wait = box(early, 1, 5, "wait");
  CHECK(sends_wait.start_ms == Approx(9.0));
  CHECK(sends_wait.dur_ms == Approx(2.0));
  // d1 waited [0,3] in its exchange while the message moved [1,3] (2 ms
  // transfer, 1 ms wait), then [9,11] for its own send (2 ms transfer).
  CHECK(early.devices[1].transfer_ms == Approx(4.0));
  CHECK(early.devices[1].wait_ms == Approx(1.0));
  // With overhead (100 us per exchange or post_send, 50 us per message,
  // packing at 2 GB/s: 1 ms per 2e6 bytes): the sender packs in its
  // post_send [1, 2.15], then goes on; the receiver's exchange costs 0.15
  // before and 1 ms unpacking after the message [2.15, 4.15].
  //   d0: fwd C [2.15,4.15]; d1: exchange [0,5.15], fwd B [5.15,7.15], bwd B [7.15,11.15],
  //   post_send [11.15,12.30], message [12.30,14.30]; d0: exchange bwd [4.15,15.30], bwd C, bwd A: 21.30
  sp::CommOverhead o;
  o.exchange_us = 100;
  o.message_us = 50;
  o.pack_gbytes_per_s = 2;
  const sp::Simulation costly = send_before_other_work(true).run(hand_cluster(1, 2), {}, o);
  CHECK(costly.messages[0].ready_ms == Approx(2.15));
  CHECK(box(costly, 0, 1, "send").dur_ms == Approx(1.15));
  CHECK(box(costly, 0, 2, "forward").start_ms == Approx(2.15));
  CHECK(box(costly, 1, 2, "forward").start_ms == Approx(5.15));
  CHECK(costly.iteration_ms == Approx(21.3));

  // With only the executor's bookkeeping (100 us per exchange, post_send,
  // post_recv and wait_sends, whatever they move):
  //   d1: post_recv [0,0.1], exchange fwd [0.1, 3.1] (f moves [1.1,3.1]), fwd B [3.1,5.1], bwd B [5.1,9.1],
  //       post_send [9.1,9.2] (g moves [9.2,11.2]), wait_sends [9.2,11.3]
  //   d0: fwd A [0,1], post_send [1,1.1], fwd C [1.1,3.1], post_recv [3.1,3.2], exchange bwd [3.2,11.2],
  //       bwd C [11.2,15.2], bwd A [15.2,17.2], wait_sends [17.2,17.3]
  sp::CommOverhead books;
  books.instruction_us = 100;
  const sp::Simulation kept = send_before_other_work(true).run(hand_cluster(1, 2), {}, books);
  CHECK(kept.messages[0].start_ms == Approx(1.1));
  CHECK(kept.messages[1].start_ms == Approx(9.2));
  CHECK(box(kept, 1, 0, "recv").dur_ms == Approx(0.1));
  CHECK(box(kept, 0, 3, "recv").start_ms == Approx(3.1));
  CHECK(box(kept, 1, 2, "forward").start_ms == Approx(3.1));
  CHECK(box(kept, 1, 5, "wait").start_ms == Approx(9.2));
  CHECK(box(kept, 1, 5, "wait").dur_ms == Approx(2.1));
  CHECK(kept.devices[1].finish_ms == Approx(11.3));
  CHECK(box(kept, 0, 5, "backward").start_ms == Approx(11.2));
  CHECK(kept.devices[0].finish_ms == Approx(17.3));
  // d1 moved f [1.1,3.1] inside its exchange [0.1,3.1] and packed [0.1,0.2]:
  // 2.1 transfer, 0.9 wait; posted [0,0.1] and [9.1,9.2]; g moved [9.2,11.2]
  // and it completed [11.2,11.3] inside its wait_sends: 4.4 in all.
  CHECK(kept.devices[1].transfer_ms == Approx(4.4));
  CHECK(kept.devices[1].wait_ms == Approx(0.9));
}

TEST_CASE("a backward exchange adds the pieces it adds (local ones too), not one it takes whole, and a forward one takes views", "[sim]") {
  // d0 alone: slice A (wave 0, 3 ms: forward 1, backward 2), then slice C
  // (wave 1, 6 ms: 2 + 4) on A's output, 1e6 bytes each way, both local.
  // With 100 us per instruction and adding at 1 GB/s (1e6 bytes: 1 ms):
  //   fwd A [0,1], exchange fwd [1,1.1], fwd C [1.1,3.1], bwd C [3.1,7.1],
  //   exchange bwd [7.1,8.2] (0.1 + 1 adding), bwd A [8.2,10.2]
  Programs p(1);
  const int a = p.slice(0, {0}, 3.0), c = p.slice(1, {0}, 6.0);
  const int f = p.transfer(sp::Direction::forward, 1, 0, 0, 1'000'000);
  const int g = p.transfer(sp::Direction::backward, 1, 0, 0, 1'000'000);
  p.fwd(0, a);
  p.exchange(0, sp::Direction::forward, 1, {f});
  p.fwd(0, c);
  p.bwd(0, c);
  p.exchange(0, sp::Direction::backward, 1, {g});
  p.bwd(0, a);
  CHECK(p.run(hand_cluster(1, 1)).iteration_ms == Approx(9.0));   // local copies cost nothing by default
  sp::CommOverhead o;
  o.instruction_us = 100;
  o.accumulate_gbytes_per_s = 1;
  o.exchange_us = 1000;   // per exchange that moves a message: none here
  o.message_us = 1000;
  o.pack_gbytes_per_s = 0.001;
  const sp::Simulation sim = p.run(hand_cluster(1, 1), {}, o);
  CHECK(box(sim, 0, 1, "exchange").dur_ms == Approx(0.1));
  CHECK(box(sim, 0, 4, "exchange").start_ms == Approx(7.1));
  CHECK(box(sim, 0, 4, "exchange").dur_ms == Approx(1.1));
  CHECK(sim.iteration_ms == Approx(10.2));
  CHECK(sim.devices[0].transfer_ms == Approx(1.2));
  CHECK(sim.devices[0].wait_ms == Approx(0.0).margin(1e-12));
  // Without communication priced, none of it.
  sp::SimOptions compute_only;
  compute_only.price_communication = false;
  CHECK(p.run(hand_cluster(1, 1), compute_only, o).iteration_ms == Approx(9.0));
  // The piece taken as A's output gradient as it is (Transfer::adds false,
  // as the lowering marks a first piece covering all rows): the backward
  // exchange is its instruction alone, 0.1 ms, and the step 1 ms shorter.
  p.l.transfers[static_cast<size_t>(g)].adds = false;
  const sp::Simulation taken = p.run(hand_cluster(1, 1), {}, o);
  CHECK(box(taken, 0, 4, "exchange").dur_ms == Approx(0.1));
  CHECK(taken.iteration_ms == Approx(9.2));
  CHECK(taken.devices[0].transfer_ms == Approx(0.2));
}

TEST_CASE("an all-reduce waits for the slower member of its group", "[sim]") {
  // d0 runs a 3 ms slice, d1 a 9 ms one; then a 1e6-byte bucket over both:
  // ring all-reduce 2 (p-1)/p x 1e6 B at 1 GB/s = 1 ms, from 9 to 10.
  const Programs p = slow_member(false);
  const sp::Simulation sim = p.run(hand_cluster(1, 2));
  CHECK(sim.iteration_ms == Approx(10.0));
  CHECK(sim.devices[0].sync_ms == Approx(1.0));
  CHECK(sim.devices[0].wait_ms == Approx(6.0));
  CHECK(sim.devices[1].wait_ms == 0);
  CHECK(box(sim, 0, 2, "allreduce").start_ms == Approx(9.0));
  CHECK(box(sim, 0, 2, "wait").start_ms == Approx(3.0));
  CHECK(box(sim, 0, 2, "wait").dur_ms == Approx(6.0));
  // Across two islands (1 device each) the inter-island link decides: 2 ms.
  CHECK(p.run(hand_cluster(2, 1)).iteration_ms == Approx(11.0));
  // The per-device lower bound: d1's 9 ms of compute and its 1 ms all-reduce
  // after it (blocking all-reduces); with overlap, the larger of its compute
  // (9) and its forward plus the all-reduce (3 + 1).
  const sp::Cluster one = hand_cluster(1, 2);
  const sp::TableCostModel cost(one);
  sp::SimOptions blocking;
  blocking.sync = sp::GradSync{};
  blocking.sync->overlap = false;
  CHECK(sp::device_lower_bound_ms(p.l, p.slice_ms, cost, blocking) == Approx(10.0));
  CHECK(sp::device_lower_bound_ms(p.l, p.slice_ms, cost) == Approx(9.0));
  sp::SimOptions compute_only = blocking;
  compute_only.price_communication = false;
  CHECK(sp::device_lower_bound_ms(p.l, p.slice_ms, cost, compute_only) == Approx(9.0));
  // From the programs: d1's 9 ms of compute, then its started all-reduce
  // (1 ms) before its wait: 10, the makespan.
  CHECK(sp::program_lower_bound_ms(slow_member(true).l, p.slice_ms, cost) == Approx(10.0));
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, cost, blocking) == Approx(10.0));
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, cost, compute_only) == Approx(9.0));
  // Slice times that do not match the programs bound nothing.
  CHECK(sp::program_lower_bound_ms(p.l, {3.0}, cost) == 0.0);
}

TEST_CASE("the critical path by hand: compute, messages and an all-reduce", "[sim]") {
  sp::SimOptions traced;
  traced.critical_path = true;
  {
    // one_transfer_each_way: device 0 ends last (13 ms). Back from there:
    // bwd A [11,13] <- the bwd message [9,11], sent when d1's bwd B ended
    // <- bwd B [5,9] <- fwd B [3,5] <- d1's fwd exchange, done when the fwd
    // message arrived [1,3] <- fwd A [0,1]. Compute 1 + 2 + 4 + 2, transfer
    // 2 + 2.
    const sp::Simulation sim = one_transfer_each_way(true).run(hand_cluster(1, 2), traced);
    CHECK(sim.critical.device == 0);
    CHECK(sim.critical.compute_ms == Approx(9.0));
    CHECK(sim.critical.transfer_ms == Approx(4.0));
    CHECK(sim.critical.sync_ms == 0);
    CHECK(sim.critical_slices == std::vector<char>{1, 1});
    CHECK(box(sim, 0, 0, "forward").critical);
    CHECK_FALSE(box(sim, 0, 1, "exchange").critical);   // d0's fwd exchange: d1 did not wait for its end
    CHECK(box(sim, 0, 2, "exchange").critical);
    CHECK(box(sim, 0, 3, "backward").critical);
    CHECK(box(sim, 1, 0, "exchange").critical);
    CHECK(box(sim, 1, 1, "forward").critical);
    CHECK(box(sim, 1, 2, "backward").critical);
    CHECK_FALSE(box(sim, 1, 3, "exchange").critical);   // d1 ends at 11, off the path
    // Without the option: none of it.
    const sp::Simulation plain = one_transfer_each_way(true).run(hand_cluster(1, 2));
    CHECK(plain.critical.device == -1);
    CHECK(plain.critical_slices.empty());
    CHECK_FALSE(box(plain, 0, 0, "forward").critical);
  }
  {
    // slow_member: both end at 10 (the lower device, 0, is the last). Its
    // all-reduce [9,10] waited for d1's 9 ms slice: compute 9 (d1), sync 1,
    // the all-reduce shown on d0, which waited for it; d0's 3 ms slice is
    // off the path.
    const sp::Simulation sim = slow_member(false).run(hand_cluster(1, 2), traced);
    CHECK(sim.critical.device == 0);
    CHECK(sim.critical.compute_ms == Approx(9.0));
    CHECK(sim.critical.transfer_ms == 0);
    CHECK(sim.critical.sync_ms == Approx(1.0));
    CHECK(sim.critical_slices == std::vector<char>{0, 1});
    CHECK(box(sim, 0, 2, "allreduce").critical);
    CHECK_FALSE(box(sim, 1, 2, "allreduce").critical);
    CHECK_FALSE(box(sim, 0, 0, "forward").critical);
    CHECK(box(sim, 1, 1, "backward").critical);
    // Compute alone in one pass: the same slices, all of it compute.
    sp::SimOptions one_pass = traced;
    one_pass.price_communication = false;
    one_pass.timeline = false;
    const sp::Simulation fast = slow_member(false).run(hand_cluster(1, 2), one_pass);
    CHECK(fast.critical.compute_ms == Approx(9.0));
    CHECK(fast.critical_slices == std::vector<char>{0, 1});
  }
}

TEST_CASE("gradient all-reduces started during the backward pass run beside it", "[sim]") {
  // Both devices run s1 (wave 0, 3 ms: forward 1, backward 2) and s2 (wave
  // 1, 6 ms: 2 + 4). s2's parameters are bucket k2 (1e6 bytes: 1 ms over
  // 2 devices at 1 GB/s), s1's are k1 (2e6 bytes: 2 ms). Forward 0-3,
  // backward of s2 3-7, k2 starts at 7 and runs 7-8 beside the backward of
  // s1 (7-9); k1 starts at 9 and runs 9-11; the wait for k2 passes at 9,
  // the wait for k1 blocks 9-11. Blocking all-reduces after the backward
  // pass: 9 + 1 + 2 = 12.
  const Programs overlapped = two_buckets(Reduce::each_when_ready);
  const sp::Simulation sim = overlapped.run(hand_cluster(1, 2));
  CHECK(sim.iteration_ms == Approx(11.0));
  for (const sp::SimDevice& d : sim.devices) {
    CHECK(d.sync_ms == Approx(2.0));          // k1, waited for
    CHECK(d.hidden_sync_ms == Approx(1.0));   // k2, behind the backward of s1
    CHECK(d.wait_ms == Approx(0.0));
    CHECK(d.compute_ms == Approx(9.0));
    CHECK(d.busy_ms() <= d.finish_ms + 1e-9);
  }
  CHECK(box(sim, 0, 3, "allreduce").start_ms == Approx(7.0));
  CHECK(box(sim, 0, 3, "allreduce").dur_ms == Approx(1.0));
  CHECK(box(sim, 0, 5, "allreduce").start_ms == Approx(9.0));
  CHECK(box(sim, 1, 7, "wait").start_ms == Approx(9.0));
  CHECK(box(sim, 1, 7, "wait").dur_ms == Approx(2.0));
  CHECK(two_buckets(Reduce::blocking).run(hand_cluster(1, 2)).iteration_ms == Approx(12.0));
  // The overlapped bound: compute 9 (forward 3 plus both all-reduces: 6).
  const sp::Cluster one = hand_cluster(1, 2);
  const sp::TableCostModel cost(one);
  CHECK(sp::device_lower_bound_ms(overlapped.l, overlapped.slice_ms, cost) == Approx(9.0));
  // From the programs, exact here: k1 starts after the backward of s1 (at
  // 9 at the earliest) and takes 2 ms before its wait: 3 + 4 + 2 + 2 = 11.
  // Blocking: 9 + 1 + 2 = 12. Both started after the backward of s2 (at 7):
  // they run one after another, 7 + 1 + 2 = 10, while s1's backward ends at 9.
  CHECK(sp::program_lower_bound_ms(overlapped.l, overlapped.slice_ms, cost) == Approx(11.0));
  const Programs blocking = two_buckets(Reduce::blocking);
  CHECK(sp::program_lower_bound_ms(blocking.l, blocking.slice_ms, cost) == Approx(12.0));
  const Programs early = two_buckets(Reduce::both_early);
  CHECK(sp::program_lower_bound_ms(early.l, early.slice_ms, cost) == Approx(10.0));
  CHECK(early.run(hand_cluster(1, 2)).iteration_ms == Approx(10.0));
  // One member late: the all-reduce runs once both started, and the early
  // one's wait covers the gap as waiting, not sync.
  const sp::Simulation lsim = slow_member(true).run(hand_cluster(1, 2));
  CHECK(lsim.iteration_ms == Approx(10.0));
  CHECK(lsim.devices[0].wait_ms == Approx(6.0));
  CHECK(lsim.devices[0].sync_ms == Approx(1.0));
  CHECK(lsim.devices[0].hidden_sync_ms == Approx(0.0));
}

namespace {
// Device 0 runs a (3 ms: forward 0-1) and b (12 ms: forward 1-5), starting
// bucket k (1e6 bytes) before b when `early`, else after it, then waits for
// k; device 1 runs c (6 ms: forward 0-2), starts k and waits for it.
Programs long_compute_beside_bucket(bool early) {
  Programs p(2);
  const int a = p.slice(0, {0}, 3.0), b = p.slice(1, {0}, 12.0), c = p.slice(0, {1}, 6.0);
  const int k = p.bucket({0, 1}, 1'000'000);
  p.fwd(0, a);
  if (early) p.start(0, k);
  p.fwd(0, b);
  if (!early) p.start(0, k);
  p.wait(0, k);
  p.fwd(1, c);
  p.start(1, k);
  p.wait(1, k);
  return p;
}
}  // namespace

TEST_CASE("all-reduces that progress only inside calls begin when every member has polled", "[sim]") {
  // Device 0 runs a (forward 0-1), starts bucket k (1e6 bytes: 1 ms over 2
  // devices at 1 GB/s), then b (forward 1-5), then waits for k; device 1
  // runs c (forward 0-2), starts k and waits for it. In the background
  // (NCCL) k runs 2-3 once device 1 has started it: device 1 finishes at
  // 3, device 0 at 5. Progressing only inside calls (MPI) k waits for
  // device 0's next poll, after b, at 5: it runs 5-6, and both end at 6.
  const Programs p = long_compute_beside_bucket(true);
  const sp::Cluster cluster = hand_cluster(1, 2);
  sp::TableCostModel background(cluster), in_calls(cluster);
  sp::ProfileLinks links;   // no link measured: the cluster's figures stay
  links.progress_in_calls = true;
  in_calls.use_measured_links(links);
  CHECK_FALSE(background.allreduce_progress_in_calls());
  CHECK(in_calls.allreduce_progress_in_calls());
  auto bg = sp::simulate(p.l, p.slice_ms, background, 2);
  auto mpi = sp::simulate(p.l, p.slice_ms, in_calls, 2);
  REQUIRE(bg.ok());
  REQUIRE(mpi.ok());
  CHECK(bg->iteration_ms == Approx(5.0));
  CHECK(bg->devices[1].finish_ms == Approx(3.0));
  CHECK(mpi->iteration_ms == Approx(6.0));
  CHECK(mpi->devices[1].finish_ms == Approx(6.0));
  CHECK(box(*mpi, 1, 1, "allreduce").start_ms == Approx(5.0));
  CHECK(box(*mpi, 1, 2, "wait").dur_ms == Approx(4.0));   // device 1 waits 2-6
  // A member blocked in a call (device 1, already waiting) polls at once:
  // with device 0 starting k last, at 5 after b, k runs 5-6 either way.
  const Programs q = long_compute_beside_bucket(false);
  auto late = sp::simulate(q.l, q.slice_ms, in_calls, 2);
  REQUIRE(late.ok());
  CHECK(late->iteration_ms == Approx(6.0));
  // Communication priced at 0 (the compute gap): no wait for a poll either.
  sp::SimOptions free_comm;
  free_comm.price_communication = false;
  auto gap = sp::simulate(p.l, p.slice_ms, in_calls, 2, free_comm);
  REQUIRE(gap.ok());
  CHECK(gap->iteration_ms == Approx(5.0));
}

TEST_CASE("optimizer steps: 28 bytes per value at the profile's rate, a bucket's after its wait", "[sim]") {
  // Both devices run s (3 ms: forward 0-1, backward 1-3); bucket k (1e6
  // bytes: 1 ms over 2 devices at 1 GB/s) runs 3-4. At 7 GB/s a step of
  // 250,000 values moves 7e6 bytes: 1 ms, 4-5 on both; device 0 then steps
  // the 500,000 values it alone holds: 2 ms, 5-7.
  Programs p(2);
  const int s = p.slice(0, {0, 1}, 3.0);
  const int k = p.bucket({0, 1}, 1'000'000);
  for (int d : {0, 1}) {
    p.train_and_reduce(d, s, k);
    p.optimizer(d, k, 250'000);
    p.optimizer(d, -1, d == 0 ? 500'000 : 0);
  }
  const sp::Simulation sim = p.run(hand_cluster(1, 2), {}, {}, 7.0);
  CHECK(sim.iteration_ms == Approx(7.0));
  CHECK(sim.devices[0].compute_ms == Approx(6.0));
  CHECK(sim.devices[1].compute_ms == Approx(4.0));
  CHECK(sim.devices[1].finish_ms == Approx(5.0));
  CHECK(box(sim, 0, 4, "optimizer").start_ms == Approx(4.0));
  CHECK(box(sim, 0, 4, "optimizer").dur_ms == Approx(1.0));
  CHECK(box(sim, 0, 5, "optimizer").start_ms == Approx(5.0));
  CHECK(box(sim, 0, 5, "optimizer").dur_ms == Approx(2.0));
  // No rate (an older profile), or price_optimizer off (the compute gap):
  // the steps take 0 ms.
  CHECK(p.run(hand_cluster(1, 2)).iteration_ms == Approx(4.0));
  sp::SimOptions unpriced;
  unpriced.price_optimizer = false;
  CHECK(p.run(hand_cluster(1, 2), unpriced, {}, 7.0).iteration_ms == Approx(4.0));
  // A bound stops a run whose steps pass it.
  sp::SimOptions bounded;
  bounded.timeline = false;
  bounded.stop_after_ms = 6.5;
  CHECK(std::isinf(p.run(hand_cluster(1, 2), bounded, {}, 7.0).iteration_ms));
  bounded.stop_after_ms = 7.0 * (1 + 1e-9);
  CHECK(p.run(hand_cluster(1, 2), bounded, {}, 7.0).iteration_ms == Approx(7.0));
}

namespace {
// ZeRO-1 by hand: three devices run one slice s (3 ms: forward 0-1,
// backward 1-3) and all-reduce bucket k (300,000 values, 1.2e6 bytes) over
// all three; device 2 also holds 150,000 values of its own. As lowering
// writes them with `sharded` optimizer state: each member steps its chunk
// (100,000 values) and the group all-gathers the stepped chunks (3 x
// 100,000 x 4 = 1.2e6 bytes); replicated, each steps all 300,000 and there
// is no all-gather. `overlap`: start, wait, the bucket's step, its
// all-gather, then the step of the rest; else blocking: the all-reduce,
// one step of everything, then the all-gather.
Programs zero_one(bool sharded, bool overlap) {
  Programs p(3);
  p.l.sharded_state = sharded;
  const int s = p.slice(0, {0, 1, 2}, 3.0);
  const int k = p.bucket({0, 1, 2}, 1'200'000);
  p.l.buckets[static_cast<size_t>(k)].values = 300'000;
  for (int d = 0; d < 3; ++d) {
    const int64_t own = d == 2 ? 150'000 : 0;
    const int64_t stepped = p.l.owned(k, d).size();
    p.fwd(d, s);
    p.bwd(d, s);
    if (overlap) {
      p.start(d, k);
      p.wait(d, k);
      p.optimizer(d, k, stepped);
      if (sharded) p.gather(d, k);
      p.optimizer(d, -1, own);
    } else {
      p.allreduce(d, k);
      p.optimizer(d, -1, stepped + own);
      if (sharded) p.gather(d, k);
    }
  }
  return p;
}
}  // namespace

TEST_CASE("the gradient norm: every device waits for the last one, then a ring all-reduce of one value", "[sim]") {
  // d0 and d1 run slice a (3 ms: forward 0-1, backward 1-3) and all-reduce
  // bucket k (1e6 bytes over 2 devices, latency 100 us: 1 + 0.2 ms, 3-4.2);
  // d2 runs slice c alone (9 ms). With the norm, each then all-reduces one
  // value (4 bytes) over all three: 2 x 2/3 x 4 B at 1 GB/s plus 2 x 2 x
  // 100 us = 0.4000053 ms, once d2 is there at 9; then the steps (0 ms).
  // The norm's local sums read 250,000 gradient values on d0 and d1 and
  // 1,000,000 on d2: unpriced here (no optimizer rate), below at 4 GB/s.
  auto programs = [](bool norm) {
    Programs p(3);
    const int a = p.slice(0, {0, 1}, 3.0), c = p.slice(0, {2}, 9.0);
    const int k = p.bucket({0, 1}, 1'000'000);
    for (int d : {0, 1}) {
      p.train_and_reduce(d, a, k);
      if (norm) p.norm(d, 250'000);
      p.optimizer(d, k);
      p.optimizer(d);
    }
    p.fwd(2, c);
    p.bwd(2, c);
    if (norm) p.norm(2, 1'000'000);
    p.optimizer(2);
    return p;
  };
  const sp::Cluster cluster = hand_cluster(1, 3, 100);
  const double norm_ms = 2 * 2.0 / 3 * 4 / 1e9 * 1e3 + 0.4;
  const sp::Simulation without = programs(false).run(cluster);
  CHECK(without.iteration_ms == Approx(9.0));
  CHECK(without.devices[0].finish_ms == Approx(4.2));
  const Programs p = programs(true);
  const sp::Simulation sim = p.run(cluster);
  CHECK(sim.iteration_ms == Approx(9.0 + norm_ms).epsilon(1e-12));
  for (int d = 0; d < 3; ++d) CHECK(sim.devices[static_cast<size_t>(d)].finish_ms == Approx(9.0 + norm_ms).epsilon(1e-12));
  // On d0: the wait for d2 (4.2-9), then the norm, counted as sync.
  CHECK(box(sim, 0, 5, "wait").start_ms == Approx(4.2));
  CHECK(box(sim, 0, 5, "wait").dur_ms == Approx(4.8));
  CHECK(box(sim, 0, 5, "allreduce").start_ms == Approx(9.0));
  CHECK(box(sim, 0, 5, "allreduce").dur_ms == Approx(norm_ms).epsilon(1e-12));
  CHECK(box(sim, 0, 5, "allreduce").name == "gradient norm (3 devices)");
  CHECK(box(sim, 2, 3, "allreduce").start_ms == Approx(9.0));
  CHECK(sim.devices[2].sync_ms == Approx(norm_ms).epsilon(1e-12));
  // The local sums priced at 4 GB/s, 4 bytes a value (rules/memory.h
  // norm_sum_ms): 0.25 ms on d0 and d1 (4.2-4.45), 1 ms on d2 (9-10); the
  // all-reduce then begins at 10. They are the optimizer's compute.
  const sp::Simulation priced = p.run(cluster, {}, {}, 4.0);
  CHECK(sp::norm_sum_ms(1'000'000, 4.0) == Approx(1.0).epsilon(1e-15));
  CHECK(priced.iteration_ms == Approx(10.0 + norm_ms).epsilon(1e-12));
  CHECK(box(priced, 0, 4, "optimizer").name == "gradient norm sum");
  CHECK(box(priced, 0, 4, "optimizer").start_ms == Approx(4.2));
  CHECK(box(priced, 0, 4, "optimizer").dur_ms == Approx(0.25).epsilon(1e-12));
  CHECK(box(priced, 2, 2, "optimizer").start_ms == Approx(9.0));
  CHECK(box(priced, 2, 2, "optimizer").dur_ms == Approx(1.0).epsilon(1e-12));
  CHECK(box(priced, 0, 5, "wait").dur_ms == Approx(10.0 - 4.45).epsilon(1e-12));
  CHECK(box(priced, 0, 5, "allreduce").start_ms == Approx(10.0));
  CHECK(priced.devices[2].compute_ms == Approx(10.0).epsilon(1e-12));
  CHECK(priced.devices[0].compute_ms == Approx(3.25).epsilon(1e-12));
  // The bounds hold; compute alone, the events and the one pass agree to
  // the bit (and the norm costs nothing there).
  const sp::TableCostModel cost(cluster);
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, cost) <= sim.iteration_ms);
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, cost) >= 9.0);
  sp::SimOptions compute_only;
  compute_only.price_communication = false;
  const auto [options, one_pass] = one_pass_equals_events(p.l, p.slice_ms, cost, 3, compute_only);
  CHECK(one_pass.iteration_ms == Approx(9.0));
  CHECK(one_pass.devices[0].finish_ms == Approx(9.0));   // d0 still waits for d2
  // Priced, the local sums count in the bound and in compute alone.
  sp::TableCostModel rated(cluster);
  rated.set_optimizer_rate(4.0);
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, rated) <= priced.iteration_ms);
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, rated) >= 10.0);
  const auto [rated_options, rated_pass] = one_pass_equals_events(p.l, p.slice_ms, rated, 3, compute_only);
  CHECK(rated_pass.iteration_ms == Approx(10.0));
}

TEST_CASE("sharded optimizer state: each bucket reduce-scattered, then all-gathered after its step, priced as rings", "[sim]") {
  // 1 GB/s and 10 us latency inside the island; optimizer at 7 GB/s (28
  // bytes per value: 100,000 values 0.4 ms). Three devices:
  //   all-reduce of 1.2e6 bytes (replicated): 2 (p-1)/p x 1.2e6 B / 1 GB/s + 2 (p-1) x 10 us = 1.6 + 0.04 = 1.64 ms
  //   reduce-scatter (sharded) and all-gather of 1.2e6 bytes each: (p-1)/p x 1.2e6 B / 1 GB/s + (p-1) x 10 us
  //   = 0.8 + 0.02 = 0.82 ms
  const sp::Cluster cluster = hand_cluster(1, 3, 10);
  const Programs sharded = zero_one(true, false);
  REQUIRE(sharded.l.gather_bytes(0) == 1'200'000);
  const sp::TableCostModel cost(cluster);
  CHECK(cost.allgather_ms(1.2e6, {0, 1, 2}) == Approx(0.82));
  CHECK(cost.reduce_scatter_ms(1.2e6, {0, 1, 2}) == Approx(0.82));
  {
    // Blocking: backward ends at 3, the reduce-scatter runs 3-3.82; devices
    // 0 and 1 step their chunks 3.82-4.22, device 2 its chunk and its own
    // 150,000 values 3.82-4.82; the all-gather waits for device 2 and runs
    // 4.82-5.64 (devices 0 and 1 wait 4.22-4.82).
    sp::SimOptions traced;
    traced.critical_path = true;
    const sp::Simulation sim = sharded.run(cluster, traced, {}, 7.0);
    CHECK(sim.iteration_ms == Approx(5.64));
    for (const sp::SimDevice& d : sim.devices) {
      CHECK(d.finish_ms == Approx(5.64));
      CHECK(d.sync_ms == Approx(0.82 + 0.82));
    }
    CHECK(sim.devices[0].wait_ms == Approx(0.6));
    CHECK(sim.devices[2].wait_ms == Approx(0.0).margin(1e-12));
    const sp::SimBox& g = box(sim, 0, 4, "allgather");
    CHECK(g.start_ms == Approx(4.82));
    CHECK(g.dur_ms == Approx(0.82));
    CHECK(g.track == sp::SimTrack::communication);
    CHECK(g.bucket == 0);
    CHECK(g.sent_bytes == 1'200'000);
    CHECK(g.name == "all-gather bucket 0 (3 devices)");
    CHECK(box(sim, 0, 4, "wait").start_ms == Approx(4.22));
    CHECK(box(sim, 0, 4, "wait").dur_ms == Approx(0.6));
    CHECK(box(sim, 0, 4, "wait").name == "wait for all-gather of bucket 0");
    CHECK(box(sim, 0, 2, "allreduce").sent_bytes == 1'200'000);
    CHECK(box(sim, 0, 2, "allreduce").dur_ms == Approx(0.82));
    // The path, back from device 0's all-gather (it waited for it): the
    // all-gather (0.82) <- device 2's step (1.0) <- the reduce-scatter
    // (0.82) <- the backward and forward before (3).
    CHECK(sim.critical.device == 0);
    CHECK(sim.critical.compute_ms == Approx(4.0));
    CHECK(sim.critical.sync_ms == Approx(1.64));
    CHECK(sim.critical.transfer_ms == 0);
    CHECK(g.critical);
    CHECK_FALSE(box(sim, 1, 4, "allgather").critical);
    CHECK(box(sim, 2, 3, "optimizer").critical);
    CHECK_FALSE(box(sim, 0, 3, "optimizer").critical);
    // The bounds: device 0's compute (3) and collectives (0.82 + 0.82) one
    // after another; from the programs, device 2's 3 + 0.82 + 1.0 + 0.82:
    // exact. A bounded run stops just below the makespan, not at it.
    sp::SimOptions blocking;
    blocking.sync = sp::GradSync{};
    blocking.sync->overlap = false;
    sp::TableCostModel priced(cluster);
    priced.set_optimizer_rate(7.0);
    CHECK(sp::device_lower_bound_ms(sharded.l, sharded.slice_ms, priced, blocking) == Approx(4.64));
    CHECK(sp::program_lower_bound_ms(sharded.l, sharded.slice_ms, priced, blocking) == Approx(5.64));
    sp::SimOptions bounded = blocking;
    bounded.timeline = false;
    bounded.stop_after_ms = 5.64 * (1 + 1e-9);
    CHECK(sharded.run(cluster, bounded, {}, 7.0).iteration_ms == Approx(5.64));
    bounded.stop_after_ms = 5.63;
    CHECK(std::isinf(sharded.run(cluster, bounded, {}, 7.0).iteration_ms));
    // Replicated: no all-gather, every device steps all 300,000 values
    // (1.2 ms; device 2 with its own 1.8): 4.64 + 1.8 = 6.44.
    const sp::Simulation rep = zero_one(false, false).run(cluster, {}, {}, 7.0);
    CHECK(rep.iteration_ms == Approx(6.44));
    CHECK(std::none_of(rep.boxes.begin(), rep.boxes.end(), [](const sp::SimBox& b) { return b.cat == "allgather"; }));
    CHECK(rep.devices[0].sync_ms == Approx(1.64));
    // Steps unpriced: 3 + 0.82 + 0.82 sharded, 3 + 1.64 replicated: the
    // same bytes on the wire.
    CHECK(sharded.run(cluster).iteration_ms == Approx(4.64));
    CHECK(zero_one(false, false).run(cluster).iteration_ms == Approx(4.64));
    // Communication unpriced: compute alone (3 + 1.0 on device 2), the
    // group still synchronised at the all-gather (devices 0 and 1 end with
    // device 2).
    sp::SimOptions compute_only;
    compute_only.price_communication = false;
    const sp::Simulation free_comm = sharded.run(cluster, compute_only, {}, 7.0);
    CHECK(free_comm.iteration_ms == Approx(4.0));
    CHECK(free_comm.devices[0].finish_ms == Approx(4.0));
    // A replay times compute alone: an all-gather with a replay time is an error.
    sp::SimOptions replay;
    replay.replay_ms.assign(3, std::vector<double>(5, -1.0));
    replay.replay_ms[2][3] = 2.0;   // device 2's step: 3 + 0.82 + 2 + 0.82
    CHECK(sharded.run(cluster, replay, {}, 7.0).iteration_ms == Approx(6.64));
    replay.replay_ms[0][4] = 1.0;
    CHECK_FALSE(sp::simulate(sharded.l, sharded.slice_ms, priced, 3, replay).ok());
  }
  {
    // Overlapped: the reduce-scatter 3-3.82, each device steps its chunk
    // 3.82-4.22, the all-gather runs 4.22-5.04; then device 2 steps its own
    // 150,000 values 5.04-5.64.
    const Programs over = zero_one(true, true);
    const sp::Simulation sim = over.run(cluster, {}, {}, 7.0);
    CHECK(sim.iteration_ms == Approx(5.64));
    CHECK(sim.devices[0].finish_ms == Approx(5.04));
    CHECK(box(sim, 1, 5, "allgather").start_ms == Approx(4.22));
    CHECK(box(sim, 1, 5, "allgather").dur_ms == Approx(0.82));
    CHECK(sim.devices[0].sync_ms == Approx(0.82 + 0.82));
    CHECK(sim.devices[0].hidden_sync_ms == Approx(0.0).margin(1e-12));
    // From the programs: exact (device 2: 3 + 0.82 + 0.4 + 0.82 + 0.6).
    sp::TableCostModel priced(cluster);
    priced.set_optimizer_rate(7.0);
    CHECK(sp::program_lower_bound_ms(over.l, over.slice_ms, priced) == Approx(5.64));
    // Replicated: 4.64 + 1.2 (+ 0.6 on device 2).
    CHECK(zero_one(false, true).run(cluster, {}, {}, 7.0).iteration_ms == Approx(6.44));
  }
  // A device runs one collective at a time, all-gathers and all-reduces
  // alike. Devices 0 and 1 run a (3 ms) and all-gather X (500,000 values:
  // 2 x 250,000 x 4 = 2e6 bytes, 1 ms at 1 GB/s), device 0 having started
  // Y (250,000 values, reduce-scattered: 1e6 bytes, 0.5 ms) with device 2
  // just before; device 2 runs c (3.5 ms) and starts Y at 3.5. Y's group is
  // complete at 3.5, but device 0 is in X's all-gather 3-4: Y runs 4-4.5.
  {
    Programs p(3);
    p.l.sharded_state = true;
    const int a = p.slice(0, {0, 1}, 3.0), c = p.slice(0, {2}, 3.5);
    const int x = p.bucket({0, 1}, 2'000'000), y = p.bucket({0, 2}, 1'000'000);
    p.l.buckets[static_cast<size_t>(x)].values = 500'000;
    p.l.buckets[static_cast<size_t>(y)].values = 250'000;
    for (int d : {0, 1}) {
      p.fwd(d, a);
      p.bwd(d, a);
    }
    p.start(0, y);
    p.gather(0, x);   // not a program lowering writes (X's step left out): the rule alone
    p.wait(0, y);
    p.gather(1, x);
    p.fwd(2, c);
    p.bwd(2, c);
    p.start(2, y);
    p.wait(2, y);
    const sp::Simulation sim = p.run(hand_cluster(1, 3));
    CHECK(box(sim, 0, 3, "allgather").start_ms == Approx(3.0));
    CHECK(box(sim, 0, 3, "allgather").dur_ms == Approx(1.0));
    CHECK(box(sim, 0, 3, "allgather").sent_bytes == 2'000'000);
    CHECK(box(sim, 0, 2, "allreduce").start_ms == Approx(4.0));
    CHECK(box(sim, 0, 2, "allreduce").dur_ms == Approx(0.5));
    CHECK(box(sim, 2, 3, "wait").dur_ms == Approx(1.0));   // 3.5-4.5
    CHECK(sim.devices[1].finish_ms == Approx(4.0));
    CHECK(sim.iteration_ms == Approx(4.5));
  }
}

namespace {
// ZeRO-1 with overlap by hand, as lowering writes it: the all-gathers open
// the programs. Bucket X (index 0: 250,000 values over devices 0 and 1)
// holds slice s0's parameters, Y (index 1: 1,000,000 values over devices
// 0 and 2) slice s2's; slice s1 (device 2 alone) is in no bucket. Slices:
// s0 (wave 0, devices 0 and 1, 3 ms: forward 1, backward 2), s1 (wave 0,
// device 2, 6 ms: 2 + 4), s2 (wave 1, devices 0 and 2, 3 ms: 1 + 2). Each
// device starts the all-gather of each of its buckets (X before Y: by
// first wave), waits for it right before its first forward using it,
// starts each reduce-scatter after the backward that makes its gradients
// final, then waits for each (X before Y), each followed by the step of
// its chunk of the bucket, and last steps the rest (none).
//   d0: 0 allgather_start X, 1 allgather_start Y, 2 allgather_wait X, 3 fwd s0, 4 allgather_wait Y,
//       5 fwd s2, 6 bwd s2, 7 start Y, 8 bwd s0, 9 start X, 10 wait X, 11 step X, 12 wait Y, 13 step Y,
//       14 optimizer
//   d1: 0 allgather_start X, 1 allgather_wait X, 2 fwd s0, 3 bwd s0, 4 start X, 5 wait X, 6 step X,
//       7 optimizer
//   d2: 0 allgather_start Y, 1 fwd s1, 2 allgather_wait Y, 3 fwd s2, 4 bwd s2, 5 start Y, 6 bwd s1,
//       7 wait Y, 8 step Y, 9 optimizer
Programs gathered_at_start() {
  Programs p(3);
  p.l.sharded_state = true;
  p.l.gathers_at_start = true;
  const int s0 = p.slice(0, {0, 1}, 3.0), s1 = p.slice(0, {2}, 6.0), s2 = p.slice(1, {0, 2}, 3.0);
  const int x = p.bucket({0, 1}, 1'000'000), y = p.bucket({0, 2}, 4'000'000);
  p.l.buckets[static_cast<size_t>(x)].values = 250'000;
  p.l.buckets[static_cast<size_t>(y)].values = 1'000'000;
  p.l.buckets[static_cast<size_t>(y)].first_wave = 1;
  const auto step = [&](int d, int k) { p.optimizer(d, k, p.l.owned(k, d).size()); };
  p.gather_start(0, x);
  p.gather_start(0, y);
  p.gather_wait(0, x);
  p.fwd(0, s0);
  p.gather_wait(0, y);
  p.fwd(0, s2);
  p.bwd(0, s2);
  p.start(0, y);
  p.bwd(0, s0);
  p.start(0, x);
  p.wait(0, x);
  step(0, x);
  p.wait(0, y);
  step(0, y);
  p.optimizer(0);
  p.gather_start(1, x);
  p.gather_wait(1, x);
  p.fwd(1, s0);
  p.bwd(1, s0);
  p.start(1, x);
  p.wait(1, x);
  step(1, x);
  p.optimizer(1);
  p.gather_start(2, y);
  p.fwd(2, s1);
  p.gather_wait(2, y);
  p.fwd(2, s2);
  p.bwd(2, s2);
  p.start(2, y);
  p.bwd(2, s1);
  p.wait(2, y);
  step(2, y);
  p.optimizer(2);
  return p;
}
}  // namespace

TEST_CASE("sharded optimizer state with overlap: all-gathers started as the programs open, waited for before their forwards", "[sim]") {
  // 1 GB/s inside the island, no latency. Over 2 devices an all-gather or
  // reduce-scatter of B bytes takes (p-1)/p x B / 1 GB/s: X's buffer is
  // 250,000 values (4 bytes each on the wire: 1e6 bytes) 0.5 ms, Y's
  // 1,000,000 values (4e6 bytes) 2 ms. Optimizer steps unpriced.
  const sp::Cluster cluster = hand_cluster(1, 3);
  const Programs p = gathered_at_start();
  REQUIRE(p.l.gather_bytes(0) == 1'000'000);
  REQUIRE(p.l.gather_bytes(1) == 4'000'000);
  const sp::TableCostModel cost(cluster);
  REQUIRE(cost.allgather_ms(1e6, {0, 1}) == Approx(0.5));
  REQUIRE(cost.allgather_ms(4e6, {0, 2}) == Approx(2.0));
  REQUIRE(cost.reduce_scatter_ms(4e6, {0, 2}) == Approx(2.0));
  // At 0 every device starts its all-gathers. X's group (d0, d1) is
  // complete at once: X runs 0-0.5. Y's group (d0, d2) is too, but d0
  // runs one collective at a time: Y runs after X, 0.5-2.5.
  //   d0: waits for X 0-0.5, fwd s0 0.5-1.5, waits for Y 1.5-2.5, fwd s2 2.5-3.5, bwd s2 3.5-5.5
  //       (starts Y's reduce-scatter), bwd s0 5.5-7.5 (starts X's), waits for X 7.5-8, Y has ended
  //   d1: waits for X 0-0.5, fwd s0 0.5-1.5, bwd s0 1.5-3.5 (starts X's reduce-scatter), waits 3.5-8
  //   d2: fwd s1 0-2 beside Y's all-gather (s1 needs no bucket), waits for Y 2-2.5, fwd s2 2.5-3.5,
  //       bwd s2 3.5-5.5 (starts Y's reduce-scatter), bwd s1 5.5-9.5, Y's ended at 7.5
  //   reduce-scatters: Y 5.5-7.5 (both there at 5.5); X 7.5-8 (d0 there at 7.5)
  // The makespan: d2's 9 ms of compute and its 0.5 ms wait for Y, 9.5
  // (9 were the all-gathers not one at a time on d0).
  sp::SimOptions traced;
  traced.critical_path = true;
  const sp::Simulation sim = p.run(cluster, traced);
  CHECK(sim.iteration_ms == Approx(9.5));
  CHECK(sim.devices[0].finish_ms == Approx(8.0));
  CHECK(sim.devices[1].finish_ms == Approx(8.0));
  CHECK(sim.devices[2].finish_ms == Approx(9.5));
  // The all-gathers' boxes (on each member, at its allgather_start).
  const sp::SimBox& gx = box(sim, 0, 0, "allgather");
  CHECK(gx.start_ms == Approx(0.0).margin(1e-12));
  CHECK(gx.dur_ms == Approx(0.5));
  CHECK(gx.track == sp::SimTrack::communication);
  CHECK(gx.bucket == 0);
  CHECK(gx.sent_bytes == 1'000'000);
  CHECK(gx.name == "all-gather bucket 0 (2 devices)");
  CHECK(box(sim, 1, 0, "allgather").start_ms == Approx(0.0).margin(1e-12));
  // d0's second all-gather begins when its first has ended.
  const sp::SimBox& gy = box(sim, 0, 1, "allgather");
  CHECK(gy.start_ms == Approx(0.5));
  CHECK(gy.dur_ms == Approx(2.0));
  CHECK(gy.sent_bytes == 4'000'000);
  CHECK(gy.name == "all-gather bucket 1 (2 devices)");
  CHECK(box(sim, 2, 0, "allgather").start_ms == Approx(0.5));
  CHECK(box(sim, 2, 0, "allgather").dur_ms == Approx(2.0));
  // A forward that needs a bucket waits for its all-gather; one that does
  // not runs beside it.
  CHECK(box(sim, 0, 2, "wait").start_ms == Approx(0.0).margin(1e-12));
  CHECK(box(sim, 0, 2, "wait").dur_ms == Approx(0.5));
  CHECK(box(sim, 0, 2, "wait").name == "wait for all-gather of bucket 0");
  CHECK(box(sim, 0, 3, "forward").start_ms == Approx(0.5));
  CHECK(box(sim, 1, 2, "forward").start_ms == Approx(0.5));
  CHECK(box(sim, 0, 4, "wait").start_ms == Approx(1.5));
  CHECK(box(sim, 0, 4, "wait").dur_ms == Approx(1.0));
  CHECK(box(sim, 0, 5, "forward").start_ms == Approx(2.5));
  CHECK(box(sim, 2, 1, "forward").start_ms == Approx(0.0).margin(1e-12));
  CHECK(box(sim, 2, 1, "forward").dur_ms == Approx(2.0));
  CHECK(box(sim, 2, 2, "wait").start_ms == Approx(2.0));
  CHECK(box(sim, 2, 2, "wait").dur_ms == Approx(0.5));
  CHECK(box(sim, 2, 2, "wait").bucket == 1);
  CHECK(box(sim, 2, 3, "forward").start_ms == Approx(2.5));
  // The reduce-scatters, started and waited for as before.
  CHECK(box(sim, 0, 7, "allreduce").start_ms == Approx(5.5));
  CHECK(box(sim, 0, 7, "allreduce").name == "reduce-scatter bucket 1 (2 devices)");
  CHECK(box(sim, 0, 9, "allreduce").start_ms == Approx(7.5));
  CHECK(box(sim, 0, 10, "wait").dur_ms == Approx(0.5));
  CHECK(box(sim, 1, 5, "wait").start_ms == Approx(3.5));
  CHECK(box(sim, 1, 5, "wait").name == "wait for all-reduce of bucket 0");
  // Where the time went. A started all-gather counts as sync where its
  // wait was blocked on it while it ran, the rest hidden: d2 was blocked
  // on Y 2-2.5 (0.5 exposed, 1.5 hidden); its reduce-scatter of Y ended
  // before its wait (2 hidden).
  CHECK(sim.devices[2].compute_ms == Approx(9.0));
  CHECK(sim.devices[2].sync_ms == Approx(0.5));
  CHECK(sim.devices[2].hidden_sync_ms == Approx(3.5));
  CHECK(sim.devices[2].wait_ms == Approx(0.0).margin(1e-12));
  // d0: X 0-0.5 and Y 1.5-2.5 exposed (Y's first ms hidden behind fwd s0),
  // X's reduce-scatter 7.5-8 exposed, Y's hidden (2).
  CHECK(sim.devices[0].compute_ms == Approx(6.0));
  CHECK(sim.devices[0].sync_ms == Approx(2.0));
  CHECK(sim.devices[0].hidden_sync_ms == Approx(3.0));
  // d1: X 0-0.5 exposed; in its wait for X's reduce-scatter 3.5-8, the
  // last 0.5 ms on it, 4 waiting for d0.
  CHECK(sim.devices[1].sync_ms == Approx(1.0));
  CHECK(sim.devices[1].wait_ms == Approx(4.0));
  for (const sp::SimDevice& d : sim.devices) CHECK(d.busy_ms() <= d.finish_ms + 1e-9);
  // The critical path, back from d2's end: bwd s1 (4) <- the start of Y's
  // reduce-scatter <- bwd s2 (2) <- fwd s2 (1) <- d2's wait for Y's
  // all-gather, which ended at 2.5 (2) <- d0's all-gather of X before it
  // (0.5). Compute 7, sync 2.5; s0 off the path. Y's all-gather is shown
  // on d2 (it waited for it), X's on d0 (Y waited for it there).
  CHECK(sim.critical.device == 2);
  CHECK(sim.critical.compute_ms == Approx(7.0));
  CHECK(sim.critical.sync_ms == Approx(2.5));
  CHECK(sim.critical.transfer_ms == 0);
  CHECK(sim.critical_slices == std::vector<char>{0, 1, 1});
  CHECK(box(sim, 2, 0, "allgather").critical);
  CHECK_FALSE(box(sim, 0, 1, "allgather").critical);
  CHECK(box(sim, 0, 0, "allgather").critical);
  CHECK_FALSE(box(sim, 1, 0, "allgather").critical);
  CHECK(box(sim, 2, 2, "wait").critical);
  CHECK(box(sim, 2, 6, "backward").critical);
  CHECK_FALSE(box(sim, 0, 3, "forward").critical);

  // The bounds. Per device: d2's compute, 9 (its all-gather may run beside
  // its forward pass). From the programs: d2 from its start, 9 (fwd s1,
  // then the 7 ms from its wait for Y on; Y's 2 ms all-gather then that
  // wait's 7 ms: 9 too). Neither sees that d0 runs X before Y.
  CHECK(sp::device_lower_bound_ms(p.l, p.slice_ms, cost) == Approx(9.0));
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, cost) == Approx(9.0));
  sp::SimOptions bounded;
  bounded.timeline = false;
  bounded.stop_after_ms = 9.5 * (1 + 1e-9);
  CHECK(p.run(cluster, bounded).iteration_ms == Approx(9.5));
  bounded.stop_after_ms = 9.4;
  CHECK(std::isinf(p.run(cluster, bounded).iteration_ms));
  // Every slice's time in its forward (backwards take 0 ms): the
  // all-gathers now run beside long forwards, and d2's makespan is its
  // forwards (6 + 3, fwd s2 9 at the earliest) and Y's reduce-scatter after
  // them, 9-11; both bounds exact. (Its forwards plus every collective of
  // its, 9 + 2 + 2 = 13, is no bound: Y's all-gather ran beside fwd s1.)
  sp::SimOptions forwards;
  forwards.forward_share = 1.0;
  const sp::Simulation fwd_only = p.run(cluster, forwards);
  CHECK(fwd_only.iteration_ms == Approx(11.0));
  CHECK(box(fwd_only, 2, 0, "allgather").start_ms == Approx(0.5));
  CHECK(box(fwd_only, 2, 1, "forward").dur_ms == Approx(6.0));
  CHECK(box(fwd_only, 2, 5, "allreduce").start_ms == Approx(9.0));
  CHECK(sp::device_lower_bound_ms(p.l, p.slice_ms, cost, forwards) == Approx(11.0));
  CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, cost, forwards) == Approx(11.0));
  // Communication unpriced: compute alone (d2's 9 ms), the one pass and
  // the events to the bit.
  sp::SimOptions compute_only;
  compute_only.price_communication = false;
  auto [one_pass, fast] = one_pass_equals_events(p.l, p.slice_ms, cost, 3, compute_only);
  CHECK(fast.iteration_ms == Approx(9.0));
}

TEST_CASE("sharded optimizer state: the one-pass makespan of compute alone equals the events', to the bit", "[sim]") {
  // The hand-built programs, blocking and overlapped, steps priced or not.
  for (bool overlap : {false, true})
    for (double rate : {0.0, 7.0}) {
      const Programs p = zero_one(true, overlap);
      sp::SimOptions events;
      events.price_communication = false;
      sp::SimOptions one_pass = events;
      one_pass.timeline = false;
      const sp::Simulation a = p.run(hand_cluster(1, 3, 10), events, {}, rate);
      const sp::Simulation b = p.run(hand_cluster(1, 3, 10), one_pass, {}, rate);
      CHECK(b.iteration_ms == a.iteration_ms);
      for (size_t d = 0; d < a.devices.size(); ++d) CHECK(b.devices[d].finish_ms == a.devices[d].finish_ms);
    }
  // The all-gathers started as the programs open (gathered_at_start), with
  // other forward shares: the same; and priced, its bounds are bounds and
  // a bounded run stops exactly when the makespan passes its bound.
  for (double share : {0.0, 1.0 / 3.0, 0.8, 1.0})
    for (double rate : {0.0, 7.0}) {
      INFO("forward share " << share << ", optimizer at " << rate << " GB/s");
      const Programs p = gathered_at_start();
      sp::TableCostModel cost(hand_cluster(1, 3, 10));
      cost.set_optimizer_rate(rate);
      sp::SimOptions events;
      events.price_communication = false;
      events.forward_share = share;
      one_pass_equals_events(p.l, p.slice_ms, cost, 3, events);
      sp::SimOptions priced;
      priced.timeline = false;
      priced.forward_share = share;
      auto full = sp::simulate(p.l, p.slice_ms, cost, 3, priced);
      REQUIRE(full.ok());
      CHECK(sp::program_lower_bound_ms(p.l, p.slice_ms, cost, priced) <= full->iteration_ms);
      CHECK(sp::device_lower_bound_ms(p.l, p.slice_ms, cost, priced) <= full->iteration_ms);
      priced.stop_after_ms = full->iteration_ms * (1 + 1e-9);
      CHECK(sp::simulate(p.l, p.slice_ms, cost, 3, priced)->iteration_ms == full->iteration_ms);
      priced.stop_after_ms = full->iteration_ms * (1 - 1e-6);
      CHECK(std::isinf(sp::simulate(p.l, p.slice_ms, cost, 3, priced)->iteration_ms));
    }
  // A planned workload sharded and the same plan replicated, lowered three
  // ways, with random slice times.
  spindle::plan::testing::Fixture f("tiny-clip", "cpu-1x4");
  sp::Plan plan = f.plan();
  plan.optimizer_state = sp::OptimizerState::sharded;
  std::mt19937 rng(20270101);
  std::uniform_real_distribution<double> scale(0.05, 3.0);
  int gathers = 0, started = 0;
  for (sp::OptimizerState state : {sp::OptimizerState::sharded, sp::OptimizerState::replicated})
    for (int way = 0; way < 5; ++way) {
      // Ways 3 and 4: 0 and 1 with the values gathered after the step.
      INFO((state == sp::OptimizerState::sharded ? "sharded" : "replicated") << ", lowering " << way);
      plan.optimizer_state = state;
      plan.param_gather = way < 3 ? sp::ParamGather::next_step : sp::ParamGather::after_step;
      const bool gathered_early = way < 2;
      sp::LowerOptions lower_options;
      lower_options.sync = sp::GradSync{};
      lower_options.sync->overlap = way != 2;
      lower_options.sync->early_transfers = way % 3 == 0;
      plan.early_transfers = way % 3 == 0;
      auto lowered = sp::lower(plan, f.model, f.graph, lower_options);
      REQUIRE(lowered.ok());
      CHECK(lowered->sharded_state == (state == sp::OptimizerState::sharded));
      // An all-gather per bucket and member: with overlap started as the
      // programs open (allgather_start), else blocking after the step.
      int here = 0, starts = 0;
      for (const sp::Program& prog : lowered->programs)
        for (const sp::Instr& in : prog.instrs) {
          here += in.kind == sp::InstrKind::allgather || in.kind == sp::InstrKind::allgather_start;
          starts += in.kind == sp::InstrKind::allgather_start;
        }
      CHECK((here > 0) == lowered->sharded_state);
      CHECK(starts == (gathered_early ? here : 0));
      gathers += here;
      started += starts;
      for (int trial = 0; trial < 3; ++trial) {
        std::vector<double> slice_ms = sp::lowered_slice_ms(plan);
        if (trial > 0)
          for (double& ms : slice_ms) ms *= scale(rng);
        sp::SimOptions events;
        events.price_communication = false;
        events.price_optimizer = trial != 1;
        events.sync = lower_options.sync;
        one_pass_equals_events(*lowered, slice_ms, *f.cost, f.cluster.devices_per_island, events);
        // Priced, a bounded run stops exactly when the makespan passes its bound.
        sp::SimOptions priced;
        priced.timeline = false;
        priced.sync = lower_options.sync;
        auto full = sp::simulate(*lowered, slice_ms, *f.cost, f.cluster.devices_per_island, priced);
        REQUIRE(full.ok());
        CHECK(sp::program_lower_bound_ms(*lowered, slice_ms, *f.cost, priced) <= full->iteration_ms);
        CHECK(sp::device_lower_bound_ms(*lowered, slice_ms, *f.cost, priced) <= full->iteration_ms);
        priced.stop_after_ms = full->iteration_ms * (1 + 1e-9);
        CHECK(sp::simulate(*lowered, slice_ms, *f.cost, f.cluster.devices_per_island, priced)->iteration_ms ==
              full->iteration_ms);
        priced.stop_after_ms = full->iteration_ms * (1 - 1e-6);
        CHECK(std::isinf(sp::simulate(*lowered, slice_ms, *f.cost, f.cluster.devices_per_island, priced)->iteration_ms));
      }
    }
  CHECK(gathers > 0);
  CHECK(started > 0);
}

TEST_CASE("sharded optimizer state: the timeline shows each bucket's all-gather with its bytes", "[sim]") {
  spindle::plan::testing::Fixture f("tiny-clip", "cpu-1x4");
  sp::Plan plan = f.plan();
  plan.optimizer_state = sp::OptimizerState::sharded;
  for (int way = 0; way < 3; ++way) {
    const bool overlap = way < 2, early = way == 0;   // early: the values gathered at the step's start
    plan.param_gather = early ? sp::ParamGather::next_step : sp::ParamGather::after_step;
    INFO((overlap ? "overlapped" : "blocking") << (early ? ", gathered at the start" : ""));
    sp::SimOptions options;
    options.sync = sp::planned_sync(plan);
    options.sync->overlap = overlap;
    options.critical_path = true;
    sp::LowerOptions lower_options;
    lower_options.sync = options.sync;
    auto lowered = sp::lower(plan, f.model, f.graph, lower_options);
    REQUIRE(lowered.ok());
    REQUIRE(lowered->sharded_state);
    REQUIRE_FALSE(lowered->buckets.empty());
    auto sim = sp::simulate_plan(plan, f.model, f.graph, *f.cost, options);
    REQUIRE(sim.ok());
    // One all-gather box per bucket on each of its devices: its bytes, its
    // group, and at least the ring all-gather's time.
    size_t expected = 0;
    for (const sp::Bucket& b : lowered->buckets) expected += b.devices.size();
    size_t shown = 0;
    std::vector<double> gathered(static_cast<size_t>(plan.devices), 0.0);
    for (const sp::SimBox& b : sim->boxes) {
      if (b.cat != "allgather") continue;
      ++shown;
      REQUIRE(b.bucket >= 0);
      const sp::Bucket& k = lowered->buckets[static_cast<size_t>(b.bucket)];
      const sp::Instr& in = lowered->programs[static_cast<size_t>(b.device)].instrs[static_cast<size_t>(b.instr)];
      CHECK(in.kind == (early ? sp::InstrKind::allgather_start : sp::InstrKind::allgather));
      CHECK(in.bucket == b.bucket);
      CHECK(b.track == sp::SimTrack::communication);
      CHECK(b.sent_bytes == lowered->gather_bytes(b.bucket));
      CHECK(b.sent_bytes > 0);
      CHECK(std::binary_search(k.devices.begin(), k.devices.end(), b.device));
      CHECK(b.name == "all-gather bucket " + std::to_string(b.bucket) + " (" + std::to_string(k.devices.size()) +
                          " devices)");
      CHECK(b.dur_ms == Approx(f.cost->allgather_ms(static_cast<double>(b.sent_bytes), k.devices)));
      gathered[static_cast<size_t>(b.device)] += static_cast<double>(b.sent_bytes);
    }
    CHECK(shown == expected);
    for (int d = 0; d < plan.devices; ++d)
      CHECK(gathered[static_cast<size_t>(d)] == static_cast<double>(lowered->bytes(d).gathered));
    // The path's parts add up to the makespan, the all-gathers in sync.
    const sp::SimPath& path = sim->critical;
    CHECK(path.compute_ms + path.transfer_ms + path.sync_ms == Approx(sim->iteration_ms).epsilon(1e-9));
    for (const sp::SimDevice& d : sim->devices) CHECK(d.busy_ms() <= sim->iteration_ms * (1 + 1e-9));
    // Replicated: no all-gather box; the same plan otherwise.
    sp::Plan replicated = plan;
    replicated.optimizer_state = sp::OptimizerState::replicated;
    auto rep = sp::simulate_plan(replicated, f.model, f.graph, *f.cost, options);
    REQUIRE(rep.ok());
    CHECK(std::none_of(rep->boxes.begin(), rep->boxes.end(), [](const sp::SimBox& b) { return b.cat == "allgather"; }));
  }
}

TEST_CASE("a device runs one all-reduce at a time, and a complete group does not wait behind an incomplete one", "[sim]") {
  // The programs of the case above, but both buckets start after the
  // backward of s2 (at 7): k2 runs 7-8, then k1 8-10 (not 7-9 beside it);
  // the backward of s1 ends at 9 and the wait for k1 blocks 9-10.
  const Programs p = two_buckets(Reduce::both_early);
  const sp::Simulation sim = p.run(hand_cluster(1, 2));
  CHECK(sim.iteration_ms == Approx(10.0));
  CHECK(box(sim, 0, 3, "allreduce").start_ms == Approx(7.0));
  CHECK(box(sim, 0, 4, "allreduce").start_ms == Approx(8.0));
  CHECK(box(sim, 0, 4, "allreduce").dur_ms == Approx(2.0));
  for (const sp::SimDevice& d : sim.devices) {
    CHECK(d.sync_ms == Approx(1.0));          // k1 after the last backward, 9-10
    CHECK(d.hidden_sync_ms == Approx(2.0));   // k2 and the first ms of k1
  }
  // The bound: compute 9; forward 3 plus both all-reduces 3.
  const sp::Cluster one = hand_cluster(1, 2);
  const sp::TableCostModel cost(one);
  CHECK(sp::device_lower_bound_ms(p.l, p.slice_ms, cost) == Approx(9.0));

  // Across groups: d0 starts X (with d1) and then Y (with d2) at 3, as d2
  // starts Y. Y's group is complete at 3: it runs 3-4, not behind X, whose
  // group completes when d1 starts it at 9: X runs 9-10. Each all-reduce:
  // 1e6 bytes over 2 devices at 1 GB/s, 1 ms.
  const sp::Simulation qsim = two_groups({3.0, 9.0, 3.0}, 1'000'000, 1'000'000).run(hand_cluster(1, 3));
  CHECK(qsim.iteration_ms == Approx(10.0));
  CHECK(box(qsim, 0, 2, "allreduce").start_ms == Approx(9.0));
  CHECK(box(qsim, 0, 3, "allreduce").start_ms == Approx(3.0));
  CHECK(qsim.devices[2].finish_ms == Approx(4.0));
  CHECK(qsim.devices[2].sync_ms == Approx(1.0));   // Y, 3-4, waited for from 3
  CHECK(qsim.devices[0].wait_ms == Approx(6.0));   // in X's wait 3-9: its group incomplete
  CHECK(qsim.devices[0].hidden_sync_ms == Approx(1.0));   // Y ran 3-4, while d0 waited for X
  // Y's group complete at 3 but d0 busy with X (started at 2, 2e6 bytes:
  // 2 ms, with d1): Y waits for d0, 4-5.
  const sp::Simulation zsim = two_groups({2.0, 2.0, 3.0}, 2'000'000, 1'000'000).run(hand_cluster(1, 3));
  CHECK(box(zsim, 0, 2, "allreduce").start_ms == Approx(2.0));
  CHECK(box(zsim, 0, 3, "allreduce").start_ms == Approx(4.0));
  CHECK(zsim.iteration_ms == Approx(5.0));
}

TEST_CASE("software overhead: packing before, unpacking after an exchange, an all-reduce fixed cost", "[sim]") {
  // The two-device program of the first case with overhead: 100 us per
  // exchange, 50 us per message, packing at 2 GB/s (2e6 bytes: 1 ms), 200 us
  // per all-reduce. Each exchange of one message: before it leaves, the
  // device spends 0.1 + 0.05 (+ 1 packing on the sender) ms; after the
  // message arrives, 1 ms unpacking on the receiver.
  //   d0: fwd A [0,1], exchange fwd: packs [1,2.15], wire [2.15,4.15];
  //   d1: exchange fwd: packs [0,0.15], waits, unpacks [4.15,5.15];
  //       fwd B [5.15,7.15], bwd B [7.15,11.15], exchange bwd: packs
  //       [11.15,12.30], wire [12.30,14.30]
  //   d0: exchange bwd: reached 4.15, packs [4.15,4.30], waits, unpacks
  //       [14.30,15.30]; bwd A [15.30,17.30]
  Programs p = one_transfer_each_way(false);
  sp::CommOverhead o;
  o.exchange_us = 100;
  o.message_us = 50;
  o.pack_gbytes_per_s = 2;
  o.allreduce_us = 200;
  const sp::Simulation sim = p.run(hand_cluster(1, 2), {}, o);
  CHECK(sim.iteration_ms == Approx(17.3));
  CHECK(box(sim, 0, 1, "exchange").dur_ms == Approx(3.15));   // [1, 4.15]
  CHECK(box(sim, 1, 0, "exchange").dur_ms == Approx(5.15));   // [0, 5.15]
  CHECK(box(sim, 1, 1, "forward").start_ms == Approx(5.15));
  CHECK(sim.messages[0].ready_ms == Approx(2.15));
  CHECK(sim.messages[1].start_ms == Approx(12.3));
  // Transfer = software + wire: d0 1.15 + 2 (fwd) + 0.15 + 2 + 1 (bwd).
  CHECK(sim.devices[0].transfer_ms == Approx(6.3));
  // d1: 0.15 + 2 + 1 (fwd) + 1.15 + 2 (bwd).
  CHECK(sim.devices[1].transfer_ms == Approx(6.3));
  CHECK(sim.devices[1].wait_ms == Approx(2.0));   // [0.15, 2.15]: device 0 still computes and packs
  // Without communication pricing the overhead is not priced either.
  sp::SimOptions no_comm;
  no_comm.price_communication = false;
  CHECK(p.run(hand_cluster(1, 2), no_comm, o).iteration_ms == Approx(9.0));

  // All-reduce of 1e6 bytes over two devices: ring 1 ms + 0.2 ms fixed =
  // 1.2 ms (the gradients are views of the bucket's buffer: no copies).
  const sp::Simulation ar = one_bucket({3.0, 3.0}, false).run(hand_cluster(1, 2), {}, o);
  CHECK(ar.devices[0].sync_ms == Approx(1.2));
  CHECK(ar.iteration_ms == Approx(4.2));
}

TEST_CASE("messages share links: an island's uplink and a device's inbound link serialise", "[sim]") {
  // Islands {0,1} and {2,3}. Two messages of 1e6 bytes, each 2 ms across islands.
  auto two_messages = [](int s0, int d0, int s1, int d1) {
    Programs p(4);
    const int t0 = p.transfer(sp::Direction::forward, 0, s0, d0, 1'000'000);
    const int t1 = p.transfer(sp::Direction::forward, 0, s1, d1, 1'000'000);
    for (int d = 0; d < 4; ++d) {
      std::vector<int> mine;
      for (int t : {t0, t1})
        if (p.l.transfers[static_cast<size_t>(t)].src == d || p.l.transfers[static_cast<size_t>(t)].dst == d)
          mine.push_back(t);
      if (!mine.empty()) p.exchange(d, sp::Direction::forward, 0, mine);
      p.optimizer(d);
    }
    return p;
  };
  // 0 -> 2 and 1 -> 3 share island 0's uplink: one after the other, 4 ms;
  // the first ready (ties: lower source device) goes first.
  const sp::Simulation up = two_messages(0, 2, 1, 3).run(hand_cluster(2, 2));
  CHECK(up.iteration_ms == Approx(4.0));
  REQUIRE(up.messages.size() == 2);
  CHECK(up.messages[0].transfer == 0);
  CHECK(up.messages[0].end_ms == Approx(2.0));
  CHECK(up.messages[1].start_ms == Approx(2.0));
  CHECK(up.devices[3].wait_ms == Approx(2.0));
  CHECK(up.devices[3].transfer_ms == Approx(2.0));
  // 0 -> 2 and 3 -> 1 cross in opposite directions: no shared link, 2 ms.
  CHECK(two_messages(0, 2, 3, 1).run(hand_cluster(2, 2)).iteration_ms == Approx(2.0));
  // Inside one island of 4: 0 -> 1 and 2 -> 3 in parallel (1 ms), 0 -> 2 and 1 -> 2 into one device serialise (2 ms).
  CHECK(two_messages(0, 1, 2, 3).run(hand_cluster(1, 4)).iteration_ms == Approx(1.0));
  CHECK(two_messages(0, 2, 1, 2).run(hand_cluster(1, 4)).iteration_ms == Approx(2.0));
}

TEST_CASE("programs that cannot finish are an error, not a hang", "[sim]") {
  Programs p(2);
  const int k = p.bucket({0, 1}, 1000);
  p.allreduce(0, k);   // device 1 never joins
  p.optimizer(0);
  p.optimizer(1);
  const sp::TableCostModel cost(hand_cluster(1, 2));
  auto sim = sp::simulate(p.l, p.slice_ms, cost, 2);
  REQUIRE_FALSE(sim.ok());
  CHECK(sim.error().message.find("device 0 never finishes instruction 0") != std::string::npos);
  auto wrong = sp::simulate(p.l, {1.0}, cost, 2);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().message.find("slice times") != std::string::npos);
  // The one-pass makespan of compute alone (no timeline, communication
  // at 0) says the same.
  sp::SimOptions lean;
  lean.timeline = false;
  lean.price_communication = false;
  auto one_pass = sp::simulate(p.l, p.slice_ms, cost, 2, lean);
  REQUIRE_FALSE(one_pass.ok());
  CHECK(one_pass.error().message == sim.error().message);
  // An all-gather device 0 waits in for ever: named so, both ways.
  Programs q(2);
  q.l.sharded_state = true;
  const int g = q.bucket({0, 1}, 1000);
  q.l.buckets[static_cast<size_t>(g)].values = 250;
  q.gather(0, g);
  q.optimizer(1);
  auto gathered = sp::simulate(q.l, q.slice_ms, cost, 2);
  REQUIRE_FALSE(gathered.ok());
  CHECK(gathered.error().message.find("device 0 never finishes instruction 0 (all-gather of bucket 0)") !=
        std::string::npos);
  auto gathered_one_pass = sp::simulate(q.l, q.slice_ms, cost, 2, lean);
  REQUIRE_FALSE(gathered_one_pass.ok());
  CHECK(gathered_one_pass.error().message == gathered.error().message);
}

TEST_CASE("trace JSON: a box's end is rounded as the next box's start is, so boxes that meet still meet", "[sim]") {
  // 1171.4006 + 582.6466 = 1754.0472: ts and dur rounded apart (1171.401,
  // 582.647) ended at 1754.048, past the next start, 1754.047 (viewers nest
  // such boxes).
  const std::vector<sp::TraceEvent> ev = {{"a", "compute", 0, 0, 1171.4006, 582.6466, {}},
                                          {"b", "compute", 0, 0, 1171.4006 + 582.6466, 10.0, {}}};
  const nlohmann::json j = nlohmann::json::parse(sp::trace_to_json(ev, 1));
  std::vector<nlohmann::json> boxes;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") boxes.push_back(e);
  REQUIRE(boxes.size() == 2);
  CHECK(boxes[0]["ts"].get<double>() == Approx(1171.401).margin(1e-9));
  CHECK(boxes[0]["dur"].get<double>() == Approx(582.646).margin(1e-9));
  CHECK(boxes[1]["ts"].get<double>() == Approx(1754.047).margin(1e-9));
  CHECK(boxes[0]["ts"].get<double>() + boxes[0]["dur"].get<double>() <= boxes[1]["ts"].get<double>() + 1e-9);
}

TEST_CASE("the simulated trace and utilisation show the simulated boxes", "[sim]") {
  spindle::plan::testing::Fixture f;
  const sp::Plan plan = f.plan();
  auto sim = sp::simulate_plan(plan, f.model, f.graph, *f.cost);
  REQUIRE(sim.ok());
  const std::vector<sp::TraceEvent> trace = sp::simulated_trace(*sim);
  CHECK(trace.size() == sim->boxes.size());
  int compute = 0, comm = 0;
  for (const sp::TraceEvent& e : trace) {
    (e.track == 0 ? compute : comm) += 1;
    CHECK((e.track == 0) == (e.cat == "compute"));
    CHECK(e.start_us + e.dur_us <= sim->iteration_ms * 1000 * (1 + 1e-9));
  }
  CHECK(compute > 0);
  CHECK(comm > 0);
  const sp::Utilisation u = sp::utilisation(*sim, plan, 50);
  CHECK(u.iteration_ms == sim->iteration_ms);
  CHECK(u.label == plan.strategy);
  double busy = 0;
  for (double b : u.busy) busy += b;
  CHECK(busy / 50 == Approx(sp::average_utilisation(*sim)));
  CHECK(sp::average_utilisation(*sim) > 0);
  CHECK(sp::average_utilisation(*sim) <= 1.0 + 1e-9);
}

TEST_CASE("a replay: measured compute times in place of the priced ones, communication simulated around them", "[sim]") {
  // one_transfer_each_way with optimizers; programs:
  //   d0: 0 fwd A, 1 exchange fwd, 2 exchange bwd, 3 bwd A, 4 optimizer
  //   d1: 0 exchange fwd, 1 fwd B, 2 bwd B, 3 exchange bwd, 4 optimizer
  Programs p = one_transfer_each_way(true);
  const sp::Cluster c = hand_cluster(1, 2);
  sp::SimOptions replay;
  replay.replay_ms = {{4.0, -1, -1, -1, -1}, {-1, -1, 3.0, -1, 0.5}};
  // d0: fwd A [0,4], sends [4,6], exchange bwd [6,13], bwd A [13,15].
  // d1: exchange fwd [0,6] (4 waiting), fwd B [6,8], bwd B [8,11],
  //     exchange bwd [11,13], optimizer [13,13.5].
  const sp::Simulation sim = p.run(c, replay);
  CHECK(sim.iteration_ms == Approx(15.0));
  CHECK(sim.devices[0].finish_ms == Approx(15.0));
  CHECK(sim.devices[1].finish_ms == Approx(13.5));
  CHECK(sim.devices[0].compute_ms == Approx(6.0));
  CHECK(sim.devices[1].compute_ms == Approx(5.5));
  CHECK(sim.devices[1].wait_ms == Approx(4.0));
  CHECK(box(sim, 1, 2, "backward").dur_ms == Approx(3.0));
  CHECK(box(sim, 1, 4, "optimizer").start_ms == Approx(13.0));
  // Every compute instruction replayed at its priced time: the same timeline.
  sp::SimOptions same;
  same.replay_ms = {{1.0, -1, -1, 2.0, 0.0}, {-1, 2.0, 4.0, -1, 0.0}};
  const sp::Simulation plain = p.run(c), again = p.run(c, same);
  REQUIRE(plain.boxes.size() == again.boxes.size());
  for (size_t i = 0; i < plain.boxes.size(); ++i) {
    CHECK(plain.boxes[i].start_ms == again.boxes[i].start_ms);
    CHECK(plain.boxes[i].dur_ms == again.boxes[i].dur_ms);
  }
  // Compute priced at 0 stays 0.
  sp::SimOptions no_compute = replay;
  no_compute.price_compute = false;
  CHECK(p.run(c, no_compute).iteration_ms == Approx(4.0));
  // What does not fit the programs is an error.
  sp::TableCostModel cost(c);
  const auto fails = [&](const sp::SimOptions& o) { return !sp::simulate(p.l, p.slice_ms, cost, 2, o).ok(); };
  sp::SimOptions short_list = replay, on_exchange = replay, bounded = replay, not_finite = replay;
  short_list.replay_ms[1].pop_back();
  on_exchange.replay_ms[0][1] = 1.0;
  bounded.stop_after_ms = 100;
  not_finite.replay_ms[0][0] = std::nan("");
  CHECK(fails(short_list));
  CHECK(fails(on_exchange));
  CHECK(fails(bounded));
  CHECK(fails(not_finite));
  sp::SimOptions one_device = replay;
  one_device.replay_ms.pop_back();
  CHECK(fails(one_device));

  // Device 0 starts its program 2 ms after the step's start (replay_start_ms):
  // d0: fwd A [2,6], sends [6,8], exchange bwd [8,15], bwd A [15,17].
  // d1: exchange fwd [0,8] (6 waiting), fwd B [8,10], bwd B [10,13],
  //     exchange bwd [13,15], optimizer [15,15.5].
  sp::SimOptions late = replay;
  late.replay_start_ms = {2.0, 0.0};
  const sp::Simulation shifted = p.run(c, late);
  CHECK(shifted.iteration_ms == Approx(17.0));
  CHECK(shifted.devices[0].finish_ms == Approx(17.0));
  CHECK(shifted.devices[1].finish_ms == Approx(15.5));
  CHECK(shifted.devices[1].wait_ms == Approx(6.0));
  CHECK(box(shifted, 0, 0, "forward").start_ms == Approx(2.0));
  CHECK(box(shifted, 1, 4, "optimizer").start_ms == Approx(15.0));
  // The same start in one pass (compute alone) as in the events.
  sp::SimOptions events = late, one_pass = late;
  events.price_communication = one_pass.price_communication = false;
  one_pass.timeline = false;
  // Messages free: d0 fwd A [2,6]; d1 fwd B [6,8], bwd B [8,11],
  // optimizer [11,11.5]; d0 bwd A [11,13].
  CHECK(p.run(c, events).iteration_ms == Approx(13.0));
  CHECK(p.run(c, one_pass).iteration_ms == p.run(c, events).iteration_ms);
  sp::SimOptions all_zero = replay;
  all_zero.replay_start_ms = {0.0, 0.0};
  CHECK(p.run(c, all_zero).iteration_ms == sim.iteration_ms);
  sp::SimOptions starts_short = late, starts_negative = late, starts_inf = late, starts_bounded = late;
  starts_short.replay_start_ms.pop_back();
  starts_negative.replay_start_ms[1] = -1.0;
  starts_inf.replay_start_ms[0] = std::numeric_limits<double>::infinity();
  starts_bounded.replay_ms.clear();
  starts_bounded.stop_after_ms = 100;
  CHECK(fails(starts_short));
  CHECK(fails(starts_negative));
  CHECK(fails(starts_inf));
  CHECK(fails(starts_bounded));
}

TEST_CASE("one lowering simulated under several options: each as simulate_plan gives it", "[sim]") {
  spindle::plan::testing::Fixture f;
  const sp::Plan plan = f.plan();
  auto context = sp::lower_context(f.model, f.graph);
  REQUIRE(context.ok());
  sp::SimOptions full, compute_only, stopped, other_sync;
  full.timeline = false;
  compute_only.timeline = false;
  compute_only.price_communication = false;
  compute_only.price_optimizer = false;
  stopped.stop_after_ms = 1e-6;   // below the device bound: no programs built
  other_sync.sync = sp::GradSync{};
  other_sync.sync->overlap = false;
  sp::PlanSimulation simulation(plan, *context, *f.cost, sp::GradSync{});
  // Stopped before the programs first, then the programs built once for
  // the others, in any order; each the same as its own simulate_plan.
  for (const sp::SimOptions* o : {&stopped, &full, &compute_only, &full, &stopped}) {
    auto once = simulation.simulate(*o);
    auto alone = sp::simulate_plan(plan, *context, *f.cost, *o);
    REQUIRE(once.ok());
    REQUIRE(alone.ok());
    CHECK(once->iteration_ms == alone->iteration_ms);
  }
  CHECK(std::isinf(simulation.simulate(stopped)->iteration_ms));
  auto with_timeline = simulation.simulate({});
  auto alone = sp::simulate_plan(plan, *context, *f.cost);
  REQUIRE(with_timeline.ok());
  REQUIRE(alone.ok());
  REQUIRE(with_timeline->boxes.size() == alone->boxes.size());
  for (size_t i = 0; i < alone->boxes.size(); ++i) {
    CHECK(with_timeline->boxes[i].start_ms == alone->boxes[i].start_ms);
    CHECK(with_timeline->boxes[i].name == alone->boxes[i].name);
  }
  // The lowering's gradient sync is fixed: other options are an error.
  CHECK_FALSE(simulation.simulate(other_sync).ok());
}

namespace {

// The longest chain of gradient buckets, ms: bucket b after bucket a when
// they share a device and a comes first (every device runs its all-reduces
// in bucket order and each waits for its whole group), each bucket its
// all-reduce and, with sharded optimizer state, its all-gather. Once every
// device has finished its backward, the collectives take at most this long.
double longest_bucket_chain_ms(const sp::Lowered& l, const sp::CostModel& cost) {
  std::vector<double> end(l.buckets.size(), 0.0);
  double longest = 0;
  for (size_t b = 0; b < l.buckets.size(); ++b) {
    double start = 0;
    for (size_t a = 0; a < b; ++a) {
      const auto& x = l.buckets[a].devices;
      const auto& y = l.buckets[b].devices;
      std::vector<int> common;
      std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(common));
      if (!common.empty()) start = std::max(start, end[a]);
    }
    end[b] = start + cost.allreduce_ms(static_cast<double>(l.buckets[b].bytes), l.buckets[b].devices);
    if (l.sharded_state)
      end[b] += cost.allgather_ms(static_cast<double>(l.gather_bytes(static_cast<int>(b))), l.buckets[b].devices);
    longest = std::max(longest, end[b]);
  }
  return longest;
}

// The most the optimizer steps can delay the end of `l`'s programs with
// communication priced at 0 (memory at `gbytes_per_s`): every step comes
// after the device's backward, its exchanges and its all-reduce starts, so
// a delay passes from one device to another only through a blocking
// all-gather (sharded state without overlap; with overlap the all-gathers
// open the programs, before any step, and run_to finds none), which waits
// for its group's most delayed member. Each
// device's steps and all-gathers in program order, the all-gathers in
// the one global bucket order: bucket by bucket, each member's steps
// before the bucket's all-gather, then the group's largest delay, and
// what is left after its last all-gather. Replicated: each device's
// steps summed, the largest.
double steps_delay_ms(const sp::Lowered& l, double gbytes_per_s) {
  std::vector<double> delay(static_cast<size_t>(l.devices), 0.0);
  std::vector<size_t> pc(static_cast<size_t>(l.devices), 0);
  // Device d's steps up to (not past) its all-gather of bucket b; b < 0: all that is left.
  auto run_to = [&](int d, int b) {
    const std::vector<sp::Instr>& instrs = l.programs[static_cast<size_t>(d)].instrs;
    size_t& i = pc[static_cast<size_t>(d)];
    for (; i < instrs.size(); ++i) {
      const sp::Instr& in = instrs[i];
      if (in.kind == sp::InstrKind::allgather && in.bucket == b) return;
      if (in.kind == sp::InstrKind::optimizer) delay[static_cast<size_t>(d)] += sp::optimizer_ms(in.values, gbytes_per_s);
    }
  };
  if (l.sharded_state)
    for (size_t b = 0; b < l.buckets.size(); ++b) {
      double most = 0;
      for (int m : l.buckets[b].devices) {
        run_to(m, static_cast<int>(b));
        most = std::max(most, delay[static_cast<size_t>(m)]);
      }
      for (int m : l.buckets[b].devices) delay[static_cast<size_t>(m)] = most;
    }
  double most = 0;
  for (int d = 0; d < l.devices; ++d) {
    run_to(d, -1);
    most = std::max(most, delay[static_cast<size_t>(d)]);
  }
  return most;
}

struct Workload {
  std::string model_name, cluster_name;
  sp::Model model;
  sp::Cluster cluster;
  sp::Profile profile;
  sp::OpGraph graph;
  std::unique_ptr<sp::ProfileCostModel> cost;
};

// Every shipped workload: profiles/MODEL.CLUSTER.json with its model and
// cluster, by file name (under the sanitizers, those that
// profile_left_out_when_sanitized keeps).
std::vector<Workload> shipped_workloads() {
  const fs::path root = SPINDLE_SOURCE_DIR;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(root / "profiles"))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::vector<Workload> out;
  for (const fs::path& path : files) {
    Workload w;
    const std::string stem = path.stem().string();
    w.model_name = stem.substr(0, stem.find('.'));
    w.cluster_name = stem.substr(stem.find('.') + 1);
    if (sp::testing::profile_left_out_when_sanitized(w.model_name, w.cluster_name)) continue;
    w.model = sp::load_model((root / "configs/models" / (w.model_name + ".yaml")).string()).value();
    w.cluster = sp::load_cluster((root / "configs/clusters" / (w.cluster_name + ".yaml")).string()).value();
    w.profile = sp::load_profile(path.string()).value();
    w.graph = sp::expand(w.model);
    w.cost = std::move(sp::ProfileCostModel::create(w.profile, w.cluster, w.graph).value());
    out.push_back(std::move(w));
  }
  return out;
}

constexpr sp::Strategy kStrategies[] = {sp::Strategy::sequential, sp::Strategy::task_level,
                                        sp::Strategy::intra_task, sp::Strategy::spindle};

}  // namespace

// Every shipped workload, every strategy (docs/simulation.md, "Against the
// wave-barrier prediction"):
//  - every device's busy time is at most the makespan;
//  - the same inputs simulate to the same result;
//  - with communication and optimizer steps priced at zero the makespan is at most the barrier
//    compute time (sum of wave.ms: a device's wave w cannot start later than
//    all waves before it have ended) and, for the paper's workloads, at least
//    the relaxed optimum (the tiny models, with few operators per level, can
//    overlap levels without barriers and go below this per-level bound);
//  - pricing the optimizer steps (the analytic profile's rate: the device's
//    memory bandwidth) delays the makespan by at most one device's steps;
//  - the makespan is at most kSlack x (barrier compute + transfers at the wire
//    width + the longest chain of bucket all-reduces): the programs move fp32
//    where the barrier model prices the model dtype, and run their
//    all-reduces one bucket after another, each waiting for its whole group.
TEST_CASE("simulations of every shipped workload: bounds and determinism", "[sim][shipped]") {
  constexpr double kSlack = 1.10;
  int simulated = 0, when_ready = 0, late = 0, sharded = 0;
  for (const Workload& w : shipped_workloads()) {
    const double wire = static_cast<double>(sp::kWireBytesPerValue) / sp::dtype_bytes(w.model.dtype);
    for (sp::Strategy s : kStrategies) {
      INFO(w.model_name << " on " << w.cluster_name << ", " << sp::strategy_name(s));
      sp::PlanRequest request{&w.model, &w.graph, &w.cluster, w.cost.get(), w.profile.sha256, s};
      // Shifted plans too, with a few shifts (test_shift.cpp plans with
      // the default): every workload and strategy, so this test is one of
      // the longest under the sanitizers.
      request.shift_simulations = 8;
      sp::testing::first_search_when_sanitized(request);
      auto plan = sp::make_plan(request);
      if (!plan) continue;   // a baseline may have no valid plan on a cluster
      auto sim = sp::simulate_plan(*plan, w.model, w.graph, *w.cost);
      REQUIRE(sim.ok());
      const sp::Predicted& p = plan->predicted;
      const double m = sim->iteration_ms;
      INFO("simulated " << m << " ms, predicted " << p.iteration_ms << " ms");
      CHECK(m == p.simulated_ms);   // the planner's figure is this simulation
      // Its bucket starts (Plan::bucket_starts) are the faster of the two.
      sp::Plan flipped = *plan;
      flipped.bucket_starts = sp::other_rule(plan->bucket_starts);
      auto other = sp::simulate_plan(flipped, w.model, w.graph, *w.cost);
      REQUIRE(other.ok());
      CHECK(other->iteration_ms >= m * (1 - 1e-12));
      if (plan->bucket_starts == sp::BucketStarts::when_ready) ++when_ready;
      // And its transfers (Plan::early_transfers): the faster way too.
      sp::Plan moved = *plan;
      moved.early_transfers = !plan->early_transfers;
      auto elsewhere = sp::simulate_plan(moved, w.model, w.graph, *w.cost);
      REQUIRE(elsewhere.ok());
      CHECK(elsewhere->iteration_ms >= m * (1 - 1e-12));
      if (!plan->early_transfers) ++late;
      // And, sharded, where it gathers the values (Plan::param_gather).
      if (plan->optimizer_state == sp::OptimizerState::sharded) {
        sp::Plan regathered = *plan;
        regathered.param_gather = plan->param_gather == sp::ParamGather::next_step ? sp::ParamGather::after_step
                                                                                   : sp::ParamGather::next_step;
        auto gathered = sp::simulate_plan(regathered, w.model, w.graph, *w.cost);
        REQUIRE(gathered.ok());
        CHECK(gathered->iteration_ms >= m * (1 - 1e-12));
        ++sharded;
      }
      for (const sp::SimDevice& d : sim->devices) {
        CHECK(d.busy_ms() <= m * (1 + 1e-9));
        CHECK(d.finish_ms <= m);
        CHECK(d.wait_ms >= -1e-9 * m);
      }
      auto lowered = sp::lower(*plan, w.model, w.graph);
      REQUIRE(lowered.ok());
      const double chain = longest_bucket_chain_ms(*lowered, *w.cost);
      CHECK(m <= kSlack * (p.compute_ms + wire * p.transfer_ms + chain));

      // The per-device bound is one (compute and own all-reduces run one
      // after another), and a bounded simulation stops exactly when the
      // makespan passes its bound, before or after building the programs.
      const double bound = sp::device_lower_bound_ms(*lowered, sp::lowered_slice_ms(*plan), *w.cost);
      CHECK(bound <= m);
      CHECK(bound > 0);
      // The programs' bound (what a bounded simulation stops on) is one too,
      // and at least the per-device one.
      const double from_programs = sp::program_lower_bound_ms(*lowered, sp::lowered_slice_ms(*plan), *w.cost);
      CHECK(from_programs <= m);
      CHECK(from_programs >= bound * (1 - 1e-9));
      sp::SimOptions bounded;
      bounded.timeline = false;
      bounded.stop_after_ms = m * (1 + 1e-9);
      auto kept = sp::simulate_plan(*plan, w.model, w.graph, *w.cost, bounded);
      REQUIRE(kept.ok());
      CHECK(kept->iteration_ms == m);
      for (double stop : {m * (1 - 1e-6), bound * (1 - 1e-6), bound * 0.5}) {
        bounded.stop_after_ms = stop;
        auto stopped = sp::simulate_plan(*plan, w.model, w.graph, *w.cost, bounded);
        REQUIRE(stopped.ok());
        CHECK(std::isinf(stopped->iteration_ms));
      }
      // It stops early once a device's compute left, or its all-reduces
      // not yet begun, would end past the bound; never one that would
      // finish by it: bounds either side of the makespan.
      for (int k = 0; k <= 8; ++k) {
        bounded.stop_after_ms = m * (0.96 + 0.01 * k);
        auto r = sp::simulate_plan(*plan, w.model, w.graph, *w.cost, bounded);
        REQUIRE(r.ok());
        if (m <= bounded.stop_after_ms) CHECK(r->iteration_ms == m);
        else CHECK(std::isinf(r->iteration_ms));
      }

      auto again = sp::simulate_plan(*plan, w.model, w.graph, *w.cost);
      REQUIRE(again.ok());
      CHECK(again->iteration_ms == m);
      REQUIRE(again->boxes.size() == sim->boxes.size());
      bool same = true;
      for (size_t i = 0; i < sim->boxes.size(); ++i)
        same = same && again->boxes[i].start_ms == sim->boxes[i].start_ms &&
               again->boxes[i].dur_ms == sim->boxes[i].dur_ms && again->boxes[i].name == sim->boxes[i].name;
      CHECK(same);

      sp::SimOptions compute_only;
      compute_only.price_communication = false;
      compute_only.price_optimizer = false;
      auto c = sp::simulate_plan(*plan, w.model, w.graph, *w.cost, compute_only);
      REQUIRE(c.ok());
      CHECK(c->iteration_ms <= p.compute_ms * (1 + 1e-9));
      if (w.model_name.rfind("tiny-", 0) != 0) CHECK(c->iteration_ms >= p.relaxed_optimum_ms * (1 - 1e-9));
      // The optimizer steps come after every device's backward and its
      // all-reduces have begun: replicated, they delay their own device
      // alone, by at most its steps' time (28 bytes per value at the
      // profile's rate); sharded, a bucket's all-gather after its step
      // passes the slowest member's delay on to its group
      // (steps_delay_ms).
      compute_only.price_optimizer = true;
      auto stepped = sp::simulate_plan(*plan, w.model, w.graph, *w.cost, compute_only);
      REQUIRE(stepped.ok());
      const double most_steps = steps_delay_ms(*lowered, w.cluster.memory_gbytes_per_s);
      CHECK(most_steps > 0);
      CHECK(stepped->iteration_ms >= c->iteration_ms);
      CHECK(stepped->iteration_ms <= (c->iteration_ms + most_steps) * (1 + 1e-9));
      ++simulated;
    }
  }
  CHECK(simulated >= (sp::testing::sanitized_run() ? 50 : 100));
  CHECK(when_ready > 0);   // each choice is made both ways among them
  CHECK(when_ready < simulated);
  CHECK(late > 0);
  CHECK(late < simulated);
  CHECK(sharded > 0);   // auto shards some (does not fit, or faster so)
}

// The figures of docs/simulation.md: simulated against predicted, every
// shipped workload and strategy (hidden: build/test/test_sim "[.figures]").
TEST_CASE("simulated and predicted iteration of every shipped workload", "[.figures]") {
  std::printf("%-18s %-9s %-10s %10s %10s %8s %10s %10s %10s\n", "model", "cluster", "strategy", "predicted",
              "simulated", "change", "compute", "sim_comm0", "relaxed");
  for (const Workload& w : shipped_workloads())
    for (sp::Strategy s : kStrategies) {
      auto plan = sp::make_plan({&w.model, &w.graph, &w.cluster, w.cost.get(), w.profile.sha256, s});
      if (!plan) continue;
      auto sim = sp::simulate_plan(*plan, w.model, w.graph, *w.cost);
      sp::SimOptions compute_only;
      compute_only.price_communication = false;
      auto c = sp::simulate_plan(*plan, w.model, w.graph, *w.cost, compute_only);
      REQUIRE(sim.ok());
      REQUIRE(c.ok());
      const sp::Predicted& p = plan->predicted;
      std::printf("%-18s %-9s %-10s %10.3f %10.3f %+7.1f%% %10.3f %10.3f %10.3f\n", w.model_name.c_str(),
                  w.cluster_name.c_str(), sp::strategy_name(s), p.iteration_ms, sim->iteration_ms,
                  100 * (sim->iteration_ms / p.iteration_ms - 1), p.compute_ms, c->iteration_ms,
                  p.relaxed_optimum_ms);
    }
}

// A profile's measured forward shares (x-forward_share): each slice's
// forward and backward split its ms by its workload's share; workloads
// without one keep SimOptions::forward_share.
// With nothing but compute priced and no timeline, simulate() takes the
// makespan from one pass over the programs' dependencies (sim.cpp,
// run_zero_comm) instead of events; with a timeline it runs the events.
// The two agree to the bit, device by device, on every shipped workload's
// Spindle and sequential plans lowered three ways (gradient all-reduces
// overlapped with transfers posted early or in their exchanges, and
// blocking), each with its own slice times and with random ones and
// random forward shares, optimizer steps priced or not; and a bound stops
// the one pass exactly when the makespan passes it.
TEST_CASE("compute alone: the one-pass makespan equals the event simulation's, to the bit", "[sim][shipped]") {
  std::mt19937 rng(20261203);
  std::uniform_real_distribution<double> scale(0.05, 3.0), share(0.0, 1.0);
  int compared = 0;
  for (const Workload& w : shipped_workloads()) {
    for (sp::Strategy s : {sp::Strategy::spindle, sp::Strategy::sequential}) {
      sp::PlanRequest request{&w.model, &w.graph, &w.cluster, w.cost.get(), w.profile.sha256, s};
      request.shift_simulations = 0;
      sp::testing::first_search_when_sanitized(request);
      auto plan = sp::make_plan(request);
      if (!plan) continue;
      for (int way = 0; way < 3; ++way) {
        sp::LowerOptions lower_options;
        lower_options.sync = sp::GradSync{};
        lower_options.sync->overlap = way < 2;
        lower_options.sync->early_transfers = way == 0;
        plan->early_transfers = way == 0;
        auto lowered = sp::lower(*plan, w.model, w.graph, lower_options);
        REQUIRE(lowered.ok());
        for (int trial = 0; trial < 4; ++trial) {
          INFO(w.model_name << " on " << w.cluster_name << ", " << sp::strategy_name(s) << ", lowering " << way
                            << ", trial " << trial);
          std::vector<double> slice_ms = sp::lowered_slice_ms(*plan);
          sp::SimOptions events;
          events.price_communication = false;
          events.price_optimizer = trial % 2 == 1;
          events.sync = lower_options.sync;
          if (trial > 0) {
            for (double& ms : slice_ms) ms *= scale(rng);
            events.forward_share = share(rng);
          }
          auto [one_pass, b] = one_pass_equals_events(*lowered, slice_ms, *w.cost, w.cluster.devices_per_island, events);
          CHECK(b.iteration_ms > 0);
          one_pass.stop_after_ms = b.iteration_ms;
          auto at = sp::simulate(*lowered, slice_ms, *w.cost, w.cluster.devices_per_island, one_pass);
          REQUIRE(at.ok());
          CHECK(at->iteration_ms == b.iteration_ms);
          one_pass.stop_after_ms = b.iteration_ms * (1 - 1e-9);
          auto below = sp::simulate(*lowered, slice_ms, *w.cost, w.cluster.devices_per_island, one_pass);
          REQUIRE(below.ok());
          CHECK(std::isinf(below->iteration_ms));
          ++compared;
        }
      }
    }
  }
  CHECK(compared >= 300);
}

TEST_CASE("measured forward shares split each slice's time by its workload", "[sim]") {
  sp::testing::Fixture f("tiny-clip", "cpu-1x2");
  const sp::Plan plan = f.plan();
  const std::vector<double> slice_ms = sp::lowered_slice_ms(plan);
  CHECK_FALSE(f.cost->has_forward_shares());
  // Every workload but the transformer layers' at 0.9.
  for (const sp::PlanMetaOp& m : plan.metaops)
    if (m.workload.op != "transformer_layer") f.cost->set_forward_share(m.workload, 0.9);
  CHECK(f.cost->has_forward_shares());
  auto sim = sp::simulate_plan(plan, f.model, f.graph, *f.cost);
  REQUIRE(sim.ok());
  auto lowered = sp::lower(plan, f.model, f.graph);
  REQUIRE(lowered.ok());
  int boxes = 0, measured = 0;
  for (const sp::SimBox& b : sim->boxes) {
    if (b.cat != "forward" && b.cat != "backward") continue;
    const sp::LoweredSlice& s = lowered->slices[static_cast<size_t>(b.slice)];
    const bool layer = plan.metaops[static_cast<size_t>(s.metaop)].workload.op == "transformer_layer";
    const double share = layer ? 1.0 / 3.0 : 0.9;
    const double ms = slice_ms[static_cast<size_t>(b.slice)];
    CHECK(b.dur_ms == Approx(b.cat == "forward" ? share * ms : (1 - share) * ms).margin(1e-12));
    ++boxes;
    measured += !layer;
  }
  CHECK(boxes > 0);
  CHECK(measured > 0);
  CHECK(measured < boxes);
  // An explicit list wins; a wrong length or share is an error.
  sp::SimOptions even;
  even.slice_forward_share.assign(lowered->slices.size(), 0.5);
  auto halves = sp::simulate_plan(plan, f.model, f.graph, *f.cost, even);
  REQUIRE(halves.ok());
  for (const sp::SimBox& b : halves->boxes)
    if (b.cat == "forward" || b.cat == "backward")
      CHECK(b.dur_ms == Approx(0.5 * slice_ms[static_cast<size_t>(b.slice)]).margin(1e-12));
  sp::SimOptions short_list;
  short_list.slice_forward_share = {0.5};
  CHECK_FALSE(sp::simulate_plan(plan, f.model, f.graph, *f.cost, short_list).ok());
  even.slice_forward_share.back() = 1.5;
  CHECK_FALSE(sp::simulate_plan(plan, f.model, f.graph, *f.cost, even).ok());
  CHECK_THROWS_AS(f.cost->set_forward_share(plan.metaops.front().workload, -0.5), std::invalid_argument);
}

// The critical path (SimOptions::critical_path): with communication priced
// at zero the programs are a max-plus system, so a slice off the path
// shortened by a tenth leaves the makespan as it was, both in one pass and
// with events; and one on the path is there for a reason: every plan has
// one, and shortening all the path's slices shortens the makespan. Priced,
// the path's parts add up to the makespan.
TEST_CASE("the critical path: slices off it do not move the makespan", "[sim][shipped]") {
  int checked = 0, off = 0;
  for (const Workload& w : shipped_workloads()) {
    sp::PlanRequest request{&w.model, &w.graph, &w.cluster, w.cost.get(), w.profile.sha256, sp::Strategy::spindle};
    request.shift_simulations = 0;
    sp::testing::first_search_when_sanitized(request);
    auto plan = sp::make_plan(request);
    REQUIRE(plan.ok());
    auto lowered = sp::lower(*plan, w.model, w.graph);
    REQUIRE(lowered.ok());
    const std::vector<double> slice_ms = sp::lowered_slice_ms(*plan);
    for (bool timeline : {false, true}) {
      INFO(w.model_name << " on " << w.cluster_name << (timeline ? ", events" : ", one pass"));
      sp::SimOptions options;
      options.price_communication = false;
      options.timeline = timeline;
      options.critical_path = true;
      auto base = sp::simulate(*lowered, slice_ms, *w.cost, w.cluster.devices_per_island, options);
      REQUIRE(base.ok());
      REQUIRE(base->critical_slices.size() == slice_ms.size());
      std::vector<double> on_path = slice_ms;
      // Under the sanitizers, every fourth slice off the path (the same code, a quarter of the runs).
      const size_t stride = sp::testing::sanitized_run() ? 4 : 1;
      for (size_t i = 0; i < slice_ms.size(); ++i) {
        if (base->critical_slices[i]) {
          on_path[i] *= 0.9;
          continue;
        }
        if (i % stride != 0) continue;
        std::vector<double> shorter = slice_ms;
        shorter[i] *= 0.9;
        auto sim = sp::simulate(*lowered, shorter, *w.cost, w.cluster.devices_per_island, options);
        REQUIRE(sim.ok());
        CHECK(sim->iteration_ms == base->iteration_ms);
        ++off;
      }
      auto sim = sp::simulate(*lowered, on_path, *w.cost, w.cluster.devices_per_island, options);
      REQUIRE(sim.ok());
      CHECK(sim->iteration_ms < base->iteration_ms);
      ++checked;
    }
    // Priced: the path's parts add up to the makespan, and it ends on the last device.
    sp::SimOptions priced;
    priced.critical_path = true;
    auto sim = sp::simulate(*lowered, slice_ms, *w.cost, w.cluster.devices_per_island, priced);
    REQUIRE(sim.ok());
    const sp::SimPath& path = sim->critical;
    CHECK(path.compute_ms + path.transfer_ms + path.sync_ms == Approx(sim->iteration_ms).epsilon(1e-9));
    CHECK(path.compute_ms > 0);
    REQUIRE(path.device >= 0);
    CHECK(sim->devices[static_cast<size_t>(path.device)].finish_ms == sim->iteration_ms);
    CHECK(std::any_of(sim->boxes.begin(), sim->boxes.end(), [](const sp::SimBox& b) { return b.critical; }));
  }
  CHECK(checked >= 20);
  CHECK(off >= 100);
}
