// spindle-profile: writes the profile database of a model on a cluster
// (spec/cli.md, spec/profile.md). Exit 0 on success, 2 on bad usage or invalid
// input, 1 on a runtime failure (e.g. the output cannot be written).
//
//   spindle-profile MODEL --cluster C -o P [--analytic]          computed (default)
//   [mpirun -np N] spindle-profile MODEL --cluster C -o P --measure [--backend cpu]
//                  [--point-ms MS] [--devices 1,2,...]           timed (docs/profiling.md)
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "apps/cli_paths.h"
#include "libplan/cost/analytic.h"
#include "libplan/cost/cost_model.h"
#include "libplan/graph/op_graph.h"
#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/util/files.h"
#include "libplan/util/host_memory.h"
#include "libplan/util/limits.h"

#ifdef SPINDLE_HAVE_RUNTIME
#include <mpi.h>

#include "apps/mpi_start.h"

#include "libexec/backend/backend.h"
#ifdef SPINDLE_HAVE_CUDA
#include "libexec/backend/cuda/cuda_backend.h"
#include "libexec/comm/launch_env.h"
#endif
#include "libexec/comm/mpi_check.h"
#include "libexec/comm/mpi_comm.h"
#include "libexec/profile/calibrate.h"
#include "libexec/profile/fit.h"
#include "libexec/profile/measure.h"
#include "libplan/plan/plan_io.h"
#endif

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitInvalid = 2;

// Parses "1,2,4,8" into counts; false on anything else.
bool parse_counts(const std::string& text, std::vector<int>& out) {
  if (text.empty() || text.back() == ',') return false;   // getline gives no empty last item
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    out.push_back(std::stoi(item));
  }
  return !out.empty();
}

std::string counts_summary(const spindle::plan::Profile& p) {
  int lo = 0, hi = 0;
  for (const auto& e : p.entries) {
    for (const auto& pt : e.points) {
      if (lo == 0 || pt.devices < lo) lo = pt.devices;
      hi = std::max(hi, pt.devices);
    }
  }
  return std::to_string(lo) + ".." + std::to_string(hi);
}

#ifdef SPINDLE_HAVE_RUNTIME
namespace sp = spindle::plan;
namespace se = spindle::exec;

// A median spread of the points above this means other work shared the
// cores while timing (on an idle machine it is a few percent).
constexpr double kBusySpread = 0.25;
// An entry's work ratio (superlinear_factor) above 1 + this is reported:
// smaller ones are within a quiet machine's timing noise.
constexpr double kSuperlinearReported = 0.05;

// A time in seconds as a person reads it: "45 s", "12 min", "3.2 h".
std::string duration_text(double s) {
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

// Before the first operator: an estimate over this long (from the analytic
// profile's times) is said once, with the way out.
constexpr double kLongMeasureS = 1800;

// The progress line on stderr (rank 0): rewritten in place with \r on a
// terminal, else a plain line at most once a second (and the last one).
class ProgressLine {
 public:
  ProgressLine() : tty_(isatty(fileno(stderr)) != 0) {}
  void operator()(const se::MeasureProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = p.what == "done";
    if (p.total > 0 && p.done == 0 && p.left_s > kLongMeasureS && !warned_) {
      warned_ = true;
      std::fprintf(stderr,
                   "spindle-profile: timing the operators will take about %s on rank 0, as the analytic profile "
                   "prices them on this cluster (spindle-profile --analytic computes a profile in seconds)\n",
                   duration_text(p.left_s).c_str());
    }
    if (!tty_ && !last && shown_ && now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    shown_ = true;
    char buf[320];
    if (p.total > 0)
      std::snprintf(buf, sizeof buf, "spindle-profile: [%d/%d] %s | %.1f s, about %s left", p.done, p.total,
                    p.what.c_str(), p.elapsed_s, duration_text(p.left_s).c_str());
    else
      std::snprintf(buf, sizeof buf, "spindle-profile: timing %s | %.1f s", p.what.c_str(), p.elapsed_s);
    if (tty_) {
      std::fprintf(stderr, "\r%-110.110s", buf);
      if (last) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "%s\n", buf);
    }
    std::fflush(stderr);
  }

 private:
  bool tty_;
  bool shown_ = false;
  bool warned_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// An entry as the summary lines name it: "transformer_layer seq 8 batch 24".
std::string entry_name(const sp::ProfileEntry& e) {
  return e.workload.op + " seq " + std::to_string(e.workload.seq) + " batch " + std::to_string(e.workload.batch);
}

// Leave-one-out error of the fitted curves (fit.h), printed by rank 0.
void print_fit_check(const sp::Profile& p) {
  std::vector<double> all;
  double worst = -1;
  std::string worst_key;
  int worst_n = 0;
  for (const sp::ProfileEntry& e : p.entries) {
    const std::vector<double> errs = se::leave_one_out_errors(e.points);
    for (size_t i = 0; i < errs.size(); ++i) {
      all.push_back(errs[i]);
      if (errs[i] > worst) {
        worst = errs[i];
        worst_key = entry_name(e);
        worst_n = e.points[i + 1].devices;
      }
    }
  }
  if (all.empty()) {
    std::printf("fit check: no interior points to leave out (an entry needs 3 or more device counts)\n");
    return;
  }
  const se::TimingStats st = se::timing_stats(all);
  std::printf("fit check: curve error on %zu left-out interior points: median %.1f%%, max %.1f%% (%s on %d)\n",
              all.size(), 100 * st.median, 100 * worst, worst_key.c_str(), worst_n);
}

// Entries whose work n T(n) shrinks on more devices (superlinear_factor,
// curve.h), printed by rank 0: a busy machine's timings, or a cache effect
// (docs/profiling.md, "Fit check"). The planner keeps them; its relaxed
// optimum prices them linear.
void print_superlinear(const sp::Profile& p) {
  size_t count = 0;
  double worst = 1.0;
  std::string worst_key;
  for (const sp::ProfileEntry& e : p.entries) {
    const double f = sp::superlinear_factor(e.points);
    if (f <= 1.0 + kSuperlinearReported) continue;
    ++count;
    if (f > worst) {
      worst = f;
      worst_key = entry_name(e);
    }
  }
  if (count == 0) return;
  std::printf("superlinear: %zu of %zu entries take less device time on more devices (worst %s: %.2fx as "
              "much on fewer); spindle-plan keeps them, its relaxed optimum counts them linear; on a busy "
              "machine, measure again\n",
              count, p.entries.size(), worst_key.c_str(), worst);
}

void print_links(const sp::ProfileLinks& l) {
  auto one = [](const char* what, const sp::Link& link) {
    if (link.gbytes_per_s > 0)
      std::printf("links:    %-22s %8.3f GB/s, latency %7.2f us\n", what, link.gbytes_per_s, link.latency_us);
  };
  one("intra_island send/recv", l.intra_p2p);
  one("intra_island all-reduce", l.intra_allreduce);
  one("inter_island send/recv", l.inter_p2p);
  one("inter_island all-reduce", l.inter_allreduce);
}

// A calibration step predicted slower than this is not trained: the
// executor's overhead (microseconds an instruction) matters beside steps of
// milliseconds, and a large model's steps on the host take long.
constexpr double kMaxCalibrationStepMs = 2000;

// This process's host: its cores and the ranks on it (MPI_COMM_TYPE_SHARED).
// Collective over MPI_COMM_WORLD.
struct Host {
  int cores = 0;
  int ranks = 1;
};
Host this_host() {
  Host h;
  h.cores = static_cast<int>(std::thread::hardware_concurrency());
  MPI_Comm host;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
  MPI_CHECK(MPI_Comm_size(host, &h.ranks));
  MPI_CHECK(MPI_Comm_free(&host));
  return h;
}

// The operators inside the executor's steps (Calibration::compute_scale):
// sets it as the profile's "x-compute" unless compute_scale_refusal says
// why not (the cost model prices every point at its time alone times the
// scale). Returns the summary line, either way.
std::string take_compute_scale(const se::Calibration& cal, int ranks_here, int cores, sp::Profile& profile) {
  const std::string why = se::compute_scale_refusal(cal.compute_scale, ranks_here, cores);
  char line[400];
  if (!why.empty()) {
    if (cal.compute_scale < 0) return "compute: as timed alone (" + why + ")";
    std::snprintf(line, sizeof line,
                  "compute: as timed alone; in %d steps of a plan of the model the operators took %.3fx that, "
                  "not applied: %s",
                  cal.steps, cal.compute_scale, why.c_str());
    return line;
  }
  profile.compute_scale = sp::profile_figure(cal.compute_scale);   // as the file stores it
  std::snprintf(line, sizeof line,
                "compute: in %d steps of a plan of the model the operators took %.3fx their times alone "
                "(%d forward and backward instructions over the ranks): the profile's x-compute, which "
                "spindle-plan applies to every point",
                cal.steps, *profile.compute_scale, cal.compute_instructions);
  return line;
}

// After measure_profile, with a host backend under mpirun (calibrate.h):
// rank 0 plans the model with the profile it will write, every rank trains
// that plan a few steps, replicated and then sharded, and the executor's
// fitted figures replace the profile's exchange_us and message_us and add
// instruction_us, accumulate_gbytes_per_s, reduce_scatter_us and
// allgather_us. Collective; a plan that cannot be made or run
// here leaves the figures as measured, with a note saying why.
void measure_executor_overhead(const sp::Model& model, const sp::OpGraph& graph, const sp::Cluster& cluster,
                               se::MpiComm& world, const Host& host, se::Backend& backend,
                               se::MeasureReport& report) {
  const auto start = std::chrono::steady_clock::now();
  // Plans on rank 0 and prices the all-reduce fit on every rank.
  auto cost = sp::ProfileCostModel::create(report.profile, cluster, graph);
  if (!cost) throw std::runtime_error(cost.error().message);
  std::string text, why;
  if (world.rank() == 0) {
    auto plan = se::calibration_plan(model, graph, cluster, **cost, report.profile.sha256, world.size());
    if (!plan) {
      why = plan.error().message;
    } else if (plan->predicted.iteration_ms > kMaxCalibrationStepMs) {
      char line[160];
      std::snprintf(line, sizeof line, "a step of its plan is predicted at %.0f ms (trained up to %.0f ms)",
                    plan->predicted.iteration_ms, kMaxCalibrationStepMs);
      why = line;
    } else {
      text = sp::plan_to_json(*plan);
    }
  }
  long long length = static_cast<long long>(text.size());
  MPI_Bcast(&length, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  if (length == 0) {
    report.notes.push_back("overhead: the executor's own not measured: " + why);
    return;
  }
  text.resize(static_cast<size_t>(length));
  MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, MPI_COMM_WORLD);
  auto plan = sp::parse_plan_string(text, "the calibration plan");
  if (!plan) throw std::runtime_error(plan.error().message);
  se::GroupComms groups = se::create_group_comms(world, se::Executor::device_groups(model, *plan));
  const sp::CommOverhead packing = report.profile.overhead.value_or(sp::CommOverhead{});
  auto cal = se::calibrate_executor(model, graph, *plan, world, std::move(groups), backend, packing, **cost);
  if (!cal) {
    report.notes.push_back("overhead: the executor's own not measured: " + cal.error().message);
    return;
  }
  sp::CommOverhead o = packing;
  o.exchange_us = 0;   // in instruction_us and message_us now
  o.message_us = cal->fit.message_us;
  o.instruction_us = cal->fit.instruction_us;
  o.accumulate_gbytes_per_s = cal->fit.accumulate_gbytes_per_s;
  const se::AllreduceInSitu& ar = cal->allreduce;
  if (ar.allreduce_us >= 0) o.allreduce_us = ar.allreduce_us;
  report.profile.overhead = o;
  report.overhead = o;
  // The optimizer as the executor steps it (every tensor of the rank, its
  // values cold from the backward pass) replaces the rate timed alone (one
  // flat tensor, warm).
  char optimizer[160] = "as timed alone (no step timed)";
  if (cal->optimizer_gbytes_per_s > 0 && report.profile.optimizer_gbytes_per_s) {
    const double alone = *report.profile.optimizer_gbytes_per_s;
    report.profile.optimizer_gbytes_per_s = sp::profile_figure(
        std::clamp(cal->optimizer_gbytes_per_s, sp::limits::kMinRate, 1e9));   // the file's bounds
    std::snprintf(optimizer, sizeof optimizer, "%.2f GB/s in its steps (timed alone: %.2f GB/s)",
                  *report.profile.optimizer_gbytes_per_s, alone);
  }
  char allreduce[160] = "as timed alone (the plan has no bucket)";
  if (ar.allreduce_us >= 0) std::snprintf(allreduce, sizeof allreduce, "%.2f us per call", o.allreduce_us);
  // The executor's buckets faster than the link's timing, fixed cost 0:
  // the wire's rate in them replaces the link's inside an island.
  if (ar.intra_rate_scale > 0 && report.profile.links && report.profile.links->intra_allreduce.gbytes_per_s > 0) {
    sp::Link& link = report.profile.links->intra_allreduce;
    const double rate = std::clamp(link.gbytes_per_s * ar.intra_rate_scale, sp::limits::kMinRate, 1e9);   // a rate's bounds
    std::snprintf(allreduce, sizeof allreduce, "%.2f us per call at %.2f GB/s in its buckets (timed alone: %.2f GB/s)",
                  o.allreduce_us, rate, link.gbytes_per_s);
    link.gbytes_per_s = rate;
  }
  // ZeRO-1: the same plan sharded, priced with the figures just fitted.
  char zero1[160] = "not fitted (no bucket of two ranks)";
  auto fitted = sp::ProfileCostModel::create(report.profile, cluster, graph);
  if (!fitted) throw std::runtime_error(fitted.error().message);
  const sp::Plan sharded = se::sharded_calibration_plan(*plan);
  const se::Zero1InSitu z = se::calibrate_zero1(
      model, sharded, world, se::create_group_comms(world, se::Executor::device_groups(model, sharded)), backend,
      **fitted);
  // As the file stores them, so that the line says what was written.
  if (z.reduce_scatter_us >= 0) o.reduce_scatter_us = sp::profile_figure(z.reduce_scatter_us);
  if (z.allgather_us >= 0) o.allgather_us = sp::profile_figure(z.allgather_us);
  report.profile.overhead = o;
  report.overhead = o;
  if (z.reduce_scatter_us >= 0 && z.allgather_us >= 0)
    std::snprintf(zero1, sizeof zero1, "reduce-scatter %.2f us, all-gather %.2f us per call (%d steps sharded)",
                  *o.reduce_scatter_us, *o.allgather_us, z.steps);
  report.notes.push_back(take_compute_scale(*cal, host.ranks, host.cores, report.profile));
  char line[800];
  std::snprintf(line, sizeof line,
                "overhead: the executor's own, from %d instructions of %d steps of a plan of the model: "
                "%.2f us per instruction, %.2f us per message, adding gradient pieces at %.2f GB/s "
                "(rms residual %.2f us); all-reduce %s; ZeRO-1 %s; optimizer %s; %.1f s",
                cal->samples, cal->steps, o.instruction_us, o.message_us, o.accumulate_gbytes_per_s,
                cal->fit.rms_residual_us, allreduce, zero1, optimizer,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  report.notes.push_back(line);
}

// --measure: returns the exit code. MPI is initialised here (a plain run is
// a world of one rank); only rank 0 prints and writes.
int run_measure(int* argc, char*** argv, const std::string& model_path, const std::string& cluster_path,
                const std::string& out_path, const std::vector<int>& counts, const std::string& backend_name,
                double point_ms) {
  se::MpiSession session(argc, argv);
  std::unique_ptr<se::MpiComm> world = se::MpiComm::world();
  const bool lead = world->rank() == 0;
  auto invalid = [&](const std::string& msg) {
    if (lead) std::fprintf(stderr, "spindle-profile: error: %s\n", msg.c_str());
    return kExitInvalid;
  };
#ifdef SPINDLE_HAVE_CUDA
  if (backend_name == "cuda") {  // GPU local_rank % device count, as spindle-run
    if (se::cuda_device_count() == 0) {
      std::string built;
      for (auto n : se::backend_names()) built += (built.empty() ? "" : ", ") + std::string(n);
      return invalid("--backend cuda: no CUDA device visible (built: " + built + ")");
    }
    se::LaunchEnv env;
    const std::string e = se::discover_launch_env(se::process_launch_env(), world->rank(), world->size(), &env);
    const int on_node = se::node_local_rank();   // collective: every rank, whatever its variables
    se::cuda_bind_device(e.empty() && !env.local_rank_var.empty() ? env.local_rank : on_node);
  }
#endif
  std::unique_ptr<se::Backend> backend = se::make_backend(backend_name);
  if (!backend) {
    std::string built;
    for (auto n : se::backend_names()) built += (built.empty() ? "" : ", ") + std::string(n);
    return invalid("--backend " + backend_name + ": not built into this binary (built: " + built + ")");
  }
  // Finite: an infinite budget would only be cut by the repeat cap, and read
  // as a budget it is a typo (1e400).
  if (!(point_ms > 0) || !std::isfinite(point_ms))
    return invalid("--point-ms: expected a positive, finite number of milliseconds");
  // Every rank reads model and cluster itself: under mpirun a pipe there
  // is refused by all (stat alone, the same on every rank) rather than read
  // by one while the others wait for it forever.
  for (const std::string& path : {model_path, cluster_path})
    if (std::string why = sp::shared_input_refusal(path, world->size()); !why.empty()) return invalid(why);
  auto model = sp::load_model(model_path);
  if (!model.ok()) return invalid(model.error().message);
  auto cluster = sp::load_cluster(cluster_path);
  if (!cluster.ok()) return invalid(cluster.error().message);
  if (sp::Status st = sp::check_output_paths({{"-o", out_path}}, {model_path, cluster_path}); !st.ok())
    return invalid(st.error().message);
  // One rank per device at most: a rank past the cluster's devices would
  // time links the cluster does not have (rank 2 of a one-island cpu-1x2
  // timed "inter_island" send/recv and all-reduce, recorded as the
  // cluster's) and collectives over more devices than any plan of it uses.
  if (world->size() > cluster->devices())
    return invalid(std::to_string(world->size()) + " ranks, but cluster " + cluster->name + " (" + cluster_path +
                   ") has " + std::to_string(cluster->devices()) + " devices: run at most one rank per device "
                   "(mpirun -np " + std::to_string(cluster->devices()) + " or fewer)");
  const sp::OpGraph graph = sp::expand(*model);
  // The skeleton (keys, sizes, valid counts) comes from the analytic profile;
  // its times are replaced. Device figures only matter to those times.
  sp::Cluster for_keys = *cluster;
  if (!(for_keys.peak_tflops > 0)) for_keys.peak_tflops = 1;
  if (!(for_keys.memory_gbytes_per_s > 0)) for_keys.memory_gbytes_per_s = 1;
  auto skeleton = sp::analytic_profile(*model, graph, for_keys, counts.empty() ? nullptr : &counts);
  if (!skeleton.ok()) return invalid(skeleton.error().message);

  se::MeasureOptions options;
  options.point_budget_ms = point_ms;
  // Ranks on the host share its memory system: a point of n devices is
  // timed on n ranks at once, as its slice runs (MeasureOptions::together).
  options.together = backend->device() == se::Device::host;
  const Host host = this_host();
  options.host_threads = se::host_threads_for(backend->device(), host.cores, host.ranks);
  ProgressLine line;
  se::ProgressFn progress;
  if (lead) progress = [&line](const se::MeasureProgress& p) { line(p); };
  sp::Result<se::MeasureReport> report = sp::Error{"not run"};
  try {
    report = se::measure_profile(*model, graph, *skeleton, *cluster, *world, *backend, options, progress);
    if (report.ok() && world->size() >= 2 && backend->device() == se::Device::host) {
      if (lead) std::fprintf(stderr, "spindle-profile: the executor's own overhead: training a plan a few steps\n");
      measure_executor_overhead(*model, graph, *cluster, *world, host, *backend, *report);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spindle-profile: error: rank %d: %s\n", world->rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kExitRuntime);
    return kExitRuntime;
  }
  if (!report.ok()) return invalid(report.error().message);
  if (!lead) return 0;
  const std::string bytes = sp::profile_to_json(report->profile);
  if (auto st = sp::write_file_atomic(out_path, bytes); !st.ok()) {
    std::fprintf(stderr, "spindle-profile: error: %s\n", st.error().message.c_str());
    return kExitRuntime;
  }
  for (const std::string& n : report->notes) std::printf("%s\n", n.c_str());
  if (report->profile.links) print_links(*report->profile.links);
  std::vector<double> spreads;
  for (const auto& e : report->profile.entries)
    for (const auto& pt : e.points) spreads.push_back(pt.spread);
  const se::TimingStats sp_stats = se::timing_stats(spreads);
  std::printf("spread:   (p90 - p10) / median per point: median %.1f%%, p90 %.1f%%\n", 100 * sp_stats.median,
              100 * sp_stats.p90);
  if (sp_stats.median > kBusySpread)
    std::fprintf(stderr,
                 "spindle-profile: warning: the median spread is %.0f%%: the machine looks busy, the times "
                 "are unreliable (measure on an otherwise idle machine)\n",
                 100 * sp_stats.median);
  print_fit_check(report->profile);
  print_superlinear(report->profile);
  std::printf("spindle-profile: %zu entries, measured (%s backend, %d rank%s) for %s, device counts %s -> %s\n",
              report->profile.entries.size(), backend->name(), world->size(), world->size() > 1 ? "s" : "",
              report->profile.device.c_str(), counts_summary(report->profile).c_str(), out_path.c_str());
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  spindle::plan::keep_freed_host_memory(std::getenv("GLIBC_TUNABLES"));  // util/host_memory.h
  namespace sp = spindle::plan;
  CLI::App app{"spindle-profile: operator scaling curves of a model on a cluster (spec/profile.md)"};
  spindle::apps::init_app(app, "spindle-profile");
  std::string model_path, cluster_path, out_path, devices_text, backend_name = "cpu";
  double point_ms = 120;
  bool analytic = false, measure = false;
  app.add_option("MODEL", model_path, "model description (YAML)")->required();
  app.add_option("--cluster", cluster_path, "cluster description (YAML)")->required();
  app.add_option("-o,--output", out_path, "profile database to write (JSON)")->required()->check(spindle::apps::non_empty_path());
  auto* a = app.add_flag("--analytic", analytic, "compute from the cluster's device numbers (default)");
  auto* m = app.add_flag("--measure", measure,
                         "time the operators on the local backend (and, under mpirun, the collectives)");
  a->excludes(m);
  app.add_option("--devices", devices_text,
                 "comma-separated device counts to profile (default: every valid count up to the "
                 "cluster size)");
  auto* b = app.add_option("--backend", backend_name, "--measure: compute backend (cpu; cuda when built with CUDA)")->capture_default_str();
  auto* pm = app.add_option("--point-ms", point_ms, "--measure: time budget of the repeats of one point, ms")
                 ->capture_default_str();
  b->needs(m);
  pm->needs(m);
  spindle::apps::refuse_empty_values(app);   // once every option is added
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every rank reads the same line: the launcher's rank 0
    // (or a process started alone) says it once for all.
    const int rc = e.get_exit_code() == 0 ? 0 : kExitInvalid;
#ifdef SPINDLE_HAVE_RUNTIME
    return spindle::apps::end_before_mpi(&argc, &argv, rc, [&] { app.exit(e); });
#else
    app.exit(e);
    return rc;
#endif
  }
  if (const std::string threads = spindle::apps::plan_threads_env_error(); !threads.empty()) {
    std::fprintf(stderr, "spindle-profile: error: %s\n", threads.c_str());
    return kExitInvalid;
  }

  std::vector<int> counts;
  // Given at all, it must hold counts: --devices "$COUNTS" with COUNTS unset
  // is an error, not every count.
  if (app.count("--devices") > 0 && !parse_counts(devices_text, counts)) {
    // Echoed up to 80 bytes: a list of 100 000 digits is not repeated back.
    const std::string shown = devices_text.size() > 80 ? devices_text.substr(0, 77) + "..." : devices_text;
    const auto say = [&] {
      std::fprintf(stderr,
                   "spindle-profile: error: --devices: expected positive integers separated by commas, found '%s'\n",
                   shown.c_str());
    };
#ifdef SPINDLE_HAVE_RUNTIME
    if (measure) return spindle::apps::end_before_mpi(&argc, &argv, kExitInvalid, say);
#endif
    say();
    return kExitInvalid;
  }
  if (measure) {
#ifdef SPINDLE_HAVE_RUNTIME
    return run_measure(&argc, &argv, model_path, cluster_path, out_path, counts, backend_name, point_ms);
#else
    std::fprintf(stderr,
                 "spindle-profile: error: --measure needs the runtime (libexec), which this build does not "
                 "include (SPINDLE_BUILD_RUNTIME=OFF); use --analytic\n");
    return kExitInvalid;
#endif
  }

  // Every refusal as "spindle-profile: error: MESSAGE", as in --measure.
  const auto error = [](const std::string& message, int code) {
    std::fprintf(stderr, "spindle-profile: error: %s\n", message.c_str());
    return code;
  };
  if (sp::Status st = sp::check_output_paths({{"-o", out_path}}, {model_path, cluster_path}); !st.ok())
    return error(st.error().message, kExitInvalid);
  auto model = sp::load_model(model_path);
  if (!model.ok()) return error(model.error().message, kExitInvalid);
  auto cluster = sp::load_cluster(cluster_path);
  if (!cluster.ok()) return error(cluster.error().message, kExitInvalid);
  const sp::OpGraph graph = sp::expand(*model);
  auto profile = sp::analytic_profile(*model, graph, *cluster, counts.empty() ? nullptr : &counts);
  if (!profile.ok()) return error(profile.error().message, kExitInvalid);
  const std::string bytes = sp::profile_to_json(*profile);
  if (auto st = sp::write_file_atomic(out_path, bytes); !st.ok()) return error(st.error().message, kExitRuntime);
  std::printf("spindle-profile: %zu entries, analytic on %s, device counts %s -> %s\n",
              profile->entries.size(), profile->device.c_str(), counts_summary(*profile).c_str(),
              out_path.c_str());
  return 0;
}
