// The executor's own overhead (libexec/profile/calibrate.h): which
// instructions are samples and what each carries, by hand; a calibration
// run on one rank; the refusals. Under mpirun -np 2, profile_checks.sh
// mpi-links checks that spindle-profile --measure writes the figures.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "libexec/comm/fake_comm.h"
#include "libexec/profile/calibrate.h"
#include "libplan/cost/analytic.h"
#include "libplan/cost/cost_model.h"
#include "libplan/lower/lower.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/plan/check.h"
#include "libplan/planner/planner.h"

namespace se = spindle::exec;
namespace sp = spindle::plan;

namespace {

std::string shipped(const std::string& rel) { return std::string(SPINDLE_SOURCE_DIR) + "/configs/" + rel; }

sp::Transfer hand_transfer(sp::Direction dir, int src, int dst, int64_t values) {
  sp::Transfer t;
  t.dir = dir;
  t.src = src;
  t.dst = dst;
  t.values = values;
  t.bytes = src == dst ? 0 : values * sp::kWireBytesPerValue;
  return t;
}

sp::Instr hand_instr(sp::InstrKind kind, sp::Direction dir, int begin, int end) {
  sp::Instr in;
  in.kind = kind;
  in.dir = dir;
  in.transfers_begin = begin;
  in.transfers_end = end;
  return in;
}

// A lowering of two devices with these instructions (no transfers).
sp::Lowered two_programs(std::vector<sp::Instr> device0, std::vector<sp::Instr> device1) {
  sp::Lowered l;
  l.devices = 2;
  l.programs = {sp::Program{0, {}, {}, {}}, sp::Program{1, {}, {}, {}}};
  l.programs[0].instrs = std::move(device0);
  l.programs[1].instrs = std::move(device1);
  return l;
}

}  // namespace

TEST_CASE("overhead_samples: the instructions that never wait for a peer with their messages and added bytes",
          "[profile][calibrate]") {
  // Device 0's program: a forward exchange of a local view (0), a post_send
  // of one message of 1000 values (1), a forward exchange that receives
  // (2: may wait, left out), a post_recv (3), a forward (4: not
  // communication), a backward exchange adding a local piece of 2500
  // values and sending one of 500 (5), a wait_sends (6: may wait).
  sp::Lowered l;
  l.devices = 2;
  l.transfers = {hand_transfer(sp::Direction::forward, 0, 0, 100), hand_transfer(sp::Direction::forward, 0, 1, 1000),
                 hand_transfer(sp::Direction::forward, 1, 0, 700), hand_transfer(sp::Direction::backward, 0, 0, 2500),
                 hand_transfer(sp::Direction::backward, 0, 1, 500)};
  sp::Program p{0, {}, {0, 1, 2, 2, 3, 4}, {}};
  p.instrs = {hand_instr(sp::InstrKind::exchange, sp::Direction::forward, 0, 1),
              hand_instr(sp::InstrKind::post_send, sp::Direction::forward, 1, 2),
              hand_instr(sp::InstrKind::exchange, sp::Direction::forward, 2, 3),
              hand_instr(sp::InstrKind::post_recv, sp::Direction::forward, 3, 4),
              hand_instr(sp::InstrKind::forward, sp::Direction::forward, 0, 0),
              hand_instr(sp::InstrKind::exchange, sp::Direction::backward, 4, 6),
              hand_instr(sp::InstrKind::wait_sends, sp::Direction::forward, 0, 0)};
  l.programs = {p, sp::Program{1, {}, {}, {}}};
  // Three steps; the medians are the middle values. Packing at 4 GB/s: the
  // post_send's 4000 bytes take 1 us, the exchange's 2000 bytes 0.5 us.
  const std::vector<std::vector<double>> steps = {{0.0010, 0.0030, 0.5, 0.0020, 1.0, 0.0090, 0.3},
                                                  {0.0008, 0.0050, 0.1, 0.0010, 1.0, 0.0070, 0.2},
                                                  {0.0012, 0.0040, 0.9, 0.0030, 1.0, 0.0080, 0.1}};
  sp::CommOverhead packing;
  packing.pack_gbytes_per_s = 4;
  const std::vector<se::OverheadSample> s = se::overhead_samples(l, 0, steps, packing);
  REQUIRE(s.size() == 4);
  CHECK(s[0].us == Approx(1.0));   // the local view: no message, nothing added
  CHECK(s[0].messages == 0);
  CHECK(s[0].accumulated_bytes == 0);
  CHECK(s[1].us == Approx(4.0 - 1.0));   // the post_send, less its packing
  CHECK(s[1].messages == 1);
  CHECK(s[2].us == Approx(2.0));   // the post_recv: its message is the exchange's
  CHECK(s[2].messages == 0);
  CHECK(s[3].us == Approx(8.0 - 0.5));   // the backward exchange
  CHECK(s[3].messages == 1);
  CHECK(s[3].accumulated_bytes == 2500 * sp::kWireBytesPerValue);   // the piece it keeps, not the one it sends
  CHECK(se::overhead_samples(l, 1, steps, packing).empty());
}

TEST_CASE("optimizer_rate_samples: the values a device's optimizer instructions step over their time, per step",
          "[profile][calibrate]") {
  // Device 0 steps 1000 values in a bucket's optimizer instruction (1) and
  // 500 in the whole-device one (3), around a forward (0) and an
  // all-reduce (2); device 1's program has no optimizer instruction.
  sp::Lowered l = two_programs({hand_instr(sp::InstrKind::forward, sp::Direction::forward, 0, 0),
                                 hand_instr(sp::InstrKind::optimizer, sp::Direction::backward, 0, 0),
                                 hand_instr(sp::InstrKind::allreduce, sp::Direction::backward, 0, 0),
                                 hand_instr(sp::InstrKind::optimizer, sp::Direction::backward, 0, 0)},
                                {hand_instr(sp::InstrKind::forward, sp::Direction::forward, 0, 0)});
  l.programs[0].instrs[1].values = 1000;
  l.programs[0].instrs[3].values = 500;
  // Step 1: the optimizer instructions take 0.004 + 0.003 ms: 1500 x 28
  // bytes in 7 us, 6 GB/s. Step 2: 0.010 + 0.011 ms, 2 GB/s. Step 3: no
  // time at all (a clock that did not move): no sample.
  const std::vector<std::vector<double>> steps = {
      {1.0, 0.004, 0.5, 0.003}, {1.0, 0.010, 0.5, 0.011}, {1.0, 0.0, 0.5, 0.0}};
  const std::vector<double> r = se::optimizer_rate_samples(l, 0, steps);
  REQUIRE(r.size() == 3);
  CHECK(r[0] == Approx(6.0));
  CHECK(r[1] == Approx(2.0));
  CHECK(r[2] == -1);
  // Nothing stepped: -1 in every step, as many as the steps.
  CHECK(se::optimizer_rate_samples(l, 1, steps) == std::vector<double>{-1, -1, -1});
}

TEST_CASE("compute_in_situ: a device's forward and backward instructions, median measured against simulated",
          "[profile][calibrate]") {
  // Device 0: a forward (0), an exchange (1), a backward (2), an optimizer
  // step (3); device 1: a forward (0). The simulation's boxes: device 0's
  // forward 2 ms and backward 4 ms, its exchange 1 ms (not compute), and
  // device 1's forward 3 ms.
  const sp::Lowered l = two_programs({hand_instr(sp::InstrKind::forward, sp::Direction::forward, 0, 0),
                                       hand_instr(sp::InstrKind::exchange, sp::Direction::forward, 0, 0),
                                       hand_instr(sp::InstrKind::backward, sp::Direction::backward, 0, 0),
                                       hand_instr(sp::InstrKind::optimizer, sp::Direction::backward, 0, 0)},
                                      {hand_instr(sp::InstrKind::forward, sp::Direction::forward, 0, 0)});
  auto box = [](int device, const char* cat, int instr, double ms) {
    sp::SimBox b;
    b.device = device;
    b.cat = cat;
    b.instr = instr;
    b.dur_ms = ms;
    return b;
  };
  sp::Simulation sim;
  sim.boxes = {box(0, "forward", 0, 2.0), box(0, "exchange", 1, 1.0), box(0, "backward", 2, 4.0),
               box(0, "optimizer", 3, 0.5), box(1, "forward", 0, 3.0)};
  // Three steps: device 0's forward 2.5, 2.2, 9.0 (median 2.5) and backward
  // 5.0, 4.4, 4.6 (median 4.6); the exchange and optimizer times count not.
  const std::vector<std::vector<double>> steps = {
      {2.5, 7.0, 5.0, 1.0}, {2.2, 7.0, 4.4, 1.0}, {9.0, 7.0, 4.6, 1.0}};
  const se::ComputeInSitu c = se::compute_in_situ(l, 0, steps, sim);
  CHECK(c.instructions == 2);
  CHECK(c.measured_ms == Approx(2.5 + 4.6));
  CHECK(c.profiled_ms == Approx(2.0 + 4.0));
  // Device 1's forward, from its own steps.
  const se::ComputeInSitu one = se::compute_in_situ(l, 1, {{3.3}, {3.6}, {3.0}}, sim);
  CHECK(one.instructions == 1);
  CHECK(one.measured_ms == Approx(3.3));
  CHECK(one.profiled_ms == Approx(3.0));
  // No step timed, or a box whose instruction is not compute in the
  // program (another lowering): left out.
  CHECK(se::compute_in_situ(l, 0, {}, sim).instructions == 0);
  sim.boxes = {box(0, "forward", 1, 2.0), box(0, "forward", 7, 2.0)};
  CHECK(se::compute_in_situ(l, 0, steps, sim).instructions == 0);
}

TEST_CASE("compute_scale_refusal: applied within 0.5-2x with no more ranks than cores, else why not",
          "[profile][calibrate]") {
  CHECK(se::compute_scale_refusal(1.12, 2, 2) == "");
  CHECK(se::compute_scale_refusal(0.5, 1, 16) == "");
  CHECK(se::compute_scale_refusal(2.0, 8, 8) == "");
  CHECK(se::compute_scale_refusal(1.12, 2, 0) == "");   // cores unknown: not held against it
  CHECK(se::compute_scale_refusal(0.49, 2, 2) == "outside 0.5-2x");
  CHECK(se::compute_scale_refusal(2.01, 2, 2) == "outside 0.5-2x");
  CHECK(se::compute_scale_refusal(1.65, 4, 2) ==
        "4 ranks share 2 cores here (how much slower a rank computes depends on the plan)");
  CHECK(se::compute_scale_refusal(-1, 2, 2) == "no forward or backward timed in a step");
}

TEST_CASE("calibrate_executor trains a plan on one rank and fits figures >= 0 and the plan must fit the ranks",
          "[profile][calibrate]") {
  auto model = sp::load_model(shipped("models/tiny-clip.yaml"));
  REQUIRE(model.ok());
  auto one = sp::load_cluster(shipped("clusters/cpu-1x1.yaml"));
  REQUIRE(one.ok());
  const sp::OpGraph graph = sp::expand(*model);
  auto profile = sp::analytic_profile(*model, graph, *one, nullptr);
  REQUIRE(profile.ok());
  auto cost = sp::ProfileCostModel::create(*profile, *one, graph);
  REQUIRE(cost.ok());
  auto plan = se::calibration_plan(*model, graph, *one, **cost, profile->sha256, 1);
  REQUIRE(plan.ok());
  se::SelfComm world;
  se::GroupComms groups;
  groups[{0}] = std::make_unique<se::SelfComm>();
  auto backend = se::make_backend("cpu");
  sp::CommOverhead packing;
  packing.pack_gbytes_per_s = 10;
  auto cal = se::calibrate_executor(*model, graph, *plan, world, std::move(groups), *backend, packing, **cost, 1.0);
  REQUIRE(cal.ok());
  CHECK(cal->steps == 5);   // a 1 ms budget: the fewest
  CHECK(cal->samples >= 2);
  CHECK(cal->fit.instruction_us >= 0);
  CHECK(cal->fit.message_us == 0);   // one rank sends nothing
  CHECK(cal->fit.accumulate_gbytes_per_s >= 0);
  CHECK(cal->allreduce.allreduce_us == -1);   // one device all-reduces nothing
  CHECK(cal->allreduce.intra_rate_scale == 0);
  // The one rank steps every parameter of the model in its optimizer
  // instructions: a rate from them, which no CPU reaches 10^4 GB/s with.
  CHECK(cal->optimizer_gbytes_per_s > 0);
  CHECK(cal->optimizer_gbytes_per_s < 1e4);
  // The operators in its steps against the analytic profile's times (a
  // CPU core is not the cluster file's device: any positive factor), from
  // every forward and backward instruction of the plan's one program.
  CHECK(cal->compute_scale > 0);
  CHECK(std::isfinite(cal->compute_scale));
  // (Lowered as spindle-run lowers the plan given no flag.)
  const sp::Result<sp::Lowered> lowered = sp::lower(*plan, *model, graph);
  REQUIRE(lowered.ok());
  int compute = 0;
  for (const sp::Instr& in : lowered->programs[0].instrs)
    compute += in.kind == sp::InstrKind::forward || in.kind == sp::InstrKind::backward;
  CHECK(compute > 0);
  CHECK(cal->compute_instructions == compute);
  // The same plan sharded (calibrate_zero1): trained, but no bucket of two
  // members to fit.
  se::GroupComms sharded_groups;
  sharded_groups[{0}] = std::make_unique<se::SelfComm>();
  const se::Zero1InSitu z = se::calibrate_zero1(*model, se::sharded_calibration_plan(*plan), world,
                                                std::move(sharded_groups), *backend, **cost, 1.0);
  CHECK(z.steps == 5);
  CHECK(z.reduce_scatter_us == -1);
  CHECK(z.allgather_us == -1);

  // Four devices' cluster, two ranks: a plan of it cannot run here.
  auto four = sp::load_cluster(shipped("clusters/cpu-1x4.yaml"));
  REQUIRE(four.ok());
  auto p4 = sp::analytic_profile(*model, graph, *four, nullptr);
  REQUIRE(p4.ok());
  auto cost4 = sp::ProfileCostModel::create(*p4, *four, graph);
  REQUIRE(cost4.ok());
  auto refused = se::calibration_plan(*model, graph, *four, **cost4, p4->sha256, 2);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message, Catch::Contains("the cluster has 4 devices and 2 ranks measure"));
}

namespace {

// Two islands of two devices: inside 4 GB/s and 2 us per ring step,
// across 1 GB/s and 10 us; copies at 10 GB/s; 20 us all-reduce fixed cost
// (as timed alone).
sp::TableCostModel hand_cost() {
  sp::Cluster c;
  c.islands = 2;
  c.devices_per_island = 2;
  c.intra_island = {4.0, 2.0};
  c.inter_island = {1.0, 10.0};
  sp::TableCostModel cost(c);
  sp::CommOverhead o;
  o.pack_gbytes_per_s = 10;
  o.allreduce_us = 20;
  cost.set_overhead(o);
  return cost;
}

sp::Bucket hand_bucket(std::vector<int> devices, int64_t bytes) {
  sp::Bucket b;
  b.devices = std::move(devices);
  b.bytes = bytes;
  return b;
}

}  // namespace

TEST_CASE("fit_executor_allreduce: the fixed cost beyond the formula or else the wire's rate in the buckets",
          "[profile][calibrate]") {
  sp::TableCostModel cost = hand_cost();
  sp::Lowered l;
  // 100 kB over 2 devices: 100 kB on the wire per device, 0.025 ms inside an
  // island; latency 2 x 2 us; no copies (the gradients are views of the
  // bucket's buffer). Priced 0.049 ms with the fixed cost, 0.029 ms without.
  l.buckets = {hand_bucket({0, 1}, 100000)};
  REQUIRE(cost.allreduce_ms(100000, {0, 1}) == Approx(0.049));

  SECTION("slower than the formula: the fixed cost, the link kept") {
    // Per step the least over the members: 0.058, 0.061, 0.059 (median 0.059).
    const std::vector<std::vector<std::vector<double>>> ms = {{{0.060}, {0.061}, {0.059}},
                                                              {{0.058}, {0.070}, {0.062}}};
    const se::AllreduceInSitu fit = se::fit_executor_allreduce(l, cost, 2, ms);
    CHECK(fit.allreduce_us == Approx(30.0));   // 0.059 - 0.029 ms
    CHECK(fit.intra_rate_scale == 0);
  }
  SECTION("faster than the formula with no fixed cost: fixed cost 0 and the wire's rate") {
    const std::vector<std::vector<std::vector<double>>> ms = {{{0.019}, {0.020}}, {{0.025}, {0.021}}};
    // Median of the least (0.019, 0.020) is 0.0195: 0.0195 - 0.004 = 0.0155
    // ms for 100 kB on the wire.
    const se::AllreduceInSitu fit = se::fit_executor_allreduce(l, cost, 2, ms);
    CHECK(fit.allreduce_us == 0);
    CHECK(4.0 * fit.intra_rate_scale == Approx(100000 / 0.0155 * 1e3 / 1e9));   // the link's 4 GB/s scaled
  }
  SECTION("a bucket across islands counts for the fixed cost, not for the rate inside an island") {
    // Across: latency 2 x 10 us, wire 0.1 ms at 1 GB/s: 0.12 ms without the
    // fixed cost; measured 0.10 (-20 us). Inside: 0.019 (-10 us). Median
    // -15 us: fixed cost 0, the rate from the first alone.
    l.buckets.push_back(hand_bucket({0, 2}, 100000));
    const std::vector<std::vector<std::vector<double>>> ms = {{{0.019, 0.10}}, {{0.030, -1}}, {{-1, 0.11}}};
    const se::AllreduceInSitu fit = se::fit_executor_allreduce(l, cost, 2, ms);
    CHECK(fit.allreduce_us == 0);
    CHECK(4.0 * fit.intra_rate_scale == Approx(100000 / 0.015 * 1e3 / 1e9));
    // Only across islands: the fixed cost 0, no rate.
    l.buckets.erase(l.buckets.begin());
    const std::vector<std::vector<std::vector<double>>> across = {{{0.10}}, {{-1}}, {{0.11}}};
    const se::AllreduceInSitu only = se::fit_executor_allreduce(l, cost, 2, across);
    CHECK(only.allreduce_us == 0);
    CHECK(only.intra_rate_scale == 0);
  }
  SECTION("no bucket with a time: -1") {
    const std::vector<std::vector<std::vector<double>>> none = {{{-1}}, {{-1}}};
    CHECK(se::fit_executor_allreduce(l, cost, 2, none).allreduce_us == -1);
    l.buckets.clear();
    CHECK(se::fit_executor_allreduce(l, cost, 2, {}).allreduce_us == -1);
  }
}

TEST_CASE("fit_executor_fixed_us: ZeRO-1's reduce-scatter and all-gather cost per call beyond their formula",
          "[profile][calibrate]") {
  // The all-reduce's fixed cost of 20 us stands for ZeRO-1's collectives
  // while their own figures are absent.
  sp::TableCostModel cost = hand_cost();
  sp::CommOverhead o = cost.overhead();
  sp::Lowered l;
  l.sharded_state = true;
  // 25001 values over 2 members: padded to 25002, 100008 bytes gathered.
  // Ring: 1/2 x 100008 B at 4 GB/s = 0.012501 ms, + 2 us; the all-gather's
  // copies 2 x 0.0100008 ms (the reduce-scatter runs on the gradients in
  // place). Without the fixed cost 0.014501 ms and 0.0345026 ms.
  sp::Bucket b = hand_bucket({0, 1}, 100004);
  b.values = 25001;
  l.buckets = {b};
  REQUIRE(l.gather_bytes(0) == 100008);
  REQUIRE(cost.reduce_scatter_ms(100008, {0, 1}) == Approx(0.034501));
  REQUIRE(cost.allgather_ms(100008, {0, 1}) == Approx(0.0545026));

  // Per step the least over the members: 0.1345, 0.0845, 0.0945026
  // (median 0.0945026): 60 us beyond the all-gather's formula; the same
  // less its copies, 60 us beyond the reduce-scatter's.
  const std::vector<std::vector<std::vector<double>>> ms = {{{0.1345}, {0.0845}, {0.0990}},
                                                            {{0.1400}, {0.0900}, {0.0945026}}};
  const std::vector<std::vector<std::vector<double>>> rs = {{{0.1145}, {0.0645}, {0.0790}},
                                                            {{0.1200}, {0.0700}, {0.074501}}};
  CHECK(se::fit_executor_fixed_us(l, cost, sp::Collective::reduce_scatter, rs) == Approx(60.0).margin(1e-6));
  CHECK(se::fit_executor_fixed_us(l, cost, sp::Collective::allgather, ms) == Approx(60.0).margin(1e-6));
  // The figure is beyond the formula whatever the fixed cost priced before.
  o.reduce_scatter_us = 100;
  cost.set_overhead(o);
  CHECK(se::fit_executor_fixed_us(l, cost, sp::Collective::reduce_scatter, rs) == Approx(60.0).margin(1e-6));
  // Faster than the formula with no fixed cost: 0, not a negative figure.
  const std::vector<std::vector<std::vector<double>>> fast = {{{0.02}}, {{0.03}}};
  CHECK(se::fit_executor_fixed_us(l, cost, sp::Collective::allgather, fast) == 0.0);
  // No member's time, or no bucket: -1.
  CHECK(se::fit_executor_fixed_us(l, cost, sp::Collective::allgather, {{{-1}}, {{-1}}}) == -1);
  l.buckets.clear();
  CHECK(se::fit_executor_fixed_us(l, cost, sp::Collective::allgather, {}) == -1);
}

TEST_CASE("the calibration trains Spindle's plan replicated, then the same plan with ZeRO-1 gathered after the step",
          "[profile][calibrate]") {
  auto model = sp::load_model(shipped("models/tiny-clip.yaml"));
  REQUIRE(model.ok());
  const sp::OpGraph graph = sp::expand(*model);
  auto two = sp::load_cluster(shipped("clusters/cpu-1x2.yaml"));
  REQUIRE(two.ok());
  auto profile = sp::analytic_profile(*model, graph, *two, nullptr);
  REQUIRE(profile.ok());
  // An optimizer step slow enough (0.01 GB/s: about 35 ms a step for each
  // half of tiny-clip's values) that auto would shard it.
  profile->optimizer_gbytes_per_s = 0.01;
  auto cost = sp::ProfileCostModel::create(*profile, *two, graph);
  REQUIRE(cost.ok());
  auto plan = se::calibration_plan(*model, graph, *two, **cost, profile->sha256, 2);
  REQUIRE(plan.ok());
  CHECK(plan->optimizer_state == sp::OptimizerState::replicated);
  auto automatic = sp::make_plan({&*model, &graph, &*two, cost->get(), profile->sha256, sp::Strategy::spindle});
  REQUIRE(automatic.ok());
  CHECK(automatic->optimizer_state == sp::OptimizerState::sharded);
  const sp::Plan sharded = se::sharded_calibration_plan(*plan);
  CHECK(sharded.optimizer_state == sp::OptimizerState::sharded);
  CHECK(sharded.param_gather == sp::ParamGather::after_step);
  CHECK(sharded.waves.size() == plan->waves.size());
  CHECK(sp::check_plan_status(sharded, *model, graph, "sharded", &*two).ok());
}
