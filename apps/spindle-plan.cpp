// spindle-plan: model + cluster + profile -> wave plan (spec/cli.md).
//
//   spindle-plan MODEL.yaml [--cluster C.yaml] [--profile P.json] [-o plan.json]
//                [--strategy S] [--placement P] [--compare] [--trace T.json] [--plot U.svg]
//   spindle-plan MODEL.yaml --check PLAN.json      (or --model MODEL.yaml --check PLAN.json)
//
// Exit codes: 0 success, 2 bad usage or invalid input (nothing written),
// 1 runtime failure (e.g. the output cannot be written).
#include <cstdlib>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/cli_paths.h"
#include "libplan/cost/analytic.h"
#include "libplan/cost/cost_model.h"
#include "libplan/report/trace.h"
#include "libplan/report/utilisation.h"
#include "libplan/plan/check.h"
#include "libplan/planner/feasibility.h"
#include "libplan/plan/plan_io.h"
#include "libplan/lower/lower.h"
#include "libplan/planner/planner.h"
#include "libplan/sim/sim.h"
#include "libplan/util/files.h"
#include "libplan/util/host_memory.h"
#include "libplan/util/parallel.h"
#include "libplan/util/units.h"

namespace sp = spindle::plan;
namespace fs = std::filesystem;

namespace {

constexpr int kExitInvalid = 2;
constexpr int kExitFailure = 1;

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "spindle-plan: error: %s\n", message.c_str());
  return code;
}

// The default cluster, configs/clusters/a800-1x8.yaml, from the first of
// these configs/ folders that holds it: $SPINDLE_HOME/configs; beside an
// installed binary (PREFIX/bin/spindle-plan -> PREFIX/share/spindle/configs,
// `cmake --install`, docs/building.md); ../configs beside the binary; the
// source tree the binary was built from. None: an error naming where it
// looked (the user then gives --cluster).
sp::Result<std::string> default_cluster_path(const char* argv0) {
  const char* rel = "clusters/a800-1x8.yaml";
  std::vector<fs::path> roots;
  if (const char* home = std::getenv("SPINDLE_HOME"); home != nullptr && *home != '\0')
    roots.push_back(fs::path(home) / "configs");
  std::error_code ec;
  fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (ec) exe = fs::path(argv0);
  roots.push_back(exe.parent_path() / ".." / "share" / "spindle" / "configs");
  roots.push_back(exe.parent_path() / ".." / "configs");
  roots.push_back(fs::path(SPINDLE_SOURCE_DIR) / "configs");
  std::string looked;
  for (const fs::path& r : roots) {
    const fs::path candidate = (r / rel).lexically_normal();
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
    // Something else there (a folder, a FIFO) is a mistake to name, not a
    // reason to take another tree's cluster.
    if (fs::exists(candidate, ec))
      return sp::Error{"default cluster " + candidate.string() + ": not a regular file (give --cluster CLUSTER.yaml)"};
    looked += (looked.empty() ? "" : ", ") + candidate.string();
  }
  return sp::Error{std::string("no default cluster: ") + rel + " is in none of " + looked +
                   " (give --cluster CLUSTER.yaml, or set SPINDLE_HOME to the folder that holds configs/)"};
}

std::string size_text(int64_t bytes) { return sp::human_bytes(static_cast<double>(bytes)); }

// spindle-plan hints at dropping --no-early-transfers when posting early
// simulates the plan at least this much faster.
constexpr double kHintMargin = 0.01;

// `sim` simulates `plan` (the planner's objective); `gap` is its
// simulated_compute_gap and `width_optimum_ms` its width_optimum_ms (0: not
// known).
// Why --optimizer-state auto sharded the plan's optimizer state, for the
// memory line ("" when it did not).
std::string sharded_because(const sp::Plan& plan) {
  switch (plan.sharded_because) {
    case sp::Plan::ShardedBecause::none: return "";
    case sp::Plan::ShardedBecause::does_not_fit:
      return " (ZeRO-1: the plan with it replicated does not fit; an all-gather per bucket and step)";
    case sp::Plan::ShardedBecause::does_not_fit_as_run:
      return " (ZeRO-1: the plan with it replicated fits the count above, but on GPUs spindle-run would hold more than "
             "the device has: run mem; an all-gather per bucket and step)";
    case sp::Plan::ShardedBecause::faster: {
      char text[160];
      std::snprintf(text, sizeof text, " (ZeRO-1: it fits replicated, but simulates faster sharded; %.3f ms replicated)",
                    plan.replicated_ms);
      return text;
    }
  }
  return "";
}

void print_summary(const sp::Plan& plan, const sp::OpGraph& graph, int levels, const sp::Simulation& sim, double gap,
                   double width_optimum_ms) {
  const sp::Predicted& p = plan.predicted;
  int64_t peak = 0;
  int peak_dev = 0;
  for (size_t d = 0; d < p.memory_bytes.size(); ++d)
    if (p.memory_bytes[d] > peak) peak = p.memory_bytes[d], peak_dev = static_cast<int>(d);
  std::printf("plan      %s: model %s on %s (%d devices, %d per island)\n", plan.strategy.c_str(),
              plan.model_name.c_str(), plan.cluster_name.c_str(), plan.devices, plan.devices_per_island);
  std::printf("graph     %zu operators -> %zu MetaOps in %d levels -> %zu waves\n", graph.ops.size(),
              plan.metaops.size(), levels, plan.waves.size());
  // A plan may leave devices idle: where spreading wider costs more in
  // gradient all-reduce than it saves (docs/planner.md, "Fewer islands").
  std::vector<char> used(static_cast<size_t>(plan.devices), 0);
  for (const sp::Wave& w : plan.waves)
    for (const sp::Slice& s : w.slices)
      for (int d : s.devices) used[static_cast<size_t>(d)] = 1;
  if (const auto n = std::count(used.begin(), used.end(), 1); n < plan.devices)
    std::printf("devices   %td of %d run a slice; the others stay idle (more would only spread the gradient "
                "all-reduces wider)\n",
                n, plan.devices);
  // The shares of the cluster planned on (docs/planner.md, "Fewer
  // islands"): each with its makespan before the boundary shifts.
  if (!plan.shares_planned.empty()) {
    std::string shares;
    for (const sp::Plan::Share& sh : plan.shares_planned) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.3f", sh.ms);
      shares += (shares.empty() ? "" : ", ") + std::to_string(sh.islands) + " (" + ms + " ms)";
    }
    std::printf("islands   planned on %s islands, before boundary shifts; the fastest kept\n", shares.c_str());
  }
  // The simulated programs (libplan/sim): device-ms shares of devices x iteration.
  const double device_ms = sim.iteration_ms * static_cast<double>(sim.devices.size());
  auto of_all = [&](double ms) { return device_ms > 0 ? 100.0 * ms / device_ms : 0.0; };
  // Not "iteration ..." at the start of a line: that is spindle-run's
  // Megatron-style step line, which log parsers (and the Slurm helper's
  // tests) count.
  std::printf("predicted %.3f ms per iteration, simulated (the planner's objective, no wave barriers): device time "
              "compute %.1f%%, "
              "transfer %.1f%%, sync %.1f%%, idle %.1f%%\n",
              sim.iteration_ms, of_all(sim.compute_device_ms()), of_all(sim.transfer_device_ms()),
              of_all(sim.sync_device_ms()),
              // The rest, at least 0: the three sums round a busy plan's to -0.0.
              std::max(0.0, of_all(device_ms - sim.compute_device_ms() - sim.transfer_device_ms() -
                                   sim.sync_device_ms())));
  // What the makespan waits for (SimOptions::critical_path): the chain of
  // ends back from the last device's, split by kind.
  const sp::SimPath& path = sim.critical;
  if (path.device >= 0)
    std::printf("critical  path ends on device %d: compute %.3f + transfer %.3f + all-reduce %.3f ms (the chain of "
                "ends each waited for; --trace marks it)\n",
                path.device, path.compute_ms, path.transfer_ms, path.sync_ms);
  // Gradient all-reduces behind the backward pass (not in the shares above).
  const double all_sync = sim.sync_device_ms() + sim.hidden_sync_device_ms();
  std::printf("overlap   %.1f%% of all-reduce time hidden behind compute (%.3f of %.3f device-ms)\n",
              all_sync > 0 ? 100.0 * sim.hidden_sync_device_ms() / all_sync : 0.0, sim.hidden_sync_device_ms(),
              all_sync);
  if (plan.bucket_starts == sp::BucketStarts::when_ready && all_sync > 0)
    std::printf("buckets   each started as soon as its gradients are final, not in one global order (simulates "
                "faster here; the plan says so, spindle-run follows it)\n");
  if (plan.grad_norm)
    std::printf("norm      every device's optimizer waits for the global gradient norm, an all-reduce over all %d "
                "devices (--grad-norm, for spindle-run --clip-grad)\n",
                plan.devices);
  std::printf("barrier   %.3f ms if every wave ended on a barrier = compute %.3f + transfer %.3f + sync %.3f\n",
              p.iteration_ms, p.compute_ms, p.transfer_ms, p.sync_ms);
  // The relaxed optimum is the paper's: the sum over MetaLevels of each
  // level's C*, a bound for plans that run the levels one after another.
  // Without wave barriers one task's later level may run beside another's
  // earlier one, and the compute can end below it (a measured CPU profile on
  // which 2 devices are no faster than 1: each level's C* is its longest
  // MetaOp alone).
  std::printf("optimum   relaxed %.3f ms, compute gap %+.2f%% (simulated with communication and optimizer at 0)%s\n",
              p.relaxed_optimum_ms, gap * 100,
              gap < 0 ? "; below it: levels overlap, and the optimum is per level" : "");
  // A plan that spreads some MetaOp narrower than it could (the
  // communication-capped allocation): the same makespan against the
  // optimum of its own widths, how well its waves are packed.
  if (width_optimum_ms > p.relaxed_optimum_ms * (1 + 1e-3)) {
    const double width_gap = sp::width_gap(plan, gap, width_optimum_ms);
    std::printf("widths    relaxed %.3f ms with no MetaOp wider than in this plan: compute gap %+.2f%%%s\n",
                width_optimum_ms, width_gap * 100,
                width_gap < 0 ? " (below it: levels overlap, and the optimum is per level)" : "");
  }
  std::printf("memory    peak %s on device %d (of %s), optimizer state %s%s\n", size_text(peak).c_str(), peak_dev,
              size_text(plan.memory_bytes).c_str(), sp::optimizer_state_name(plan.optimizer_state),
              sharded_because(plan).c_str());
  if (plan.fitted_from)
    std::printf("fitted    Spindle's own schedules do not fit (the fastest needs %s on a device): the %s schedule, "
                "which fits, planned instead\n",
                size_text(plan.fitted_from->own_peak_bytes).c_str(), plan.fitted_from->strategy.c_str());
  // The threads the planner's parallel loops ran on (SPINDLE_PLAN_THREADS,
  // else one per hardware thread): planning times compare only alike.
  const size_t threads = sp::plan_threads();
  std::printf("planning  %.2f ms on %zu thread%s\n", plan.planning_ms, threads, threads == 1 ? "" : "s");
}

// The name of a device's program in the --lower folder: device-D.json.
const std::regex& program_file() {
  static const std::regex name(R"(device-(0|[1-9]\d{0,8})\.json)");   // the names lower writes, no leading 0
  return name;
}

// --lower DIR must not hold the programs of a plan for more devices:
// DIR/device-D.json with D >= `devices` would sit beside this plan's and
// read as part of it. Nor may a program's name be taken by anything but a
// regular file (a folder, link, FIFO...: writing the program would fail
// after planning). Refused before anything is written, naming them
// (nothing is removed: they may be what the user wanted to keep).
sp::Status check_no_stale_programs(const std::string& dir, int devices) {
  std::vector<int> stale;
  std::vector<fs::directory_entry> entries;
  sp::list_folder(dir, entries);   // a folder that does not exist yet holds nothing
  for (const fs::directory_entry& entry : entries) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, program_file())) continue;
    if (const int d = std::stoi(m[1].str()); d >= devices) {
      stale.push_back(d);
      continue;
    }
    std::error_code type_ec;
    if (const fs::file_status st = entry.symlink_status(type_ec); !fs::is_regular_file(st))
      return sp::Error{"--lower " + dir + ": " + name + " is not a regular file (" +
                       (fs::is_directory(st) ? "a folder" : "a link or special file") +
                       "), where this plan's program goes; remove it or name another folder"};
  }
  if (stale.empty()) return {};
  std::sort(stale.begin(), stale.end());
  const std::string first = "device-" + std::to_string(stale.front()) + ".json";
  const std::string held = stale.size() == 1 ? first
                                             : first + " .. device-" + std::to_string(stale.back()) + ".json (" +
                                                   std::to_string(stale.size()) + " files)";
  return sp::Error{"--lower " + dir + ": holds " + held + ", programs of a plan for more than " +
                   std::to_string(devices) + " devices; remove them or name another folder"};
}

// --lower DIR: the plan's per-device programs (libplan/lower), one file per
// device, DIR/device-D.json, staged in `out` (the folder made if missing)
// with the command's other outputs. Exit code or 0.
int stage_programs(sp::OutputSet& out, const std::string& dir, const sp::Plan& plan, const sp::Model& model,
                   const sp::OpGraph& graph, const sp::GradSync& sync) {
  sp::LowerOptions options;
  options.sync = sync;
  auto lowered = sp::lower(plan, model, graph, options);
  if (!lowered) return fail(kExitInvalid, lowered.error().message);
  // The folder passed check_output_dir before anything was read.
  if (sp::Status st = out.make_folder("--lower", dir); !st) return fail(kExitFailure, st.error().message);
  for (int d = 0; d < plan.devices; ++d) {
    const std::string path = (fs::path(dir) / ("device-" + std::to_string(d) + ".json")).string();
    if (sp::Status st = out.stage(path, sp::program_json(*lowered, graph, d)); !st)
      return fail(kExitFailure, st.error().message);
  }
  return 0;
}

// Every staged output in place, or exit code kExitFailure; then the
// --lower line when there were programs.
int commit_outputs(sp::OutputSet& out, const std::string& lower_dir, int devices) {
  if (sp::Status st = out.commit(); !st) return fail(kExitFailure, st.error().message);
  if (!lower_dir.empty()) std::printf("lowered   %d programs into %s\n", devices, lower_dir.c_str());
  return 0;
}

// The command line (spec/cli.md).
struct Options {
  std::string model_path, cluster_path, profile_path, out_path = "plan.json", strategy_name = "spindle";
  std::string placement_name = "islands", optimizer_state = "auto";
  std::string trace_path, check_path, plot_path, lower_dir, compare_json_path;
  bool compare = false, accept_profile_mismatch = false, no_overlap = false, no_early = false;
  bool grad_norm = false;
  double bucket_mb = 25;
  int shift_simulations = sp::kShiftSimulations;
  bool cluster_given = false;   // --cluster was passed (else cluster_path is the default)
  bool bucket_given = false;    // --bucket-mb was passed (--check: else the plan's)
  std::string model_option;     // --model, moved into model_path once parsed
};

// The options in --help's groups (each option_defaults()->group call names
// the group of those after it; a group shows where it first appears).
void add_options(CLI::App& app, Options& o) {
  app.option_defaults()->group("Inputs");
  app.add_option("model", o.model_path, "model description (YAML, spec/model.md)")->check(CLI::ExistingFile);
  app.add_option("--model", o.model_option, "the model, as an option (same as the positional)")
      ->check(CLI::ExistingFile);
  app.add_option("--cluster", o.cluster_path, "cluster description (YAML); default configs/clusters/a800-1x8.yaml")
      ->check(CLI::ExistingFile);
  app.add_option("--profile", o.profile_path, "profile database (JSON); default: analytic, computed in memory")
      ->check(CLI::ExistingFile);
  app.option_defaults()->group("Outputs");
  app.add_option("-o,--output", o.out_path, "plan to write (JSON, spec/plan.md)")
      ->check(spindle::apps::non_empty_path())
      ->capture_default_str();
  app.option_defaults()->group("Planning");
  app.add_option("--strategy", o.strategy_name, "spindle | sequential | task-level | intra-task")
      ->capture_default_str();
  app.add_option("--placement", o.placement_name,
                 "islands (island-, locality- and memory-aware) | sequential (naive, contiguous)")
      ->capture_default_str();
  app.option_defaults()->group("Outputs");
  app.add_flag("--compare", o.compare, "plan every strategy and print the comparison table");
  app.add_option("--compare-json", o.compare_json_path,
                 "also write the comparison as JSON (implies --compare; docs/spec/cli.md has the fields)")
      ->check(spindle::apps::non_empty_path());
  app.add_option("--trace", o.trace_path,
                 "write the simulated timeline (compute and communication tracks per device) as a Chrome trace (Perfetto)")
      ->check(spindle::apps::non_empty_path());
  app.add_option("--plot", o.plot_path,
                 "write simulated cluster utilisation over one iteration as SVG: every strategy with --compare, else the "
                 "one planned")
      ->check(spindle::apps::non_empty_path());
  app.option_defaults()->group("Checking an existing plan");
  app.add_option("--check", o.check_path,
                 "check an existing plan against the model (and the cluster, when --cluster is given) instead of "
                 "planning")
      ->check(CLI::ExistingFile);
  app.option_defaults()->group("Inputs");
  app.add_flag("--accept-profile-mismatch", o.accept_profile_mismatch,
               "plan with a profile made for another device or cluster, or the model in another dtype or "
               "tensor_parallel (a warning instead of an error)");
  app.option_defaults()->group("Outputs");
  app.add_option("--lower", o.lower_dir,
                 "also write the plan's program for every device (what spindle-run executes) as DIR/device-D.json")
      ->check(spindle::apps::non_empty_path());
  app.option_defaults()->group("Planning");
  app.add_flag("--no-overlap", o.no_overlap,
               "plan, simulate and lower with gradient all-reduces after the backward pass, blocking (default: "
               "started during it); recorded in the plan, which spindle-run follows");
  app.add_option("--bucket-mb", o.bucket_mb,
                 "gradient buckets of at most this many MiB (as PyTorch DDP's bucket_cap_mb); recorded in the plan, "
                 "which spindle-run follows")
      ->capture_default_str();
  app.add_flag("--no-early-transfers", o.no_early,
               "each transfer in its wave's exchange, recorded in the plan for spindle-run (default: sent right "
               "after the compute that made it, unless keeping it in its exchange simulates faster)");
  app.add_flag("--grad-norm", o.grad_norm,
               "plan, simulate and lower for runs that clip gradients (spindle-run --clip-grad): every device's "
               "optimizer steps wait for the global gradient norm, one all-reduce over every device; recorded in the "
               "plan, which spindle-run follows");
  app.add_option("--shift-simulations", o.shift_simulations,
                 "Spindle: at most this many simulations of boundary shifts on the winning plan (docs/planner.md, "
                 "step 9); 0: none")
      ->check(spindle::apps::integer_in(0, sp::kMaxShiftSimulations))
      ->capture_default_str();
  app.add_option("--optimizer-state", o.optimizer_state,
                 "how AdamW's state is held, recorded in the plan and followed by spindle-run: auto (replicated when "
                 "that plan fits the devices, unless sharded simulates faster or alone fits them as spindle-run holds "
                 "it on GPUs; else sharded) | sharded over the "
                 "data-parallel replicas (ZeRO-1, Megatron's distributed optimizer: an all-gather per bucket and step) "
                 "| replicated")
      ->check(CLI::IsMember({"auto", "sharded", "replicated"}))
      ->capture_default_str();
  // --check plans nothing: an option only planning reads is refused with it
  // (exit 2), not ignored: `--check P --trace T` would otherwise exit 0
  // and write no trace.
  CLI::Option* check = app.get_option("--check");
  for (const char* name : {"--output", "--strategy", "--placement", "--compare", "--compare-json", "--trace", "--plot",
                           "--accept-profile-mismatch", "--shift-simulations", "--optimizer-state"})
    check->excludes(app.get_option(name));
}

// --check PLAN: the plan checked against the model (and the cluster and the
// profile when given), and lowered with --lower as spindle-run would lower
// it given the same flags (sync_for_run). Exit code.
int check_existing(const Options& o, const sp::Model& model, const sp::OpGraph& graph) {
  auto plan = sp::load_plan(o.check_path);
  if (!plan) return fail(kExitInvalid, plan.error().message);
  std::optional<sp::Cluster> against;
  if (o.cluster_given) {
    auto cluster = sp::load_cluster(o.cluster_path);
    if (!cluster) return fail(kExitInvalid, cluster.error().message);
    against = std::move(*cluster);
  }
  if (!o.profile_path.empty()) {
    auto bytes = sp::read_file(o.profile_path);
    if (!bytes) return fail(kExitInvalid, bytes.error().message);
    if (sp::sha256_hex(*bytes) != plan->profile_sha256)
      return fail(kExitInvalid, o.check_path + ": profile.sha256: the plan was made from another profile than " +
                                    o.profile_path);
  }
  sp::Status st = sp::check_plan_status(*plan, model, graph, o.check_path, against ? &*against : nullptr);
  if (!st) return fail(kExitInvalid, st.error().message);
  if (!o.lower_dir.empty())
    if (sp::Status stale = check_no_stale_programs(o.lower_dir, plan->devices); !stale)
      return fail(kExitInvalid, stale.error().message);
  std::printf("%s: valid %s plan for %s on %d devices (%zu waves)%s\n", o.check_path.c_str(), plan->strategy.c_str(),
              plan->model_name.c_str(), plan->devices, plan->waves.size(),
              against ? (", cluster " + o.cluster_path).c_str() : "");
  // Valid, but over a device's memory as spindle-run holds it (costed
  // again from the model, not read from the plan: memory_as_run): said, as
  // spindle-run would refuse it, on GPUs over NCCL (the CUDA backend's
  // bf16 mode) and on the CPU backend.
  if (sp::Status nccl = sp::check_memory_as_run(*plan, model, graph, o.check_path, sp::kBf16LayerValueBytes); !nccl)
    std::fprintf(stderr, "spindle-plan: warning: spindle-run on GPUs over NCCL would refuse it: %s\n",
                 nccl.error().message.c_str());
  if (sp::Status host = sp::check_memory_as_run(*plan, model, graph, o.check_path); !host)
    std::fprintf(stderr, "spindle-plan: warning: spindle-run on the CPU backend would refuse it: %s\n",
                 host.error().message.c_str());
  if (o.lower_dir.empty()) return 0;
  const sp::SyncFlags flags{o.no_overlap, o.no_early,
                            o.bucket_given ? std::optional(sp::bucket_bytes_of_mb(o.bucket_mb)) : std::nullopt,
                            o.grad_norm};
  std::vector<std::string> notes;
  const sp::GradSync sync = sp::sync_for_run(*plan, flags, notes);
  for (const std::string& note : notes) std::printf("note      %s\n", note.c_str());
  sp::OutputSet out;
  if (int rc = stage_programs(out, o.lower_dir, *plan, model, graph, sync); rc != 0) return rc;
  return commit_outputs(out, o.lower_dir, plan->devices);
}

// The profile planned with: --profile (refused when made for another device
// or cluster, or another dtype or tensor_parallel of the model, unless
// --accept-profile-mismatch: then a warning), else the analytic one,
// computed in memory.
sp::Result<sp::Profile> profile_for(const Options& o, const sp::Model& model, const sp::OpGraph& graph,
                                    const sp::Cluster& cluster) {
  if (o.profile_path.empty()) return sp::analytic_profile(model, graph, cluster, nullptr);
  SPINDLE_ASSIGN(loaded, sp::load_profile(o.profile_path));
  SPINDLE_TRY(sp::check_profile_keys(model, graph));   // the model's own error first: no profile can serve it
  std::vector<std::string> mismatches = sp::profile_mismatches(loaded, cluster);
  const sp::ProfileFit fit = sp::profile_fit(loaded, model, graph, cluster);
  const std::vector<std::string>& of_model = fit.mismatches;
  constexpr size_t kShown = 5;   // of the model's: a whole other dtype differs in every entry
  for (size_t i = 0; i < of_model.size() && i < kShown; ++i) mismatches.push_back(of_model[i]);
  if (of_model.size() > kShown) mismatches.push_back("... and " + std::to_string(of_model.size() - kShown) + " more");
  if (!mismatches.empty()) {
    std::string msg = o.profile_path + ": made for another " +
                      std::string(of_model.empty() ? "device or cluster than " + o.cluster_path
                                                   : "model, device or cluster than " + o.model_path + " on " +
                                                         o.cluster_path) +
                      ":";
    for (const std::string& m : mismatches) msg += "\n  " + m;
    if (!o.accept_profile_mismatch)
      return sp::Error{msg + "\n  (regenerate it with spindle-profile, or pass --accept-profile-mismatch)"};
    std::fprintf(stderr, "spindle-plan: warning: %s\n  (accepted: --accept-profile-mismatch)\n", msg.c_str());
  }
  // Points that stop below what the cluster allows: planned, but the
  // curves are flat beyond them, so those MetaOps are never spread wider.
  const std::vector<std::string>& short_entries = fit.short_of_cluster;
  if (!short_entries.empty())
    std::fprintf(stderr,
                 "spindle-plan: warning: %s: %zu of the entries this model uses stop below the device counts %s "
                 "allows, first %s: their times beyond are held flat, so the planner never spreads them wider "
                 "(profile the cluster's counts: spindle-profile --devices)\n",
                 o.profile_path.c_str(), short_entries.size(), o.cluster_path.c_str(), short_entries.front().c_str());
  return loaded;
}

// --compare: every strategy planned and simulated, one table row each (every
// figure from the simulation, the planner's objective, except barrier_ms,
// the wave-barrier prediction: plan.predicted.iteration_ms). With --plot,
// each plan's utilisation appended to `plotted`, in table order. `table`:
// the same rows as data, for --compare-json (docs/spec/cli.md: a row per
// strategy, its figures unrounded; a strategy with no plan has its error).
// `kept`: the plan of request.strategy, the one to write (make_plan is
// deterministic: planning it again would give the same plan).
sp::Status print_comparison(sp::PlanRequest request, const sp::SimOptions& sim_options, bool plot,
                            std::vector<sp::Utilisation>& plotted, nlohmann::json& table,
                            std::optional<sp::Plan>& kept) {
  const sp::Strategy wanted = request.strategy;
  const sp::Model& model = *request.model;
  const sp::OpGraph& graph = *request.graph;
  const sp::Cluster& cluster = *request.cluster;
  table = {{"format", "spindle-compare"}, {"version", 1},      {"model", model.name},
           {"cluster", cluster.name},     {"devices", cluster.devices()}, {"strategies", nlohmann::json::array()}};
  std::printf("%-12s %13s %9s %9s %9s %9s %11s %10s %11s %10s\n", "strategy", "iteration_ms", "speedup", "gap",
              "transfer", "sync", "barrier_ms", "memory", "state", "plan_ms");
  double sequential_ms = 0;
  for (sp::Strategy s :
       {sp::Strategy::sequential, sp::Strategy::task_level, sp::Strategy::intra_task, sp::Strategy::spindle}) {
    request.strategy = s;
    auto plan = sp::make_plan(request);
    if (!plan) {
      std::printf("%-12s  not available: %s\n", sp::strategy_name(s), plan.error().message.c_str());
      table["strategies"].push_back({{"strategy", sp::strategy_name(s)}, {"error", plan.error().message}});
      continue;
    }
    auto sim = sp::simulate_plan(*plan, model, graph, *request.cost, sim_options);
    auto gap = sp::simulated_compute_gap(*plan, model, graph, *request.cost);
    if (!sim || !gap)
      return sp::Error{"internal error: cannot simulate the " + std::string(sp::strategy_name(s)) +
                       " plan: " + (sim ? gap.error() : sim.error()).message};
    const double device_ms = sim->iteration_ms * static_cast<double>(sim->devices.size());
    auto share = [&](double ms) { return device_ms > 0 ? 100 * ms / device_ms : 0.0; };
    if (s == sp::Strategy::sequential) sequential_ms = sim->iteration_ms;
    const double speedup = sequential_ms > 0 ? sequential_ms / sim->iteration_ms : 0.0;
    // Peak device memory as the plan counts it (and spindle-run holds it);
    // a plan over a device's memory (rule 6) is shown, and said to be.
    const std::vector<int64_t>& mem = plan->predicted.memory_bytes;
    const auto worst = std::max_element(mem.begin(), mem.end());
    const int64_t peak = worst == mem.end() ? 0 : *worst;
    const bool over_memory = worst != mem.end() && *worst > plan->memory_bytes;
    std::string over;
    if (over_memory)
      over = "  over memory: device " + std::to_string(worst - mem.begin()) + " needs " +
             sp::human_bytes(static_cast<double>(*worst), 2) + " of " +
             sp::human_bytes(static_cast<double>(plan->memory_bytes), 2);
    // And as spindle-run would hold it on GPUs over NCCL (memory_as_run,
    // what it checks before it allocates): a plan within its count but
    // over there is said to be refused (one over its count is said to be
    // that alone).
    auto held = sp::memory_as_run_on_gpus(*plan, model, graph);
    if (!held || held->empty())
      return sp::Error{"internal error: cannot cost the " + std::string(sp::strategy_name(s)) +
                       " plan's memory as run: " + (held ? std::string("no devices") : held.error().message)};
    const auto held_worst = std::max_element(held->begin(), held->end());
    const bool refused_on_gpus = !over_memory && *held_worst > plan->memory_bytes;
    if (refused_on_gpus)
      over += "  refused on GPUs: device " + std::to_string(held_worst - held->begin()) + " would hold " +
              sp::human_bytes(static_cast<double>(*held_worst), 2) + " as spindle-run runs it";
    // `state`: how the plan holds AdamW's state (--optimizer-state; auto
    // may choose either per strategy).
    const char* state = sp::optimizer_state_name(plan->optimizer_state);
    std::printf("%-12s %13.3f %8.2fx %8.2f%% %8.2f%% %8.2f%% %11.3f %10s %11s %10.2f%s\n", sp::strategy_name(s),
                sim->iteration_ms, speedup, *gap * 100, share(sim->transfer_device_ms()), share(sim->sync_device_ms()),
                plan->predicted.iteration_ms, sp::human_bytes(static_cast<double>(peak)).c_str(), state,
                plan->planning_ms, over.c_str());
    nlohmann::json row = {{"strategy", sp::strategy_name(s)},
                          {"iteration_ms", sim->iteration_ms},
                          {"speedup", sequential_ms > 0 ? nlohmann::json(speedup) : nlohmann::json(nullptr)},
                          {"gap_percent", *gap * 100},
                          {"transfer_percent", share(sim->transfer_device_ms())},
                          {"sync_percent", share(sim->sync_device_ms())},
                          {"barrier_ms", plan->predicted.iteration_ms},
                          {"peak_memory_bytes", peak},
                          {"gpu_run_memory_bytes", *held_worst},
                          {"device_memory_bytes", plan->memory_bytes},
                          {"optimizer_state", state},
                          {"planning_ms", plan->planning_ms}};
    if (over_memory) row["over_memory_device"] = worst - mem.begin();
    if (refused_on_gpus) row["refused_on_gpus_device"] = held_worst - held->begin();
    table["strategies"].push_back(std::move(row));
    if (plot) plotted.push_back(sp::utilisation(*sim, *plan));
    if (s == wanted) kept = std::move(*plan);
  }
  return {};
}

// Transfers posted early or in their exchanges: the planner keeps the
// faster and the plan says which (Plan::early_transfers); say so when it
// keeps them in their exchanges, and hint when --no-early-transfers costs
// this plan clearly. `sim` simulates `plan` with `sim_options`.
void print_transfer_choice(const sp::Plan& plan, const sp::Simulation& sim, const sp::PlanRequest& request,
                           const sp::SimOptions& sim_options) {
  const sp::GradSync& sync = request.sync;   // the flags
  if (!sync.overlap) return;
  const bool chose_late = sync.early_transfers && !plan.early_transfers;
  const bool forced_late = !sync.early_transfers;
  if (!chose_late && !forced_late) return;
  sp::SimOptions options = sim_options;
  options.sync = sp::planned_sync(plan);
  options.sync->early_transfers = true;
  options.timeline = false;
  sp::Plan early = plan;
  early.early_transfers = true;
  auto alt = sp::simulate_plan(early, *request.model, *request.graph, *request.cost, options);
  if (!alt) return;
  if (chose_late)
    std::printf("transfers kept in their wave's exchanges: posted early this plan simulates %.3f ms (the plan "
                "says so, spindle-run follows it)\n",
                alt->iteration_ms);
  else if (alt->iteration_ms < sim.iteration_ms * (1 - kHintMargin))
    std::printf("hint      without --no-early-transfers: this plan simulates %.3f ms (%.1f%% faster)\n",
                alt->iteration_ms, 100.0 * (1 - alt->iteration_ms / sim.iteration_ms));
}

// The bucket cap the planner chose (PlanRequest::choose_bucket_bytes) when
// it is not the request's: say so, with what the request's would simulate.
void print_bucket_choice(const sp::Plan& plan, const sp::PlanRequest& request, const sp::SimOptions& sim_options) {
  if (plan.bucket_bytes == request.sync.bucket_bytes) return;
  sp::SimOptions options = sim_options;
  options.sync = sp::planned_sync(plan);
  options.sync->bucket_bytes = request.sync.bucket_bytes;
  options.timeline = false;
  auto alt = sp::simulate_plan(plan, *request.model, *request.graph, *request.cost, options);
  if (!alt) return;
  const double mib = 1 << 20;
  std::printf("bucket    gradient buckets of at most %g MiB, the fastest simulated of the caps tried (%g MiB: "
              "%.3f ms); the plan says so, spindle-run follows it; --bucket-mb fixes one\n",
              static_cast<double>(plan.bucket_bytes) / mib, static_cast<double>(request.sync.bucket_bytes) / mib,
              alt->iteration_ms);
}

// The tensor-parallel copies at the end of each step (docs/lowering.md,
// "Tensor-parallel copies"), when the plan's programs have any messages
// of them.
void print_copies(const sp::Plan& plan, const sp::Model& model, const sp::OpGraph& graph) {
  sp::LowerOptions options;
  options.deps = false;
  const auto lowered = sp::lower(plan, model, graph, options);
  if (!lowered) return;
  int64_t messages = 0, bytes = 0;
  for (const sp::Transfer& t : lowered->transfers)
    if (t.dir == sp::Direction::copy && t.src != t.dst) {
      ++messages;
      bytes += t.bytes;
    }
  if (messages == 0) return;
  std::printf("copies    %lld message%s (%s) at the end of each step set the tensor-parallel copies of replicated "
              "tensors to TP rank 0's values (docs/lowering.md, \"Tensor-parallel copies\")\n",
              static_cast<long long>(messages), messages == 1 ? "" : "s",
              sp::human_bytes(static_cast<double>(bytes)).c_str());
}

// The peak spindle-run holds, which it checks before it allocates
// (memory_as_run): its activations in fp32 with the attention
// probabilities and the outputs, the backward pass's working set; on the
// CPU backend, and on GPUs over NCCL in the CUDA backend's default bf16
// mode (a transformer layer's internals in bf16).
void print_run_memory(const sp::Plan& plan, const sp::Model& model, const sp::OpGraph& graph) {
  const auto host = sp::memory_as_run(plan, model, graph);
  const auto nccl = sp::memory_as_run_on_gpus(plan, model, graph);
  if (!host || !nccl || host->empty()) return;
  const auto peak = [](const std::vector<int64_t>& m) { return *std::max_element(m.begin(), m.end()); };
  const bool gpu_over = peak(*nccl) > plan.memory_bytes, cpu_over = peak(*host) > plan.memory_bytes;
  const char* verdict = gpu_over && cpu_over ? "; over the device's memory: spindle-run refuses the plan there"
                        : gpu_over           ? "; over the device's memory on GPUs: spindle-run --backend cuda "
                                               "refuses the plan there"
                        : cpu_over           ? "; over the device's memory on the CPU backend: spindle-run "
                                               "--backend cpu refuses the plan there"
                                             : "";
  const std::string width = sp::dtype_bytes(model.dtype) < sp::kRunActivationValueBytes
                                ? std::string("in fp32, not ") + sp::dtype_name(model.dtype)
                                : std::string("in fp32");
  std::printf("run mem   as spindle-run holds it (activations %s, attention probabilities and outputs included; on "
              "GPUs a transformer layer's internals in bf16): peak %s on the CPU backend, %s on GPUs over NCCL "
              "(of %s)%s\n",
              width.c_str(), size_text(peak(*host)).c_str(), size_text(peak(*nccl)).c_str(),
              size_text(plan.memory_bytes).c_str(), verdict);
  // Within the margin of a GPU's memory: what the count leaves out may
  // take the device over (sp::within_uncounted_margin; docs/planner.md,
  // "Memory").
  if (sp::within_uncounted_margin(peak(*nccl), plan.memory_bytes))
    std::printf("run mem   on GPUs within %.0f%% of the device's memory: the CUDA context, cuBLAS's workspace and "
                "NCCL's buffers, which this count leaves out, may take it over; more devices give a margin\n",
                100 * sp::kUncountedMarginShare);
  // Over on GPUs with AdamW's state whole on every replica: what the same
  // waves hold with it sharded (ZeRO-1), when that fits, and the flag that
  // plans so (the plan it makes may place the waves otherwise).
  // --optimizer-state auto shards such waves (it keeps them where its own
  // sharded search places the waves over the device); a model of more
  // MetaOps than it asks gets --optimizer-state sharded, a search of its own.
  const std::optional<int64_t> with = sp::sharding_fits_on_gpus(plan, model, graph, peak(*nccl));
  if (!with) return;
  const bool auto_asks = plan.metaops.size() <= static_cast<size_t>(sp::kShardedSearchMetaOps);
  std::printf("run mem   with the optimizer state sharded (ZeRO-1) these waves need %s on GPUs over NCCL and fit: %s\n",
              size_text(*with).c_str(),
              auto_asks ? "plan with the default --optimizer-state auto, which shards waves that fit only so"
                        : "plan with --optimizer-state sharded");
}

// The link figures a measured profile carries (x-links), when it does.
void print_profile_links(const sp::Profile& profile) {
  if (!profile.links) return;
  const sp::ProfileLinks& l = *profile.links;
  auto fig = [](const sp::Link& k) {
    char buf[64];
    if (k.gbytes_per_s <= 0) return std::string("cluster's");
    std::snprintf(buf, sizeof buf, "%.2f GB/s, %.1f us", k.gbytes_per_s, k.latency_us);
    return std::string(buf);
  };
  std::printf("links     measured by the profile (x-links, %d ranks): in an island p2p %s, all-reduce %s; "
              "across p2p %s, all-reduce %s%s\n",
              l.ranks, fig(l.intra_p2p).c_str(), fig(l.intra_allreduce).c_str(), fig(l.inter_p2p).c_str(),
              fig(l.inter_allreduce).c_str(),
              l.progress_in_calls ? "; all-reduces move only inside MPI calls and polls (progress: calls)" : "");
}

// The operators' in-step scale a measured profile carries (x-compute), when it does.
void print_profile_compute(const sp::Profile& profile) {
  if (!profile.compute_scale) return;
  std::printf("compute   the profile's operator times x %.3f, as they ran inside training steps (x-compute)\n",
              *profile.compute_scale);
}

// The outputs (-o, --trace, --plot, --compare-json, --lower), before anything is read or
// written (util/files.h policy): each writable, none an input, and no file
// of them one of --lower's programs. With --check only --lower is written.
sp::Status check_outputs(const Options& o) {
  const bool planning = o.check_path.empty();
  // The files only planning writes (none with --check).
  const std::vector<sp::OutputPath> files =
      planning ? std::vector<sp::OutputPath>{{"-o", o.out_path},
                                             {"--trace", o.trace_path},
                                             {"--plot", o.plot_path},
                                             {"--compare-json", o.compare_json_path}}
               : std::vector<sp::OutputPath>{};
  SPINDLE_TRY(sp::check_output_paths(files, {o.model_path, o.cluster_path, o.profile_path}));
  if (o.lower_dir.empty()) return {};
  SPINDLE_TRY(sp::check_output_dir("--lower", o.lower_dir));
  const sp::OutputDir programs{"--lower", o.lower_dir,
                               [](const std::string& name) { return std::regex_match(name, program_file()); },
                               "a device's program"};
  return sp::check_apart_from_dir(programs, files,
                                  {o.model_path, o.cluster_path, o.profile_path, o.check_path});
}

// The planner's request from the options (their values checked by CLI11
// and main): every strategy simulated as its plan says it synchronises,
// with the bucket cap the planner chooses unless --bucket-mb fixed one.
sp::PlanRequest plan_request(const Options& o, const sp::Model& model, const sp::OpGraph& graph,
                             const sp::Cluster& cluster, const sp::CostModel& cost, const std::string& profile_sha256,
                             sp::Strategy strategy, sp::Placement placement) {
  sp::PlanRequest request{&model, &graph, &cluster, &cost, profile_sha256, strategy};
  request.placement = placement;
  request.sync.overlap = !o.no_overlap;
  request.sync.early_transfers = !o.no_early;
  request.sync.bucket_bytes = sp::bucket_bytes_of_mb(o.bucket_mb);
  request.sync.grad_norm = o.grad_norm;
  request.shift_simulations = o.shift_simulations;
  request.choose_optimizer_state = o.optimizer_state == "auto";
  if (!request.choose_optimizer_state)
    request.optimizer_state = *sp::optimizer_state_named(o.optimizer_state);   // CLI::IsMember checked it
  request.choose_bucket_bytes = !o.bucket_given;
  return request;
}

// Every output of a plan staged, then committed all or none (util/files.h
// OutputSet): the comparison (--compare-json: `compared`), trace, plot
// (`plotted`: the compared plans, else this one), plan, programs. Returns the exit code; 0 when all were written.
int write_outputs(const Options& o, const sp::Plan& plan, const sp::Model& model, const sp::OpGraph& graph,
                  const sp::Simulation& sim, std::vector<sp::Utilisation>& plotted, const nlohmann::json& compared) {
  sp::OutputSet out;
  if (!o.compare_json_path.empty())
    if (sp::Status st = out.stage(o.compare_json_path, compared.dump(2) + "\n"); !st)
      return fail(kExitFailure, st.error().message);
  if (!o.trace_path.empty()) {
    sp::Status st = out.stage(o.trace_path, sp::trace_to_json(sp::simulated_trace(sim), plan.devices));
    if (!st) return fail(kExitFailure, st.error().message);
  }
  if (!o.plot_path.empty()) {
    if (!o.compare) plotted.push_back(sp::utilisation(sim, plan));
    if (sp::Status st = out.stage(o.plot_path, sp::utilisation_svg(plotted)); !st)
      return fail(kExitFailure, st.error().message);
  }
  if (sp::Status st = out.stage(o.out_path, sp::plan_to_json(plan)); !st) return fail(kExitFailure, st.error().message);
  if (!o.lower_dir.empty())
    if (int rc = stage_programs(out, o.lower_dir, plan, model, graph, sp::planned_sync(plan)); rc != 0) return rc;
  return commit_outputs(out, o.lower_dir, plan.devices);
}

}  // namespace

int main(int argc, char** argv) {
  spindle::plan::keep_freed_host_memory(std::getenv("GLIBC_TUNABLES"));  // util/host_memory.h
  CLI::App app{"spindle-plan: plan multi-task multi-modal training as waves of MetaOps"};
  spindle::apps::init_app(app, "spindle-plan");
  Options o;
  add_options(app, o);
  spindle::apps::refuse_empty_values(app);   // once every option is added
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitInvalid;
  }
  o.bucket_given = app.count("--bucket-mb") > 0;
  // One model: given both ways, one was silently not planned (or checked).
  if (!o.model_option.empty() && !o.model_path.empty())
    return fail(kExitInvalid, "two models: " + o.model_path + " and --model " + o.model_option + "; give one");
  if (!o.model_option.empty()) o.model_path = o.model_option;
  if (!o.compare_json_path.empty()) o.compare = true;   // --compare-json implies the comparison
  if (o.model_path.empty()) return fail(kExitInvalid, "a model description is required (spindle-plan MODEL.yaml)");
  if (const std::string threads = spindle::apps::plan_threads_env_error(); !threads.empty())
    return fail(kExitInvalid, threads);

  if (sp::Status st = sp::check_bucket_mb(o.bucket_mb); !st) return fail(kExitInvalid, st.error().message);
  // Flags that would be taken and do nothing are refused (exit 2), as
  // --check refuses what only planning reads: the lowering flags shape the
  // programs --check writes with --lower, and nothing without it; the
  // boundary shifts are Spindle's; a mismatch is accepted only in a profile.
  if (!o.check_path.empty() && o.lower_dir.empty())
    for (const char* flag : {"--bucket-mb", "--no-overlap", "--no-early-transfers", "--grad-norm"})
      if (app.count(flag) > 0)
        return fail(kExitInvalid, std::string(flag) +
                                      ": with --check it shapes the programs --lower DIR writes, and there is no "
                                      "--lower");
  if (app.count("--shift-simulations") > 0 && o.strategy_name != "spindle" && !o.compare)
    return fail(kExitInvalid, "--shift-simulations: shifts Spindle's plans, not --strategy " + o.strategy_name +
                                  "'s (with --compare it applies to the spindle row)");
  if (o.accept_profile_mismatch && o.profile_path.empty())
    return fail(kExitInvalid, "--accept-profile-mismatch: accepts a mismatch of --profile, and there is none (the "
                              "analytic profile is made for the model and cluster)");
  o.cluster_given = !o.cluster_path.empty();
  if (o.cluster_path.empty() && o.check_path.empty()) {   // --check needs no cluster unless given one
    auto found = default_cluster_path(argv[0]);
    if (!found) return fail(kExitInvalid, found.error().message);
    o.cluster_path = *found;
  }
  // Outputs are checked before anything is read or written (files.h policy).
  if (sp::Status st = check_outputs(o); !st) return fail(kExitInvalid, st.error().message);

  auto model = sp::load_model(o.model_path);
  if (!model) return fail(kExitInvalid, model.error().message);
  const sp::OpGraph graph = sp::expand(*model);
  if (!o.check_path.empty()) return check_existing(o, *model, graph);

  auto cluster = sp::load_cluster(o.cluster_path);
  if (!cluster) return fail(kExitInvalid, cluster.error().message);
  if (sp::Status st = sp::check_model_fits_cluster(*model, *cluster); !st) return fail(kExitInvalid, st.error().message);
  if (!o.lower_dir.empty())   // the plan is for the cluster's devices (a share of its islands too)
    if (sp::Status st = check_no_stale_programs(o.lower_dir, cluster->devices()); !st)
      return fail(kExitInvalid, st.error().message);
  auto profile = profile_for(o, *model, graph, *cluster);
  if (!profile) return fail(kExitInvalid, profile.error().message);
  auto cost = sp::ProfileCostModel::create(*profile, *cluster, graph);
  if (!cost) return fail(kExitInvalid, cost.error().message);
  auto strategy = sp::parse_strategy(o.strategy_name);
  if (!strategy) return fail(kExitInvalid, strategy.error().message);
  auto placement = sp::parse_placement(o.placement_name);
  if (!placement) return fail(kExitInvalid, placement.error().message);
  const sp::PlanRequest request =
      plan_request(o, *model, graph, *cluster, *cost->get(), profile->sha256, *strategy, *placement);
  const sp::SimOptions sim_options;   // each plan simulated as it says it synchronises (planned_sync)

  std::vector<sp::Utilisation> plotted;  // --plot: the compared plans, in table order
  nlohmann::json compared;                // --compare-json: the table's rows
  std::optional<sp::Plan> compared_plan;  // the compared plan of --strategy
  if (o.compare)
    if (sp::Status st =
            print_comparison(request, sim_options, !o.plot_path.empty(), plotted, compared, compared_plan);
        !st)
      return fail(kExitFailure, st.error().message);

  sp::Result<sp::Plan> plan = compared_plan ? sp::Result<sp::Plan>(std::move(*compared_plan)) : sp::make_plan(request);
  if (!plan) return fail(kExitInvalid, plan.error().message);
  if (sp::Status st = sp::check_plan_memory(*plan, *model); !st) return fail(kExitInvalid, st.error().message);
  if (sp::Status st = sp::check_plan_status(*plan, *model, graph, o.out_path); !st)
    return fail(kExitFailure, "internal error: the planner produced an invalid plan: " + st.error().message);
  sp::SimOptions traced = sim_options;
  traced.critical_path = true;   // the summary's critical line, the trace's marks
  auto sim = sp::simulate_plan(*plan, *model, graph, *cost->get(), traced);
  auto gap = sp::simulated_compute_gap(*plan, *model, graph, *cost->get());
  if (!sim || !gap)
    return fail(kExitFailure, "internal error: cannot simulate the plan: " + (sim ? gap.error() : sim.error()).message);

  if (int rc = write_outputs(o, *plan, *model, graph, *sim, plotted, compared); rc != 0) return rc;

  if (o.compare) std::printf("\n");
  if (!o.cluster_given) std::printf("cluster   %s (the default; --cluster chooses another)\n", o.cluster_path.c_str());
  const sp::Result<double> width = sp::width_optimum_ms(*plan, *cost->get());
  print_summary(*plan, graph, sp::contract(graph).levels, *sim, *gap, width ? *width : 0.0);
  print_transfer_choice(*plan, *sim, request, sim_options);
  print_bucket_choice(*plan, request, sim_options);
  print_copies(*plan, *model, graph);
  print_run_memory(*plan, *model, graph);
  print_profile_links(*profile);
  print_profile_compute(*profile);
  std::printf("wrote     %s%s%s\n", o.out_path.c_str(), o.trace_path.empty() ? "" : ", ", o.trace_path.c_str());
  if (!o.plot_path.empty()) std::printf("plot      %s (%zu strategies)\n", o.plot_path.c_str(), plotted.size());
  return 0;
}
