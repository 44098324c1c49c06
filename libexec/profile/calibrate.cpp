#include "libexec/profile/calibrate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "libplan/cost/cost_model.h"
#include "libplan/plan/check.h"
#include "libplan/planner/planner.h"
#include "libplan/rules/links.h"

namespace spindle::exec {

plan::Result<plan::Plan> calibration_plan(const plan::Model& model, const plan::OpGraph& graph,
                                          const plan::Cluster& cluster, const plan::Profile& profile, int ranks) {
  if (cluster.devices() != ranks)
    return plan::Error{"the cluster has " + std::to_string(cluster.devices()) + " devices and " +
                       std::to_string(ranks) + " ranks measure (a plan of it cannot run on them)"};
  SPINDLE_ASSIGN(cost, plan::ProfileCostModel::create(profile, cluster, graph));
  plan::PlanRequest request{&model, &graph, &cluster, cost.get(), profile.sha256, plan::Strategy::spindle};
  SPINDLE_ASSIGN(p, plan::make_plan(request));
  SPINDLE_TRY(plan::check_plan_status(p, model, graph, "the calibration plan", &cluster));
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
      if (exchange && in.dir == plan::Direction::backward && x.dst == d)
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

}  // namespace

plan::Result<Calibration> calibrate_executor(const plan::Model& model, const plan::Plan& plan, Comm& world,
                                             GroupComms groups, Backend& backend,
                                             const plan::CommOverhead& packing, double budget_ms) {
  Executor ex(model, plan, world, std::move(groups), backend, ExecOptions{});
  for (int i = 0; i < 2; ++i) ex.step();
  // The step count, from the slowest rank's first timed step (every rank runs as many).
  std::vector<std::vector<double>> steps{ex.step().instr_ms};
  std::vector<float> first(static_cast<size_t>(world.size()));
  float mine = 0;
  for (double ms : steps.front()) mine += static_cast<float>(ms);
  world.all_gather({&mine, 1}, first);
  const double slowest = std::max(1e-3, static_cast<double>(*std::max_element(first.begin(), first.end())));
  const int count = std::clamp(static_cast<int>(budget_ms / slowest), 5, 30);
  while (static_cast<int>(steps.size()) < count) steps.push_back(ex.step().instr_ms);
  const std::vector<OverheadSample> pooled =
      pool_samples(world, overhead_samples(ex.lowered(), world.rank(), steps, packing));
  SPINDLE_ASSIGN(fit, fit_executor_overhead(pooled));
  return Calibration{fit, count, static_cast<int>(pooled.size())};
}

}  // namespace spindle::exec
