// loop: compares a plan's predicted timeline with what spindle-run measured
// (bench/loop.sh runs the whole loop: measure a profile, plan, run, compare).
//
//   loop PLAN.json TRACE.json METRICS.jsonl [--skip K]
//
// PLAN.json is spindle-plan's output, TRACE.json and METRICS.jsonl are
// spindle-run's --trace and --metrics of that plan. The first K steps
// (default 3) are warm-up and left out; every measured figure is the median
// over the remaining steps. Per wave: the planned wave time (its longest
// slice, forward + backward) against the measured one (per device, the sum
// of its forward and backward boxes of that wave; the largest over devices),
// and the same for inter-wave transfers; then gradient sync, the optimizer
// and the rest of the step (which the planner does not model), and the
// whole step (rank 0's step_ms). Medians are taken per row, so the rows need
// not add up to the step.
// Ratios are measured / predicted. Exit 0, or 2 on unreadable input.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "libplan/plan/plan_io.h"

namespace {

using nlohmann::json;

std::string ratio(double measured, double predicted) {
  if (!(predicted > 0)) return "    -";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%5.2f", measured / predicted);
  return buf;
}

// Phase key of a measured box: ("wave", W) for compute of wave W,
// ("transfer", W), ("sync", 0), ("optimizer", 0); ("", 0) for others.
std::pair<std::string, int> phase_of(const json& e) {
  const std::string name = e.value("name", "");
  const std::string cat = e.value("cat", "");
  const json& args = e.contains("args") ? e["args"] : json::object();
  if (cat == "compute" && args.contains("wave")) return {"wave", args["wave"].get<int>()};
  if (cat == "compute" && name == "optimizer") return {"optimizer", 0};
  if (cat == "transfer") {
    const size_t at = name.rfind(' ');
    return {"transfer", at == std::string::npos ? 0 : std::stoi(name.substr(at + 1))};
  }
  if (cat == "sync") return {"sync", 0};
  return {"", 0};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loop: predicted (plan) against measured (spindle-run trace and metrics) step and wave times"};
  std::string plan_path, trace_path, metrics_path;
  int skip = 3;
  app.add_option("plan", plan_path, "plan (spindle-plan -o)")->required();
  app.add_option("trace", trace_path, "measured trace (spindle-run --trace)")->required();
  app.add_option("metrics", metrics_path, "metrics (spindle-run --metrics)")->required();
  app.add_option("--skip", skip, "warm-up steps left out")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto plan = spindle::plan::load_plan(plan_path);
  if (!plan.ok()) {
    std::fprintf(stderr, "loop: %s\n", plan.error().message.c_str());
    return 2;
  }
  json trace;
  std::map<int, double> step_ms;   // step -> rank 0's step_ms
  try {
    std::ifstream tf(trace_path);
    trace = json::parse(tf);
    std::ifstream mf(metrics_path);
    std::string line;
    while (std::getline(mf, line))
      if (!line.empty()) {
        const json m = json::parse(line);
        if (m.value("step", 0) > skip) step_ms[m.value("step", 0)] = m.at("step_ms").get<double>();
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loop: %s / %s: %s\n", trace_path.c_str(), metrics_path.c_str(), e.what());
    return 2;
  }
  if (step_ms.empty()) {
    std::fprintf(stderr, "loop: %s: no step after the %d warm-up steps\n", metrics_path.c_str(), skip);
    return 2;
  }

  // (phase, index) -> step -> device -> ms.
  std::map<std::pair<std::string, int>, std::map<int, std::map<int, double>>> boxes;
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const int step = e.contains("args") ? e["args"].value("step", 0) : 0;
    if (step <= skip) continue;
    const auto key = phase_of(e);
    if (key.first.empty()) continue;
    boxes[key][step][e.value("pid", 0)] += e.value("dur", 0.0) / 1e3;
  }
  // Per step, the largest per-device total of a phase; `other` is what the
  // step took beyond all phases (the loss all-reduce, bookkeeping).
  std::map<int, double> other;
  for (const auto& [step, ms] : step_ms) other[step] = ms;
  auto largest = [&](const std::map<int, double>& devices) {
    double worst = 0;
    for (const auto& [d, ms] : devices) worst = std::max(worst, ms);
    return worst;
  };
  for (const auto& [key, steps] : boxes)
    for (const auto& [step, devices] : steps)
      if (other.count(step)) other[step] -= largest(devices);
  // Median over steps of the largest per-device total.
  auto measured = [&](const std::string& phase, int index) {
    std::vector<double> per_step;
    const auto it = boxes.find({phase, index});
    if (it == boxes.end()) return 0.0;
    for (const auto& [step, devices] : it->second) per_step.push_back(largest(devices));
    return spindle::bench::median(per_step);
  };
  std::vector<double> steps, others;
  for (const auto& [step, ms] : step_ms) steps.push_back(ms);
  for (const auto& [step, ms] : other) others.push_back(ms);

  const auto& pred = plan->predicted;
  std::printf("loop: plan %s (%s, %d devices, %zu waves), %zu measured steps after %d warm-up\n", plan_path.c_str(),
              plan->strategy.c_str(), plan->devices, plan->waves.size(), step_ms.size(), skip);
  std::printf("%-6s %-8s %12s %12s %7s\n", "wave", "part", "predicted_ms", "measured_ms", "ratio");
  double sum_compute = 0, sum_transfer = 0;
  for (const auto& w : plan->waves) {
    const double c = measured("wave", w.index), t = measured("transfer", w.index);
    sum_compute += c;
    sum_transfer += t;
    std::printf("%-6d %-8s %12.3f %12.3f %7s\n", w.index, "compute", w.ms, c, ratio(c, w.ms).c_str());
    if (w.transfer_ms > 0 || t > 0)
      std::printf("%-6d %-8s %12.3f %12.3f %7s\n", w.index, "transfer", w.transfer_ms, t,
                  ratio(t, w.transfer_ms).c_str());
  }
  const double sync = measured("sync", 0), optim = measured("optimizer", 0), step = spindle::bench::median(steps);
  std::printf("%-15s %12.3f %12.3f %7s\n", "compute (sum)", pred.compute_ms, sum_compute,
              ratio(sum_compute, pred.compute_ms).c_str());
  std::printf("%-15s %12.3f %12.3f %7s\n", "transfer (sum)", pred.transfer_ms, sum_transfer,
              ratio(sum_transfer, pred.transfer_ms).c_str());
  std::printf("%-15s %12.3f %12.3f %7s\n", "gradient sync", pred.sync_ms, sync, ratio(sync, pred.sync_ms).c_str());
  std::printf("%-15s %12s %12.3f %7s\n", "optimizer", "(not planned)", optim, "-");
  std::printf("%-15s %12s %12.3f %7s\n", "other", "(not planned)", spindle::bench::median(others), "-");
  const double r = step / pred.iteration_ms;
  std::printf("%-15s %12.3f %12.3f %7s   %s\n", "step", pred.iteration_ms, step, ratio(step, pred.iteration_ms).c_str(),
              r >= 0.8 && r <= 1.2 ? "within 20%" : "OUTSIDE 20%");
  // The spread of the steps: on a shared machine single steps stall.
  const double fastest = *std::min_element(steps.begin(), steps.end());
  const double slowest = *std::max_element(steps.begin(), steps.end());
  std::printf("%-15s %12s %12.3f %7s   (slowest %.3f ms)\n", "fastest step", "", fastest,
              ratio(fastest, pred.iteration_ms).c_str(), slowest);
  return 0;
}
