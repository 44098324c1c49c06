// loop: compares a plan's predicted timeline with what spindle-run measured
// (bench/loop.sh runs the whole loop: measure a profile, plan, run, compare).
//
//   loop PLAN.json TRACE.json METRICS.jsonl [--skip K]
//        [--model M.yaml --cluster C.yaml --profile P.json [--traced-metrics T.jsonl]]
//
// PLAN.json is spindle-plan's output, TRACE.json and METRICS.jsonl are
// spindle-run's --trace and --metrics of that plan (bench/loop.sh takes them
// from two runs: the metrics from one without --trace, as users run it,
// since recording the boxes slows the step). The first K steps
// (default 3) are warm-up and left out; every measured figure is the median
// over the remaining steps. Per wave: the planned wave time (its longest
// slice, forward + backward) against the measured one (per device, the sum
// of its forward and backward boxes of that wave; the largest over devices),
// and the same for inter-wave transfers; then gradient sync, the optimizer
// and the rest of the step (which the planner does not model), and the
// whole step (rank 0's step_ms). Medians are taken per row, so the rows need
// not add up to the step.
// With --model, --cluster and --profile (the inputs of the plan) it also
// simulates the plan's lowered programs (libplan/sim) and compares, per
// rank, the simulated compute, transfer, sync and finish time with the
// measured ones (--metrics "ranks": the median over steps of each rank's
// host time per phase, and its step time), and the bytes each rank moved.
// The runtime's transfer and sync times include waiting for peers; the
// simulation's transfer and sync do not (its waits are apart), so each is
// also compared with the simulated exchange and all-reduce boxes including
// their waits (rows xfer+wait, sync+wait).
// Then, per rank, every forward and backward box of the simulation against
// the measured one (medians over steps of its start, from the rank's first
// box of the step, and of its duration): which operator's profile the run
// disagrees with, and how far the drift has carried by then.
// With --traced-metrics (the --metrics of the run that wrote TRACE), last
// the replay (compare_replay): every traced step simulated around the
// compute it measured, against that run's transfer and sync.
// Ratios are measured / predicted. Exit 0, or 2 on unreadable input.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan_io.h"
#include "libplan/sim/sim.h"

namespace {

using nlohmann::json;

std::string ratio(double measured, double predicted) {
  if (!(predicted > 0)) return "    -";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%5.2f", measured / predicted);
  return buf;
}

// Phase key of a measured box: ("wave", W) for compute of wave W,
// ("transfer", W) (W = -1: the wait for sends posted early), ("sync", 0),
// ("optimizer", 0); ("", 0) for others.
std::pair<std::string, int> phase_of(const json& e) {
  const std::string name = e.value("name", "");
  const std::string cat = e.value("cat", "");
  const json& args = e.contains("args") ? e["args"] : json::object();
  if (cat == "compute" && args.contains("wave")) return {"wave", args["wave"].get<int>()};
  if (cat == "compute" && name.rfind("optimizer", 0) == 0) return {"optimizer", 0};   // "optimizer [bucket B]"
  // The runtime names a transfer box's wave in its args (a send posted
  // early: its producer's wave); the end-of-step wait for those sends has
  // none (-1).
  if (cat == "transfer") return {"transfer", args.contains("wave") ? args["wave"].get<int>() : -1};
  if (cat == "sync") return {"sync", 0};
  return {"", 0};
}

// (phase, index) -> step -> device -> ms: the measured boxes of every step
// after the first `skip`, by phase_of.
using PhaseBoxes = std::map<std::pair<std::string, int>, std::map<int, std::map<int, double>>>;
PhaseBoxes phase_boxes(const json& trace, int skip) {
  PhaseBoxes boxes;
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const int step = e.contains("args") ? e["args"].value("step", 0) : 0;
    if (step <= skip) continue;
    const auto key = phase_of(e);
    if (key.first.empty()) continue;
    boxes[key][step][e.value("pid", 0)] += e.value("dur", 0.0) / 1e3;
  }
  return boxes;
}

// Rank r's optimizer boxes ("optimizer", "optimizer bucket B") summed per
// step; the median over the steps that have some (0 when none).
double measured_optimizer_ms(const PhaseBoxes& boxes, int r) {
  std::vector<double> ms;
  if (const auto it = boxes.find({"optimizer", 0}); it != boxes.end())
    for (const auto& [step, devices] : it->second)
      if (const auto d = devices.find(r); d != devices.end()) ms.push_back(d->second);
  return ms.empty() ? 0.0 : spindle::bench::median(ms);
}

// Per-rank parts judged against their targets: measured / simulated within
// 1 +- `within`; those missed, for the verdict line.
struct Verdict {
  std::vector<std::string> missed;
  int parts = 0;
  void judge(int r, const char* part, double sim_ms, double got_ms, double within) {
    ++parts;
    if (sim_ms <= 0 && got_ms <= 0) return;   // nothing on either side
    const double q = sim_ms > 0 ? got_ms / sim_ms : std::numeric_limits<double>::infinity();
    if (q >= 1 - within && q <= 1 + within) return;
    char buf[96];
    if (sim_ms > 0) std::snprintf(buf, sizeof buf, "rank %d %s %.2f", r, part, q);
    else std::snprintf(buf, sizeof buf, "rank %d %s (%.3f ms, simulated 0)", r, part, got_ms);
    missed.push_back(buf);
  }
  void print(const char* what) const {
    std::string outside;
    for (const std::string& m : missed) outside += (outside.empty() ? "" : ", ") + m;
    std::printf("%s: %d of %d%s%s\n", what, parts - static_cast<int>(missed.size()), parts,
                missed.empty() ? "" : "; outside: ", outside.c_str());
  }
};

// Like with like: the time simulated device `program.device` spends in
// what the runtime times as transfer (exchanges, posting sends, the wait for
// the sends posted early) and as sync (a blocking all-reduce or ZeRO-1
// all-gather and the wait for its group; the wait for a started all-reduce
// or all-gather). A started collective's own box is not the device's
// time: it runs beside the compute, and what of it the device waits for
// is its wait box. ms.
struct CommParts {
  double xfer_wait = 0, sync_wait = 0;
};
CommParts comm_parts(const spindle::plan::Simulation& sim, const spindle::plan::Program& program) {
  namespace sp = spindle::plan;
  CommParts parts;
  for (const sp::SimBox& box : sim.boxes) {
    if (box.device != program.device) continue;
    const sp::InstrKind kind = program.instrs[static_cast<size_t>(box.instr)].kind;
    // The gradient norm (--clip-grad): its all-reduce and the wait for the
    // last device before it, sync as the runtime counts it.
    const bool norm = kind == sp::InstrKind::grad_norm;
    const bool waits_for_bucket = box.cat == "wait" && (box.bucket >= 0 || norm);
    if (box.cat == "exchange" || box.cat == "send" || box.cat == "recv" ||
        (box.cat == "wait" && !waits_for_bucket))
      parts.xfer_wait += box.dur_ms;
    const bool blocking = (box.cat == "allgather" && kind == sp::InstrKind::allgather) ||
                          (box.cat == "allreduce" && (kind == sp::InstrKind::allreduce || norm));
    if (waits_for_bucket || blocking) parts.sync_wait += box.dur_ms;
  }
  return parts;
}

// Per rank, each simulated forward and backward box against the measured
// box of the same rank, wave and direction (a rank runs one slice per wave):
// medians over the steps after `skip` of its start (from the rank's first
// box of the step) and duration. Boxes under 1% of the rank's simulated
// compute are left out (their ratios are noise).
void compare_boxes(const spindle::plan::Simulation& sim, const json& trace, int skip) {
  namespace sp = spindle::plan;
  struct Seen {
    std::vector<double> start, dur;
  };
  // (rank, wave, forward?) -> measured; (rank, step) -> the step's first box.
  std::map<std::tuple<int, int, bool>, Seen> seen;
  std::map<std::pair<int, int>, double> first_ts;
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || !e.contains("args")) continue;
    const int step = e["args"].value("step", 0);
    if (step <= skip) continue;
    const auto key = std::pair{e.value("pid", 0), step};
    const double ts = e.value("ts", 0.0) / 1e3;
    const auto it = first_ts.find(key);
    if (it == first_ts.end() || ts < it->second) first_ts[key] = ts;
  }
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "compute" || !e.contains("args") ||
        !e["args"].contains("wave"))
      continue;
    const int step = e["args"].value("step", 0), rank = e.value("pid", 0);
    if (step <= skip) continue;
    const std::string name = e.value("name", "");
    Seen& s = seen[{rank, e["args"]["wave"].get<int>(), name.rfind("fwd", 0) == 0}];
    s.start.push_back(e.value("ts", 0.0) / 1e3 - first_ts[{rank, step}]);
    s.dur.push_back(e.value("dur", 0.0) / 1e3);
  }
  std::printf("\nper rank and box: simulated forward and backward boxes against measured, medians over steps\n");
  std::printf("%-5s %-5s %-44s %9s %9s %9s %9s %7s\n", "rank", "wave", "box", "sim_start", "run_start", "sim_ms",
              "run_ms", "ratio");
  for (size_t r = 0; r < sim.devices.size(); ++r) {
    const double floor_ms = 0.01 * sim.devices[r].compute_ms;
    double worst = 0;
    std::string worst_name;
    for (const sp::SimBox& box : sim.boxes) {
      if (box.device != static_cast<int>(r) || (box.cat != "forward" && box.cat != "backward") ||
          box.dur_ms < floor_ms)
        continue;
      const auto it = seen.find({box.device, box.wave, box.cat == "forward"});
      if (it == seen.end()) continue;
      const double start = spindle::bench::median(it->second.start), dur = spindle::bench::median(it->second.dur);
      std::printf("%-5zu %-5d %-44s %9.3f %9.3f %9.3f %9.3f %7s\n", r, box.wave, box.name.substr(0, 44).c_str(),
                  box.start_ms, start, box.dur_ms, dur, ratio(dur, box.dur_ms).c_str());
      if (std::abs(dur - box.dur_ms) > std::abs(worst)) {
        worst = dur - box.dur_ms;
        worst_name = box.name;
      }
    }
    if (!worst_name.empty())
      std::printf("rank %zu: the box furthest off is %s, %+.3f ms\n", r, worst_name.c_str(), worst);
  }
}

// A measured compute box's key: (rank, 0 forward / 1 backward, MetaOp,
// wave) or (rank, 2 optimizer, bucket (-1: the step of the shards in no
// bucket; -2: the gradient norm's local sum, norm_sum), 0).
using ComputeKey = std::tuple<int, int, int, int>;
// The key of a measured box: nullopt for a box that is no forward,
// backward or optimizer step.
std::optional<ComputeKey> box_key(const json& e) {
  if (e.value("cat", "") != "compute") return std::nullopt;
  const json& args = e["args"];
  const int rank = e.value("pid", 0);
  const std::string name = e.value("name", "");
  if (args.contains("metaop") && args.contains("wave"))
    return ComputeKey{rank, name.rfind("fwd", 0) == 0 ? 0 : 1, args["metaop"].get<int>(), args["wave"].get<int>()};
  if (name == "optimizer") return ComputeKey{rank, 2, -1, 0};
  if (name == "optimizer norm sum") return ComputeKey{rank, 2, -2, 0};
  if (name.rfind("optimizer bucket ", 0) == 0) return ComputeKey{rank, 2, std::stoi(name.substr(17)), 0};
  return std::nullopt;
}

// One traced step as the replay takes it (compute_boxes).
struct StepBoxes {
  std::map<ComputeKey, double> ms;   // key -> ms
  std::map<int, double> start_ms;    // rank -> when its first box began, after the step's start
};

// step -> what each rank's forward, backward and optimizer steps took in
// every training step after `skip` of the trace, each with the rank's
// untimed host time around it: the gap before it (from the end of the
// rank's previous box) and the gaps before the other boxes that follow it
// up to the next compute box (a message leaves when its sender's transfer
// box begins); and when each rank's first box began, after the step's
// start (the earliest first box of any rank), so that a rank that starts
// the step late (rank 0 writes the metrics between steps) replays late,
// whatever its first instruction is (an all-gather started at the step's
// start waits for it). What a rank spends between its boxes is its own
// time, not communication.
std::map<int, StepBoxes> compute_boxes(const json& trace, int skip) {
  struct Box {
    double ts, dur;
    std::optional<ComputeKey> key;
  };
  std::map<int, std::map<int, std::vector<Box>>> boxes;   // step -> rank -> its boxes
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || !e.contains("args")) continue;
    const int step = e["args"].value("step", 0);
    if (step <= skip || e["args"].contains("eval")) continue;
    boxes[step][e.value("pid", 0)].push_back({e.value("ts", 0.0) / 1e3, e.value("dur", 0.0) / 1e3, box_key(e)});
  }
  std::map<int, StepBoxes> by_step;
  for (auto& [step, ranks] : boxes) {
    double step_start = std::numeric_limits<double>::infinity();
    for (auto& [rank, list] : ranks) {
      std::sort(list.begin(), list.end(), [](const Box& a, const Box& b) { return a.ts < b.ts; });
      step_start = std::min(step_start, list.front().ts);
    }
    std::map<ComputeKey, double>& ms = by_step[step].ms;
    for (const auto& [rank, list] : ranks) {
      by_step[step].start_ms[rank] = list.front().ts - step_start;
      double end = list.front().ts, pending = 0;
      std::optional<ComputeKey> last;
      for (const Box& b : list) {
        const double gap = std::max(0.0, b.ts - end);
        if (b.key) {
          ms[*b.key] += b.dur + gap + pending;
          pending = 0;
          last = b.key;
        } else if (last) {
          ms[*last] += gap;
        } else {
          pending += gap;
        }
        end = std::max(end, b.ts + b.dur);
      }
    }
  }
  return by_step;
}

// The key of compute instruction `in` of device d's program in `lowered`
// (compute_boxes' keys); nullopt for other kinds.
std::optional<ComputeKey> instr_key(const spindle::plan::Lowered& lowered, int d, const spindle::plan::Instr& in) {
  namespace sp = spindle::plan;
  if (in.kind == sp::InstrKind::optimizer) return ComputeKey{d, 2, in.bucket, 0};
  if (in.kind == sp::InstrKind::norm_sum) return ComputeKey{d, 2, -2, 0};
  if (in.kind != sp::InstrKind::forward && in.kind != sp::InstrKind::backward) return std::nullopt;
  const sp::LoweredSlice& s = lowered.slices[static_cast<size_t>(in.slice)];
  return ComputeKey{d, in.kind == sp::InstrKind::forward ? 0 : 1, s.metaop, s.wave};
}

// The replay: per step of the traced run, the plan's programs simulated
// with every forward, backward and optimizer instruction taking the time
// that run measured for it in that step, with the rank's host time around
// it (compute_boxes; SimOptions::replay_ms), so that
// messages, all-reduces and the waits for peers are simulated around the
// compute that really ran; against the same run's per-rank transfer and
// sync (`traced_ranks`: step -> its --metrics "ranks") and step. Medians
// over steps. It judges the communication model apart from the profile's
// compute figures: a part the profile-based simulation misses only because
// a peer computed slower than its profile comes within target here.
void compare_replay(const spindle::plan::Plan& plan, const spindle::plan::Model& model,
                    const spindle::plan::OpGraph& graph, const spindle::plan::CostModel& cost,
                    const spindle::plan::Lowered& lowered, const json& trace,
                    const std::map<int, json>& traced_ranks, const std::map<int, double>& traced_step, int skip) {
  namespace sp = spindle::plan;
  const auto boxes = compute_boxes(trace, skip);
  // rank -> part -> per-step ms, replayed and measured.
  std::map<int, std::map<std::string, std::vector<double>>> replayed, measured;
  std::vector<double> replayed_step, measured_step;
  int instrs = 0, found = 0;
  for (const auto& [step, ranks] : traced_ranks) {
    const auto b = boxes.find(step);
    if (b == boxes.end() || !traced_step.count(step)) continue;
    sp::SimOptions options;
    options.sync = sp::planned_sync(plan);
    for (const sp::Program& program : lowered.programs) {
      std::vector<double>& ms = options.replay_ms.emplace_back(program.instrs.size(), -1.0);
      for (size_t i = 0; i < program.instrs.size(); ++i) {
        const auto key = instr_key(lowered, program.device, program.instrs[i]);
        if (!key) continue;
        ++instrs;
        if (const auto it = b->second.ms.find(*key); it != b->second.ms.end()) ms[i] = it->second, ++found;
      }
      const auto start = b->second.start_ms.find(program.device);
      options.replay_start_ms.push_back(start == b->second.start_ms.end() ? 0.0 : start->second);
    }
    auto sim = sp::simulate_plan(plan, model, graph, cost, options);
    if (!sim) {
      std::fprintf(stderr, "loop: replay of step %d: %s\n", step, sim.error().message.c_str());
      return;
    }
    replayed_step.push_back(sim->iteration_ms);
    measured_step.push_back(traced_step.at(step));
    for (const sp::Program& program : lowered.programs) {
      const int r = program.device;
      const CommParts parts = comm_parts(*sim, program);
      replayed[r]["compute"].push_back(sim->devices[static_cast<size_t>(r)].compute_ms);
      replayed[r]["xfer+wait"].push_back(parts.xfer_wait);
      replayed[r]["sync+wait"].push_back(parts.sync_wait);
      for (const json& e : ranks)
        if (e.value("rank", -1) == r) {
          measured[r]["compute"].push_back(e.value("compute_ms", 0.0));
          measured[r]["xfer+wait"].push_back(e.value("transfer_ms", 0.0));
          measured[r]["sync+wait"].push_back(e.value("sync_ms", 0.0));
        }
    }
  }
  if (replayed_step.empty()) {
    std::printf("\nreplay: no traced step with both boxes and metrics\n");
    return;
  }
  std::printf("\nreplay: the programs simulated around the measured compute of each traced step (%d of %d compute "
              "instructions timed), against that run's --metrics; medians over %zu steps\n",
              found, instrs, replayed_step.size());
  std::printf("%-5s %-9s %12s %12s %7s %9s\n", "rank", "part", "replayed_ms", "measured_ms", "ratio", "diff_us");
  Verdict verdict;
  for (const auto& [r, parts] : replayed)
    for (const char* part : {"compute", "xfer+wait", "sync+wait"}) {
      const double sim_ms = spindle::bench::median(parts.at(part));
      const double got_ms = measured[r][part].empty() ? 0.0 : spindle::bench::median(measured[r][part]);
      std::printf("%-5d %-9s %12.3f %12.3f %7s %+9.1f\n", r, part, sim_ms, got_ms, ratio(got_ms, sim_ms).c_str(),
                  1e3 * (got_ms - sim_ms));
      if (std::string(part) != "compute") verdict.judge(r, part, sim_ms, got_ms, 0.25);
    }
  verdict.print("replayed per-rank parts on target (xfer+wait and sync+wait within 25%)");
  const double sim_step = spindle::bench::median(replayed_step), got_step = spindle::bench::median(measured_step);
  std::printf("%-15s %12.3f %12.3f %7s   (the step beyond its programs: the loss, bookkeeping)\n", "step (replay)",
              sim_step, got_step, ratio(got_step, sim_step).c_str());
}

// Per rank, the simulated figures of the plan against the measured ones
// (median over the steps in `ranks_by_step`: step -> the metrics' "ranks").
int compare_ranks(const spindle::plan::Plan& plan, const std::string& model_path, const std::string& cluster_path,
                  const std::string& profile_path, const std::map<int, json>& ranks_by_step,
                  const std::map<int, double>& step_ms, const json& trace, const PhaseBoxes& boxes,
                  const std::map<int, json>& traced_ranks, const std::map<int, double>& traced_step, int skip) {
  namespace sp = spindle::plan;
  auto model = sp::load_model(model_path);
  auto cluster = sp::load_cluster(cluster_path);
  auto profile = sp::load_profile(profile_path);
  if (!model.ok() || !cluster.ok() || !profile.ok()) {
    std::fprintf(stderr, "loop: %s\n",
                 (!model.ok() ? model.error() : !cluster.ok() ? cluster.error() : profile.error()).message.c_str());
    return 2;
  }
  const sp::OpGraph graph = sp::expand(*model);
  auto cost = sp::ProfileCostModel::create(*profile, *cluster, graph);
  if (!cost.ok()) {
    std::fprintf(stderr, "loop: %s\n", cost.error().message.c_str());
    return 2;
  }
  // The gradient sync the plan was made with, as spindle-run (given no
  // sync flag, as bench/loop.sh runs it) lowers it.
  sp::SimOptions planned;
  planned.sync = sp::planned_sync(plan);
  sp::LowerOptions lower_options;
  lower_options.sync = *planned.sync;
  auto sim = sp::simulate_plan(plan, *model, graph, **cost, planned);
  auto lowered = sp::lower(plan, *model, graph, lower_options);
  if (!sim.ok() || !lowered.ok()) {
    std::fprintf(stderr, "loop: %s\n", (!sim.ok() ? sim.error() : lowered.error()).message.c_str());
    return 2;
  }
  std::printf("\nper rank: simulated programs (libplan/sim) against measured (--metrics ranks), medians over steps\n");
  std::printf("%-5s %-9s %12s %12s %7s\n", "rank", "part", "simulated_ms", "measured_ms", "ratio");
  Verdict verdict;
  for (int r = 0; r < plan.devices; ++r) {
    std::map<std::string, std::vector<double>> got;
    for (const auto& [step, ranks] : ranks_by_step)
      for (const json& e : ranks)
        if (e.value("rank", -1) == r)
          for (const char* k : {"compute_ms", "transfer_ms", "sync_ms", "sent_bytes", "received_bytes"})
            got[k].push_back(e.value(k, 0.0));
    const sp::SimDevice& d = sim->devices[static_cast<size_t>(r)];
    const auto med = [&](const char* k) { return spindle::bench::median(got[k]); };
    std::printf("%-5d %-9s %12.3f %12.3f %7s\n", r, "compute", d.compute_ms, med("compute_ms"),
                ratio(med("compute_ms"), d.compute_ms).c_str());
    // Of the compute, the optimizer steps (priced at the profile's
    // "x-optimizer" rate): the simulated boxes against the measured ones.
    double sim_opt = 0;
    for (const sp::SimBox& box : sim->boxes)
      if (box.device == r && box.cat == "optimizer") sim_opt += box.dur_ms;
    const double got_opt = measured_optimizer_ms(boxes, r);
    std::printf("%-5d %-9s %12.3f %12.3f %7s\n", r, " optimizer", sim_opt, got_opt, ratio(got_opt, sim_opt).c_str());
    // The runtime's transfer and sync times include waiting for peers; the
    // simulation keeps waits apart (wait_ms): compared together.
    std::printf("%-5d %-9s %12.3f %12.3f %7s\n", r, "transfer", d.transfer_ms, med("transfer_ms"),
                ratio(med("transfer_ms"), d.transfer_ms).c_str());
    std::printf("%-5d %-9s %12.3f %12.3f %7s\n", r, "sync", d.sync_ms, med("sync_ms"),
                ratio(med("sync_ms"), d.sync_ms).c_str());
    const auto [xfer_wait, sync_wait] = comm_parts(*sim, lowered->programs[static_cast<size_t>(r)]);
    std::printf("%-5d %-9s %12.3f %12.3f %7s\n", r, "xfer+wait", xfer_wait, med("transfer_ms"),
                ratio(med("transfer_ms"), xfer_wait).c_str());
    std::printf("%-5d %-9s %12.3f %12.3f %7s\n", r, "sync+wait", sync_wait, med("sync_ms"),
                ratio(med("sync_ms"), sync_wait).c_str());
    verdict.judge(r, "compute", d.compute_ms, med("compute_ms"), 0.15);
    verdict.judge(r, "xfer+wait", xfer_wait, med("transfer_ms"), 0.25);
    verdict.judge(r, "sync+wait", sync_wait, med("sync_ms"), 0.25);
    const double comm_sim = d.transfer_ms + d.sync_ms + d.wait_ms, comm_got = med("transfer_ms") + med("sync_ms");
    std::printf("%-5d %-9s %12.3f %12.3f %7s\n", r, "comm+wait", comm_sim, comm_got, ratio(comm_got, comm_sim).c_str());
    const sp::ProgramBytes b = lowered->bytes(r);
    std::printf("%-5d %-9s %12lld %12.0f %7s\n", r, "bytes out", static_cast<long long>(b.sent), med("sent_bytes"),
                static_cast<double>(b.sent) == med("sent_bytes") ? "equal" : "DIFFER");
    std::printf("%-5d %-9s %12lld %12.0f %7s\n", r, "bytes in", static_cast<long long>(b.received),
                med("received_bytes"), static_cast<double>(b.received) == med("received_bytes") ? "equal" : "DIFFER");
  }
  verdict.print("per-rank parts on target (compute within 15%, xfer+wait and sync+wait within 25%)");
  // A rank that computes longer than the others makes them wait in their
  // next transfer or sync: the waits follow the spread of the ranks'
  // compute, so a few percent of compute off on one rank moves a part of
  // well under a millisecond far off. Per step, the busiest rank's compute
  // less the least busy's (median over steps), against the simulation's.
  if (plan.devices >= 2) {
    std::vector<double> spread;
    for (const auto& [step, ranks] : ranks_by_step) {
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (const json& e : ranks) {
        lo = std::min(lo, e.value("compute_ms", 0.0));
        hi = std::max(hi, e.value("compute_ms", 0.0));
      }
      if (ranks.size() >= 2) spread.push_back(hi - lo);
    }
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const sp::SimDevice& d : sim->devices) {
      lo = std::min(lo, d.compute_ms);
      hi = std::max(hi, d.compute_ms);
    }
    std::printf("compute spread over the ranks (busiest less least busy, per step): simulated %.0f us, measured %.0f us "
                "(the waits in xfer+wait and sync+wait follow it)\n",
                (hi - lo) * 1e3, spindle::bench::median(spread) * 1e3);
  }
  std::vector<double> steps;
  for (const auto& [step, ms] : step_ms) steps.push_back(ms);
  const double step = spindle::bench::median(steps);
  const double r = step / sim->iteration_ms;
  std::printf("%-15s %12.3f %12.3f %7s   %s\n", "step (sim)", sim->iteration_ms, step,
              ratio(step, sim->iteration_ms).c_str(), r >= 0.85 && r <= 1.15 ? "within 15%" : "OUTSIDE 15%");
  compare_boxes(*sim, trace, skip);
  if (!traced_ranks.empty())
    compare_replay(plan, *model, graph, **cost, *lowered, trace, traced_ranks, traced_step, skip);
  return 0;
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
  std::string model_path, cluster_path, profile_path;
  app.add_option("--model", model_path, "the plan's model: with --cluster and --profile, also compare per rank with the simulation");
  app.add_option("--cluster", cluster_path, "the plan's cluster");
  app.add_option("--profile", profile_path, "the plan's profile");
  std::string traced_metrics_path;
  app.add_option("--traced-metrics", traced_metrics_path,
                 "the --metrics of the run that wrote TRACE: with --model, --cluster and --profile, also replay "
                 "its measured compute in the simulation");
  CLI11_PARSE(app, argc, argv);

  auto plan = spindle::plan::load_plan(plan_path);
  if (!plan.ok()) {
    std::fprintf(stderr, "loop: %s\n", plan.error().message.c_str());
    return 2;
  }
  json trace;
  std::map<int, double> step_ms, traced_step_ms;   // step -> rank 0's step_ms
  std::map<int, json> ranks_by_step, traced_ranks;  // step -> the metrics' "ranks"
  // Every line of a --metrics file after the warm-up steps.
  const auto read_metrics = [skip](const std::string& path, std::map<int, double>& steps,
                                   std::map<int, json>& ranks) {
    std::ifstream mf(path);
    if (!mf) throw std::runtime_error("cannot read");
    std::string line;
    while (std::getline(mf, line))
      if (!line.empty()) {
        const json m = json::parse(line);
        if (m.value("step", 0) > skip && !m.contains("eval")) {   // not an evaluation line
          steps[m.value("step", 0)] = m.at("step_ms").get<double>();
          if (m.contains("ranks")) ranks[m.value("step", 0)] = m["ranks"];
        }
      }
  };
  try {
    std::ifstream tf(trace_path);
    trace = json::parse(tf);
    read_metrics(metrics_path, step_ms, ranks_by_step);
    if (!traced_metrics_path.empty()) read_metrics(traced_metrics_path, traced_step_ms, traced_ranks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loop: %s / %s%s%s: %s\n", trace_path.c_str(), metrics_path.c_str(),
                 traced_metrics_path.empty() ? "" : " / ", traced_metrics_path.c_str(), e.what());
    return 2;
  }
  if (step_ms.empty()) {
    std::fprintf(stderr, "loop: %s: no step after the %d warm-up steps\n", metrics_path.c_str(), skip);
    return 2;
  }

  const PhaseBoxes boxes = phase_boxes(trace, skip);
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
  double sum_compute = 0, sum_transfer = measured("transfer", -1);
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
  std::printf("%-15s %12s %12.3f %7s\n", "optimizer", "(per rank)", optim, "-");
  std::printf("%-15s %12s %12.3f %7s\n", "other", "(not planned)", spindle::bench::median(others), "-");
  const double r = step / pred.iteration_ms;
  std::printf("%-15s %12.3f %12.3f %7s   %s\n", "step", pred.iteration_ms, step, ratio(step, pred.iteration_ms).c_str(),
              r >= 0.8 && r <= 1.2 ? "within 20%" : "OUTSIDE 20%");
  // The spread of the steps: on a shared machine single steps stall.
  const double fastest = *std::min_element(steps.begin(), steps.end());
  const double slowest = *std::max_element(steps.begin(), steps.end());
  std::printf("%-15s %12s %12.3f %7s   (slowest %.3f ms)\n", "fastest step", "", fastest,
              ratio(fastest, pred.iteration_ms).c_str(), slowest);
  if (!model_path.empty() && !cluster_path.empty() && !profile_path.empty())
    return compare_ranks(*plan, model_path, cluster_path, profile_path, ranks_by_step, step_ms, trace, boxes,
                         traced_ranks, traced_step_ms, skip);
  return 0;
}
