#include "libexec/profile/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "libplan/cost/cost_model.h"
#include "libplan/plan/check.h"
#include "libplan/planner/planner.h"
#include "libplan/rules/links.h"
#include "libplan/rules/memory.h"
#include "libplan/sim/sim.h"
#include "libplan/util/units.h"

namespace spindle::exec {

plan::Result<plan::Plan> calibration_plan(const plan::Model& model, const plan::OpGraph& graph,
                                          const plan::Cluster& cluster, const plan::CostModel& cost,
                                          const std::string& profile_sha256, int ranks) {
  if (cluster.devices() != ranks)
    return plan::Error{"the cluster has " + std::to_string(cluster.devices()) + " devices and " +
                       std::to_string(ranks) + " ranks measure (a plan of it cannot run on them)"};
  plan::PlanRequest request{&model, &graph, &cluster, &cost, profile_sha256, plan::Strategy::spindle};
  request.choose_optimizer_state = false;   // all-reduces in its buckets (fit_executor_allreduce)
  request.optimizer_state = plan::OptimizerState::replicated;
  SPINDLE_ASSIGN(p, plan::make_plan(request));
  SPINDLE_TRY(plan::check_plan_status(p, model, graph, "the calibration plan", &cluster));
  return p;
}

plan::Plan sharded_calibration_plan(const plan::Plan& replicated) {
  plan::Plan p = replicated;
  p.optimizer_state = plan::OptimizerState::sharded;
  p.param_gather = plan::ParamGather::after_step;
  return p;
}

std::vector<OverheadSample> overhead_samples(const plan::Lowered& l, int d,
                                             const std::vector<std::vector<double>>& steps,
                                             const plan::CommOverhead& packing) {
  std::vector<OverheadSample> out;
  const plan::Program& prog = l.programs[static_cast<size_t>(d)];
  for (size_t i = 0; i < prog.instrs.size(); ++i) {
    const plan::Instr& in = prog.instrs[i];
    const bool exchange = in.kind == plan::InstrKind::exchange;
    if (!exchange && in.kind != plan::InstrKind::post_send && in.kind != plan::InstrKind::post_recv) continue;
    OverheadSample s;
    double sent = 0;
    bool waits = false;
    for (int t : prog.transfers_of(in)) {
      const plan::Transfer& x = l.transfers[static_cast<size_t>(t)];
      if (x.dst == d && x.src != d) waits = waits || exchange;   // it completes a receive
      if (x.src == d && x.dst != d) {
        s.messages += 1;
        sent += static_cast<double>(x.bytes);
      }
      if (exchange && in.dir == plan::Direction::backward && x.dst == d && x.adds)
        s.accumulated_bytes += static_cast<double>(x.values * plan::kWireBytesPerValue);
    }
    if (in.kind == plan::InstrKind::post_recv) s.messages = 0;   // priced in the exchange
    if (waits) continue;
    std::vector<double> ms;
    for (const std::vector<double>& step : steps)
      if (i < step.size()) ms.push_back(step[i]);
    if (ms.empty()) continue;
    s.us = timing_stats(ms).median * 1e3 - plan::pack_ms(packing, sent) * 1e3;
    out.push_back(s);
  }
  return out;
}

std::vector<double> optimizer_rate_samples(const plan::Lowered& l, int d,
                                           const std::vector<std::vector<double>>& steps) {
  const plan::Program& prog = l.programs[static_cast<size_t>(d)];
  std::vector<double> out;
  for (const std::vector<double>& step : steps) {
    double values = 0, ms = 0;
    for (size_t i = 0; i < prog.instrs.size() && i < step.size(); ++i)
      if (prog.instrs[i].kind == plan::InstrKind::optimizer) {
        values += static_cast<double>(prog.instrs[i].values);
        ms += step[i];
      }
    // bytes / ms / 1e6 = GB/s
    out.push_back(values > 0 && ms > 0 ? values * plan::kAdamWBytesPerValue / (ms * 1e6) : -1.0);
  }
  return out;
}

ComputeInSitu compute_in_situ(const plan::Lowered& l, int d, const std::vector<std::vector<double>>& steps,
                              const plan::Simulation& sim) {
  ComputeInSitu out;
  const plan::Program& prog = l.programs[static_cast<size_t>(d)];
  for (const plan::SimBox& box : sim.boxes) {
    if (box.device != d) continue;
    const auto i = static_cast<size_t>(box.instr);   // a compute instruction has its box alone
    if (i >= prog.instrs.size() ||
        (prog.instrs[i].kind != plan::InstrKind::forward && prog.instrs[i].kind != plan::InstrKind::backward))
      continue;
    std::vector<double> times;
    for (const std::vector<double>& step : steps)
      if (i < step.size()) times.push_back(step[i]);
    if (times.empty()) continue;
    out.measured_ms += timing_stats(times).median;
    out.profiled_ms += box.dur_ms;
    ++out.instructions;
  }
  return out;
}

std::string compute_scale_refusal(double scale, int ranks_here, int cores) {
  if (scale < 0) return "no forward or backward timed in a step";
  if (cores > 0 && ranks_here > cores)
    return std::to_string(ranks_here) + " ranks share " + std::to_string(cores) +
           " cores here (how much slower a rank computes depends on the plan)";
  if (scale < kMinAppliedComputeScale || scale > kMaxAppliedComputeScale)
    return "outside " + plan::number_text(kMinAppliedComputeScale) + "-" +
           plan::number_text(kMaxAppliedComputeScale) + "x";
  return "";
}

namespace {

// Every rank's samples on every rank, in rank order (all_gather of padded
// rows: us, messages, bytes; a padding row has messages -1).
std::vector<OverheadSample> pool_samples(Comm& world, const std::vector<OverheadSample>& mine) {
  std::vector<float> counts(static_cast<size_t>(world.size()));
  const float n = static_cast<float>(mine.size());
  world.all_gather({&n, 1}, counts);
  const size_t rows = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
  std::vector<float> send(3 * rows, 0.0f), all(3 * rows * static_cast<size_t>(world.size()));
  for (size_t r = 0; r < rows; ++r) {
    const bool real = r < mine.size();
    send[3 * r] = real ? static_cast<float>(mine[r].us) : 0.0f;
    send[3 * r + 1] = real ? static_cast<float>(mine[r].messages) : -1.0f;
    send[3 * r + 2] = real ? static_cast<float>(mine[r].accumulated_bytes) : 0.0f;
  }
  world.all_gather(send, all);
  std::vector<OverheadSample> pooled;
  for (size_t r = 0; r < all.size() / 3; ++r)
    if (all[3 * r + 1] >= 0) pooled.push_back({all[3 * r], all[3 * r + 1], all[3 * r + 2]});
  return pooled;
}

// By bucket of `l`: device d's ms in that bucket's instructions of
// collective `c` in one step (`instr_ms`), -1 where d is not a member. The
// all-reduce and ZeRO-1's reduce-scatter are the allreduce instructions
// (which one, Lowered::sharded_state says), the all-gather the allgather ones.
std::vector<double> bucket_ms(const plan::Lowered& l, int d, const std::vector<double>& instr_ms,
                              plan::Collective c) {
  using K = plan::InstrKind;
  const bool gather = c == plan::Collective::allgather;
  std::vector<double> out(l.buckets.size(), -1.0);
  const plan::Program& prog = l.programs[static_cast<size_t>(d)];
  for (size_t i = 0; i < prog.instrs.size() && i < instr_ms.size(); ++i) {
    const plan::Instr& in = prog.instrs[i];
    const bool reduce = in.kind == K::allreduce || in.kind == K::allreduce_start || in.kind == K::allreduce_wait;
    const bool gathers = in.kind == K::allgather || in.kind == K::allgather_start || in.kind == K::allgather_wait;
    if (gather ? !gathers : !reduce) continue;
    double& into = out[static_cast<size_t>(in.bucket)];
    into = std::max(into, 0.0) + instr_ms[i];
  }
  return out;
}

// Every rank's bucket_ms of every step in `steps` (each the same count on
// every rank), on every rank: by rank, step, then bucket (fit_executor_allreduce).
std::vector<std::vector<std::vector<double>>> gather_bucket_ms(Comm& world, const plan::Lowered& l,
                                                               const std::vector<std::vector<double>>& steps,
                                                               plan::Collective c) {
  const size_t buckets = l.buckets.size(), per_rank = steps.size() * buckets;
  std::vector<float> mine, all(per_rank * static_cast<size_t>(world.size()));
  for (const std::vector<double>& step : steps)
    for (double v : bucket_ms(l, world.rank(), step, c)) mine.push_back(static_cast<float>(v));
  if (per_rank > 0) world.all_gather(mine, all);
  std::vector<std::vector<std::vector<double>>> by_rank(static_cast<size_t>(world.size()));
  for (size_t r = 0; r < by_rank.size(); ++r)
    for (size_t s = 0; s < steps.size(); ++s) {
      const auto first = all.begin() + static_cast<std::ptrdiff_t>(r * per_rank + s * buckets);
      by_rank[r].emplace_back(first, first + static_cast<std::ptrdiff_t>(buckets));
    }
  return by_rank;
}

// Bucket b's time as the executor ran it: per step the least over its
// members in `ms` (by rank, step, then bucket; < 0 where not a member),
// the median over the steps; -1 when no step has one or the bucket has
// fewer than 2 members.
double bucket_time_ms(const plan::Lowered& l, size_t b, const std::vector<std::vector<std::vector<double>>>& ms) {
  std::vector<double> least;   // by step
  for (size_t s = 0; !ms.empty() && s < ms.front().size(); ++s) {
    double m = -1;
    for (const auto& rank : ms)
      if (s < rank.size() && b < rank[s].size() && rank[s][b] >= 0) m = m < 0 ? rank[s][b] : std::min(m, rank[s][b]);
    if (m >= 0) least.push_back(m);
  }
  if (least.empty() || l.buckets[b].devices.size() < 2) return -1;
  return timing_stats(least).median;
}

}  // namespace

AllreduceInSitu fit_executor_allreduce(const plan::Lowered& l, const plan::CostModel& cost, int devices_per_island,
                                       const std::vector<std::vector<std::vector<double>>>& ms) {
  const double fixed_ms = cost.overhead().allreduce_us * 1e-3;
  std::vector<double> beyond_us;    // by bucket: measured less the whole price but the fixed cost
  std::vector<double> wire_speedup;  // by bucket inside one island: priced wire time over measured
  for (size_t b = 0; b < l.buckets.size(); ++b) {
    const plan::Bucket& k = l.buckets[b];
    const double measured_ms = bucket_time_ms(l, b, ms);
    if (measured_ms < 0) continue;
    const double bytes = static_cast<double>(k.bytes);
    // The price but the fixed cost, and the part of it that is no wire: the
    // ring's latency terms (its price at 0 bytes) and the copies.
    const double priced_ms = cost.allreduce_ms(bytes, k.devices) - fixed_ms;
    const double no_wire_ms =
        cost.allreduce_ms(0.0, k.devices) - fixed_ms + plan::collective_overhead_ms(cost.overhead(), plan::Collective::allreduce, bytes) - fixed_ms;
    beyond_us.push_back((measured_ms - priced_ms) * 1e3);
    const bool one_island = plan::island_of(k.devices.front(), devices_per_island) ==
                            plan::island_of(k.devices.back(), devices_per_island);
    if (one_island && priced_ms > no_wire_ms && measured_ms > no_wire_ms)
      wire_speedup.push_back((priced_ms - no_wire_ms) / (measured_ms - no_wire_ms));
  }
  AllreduceInSitu fit;
  if (beyond_us.empty()) return fit;
  const double beyond = timing_stats(beyond_us).median;
  fit.allreduce_us = std::max(0.0, beyond);
  // Faster than the formula with no fixed cost at all: the wire is faster
  // in the executor's buckets than in the link's timing (cold caches).
  if (beyond < 0 && !wire_speedup.empty()) fit.intra_rate_scale = timing_stats(wire_speedup).median;
  return fit;
}

double fit_executor_fixed_us(const plan::Lowered& l, const plan::CostModel& cost, plan::Collective c,
                             const std::vector<std::vector<std::vector<double>>>& ms) {
  const plan::CommOverhead o = cost.overhead();
  std::vector<double> beyond_us;   // by bucket: measured less the whole price but the fixed cost
  for (size_t b = 0; b < l.buckets.size(); ++b) {
    const double measured_ms = bucket_time_ms(l, b, ms);
    if (measured_ms < 0) continue;
    const std::vector<int>& devices = l.buckets[b].devices;
    const double bytes = static_cast<double>(l.gather_bytes(static_cast<int>(b)));
    const double priced_ms = c == plan::Collective::allgather ? cost.allgather_ms(bytes, devices)
                                                              : cost.reduce_scatter_ms(bytes, devices);
    const double fixed_ms = plan::collective_overhead_ms(o, c, 0.0);   // the copies of 0 bytes are free
    beyond_us.push_back((measured_ms - (priced_ms - fixed_ms)) * 1e3);
  }
  return beyond_us.empty() ? -1 : std::max(0.0, timing_stats(beyond_us).median);
}

namespace {

// Trains `plan` with an Executor on `world`: 2 untimed steps, then as many
// as fit `budget_ms` by the slowest rank's first step, 5 to 30 (every rank
// runs as many). Returns each timed step's StepStats::instr_ms; `lowered`
// gets the executor's lowering. Collective over world.
std::vector<std::vector<double>> train_timed(const plan::Model& model, const plan::Plan& plan, Comm& world,
                                             GroupComms groups, Backend& backend, double budget_ms,
                                             plan::Lowered& lowered) {
  // As spindle-run given no flag runs the plan (its overlap, bucket cap
  // and gradient norm: planned_sync), which the simulation lowers alike.
  ExecOptions options;
  options.sync = plan::planned_sync(plan);
  Executor ex(model, plan, world, std::move(groups), backend, options);
  for (int i = 0; i < 2; ++i) ex.step();
  std::vector<std::vector<double>> steps{ex.step().instr_ms};
  std::vector<float> first(static_cast<size_t>(world.size()));
  float mine = 0;
  for (double ms : steps.front()) mine += static_cast<float>(ms);
  world.all_gather({&mine, 1}, first);
  const double slowest = std::max(1e-3, static_cast<double>(*std::max_element(first.begin(), first.end())));
  const int count = std::clamp(static_cast<int>(budget_ms / slowest), 5, 30);
  while (static_cast<int>(steps.size()) < count) steps.push_back(ex.step().instr_ms);
  lowered = ex.lowered();
  return steps;
}

}  // namespace

plan::Result<Calibration> calibrate_executor(const plan::Model& model, const plan::OpGraph& graph,
                                             const plan::Plan& plan, Comm& world,
                                             GroupComms groups, Backend& backend,
                                             const plan::CommOverhead& packing, const plan::CostModel& cost,
                                             double budget_ms) {
  plan::Lowered l;
  const std::vector<std::vector<double>> steps = train_timed(model, plan, world, std::move(groups), backend, budget_ms, l);
  const std::vector<OverheadSample> pooled = pool_samples(world, overhead_samples(l, world.rank(), steps, packing));
  SPINDLE_ASSIGN(fit, fit_executor_overhead(pooled));
  const AllreduceInSitu allreduce = fit_executor_allreduce(
      l, cost, plan.devices_per_island, gather_bucket_ms(world, l, steps, plan::Collective::allreduce));
  // Every rank has one optimizer sample per step (train_timed runs as many
  // steps everywhere): gathered whole, the same median on every rank.
  std::vector<float> mine, rates(steps.size() * static_cast<size_t>(world.size()));
  for (double r : optimizer_rate_samples(l, world.rank(), steps)) mine.push_back(static_cast<float>(r));
  if (!mine.empty()) world.all_gather(mine, rates);
  std::vector<double> positive;
  for (float r : rates)
    if (r > 0) positive.push_back(r);
  const double optimizer = positive.empty() ? -1.0 : timing_stats(positive).median;
  Calibration cal{fit, static_cast<int>(steps.size()), static_cast<int>(pooled.size()), allreduce, optimizer};
  // The operators: the executor's programs (the plan's own gradient sync,
  // as train_timed ran them) priced by `cost`, summed over the ranks.
  SPINDLE_ASSIGN(sim, plan::simulate_plan(plan, model, graph, cost));
  const ComputeInSitu mine_compute = compute_in_situ(l, world.rank(), steps, sim);
  std::vector<float> sums = {static_cast<float>(mine_compute.measured_ms),
                             static_cast<float>(mine_compute.profiled_ms),
                             static_cast<float>(mine_compute.instructions)};
  world.all_reduce_sum(sums);   // over the ranks, the same on every one
  cal.compute_instructions = static_cast<int>(sums[2]);
  if (sums[0] > 0 && sums[1] > 0) cal.compute_scale = static_cast<double>(sums[0]) / sums[1];
  return cal;
}

Zero1InSitu calibrate_zero1(const plan::Model& model, const plan::Plan& sharded, Comm& world, GroupComms groups,
                            Backend& backend, const plan::CostModel& cost, double budget_ms) {
  plan::Lowered l;
  const std::vector<std::vector<double>> steps =
      train_timed(model, sharded, world, std::move(groups), backend, budget_ms, l);
  Zero1InSitu fit;
  fit.steps = static_cast<int>(steps.size());
  if (!l.sharded_state) return fit;
  fit.reduce_scatter_us = fit_executor_fixed_us(
      l, cost, plan::Collective::reduce_scatter, gather_bucket_ms(world, l, steps, plan::Collective::reduce_scatter));
  fit.allgather_us = fit_executor_fixed_us(l, cost, plan::Collective::allgather,
                                           gather_bucket_ms(world, l, steps, plan::Collective::allgather));
  return fit;
}

}  // namespace spindle::exec
