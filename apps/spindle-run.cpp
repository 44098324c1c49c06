// spindle-run: execute a wave plan on CPU ranks under mpirun (spec/cli.md,
// docs/runtime.md).
//
//   mpirun -np N spindle-run PLAN.json --model MODEL.yaml [--steps S]
//          [--backend cpu|cuda] [--seed K] [--lr X] [--lr-warmup-steps W]
//          [--lr-decay-style constant|linear|cosine [--lr-decay-steps D] [--min-lr X]] [--clip-grad C]
//          [--weight-decay W [--no-weight-decay-1d]] [--adam-beta1 B1] [--adam-beta2 B2] [--adam-eps E]
//          [--metrics M.jsonl] [--log-interval N]
//          [--trace T.json [--trace-steps FIRST:LAST]] [--dump-params P.json] [--dump-grads G.json]
//          [--checkpoint DIR [--every K] [--keep N] [--exit-duration-mins M] [--exit-signal-handler]] [--resume]
//          [--data DATA.yaml] [--eval-data EVAL.yaml [--eval-every K]
//          [--eval-batches M]]
//
// --data reads the training batches from files (docs/spec/data.md); without
// it the synthetic data stays. Before every step each rank reads and checks
// its rows of the step's batch; a bad value stops every rank with exit 2
// before the step (so no checkpoint holds a step that read it).
//
// --steps is the step the run ends at: a resumed run trains steps
// (checkpoint step + 1) .. S, so the same command line continues a run.
//
// Every rank parses, loads and checks the same inputs; any rank's failure is
// shared with all (one collective), rank 0 prints one message and every rank
// exits 2 (invalid input). A failure while training aborts the whole job with
// exit code 1 (MPI_Abort), so nothing hangs.
//
// Test hook (undocumented for users): SPINDLE_TEST_DIE_AT_STEP=S makes rank 1
// (rank 0 when alone) call _exit(9) at the start of step S while the other
// ranks are inside it; mpirun then ends the job. SPINDLE_TEST_THROW_AT_STEP=S
// makes that rank throw there instead: the job ends through abort_job.
// SPINDLE_TEST_LOCK_AFTER=FILE makes rank 0 wait (up to 60 s) for FILE to
// exist before it takes the checkpoint folder's lock: another run can take
// the folder in between, as it could between the two by chance.
// SPINDLE_TEST_SIGNAL_IN_SAVE=S makes rank 1 (rank 0 when alone) raise
// SIGTERM on itself while the checkpoint of step S is being saved: a signal
// that arrives during a save, which a test cannot time from outside.
// SPINDLE_TEST_NO_TP_COPIES=1 runs the programs without their copy exchange
// (se::ExecOptions::tp_copies): the drift warning's positive control.
//
// --dump-grads (a test flag, docs/runtime.md): after the first step this run
// trains, the full gradients after the gradient sync, in --dump-params'
// format. A uniform gradient-scale error shows there; AdamW nearly hides it
// from the parameters.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include "apps/cli_paths.h"
#include "apps/mpi_start.h"
#include "libexec/backend/backend.h"
#include "libexec/backend/cpu/cpu_backend.h"
#ifdef SPINDLE_HAVE_CUDA
#include "libexec/backend/cuda/cuda_backend.h"
#endif
#ifdef SPINDLE_HAVE_NCCL
#include "libexec/comm/nccl_comm.h"
#endif
#include "libexec/comm/launch_env.h"
#include "libexec/comm/mpi_check.h"
#include "libexec/comm/mpi_comm.h"
#include "libexec/comm/nccl_emulation.h"
#include "libexec/data/dataset.h"
#include "libexec/exec/checkpoint.h"
#include "libexec/exec/executor.h"
#include "libexec/optim/lr_schedule.h"
#include "libplan/cost/analytic.h"
#include "libplan/graph/op_graph.h"
#include "libplan/report/trace.h"
#include "libplan/plan/check.h"
#include "libplan/plan/plan_io.h"
#include "libplan/util/files.h"
#include "libplan/planner/feasibility.h"
#include "libplan/util/host_memory.h"
#include "libplan/util/units.h"

namespace sp = spindle::plan;
namespace se = spindle::exec;

namespace {

constexpr int kExitInvalid = 2;
constexpr int kExitFailure = 1;
// The most a step count or number of batches can be (the int that --steps is).
constexpr int64_t kMaxSteps = std::numeric_limits<int>::max();

struct Args {
  std::string plan_path, model_path, backend = "cpu", metrics_path, trace_path, dump_path, grads_path;
  std::string trace_steps;     // --trace-steps as given ("" = every step)
  spindle::apps::StepRange trace_window;   // parsed from trace_steps
  std::string checkpoint_dir;  // "" = no checkpoints
  int every = 100;             // checkpoint every K steps (and at the end)
  int keep = 3;                // complete checkpoints kept
  bool resume = false;
  bool overwrite = false;      // a fresh run may delete DIR's checkpoints of another run
  bool no_overlap = false;     // gradient all-reduces after the backward pass, blocking
  bool no_early = false;       // transfers in their exchanges, not posted early
  double bucket_mb = 25;       // gradient bucket cap, MiB
  bool bucket_mb_given = false;  // --bucket-mb was passed (else the plan's)
  double comm_timeout_s = 600; // NCCL: how long a call waits for its peers before the job ends
  double exit_duration_mins = 0;  // > 0: checkpoint and exit 0 after the first step ending this long after start
  bool exit_signal_handler = false;  // SIGTERM or SIGUSR1: checkpoint and exit 0 after the step under way
  int steps = 10;
  uint64_t seed = 0;
  double lr = 3e-3;            // the peak rate (AdamW takes each step's as a float)
  // The learning-rate schedule's flags (optim/lr_schedule.h), and the
  // schedule they and --lr, --steps make (set in main after parsing).
  std::string lr_decay_style = "constant";
  int64_t lr_warmup_steps = 0;
  int64_t lr_decay_steps = 0;   // 0: not given (--steps)
  double min_lr = 0;
  bool min_lr_given = false;
  se::LrSchedule schedule;
  double clip_grad = 0;              // > 0: clip the gradients' global L2 norm to it (ExecOptions::clip_grad)
  // AdamW's other settings (optim/adamw.h), Megatron-LM's flags and defaults.
  double weight_decay = 0.01, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  bool no_decay_1d = false;          // --no-weight-decay-1d (ExecOptions::decay_1d false)
  std::string data_path, eval_path;  // "" = synthetic training data / no evaluation
  int eval_every = 0;                // 0: evaluate after the last step only
  int eval_batches = 0;              // 0: one pass over the evaluation set (drop last)
  int log_interval = 1;              // print a line every N steps (and the last), averaged over them
};

// What each rank counted in one step (Executor's StepCounters), on rank 0:
// kCounterFields doubles per rank, in rank order (empty on other ranks).
// Collective over MPI_COMM_WORLD.
constexpr int kCounterFields = 8;
constexpr int kPeakField = 7;   // peak_bytes
std::vector<double> gather_counters(const se::StepCounters& c, int rank, int size) {
  const double mine[kCounterFields] = {static_cast<double>(c.sent_bytes), static_cast<double>(c.received_bytes),
                                       static_cast<double>(c.reduced_bytes), c.compute_ms, c.transfer_ms, c.sync_ms,
                                       static_cast<double>(c.gathered_bytes), static_cast<double>(c.peak_bytes)};
  std::vector<double> all(rank == 0 ? static_cast<size_t>(kCounterFields) * static_cast<size_t>(size) : 0);
  MPI_CHECK(MPI_Gather(mine, kCounterFields, MPI_DOUBLE, all.data(), kCounterFields, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  return all;
}

// The --metrics "ranks" array: per rank its bytes (exact integers below
// 2^53) and milliseconds by phase.
nlohmann::json counters_json(const std::vector<double>& all, int size) {
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < size; ++r) {
    const double* c = all.data() + static_cast<size_t>(r) * kCounterFields;
    out.push_back({{"rank", r},
                   {"sent_bytes", static_cast<int64_t>(c[0])},
                   {"received_bytes", static_cast<int64_t>(c[1])},
                   {"reduced_bytes", static_cast<int64_t>(c[2])},
                   {"gathered_bytes", static_cast<int64_t>(c[6])},
                   {"compute_ms", c[3]},
                   {"transfer_ms", c[4]},
                   {"sync_ms", c[5]},
                   {"peak_bytes", static_cast<int64_t>(c[kPeakField])}});
  }
  return out;
}

// Every rank's string, in rank order, on every rank. Collective over comm.
std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine) {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), offs(static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offs[static_cast<size_t>(r)] = total;
    total += lens[static_cast<size_t>(r)];
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR,
                           comm));
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r)
    out.push_back(all.substr(static_cast<size_t>(offs[static_cast<size_t>(r)]),
                             static_cast<size_t>(lens[static_cast<size_t>(r)])));
  return out;
}

// Shares each rank's error ("" = none). Returns true when every rank is
// fine; otherwise rank 0 prints the first error (naming the rank when it is
// not rank 0's own) and the caller exits on every rank.
bool all_ok(MPI_Comm comm, int rank, const std::string& error) {
  const std::vector<std::string> errors = all_gather_strings(comm, error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    if (rank == 0) {
      const std::string who = r == 0 ? "" : "rank " + std::to_string(r) + ": ";
      std::fprintf(stderr, "spindle-run: error: %s%s\n", who.c_str(), errors[r].c_str());
      std::fflush(stderr);
    }
    return false;
  }
  return true;
}

// Rank discovery (launch_env.h): the launcher's variables must agree with
// MPI. Returns "" or the error; fills `local_rank`.
// Collective over MPI_COMM_WORLD (node_local_rank, on every rank alike).
std::string check_launch_env(int rank, int size, int* local_rank, std::string* source) {
  se::LaunchEnv env;
  const std::string error = se::discover_launch_env(se::process_launch_env(), rank, size, &env);
  const int on_node = se::node_local_rank();
  *local_rank = env.local_rank_var.empty() ? on_node : env.local_rank;
  *source = env.local_rank_var.empty() ? "no local-rank variable: the rank's place among its node's ranks (MPI)"
                                       : env.local_rank_var;
  return error;
}

// Human "N tensors (M values)" for the re-planning log.
std::string count_str(int64_t tensors, int64_t values) {
  return std::to_string(tensors) + " tensors (" + std::to_string(values) + " values)";
}

// Checks a checkpoint against this run (seed, model); returns "" or the
// error. Sets *replan when the model changed but re-planning applies (same
// model name, every shared tensor of the same shape), and *note to the log
// line saying what carries over.
std::string check_checkpoint(const se::Checkpoint& ck, const sp::Model& model, const Args& args,
                             const std::map<std::string, se::Shape>& shapes, bool* replan, std::string* note) {
  const se::CheckpointMeta& m = ck.meta;
  if (m.seed != args.seed)
    return ck.path + ": written with --seed " + std::to_string(m.seed) + ", this run has --seed " +
           std::to_string(args.seed) + " (pass --seed " + std::to_string(m.seed) + " to continue it)";
  *replan = m.model_sha256 != model.sha256;
  if (*replan && m.model_name != model.name)
    return ck.path + ": checkpoint of model '" + m.model_name + "' (sha256 " + m.model_sha256.substr(0, 12) +
           "), not of '" + model.name + "' (" + args.model_path +
           "); re-planning carries parameters over only between variants of one model (same name)";
  int64_t carried = 0, carried_n = 0, fresh = 0, fresh_n = 0, dropped = 0, dropped_n = 0;
  for (const auto& [name, shape] : shapes) {
    const auto it = ck.index.find(name);
    if (it == ck.index.end()) {
      ++fresh;
      fresh_n += se::shape_numel(shape);
    } else if (it->second.shape != shape) {
      return ck.path + "/params.bin: " + name + " has shape " + se::shape_str(it->second.shape) +
             " but the model " + args.model_path + " needs " + se::shape_str(shape);
    } else {
      ++carried;
      carried_n += se::shape_numel(shape);
    }
  }
  for (const auto& [name, entry] : ck.index)
    if (!shapes.count(name)) {
      ++dropped;
      dropped_n += se::shape_numel(entry.shape);
    }
  if (!*replan && (fresh > 0 || dropped > 0))
    return ck.path + ": the checkpoint's tensors do not match model " + model.name +
           " although its sha256 does (" + std::to_string(fresh) + " missing, " + std::to_string(dropped) +
           " unknown)";
  // "data"."samples" holds every task of the model that wrote it (each
  // save writes them all): with the same model, each of this model's
  // tasks. It may hold more: a run re-planned without a task keeps that
  // task's count in the checkpoints it writes under its own model.
  if (!*replan) {
    const std::string manifest = ck.path + "/manifest.json: data.samples";
    for (const sp::Task& t : model.tasks)
      if (!m.task_samples.count(t.name))
        return manifest + ": no entry for task '" + t.name + "' of model " + model.name +
               " (every checkpoint of a model counts each of its tasks)";
  }
  if (*replan && carried == 0)
    return ck.path + ": no parameter of model " + model.name + " is in the checkpoint";
  *note = "carried " + count_str(carried, carried_n) + ", new (initialised from seed " +
          std::to_string(args.seed) + ") " + count_str(fresh, fresh_n) + ", dropped " +
          count_str(dropped, dropped_n);
  return "";
}

// The step line, Megatron-LM's keys: `tflops` is the model FLOPs of a step
// per device and second, TFLOP/s (tflops_per_device), under "per GPU" on
// GPUs.
// `consumed` is the samples read in steps 1..st.step, over every task and
// run resumed from (se::samples_read).
std::string log_line(const sp::Model& model, const se::StepStats& st, int steps, int64_t samples_per_step,
                     int64_t consumed, double lr, double tflops, bool gpu) {
  char buf[320];
  const char* device = gpu ? "GPU" : "device";
  std::snprintf(buf, sizeof buf,
                "iteration %8lld/%8d | consumed samples: %10lld | elapsed time per iteration (ms): %.1f | "
                "samples per second: %.1f | throughput per %s (TFLOP/s/%s): %.3f | learning rate: %.6E |",
                static_cast<long long>(st.step), steps, static_cast<long long>(consumed),
                st.step_ms, static_cast<double>(samples_per_step) * 1000.0 / st.step_ms, device, device,
                tflops, lr);
  std::string line = buf;
  for (size_t t = 0; t < model.tasks.size(); ++t) {
    std::snprintf(buf, sizeof buf, " %s loss: %.6f |", model.tasks[t].name.c_str(), st.task_loss[t]);
    line += buf;
  }
  if (st.grad_norm) {   // the step's own, before clipping (as Megatron-LM prints it)
    std::snprintf(buf, sizeof buf, " grad norm: %.3f |", *st.grad_norm);
    line += buf;
  }
  return line;
}

// Opens DATA.yaml (`eval`: an --eval-data file) and its files for `model`;
// "" or the error in *error.
std::unique_ptr<se::FileSource> open_data(const std::string& path, const sp::Model& model, uint64_t seed, bool eval,
                                         std::string* error, std::string* sha256) {
  const auto spec = se::load_data_spec(path, model, eval);
  if (!spec.ok()) {
    *error = spec.error().message;
    return nullptr;
  }
  *sha256 = spec->sha256;
  auto src = se::FileSource::open(*spec, model, seed, eval ? 1 : 0);
  if (!src.ok()) {
    *error = src.error().message;
    return nullptr;
  }
  return std::move(*src);
}

// The checkpoint's "data"."tasks": where each task's data stands after
// `steps` steps (checkpoint.h).
nlohmann::json data_position(const sp::Model& model, const se::FileSource& data, int64_t steps) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t t = 0; t < model.tasks.size(); ++t) {
    const se::TaskFiles& tf = data.task(static_cast<int>(t));
    nlohmann::json& j = out[model.tasks[t].name];
    if (tf.synthetic) {
      j = {{"source", "synthetic"}, {"next_batch", steps}};
      continue;
    }
    const se::BatchPosition pos = se::batch_position(steps, tf.per_epoch);
    j = {{"source", "npy"},        {"dir", tf.dir},       {"samples", tf.samples},
         {"batches_per_epoch", tf.per_epoch}, {"shuffle", tf.shuffle}, {"next_batch", steps},
         {"epoch", pos.epoch},     {"batch_in_epoch", pos.index}};
  }
  return out;
}

// Lines saying how a checkpoint's data position maps onto this run's data.
std::vector<std::string> data_changes(const sp::Model& model, const nlohmann::json& saved,
                                      const se::FileSource* data) {
  std::vector<std::string> out;
  // As the manifest holds a path (bytes that are not UTF-8 as U+FFFD).
  auto as_saved = [](const std::string& s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  for (size_t t = 0; t < model.tasks.size(); ++t) {
    const std::string& name = model.tasks[t].name;
    const bool files = data && !data->task(static_cast<int>(t)).synthetic;
    // No record (a synthetic run writes none): synthetic data it was.
    if (!saved.contains(name)) {
      if (files)
        out.push_back("task " + name + " was trained on synthetic data (the checkpoint records no data), continues on "
                      "files");
      continue;
    }
    const nlohmann::json& j = saved[name];
    const bool was_files = j.value("source", "") == "npy";
    if (was_files != files) {
      out.push_back("task " + name + " was trained on " + (was_files ? "files" : "synthetic data") +
                    ", continues on " + (files ? "files" : "synthetic data"));
      continue;
    }
    if (!files) continue;
    const se::TaskFiles& now = data->task(static_cast<int>(t));
    std::vector<std::string> what;   // each difference, then one line
    if (j.value("samples", int64_t{-1}) != now.samples)
      what.push_back(std::to_string(j.value("samples", int64_t{-1})) + " samples, now " + std::to_string(now.samples));
    if (j.value("batches_per_epoch", int64_t{-1}) != now.per_epoch)
      what.push_back(std::to_string(j.value("batches_per_epoch", int64_t{-1})) + " batches an epoch, now " +
                     std::to_string(now.per_epoch));
    if (j.contains("shuffle") && j["shuffle"].is_boolean() && j["shuffle"].get<bool>() != now.shuffle)
      what.push_back(std::string("shuffle ") + (now.shuffle ? "false, now true" : "true, now false"));
    std::error_code ec;
    if (j.contains("dir") && j["dir"].is_string() && as_saved(j["dir"].get<std::string>()) != as_saved(now.dir) &&
        !std::filesystem::equivalent(j["dir"].get<std::string>(), now.dir, ec))   // another spelling of one folder
      what.push_back("folder " + j["dir"].get<std::string>() + ", now " + now.dir);
    if (what.empty()) continue;
    std::string line = "task " + name + "'s data had ";
    for (size_t k = 0; k < what.size(); ++k) line += (k ? "; " : "") + what[k];
    out.push_back(line + ": its batches are counted afresh over the new data");
  }
  return out;
}

nlohmann::json params_json(const std::map<std::string, se::Tensor>& params, int64_t steps) {
  nlohmann::json j = {{"format", "spindle-params"}, {"version", 1}, {"steps", steps}};
  nlohmann::json& ps = j["params"] = nlohmann::json::object();
  for (const auto& [name, t] : params)
    ps[name] = {{"shape", t.shape()}, {"values", std::vector<float>(t.data(), t.data() + t.numel())}};
  return j;
}

#ifdef SPINDLE_HAVE_NCCL
// Whether every rank's (host, `gpu`) differs from every other rank's.
// Collective over MPI_COMM_WORLD.
bool gpus_all_distinct(const std::string& gpu) {
  constexpr int kLen = 320;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string mine = std::string(host) + "/" + gpu;
  mine.resize(kLen - 1, ' ');
  int size = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  std::vector<char> all(static_cast<size_t>(size) * kLen);
  MPI_CHECK(MPI_Allgather(mine.c_str(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD));
  std::set<std::string> seen;
  for (int r = 0; r < size; ++r) seen.insert(std::string(all.data() + static_cast<size_t>(r) * kLen));
  return static_cast<int>(seen.size()) == size;
}
#endif

// --backend cuda: built in and a device visible on this rank; else *error says why.
bool cuda_backend_usable(std::string* error) {
#ifdef SPINDLE_HAVE_CUDA
  if (se::cuda_device_count() > 0) return true;
  *error = "--backend cuda: no CUDA device visible on this rank";
#else
  *error = "--backend cuda: this build has no CUDA backend (built: cpu)";
#endif
  return false;
}

// Numeric flags (docs/hardening.md, "Limits"): "" or what is wrong.
std::string check_numbers(const Args& args) {
  if (std::string error = se::check_lr_schedule(args.schedule); !error.empty()) return error;
  // Careless: a floor or a decay length with nothing that decays.
  if (args.schedule.decay == se::LrDecay::constant && (args.min_lr_given || args.lr_decay_steps > 0))
    return std::string(args.min_lr_given ? "--min-lr" : "--lr-decay-steps") +
           " has no effect with --lr-decay-style constant (the default): give --lr-decay-style linear or cosine";
  if (!(std::isfinite(args.clip_grad) && args.clip_grad >= 0 && args.clip_grad <= 1e30))
    return "--clip-grad " + sp::number_text(args.clip_grad) +
           ": expected the largest gradient norm, a number above 0 and at most 1e30 (0: no clipping)";
  // AdamW: a decay that keeps 1 - lr * wd positive at any rate up to 1,
  // moment factors below 1 (at 1 the bias correction divides by 0), an
  // epsilon that keeps the update's denominator positive. AdamW takes them
  // as floats, so they hold as floats: 0.99999999 is 1 there, 1e-46 is 0.
  for (const auto& [flag, value] : {std::pair{"--weight-decay", args.weight_decay},
                                    std::pair{"--adam-beta1", args.adam_beta1},
                                    std::pair{"--adam-beta2", args.adam_beta2}})
    if (!(value >= 0 && static_cast<float>(value) < 1))
      return std::string(flag) + " " + sp::number_text(value) + ": expected a number from 0 to below 1" +
             (value >= 0 && value < 1 ? " (as a float: it is 1 there)" : "");
  if (!(static_cast<float>(args.adam_eps) > 0 && args.adam_eps <= 1))
    return "--adam-eps " + sp::number_text(args.adam_eps) + ": expected a number above 0 and at most 1" +
           (args.adam_eps > 0 && static_cast<float>(args.adam_eps) == 0 ? " (as a float: it is 0 there)" : "");
  // --steps, --every and --keep: decimal integers from 1 (integer_in, on the command line).
  if (sp::Status st = sp::check_bucket_mb(args.bucket_mb); !st) return st.error().message;
  if (!(args.exit_duration_mins == 0 ||
        (std::isfinite(args.exit_duration_mins) && args.exit_duration_mins > 0 && args.exit_duration_mins <= 1e6)))
    return "--exit-duration-mins " + sp::number_text(args.exit_duration_mins) +
           ": expected minutes above 0 and at most 1e6";
  if (!(std::isfinite(args.comm_timeout_s) && args.comm_timeout_s > 0 && args.comm_timeout_s <= 1e6))
    return "--comm-timeout " + sp::number_text(args.comm_timeout_s) + ": expected seconds above 0 and at most 1e6";
  if (args.trace_window.first > args.steps)
    return "--trace-steps " + args.trace_steps + ": starts after the run's last step (--steps " +
           std::to_string(args.steps) + "): the trace would hold no step";
  return "";
}

// The file outputs of a run (each checked as files.h says).
std::vector<sp::OutputPath> file_outputs(const Args& args) {
  return {{"--metrics", args.metrics_path},
          {"--trace", args.trace_path},
          {"--dump-params", args.dump_path},
          {"--dump-grads", args.grads_path}};
}

// A fresh run (neither --resume nor --overwrite) into a folder that holds
// checkpoints: the error, else "". Checked with the paths, and again by
// rank 0 once it holds the folder's lock: a run that took the folder in
// between (both found it empty) would otherwise have its checkpoints of the
// same steps replaced.
std::string other_runs_checkpoints(const Args& args) {
  if (args.checkpoint_dir.empty() || args.resume || args.overwrite) return "";
  const std::vector<int64_t> found = se::list_checkpoints(args.checkpoint_dir);
  if (found.empty()) return "";
  return "--checkpoint " + args.checkpoint_dir + ": holds checkpoints of another run (" +
         se::checkpoint_name(found.front()) + (found.size() > 1 ? " .. " + se::checkpoint_name(found.back()) : "") +
         "); pass --resume to continue that run, --overwrite to delete them and start afresh, or name an "
         "empty folder";
}

// Every path the run will write, checked before the first step (files.h
// policy): the outputs, and the checkpoint folder, which belongs to one
// run: a fresh run (no --resume) refuses a folder holding checkpoints unless
// --overwrite. "" or what is wrong.
std::string check_paths(const Args& args) {
  const std::vector<sp::OutputPath> outputs = file_outputs(args);
  const std::vector<std::string> inputs = {args.plan_path, args.model_path, args.data_path, args.eval_path};
  sp::Status st = sp::check_output_paths(outputs, inputs);
  if (!st.ok()) return st.error().message;
  if (args.checkpoint_dir.empty()) return "";
  st = sp::check_output_dir("--checkpoint", args.checkpoint_dir);
  if (!st.ok()) return st.error().message;
  // The folder that holds the step-N folders, not one of them: nested
  // there, this run's checkpoints would be deleted with that step.
  const std::filesystem::path dir = se::lexical_folder(args.checkpoint_dir);
  std::error_code ec;
  if (se::checkpoint_step_of(dir.filename().string()) >= 0 || std::filesystem::exists(dir / "manifest.json", ec))
    return "--checkpoint " + args.checkpoint_dir +
           ": is a checkpoint (a step folder), not a folder of checkpoints; name the folder that holds the "
           "step-N folders, or a new one";
  st = sp::check_apart_from_dir({"--checkpoint", args.checkpoint_dir, se::is_checkpoint_entry,
                                 "a name checkpoints take (step-*, .spindle-run.lock)"},
                                outputs, inputs);
  if (!st.ok()) return st.error().message;
  return other_runs_checkpoints(args);
}

// What every rank loaded and checked before training (step 1 of run).
struct Inputs {
  int local_rank = 0;
  std::string local_source;             // where local_rank came from
  std::vector<std::string> locals;      // every rank's local rank, in rank order
  sp::Result<sp::Model> model = sp::Error{"not loaded"};
  sp::OpGraph graph;                    // the model's operators (sp::expand), once it is loaded
  sp::Result<sp::Plan> plan = sp::Error{"not loaded"};
  std::string plan_sha;                 // sha256 of the plan file's bytes
  std::unique_ptr<se::FileSource> data, eval_data;   // null: synthetic / no evaluation
  std::optional<se::Checkpoint> ck;     // --resume: the newest complete checkpoint
  // The samples each task had read by the checkpoint resumed from, and its
  // step (CheckpointMeta::task_samples, samples_step): kept by resume when
  // it frees ck, counted on from by this run's checkpoints and step lines.
  std::map<std::string, int64_t> resumed_samples;
  int64_t resumed_step = 0;
  se::CheckpointLock lock;              // rank 0, with --checkpoint: the folder is this run's
};

// --resume (step 1 of run, in load_inputs): the newest complete checkpoint
// in --checkpoint DIR, each file's SHA-256 checked by one rank
// (se::checkpoint_file_rank), not by all; then every rank indexes the
// tensors from the records' heads alone into in.ck, and later reads only
// the values of the tensors it holds shards of (resume). DIR must be
// visible to every rank, e.g. a shared filesystem. False on every rank
// when it cannot be resumed (rank 0 printed why). Collective over
// MPI_COMM_WORLD.
bool load_checkpoint_to_resume(const Args& args, int rank, int size, Inputs& in) {
  std::string error;
  const std::vector<int64_t> found = se::list_checkpoints(args.checkpoint_dir);
  const std::string newest =
      found.empty() ? "" : args.checkpoint_dir + "/" + se::checkpoint_name(found.back());
  // Nothing is removed for the user: the way back to the one before is
  // said instead.
  auto refused = [&](const std::string& why) {
    return why + " (--resume reads the newest checkpoint, " + newest +
           (found.size() > 1 ? "; to resume from " + args.checkpoint_dir + "/" +
                                   se::checkpoint_name(found[found.size() - 2]) + ", move " + newest + " out of " +
                                   args.checkpoint_dir + ")"
                             : ", and there is no other)");
  };
  // The files verified, each by its rank; then indexed by every rank.
  if (found.empty()) {
    error = args.checkpoint_dir + ": --resume: no complete checkpoint (step-N directory) here";
  } else {
    if (const sp::Status verified = se::verify_checkpoint_files(newest, se::checkpoint_files_of(rank, size));
        !verified)
      error = refused(verified.error().message);
  }
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  const std::set<std::string> none;
  if (auto loaded = se::load_checkpoint(newest, &none, /*hash=*/false); loaded.ok())
    in.ck = std::move(*loaded);
  else
    error = refused(loaded.error().message);
  // A run that will train (the checkpoint before --steps) resumes after
  // the checkpoint's step: a trace window ending there holds nothing.
  if (error.empty() && in.ck->meta.step < args.steps && args.trace_window.last <= in.ck->meta.step)
    error = "--trace-steps " + args.trace_steps + ": ends at or before step " + std::to_string(in.ck->meta.step) +
            ", the checkpoint this run resumes from: the trace would hold no step";
  return all_ok(MPI_COMM_WORLD, rank, error);
}

// Step 1 of run: the launch, the numeric flags and every path, the model,
// the plan (against the model and the world size), the data files and the
// checkpoint to resume from, loaded and checked on every rank; any rank's
// failure is shared with all (all_ok) and rank 0 prints it. False then.
// Collective over MPI_COMM_WORLD.
bool load_inputs(const Args& args, int rank, int size, Inputs& in) {
  // Launcher variables first: a wrong launch (e.g. srun starting singleton
  // MPI processes) is named as such rather than as a world-size mismatch.
  std::string error = check_launch_env(rank, size, &in.local_rank, &in.local_source);
  if (!error.empty()) {
  } else if (args.backend == "cuda" && !cuda_backend_usable(&error)) {
  } else if (args.backend != "cuda" && !se::make_backend(args.backend)) {
    error = "--backend " + args.backend + ": unknown backend (built: cpu)";
  } else {   // the numbers were checked before MPI started (main)
    error = check_paths(args);
  }
  // Every rank reads plan, model and DATA.yaml itself: with more than one,
  // a pipe there is refused by all (stat alone, before any rank opens it)
  // rather than read by one while the others wait for it forever.
  for (const std::string* path : {&args.plan_path, &args.model_path, &args.data_path, &args.eval_path})
    if (error.empty() && !path->empty()) error = sp::shared_input_refusal(*path, size);
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  if (error.empty()) {
    in.model = sp::load_model(args.model_path);
    if (!in.model.ok()) error = in.model.error().message;
    else in.graph = sp::expand(*in.model);
  }
  std::string plan_bytes;   // read once: a pipe (one rank) gives its bytes once
  if (error.empty()) {
    auto bytes = sp::read_file(args.plan_path);
    if (bytes.ok()) plan_bytes = std::move(*bytes);
    else error = bytes.error().message;
  }
  if (error.empty()) {
    in.plan = sp::parse_plan_string(plan_bytes, args.plan_path);
    if (!in.plan.ok()) error = in.plan.error().message;
  }
  if (error.empty()) {
    const sp::Status st = sp::check_plan_status(*in.plan, *in.model, in.graph, args.plan_path);
    if (!st.ok()) error = st.error().message;
  }
  if (error.empty() && in.plan->devices != size)
    error = args.plan_path + ": the plan is for " + std::to_string(in.plan->devices) + " devices but the job has " +
            std::to_string(size) + (size == 1 ? " rank" : " ranks") + " (start it with mpirun -np " +
            std::to_string(in.plan->devices) + ", or srun --ntasks=" + std::to_string(in.plan->devices) + ")";
  if (error.empty()) in.plan_sha = sp::sha256_hex(plan_bytes);
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  // Data files: every rank opens and checks them (headers, dtypes, shapes).
  std::string data_sha, eval_sha;
  if (!args.data_path.empty())
    in.data = open_data(args.data_path, *in.model, args.seed, false, &error, &data_sha);
  if (error.empty() && !args.eval_path.empty())
    in.eval_data = open_data(args.eval_path, *in.model, args.seed, true, &error, &eval_sha);
  if (error.empty()) {   // the files DATA.yaml names are inputs too (check_paths had the DATA.yaml files)
    std::vector<std::string> read;
    for (const se::FileSource* src : {in.data.get(), in.eval_data.get()})
      if (src)
        for (const std::string& path : src->paths()) read.push_back(path);
    if (sp::Status st = sp::check_output_paths(file_outputs(args), read); !st.ok()) error = st.error().message;
  }
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  // Same files on every rank (sha256 of plan, model and DATA.yaml bytes).
  const std::vector<std::string> hashes =
      all_gather_strings(MPI_COMM_WORLD, in.plan_sha + "/" + in.model->sha256 + "/" + data_sha + "/" + eval_sha);
  error.clear();
  if (hashes[static_cast<size_t>(rank)] != hashes[0])
    error = "plan, model or data description differs from rank 0's (sha256 of the files' bytes)";
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  in.locals = all_gather_strings(MPI_COMM_WORLD, std::to_string(in.local_rank));

  // The checkpoint folder is this run's alone from here on (rank 0 writes
  // it): another run still using it, e.g. the job this one resumes, is
  // refused before anything is read.
  if (rank == 0 && !args.checkpoint_dir.empty()) {
    std::error_code lock_ec;
    if (const char* after = std::getenv("SPINDLE_TEST_LOCK_AFTER"))
      for (int i = 0; i < 600 && !std::filesystem::exists(after, lock_ec); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto lock = se::lock_checkpoint_dir(args.checkpoint_dir);
    if (!lock.ok()) {
      error = lock.error().message;
    } else {
      in.lock = std::move(*lock);
      error = other_runs_checkpoints(args);
      if (!in.lock.unlocked_reason().empty())
        std::printf("spindle-run: note: --checkpoint %s could not be locked (%s): a second run into it would not "
                    "be noticed\n",
                    args.checkpoint_dir.c_str(), in.lock.unlocked_reason().c_str());
    }
  }
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;

  if (args.resume && !load_checkpoint_to_resume(args, rank, size, in)) return false;
  // The samples this run's last checkpoint would count stay within what a
  // checkpoint may (se::kMaxCheckpointSamples): one it writes can be
  // resumed, and no count overflows.
  se::CheckpointMeta counted;
  for (const sp::Task& t : in.model->tasks) counted.task_batch[t.name] = t.batch;
  if (in.ck) {
    counted.task_samples = in.ck->meta.task_samples;
    counted.samples_step = in.ck->meta.samples_step;
  }
  error = se::check_samples_fit(counted, args.steps, in.ck ? in.ck->path + "/manifest.json" : "");
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  return true;
}

// The communicators, backend and executor of this rank (step 2 of run).
struct Runtime {
  std::unique_ptr<se::MpiComm> world;
  std::unique_ptr<se::Comm> nccl_world;    // the executor's world with NCCL (or its emulation), else null
  std::unique_ptr<se::Backend> backend;
  se::ExecOptions options;
  std::unique_ptr<se::Executor> executor;
  int gpu = -1;                            // the bound GPU (--backend cuda), else -1
  bool use_nccl = false;
  // Bytes per value of a transformer layer's internals: 2 in the CUDA
  // backend's bf16 mode (SPINDLE_CUDA_MATMUL, docs/gpu.md), else 4.
  int layer_value_bytes = sp::kRunActivationValueBytes;
  std::vector<int64_t> counted_bytes;      // per rank: what the memory check counted (memory_as_run)
  // SPINDLE_TEST_EMULATE_DEVICE=1 with --backend cpu: the CPU backend
  // posing as a device's and the communicators under NCCL's rules, so that
  // the executor takes its NCCL branches without a GPU (docs/gpu.md, "The
  // device paths on the CPU"); the device-memory calls they made.
  std::shared_ptr<se::DeviceCalls> emulated;
  std::vector<std::string> sync_notes;     // flags that lower other programs than the plan's (sync_for_run)
};

// Step 2 of run, first half (memory_error, then build_executor):
// MPI_COMM_WORLD as the runtime's world; --backend cuda binds GPU
// local_rank % device count (docs/gpu.md) and chooses NCCL for the
// communicators when every rank has a GPU of its own (no two ranks of a
// node on one physical GPU, by PCI bus id, so per-rank
// CUDA_VISIBLE_DEVICES works too; all ranks must agree: NCCL setup is
// collective), else MPI, staged. Collective over MPI_COMM_WORLD.
Runtime start_runtime([[maybe_unused]] const Args& args, [[maybe_unused]] const Inputs& in) {
  Runtime rt;
  rt.world = se::MpiComm::world();
#ifdef SPINDLE_HAVE_CUDA
  if (args.backend == "cuda") {
    rt.gpu = se::cuda_bind_device(in.local_rank);
    if (se::cuda_options_from_env(nullptr).matmul == se::MatmulPrecision::bf16)
      rt.layer_value_bytes = sp::kBf16LayerValueBytes;
  }
#endif
#ifdef SPINDLE_HAVE_NCCL
  if (args.backend == "cuda") rt.use_nccl = gpus_all_distinct(se::cuda_device_info().pci_bus_id);
#endif
  return rt;
}

// SPINDLE_TEST_EMULATE_DEVICE=1 with --backend cpu (Runtime::emulated).
bool emulates_device(const Args& args) {
  const char* emulate = std::getenv("SPINDLE_TEST_EMULATE_DEVICE");
  return emulate && std::string(emulate) == "1" && args.backend == "cpu";
}

// Whether this run's memory is a device's, over NCCL (or its emulation):
// where what the memory check leaves out (the CUDA context, cuBLAS's
// workspace, NCCL's buffers) is taken from the same memory.
bool device_memory_run(const Args& args, const Runtime& rt) { return rt.use_nccl || emulates_device(args); }

// The plan's memory as this run will hold it (the optimizer state as the
// plan holds it; sharded, every all-gather's buffers:
// check_memory_as_run), before anything is allocated: "" or the error.
// The same on every rank.
// Keeps the figures in `rt.counted_bytes`, which the run's peaks are
// reported against (report_memory).
std::string memory_error(const Args& args, const Inputs& in, Runtime& rt) {
  auto counted = sp::memory_as_run(*in.plan, *in.model, in.graph, rt.layer_value_bytes);
  if (!counted) return counted.error().message;
  rt.counted_bytes = std::move(*counted);
  const sp::Status st =
      sp::check_memory_as_run(*in.plan, *in.model, rt.counted_bytes, args.plan_path, rt.layer_value_bytes);
  return st.ok() ? "" : st.error().message;
}

// Rank 0, on a device backend (its memory the device's: device_memory_run):
// a warning when a device's figure as this run holds it is within the
// margin of its memory (sp::within_uncounted_margin), which what the count
// leaves out may take. The plan fits, so the run goes on.
void warn_memory_margin(const Args& args, const Inputs& in, const Runtime& rt) {
  if (!device_memory_run(args, rt) || rt.counted_bytes.empty()) return;
  const auto worst = std::max_element(rt.counted_bytes.begin(), rt.counted_bytes.end());
  if (!sp::within_uncounted_margin(*worst, in.plan->memory_bytes)) return;
  std::printf("spindle-run: warning: device %lld would hold %s of %s as this run holds it, within %.0f%% of the "
              "device's memory: the CUDA context, cuBLAS's workspace and NCCL's buffers, which that count leaves "
              "out, may take it over (docs/planner.md, \"Memory\"); more devices give a margin\n",
              static_cast<long long>(worst - rt.counted_bytes.begin()),
              sp::human_bytes(static_cast<double>(*worst), 2).c_str(),
              sp::human_bytes(static_cast<double>(in.plan->memory_bytes), 2).c_str(), 100 * sp::kUncountedMarginShare);
}

// Step 2 of run, second half: the backend, the communicators and the
// executor. With NCCL: one world NCCL communicator, the executor's world
// (inter-wave transfers device to device, one NCCL group per wave), and the
// group communicators split from it; else group communicators over MPI.
// Collective over MPI_COMM_WORLD.
void build_executor(const Args& args, const Inputs& in, Runtime& rt) {
  if (emulates_device(args)) rt.emulated = std::make_shared<se::DeviceCalls>();
  rt.backend = rt.emulated ? se::make_cpu_backend_as_device() : se::make_backend(args.backend);
  rt.options.seed = args.seed;
  rt.options.adamw = {static_cast<float>(se::lr_at(args.schedule, 1)), static_cast<float>(args.adam_beta1),
                     static_cast<float>(args.adam_beta2), static_cast<float>(args.adam_eps),
                     static_cast<float>(args.weight_decay)};
  rt.options.record_trace = !args.trace_path.empty();
  rt.options.trace_first_step = args.trace_window.first;
  rt.options.trace_last_step = args.trace_window.last;
  // Ranks per node: the highest local rank + 1 (the same count on every
  // node assumed, as the GPU binding does).
  int ranks_on_node = 1;
  for (const std::string& l : in.locals) ranks_on_node = std::max(ranks_on_node, std::atoi(l.c_str()) + 1);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  rt.options.host_threads = se::host_threads_for(rt.backend->device(), cores, ranks_on_node);
  // The gradient sync the plan was simulated with, unless a flag says otherwise.
  const sp::SyncFlags flags{args.no_overlap, args.no_early,
                            args.bucket_mb_given ? std::optional(sp::bucket_bytes_of_mb(args.bucket_mb)) : std::nullopt,
                            args.clip_grad > 0};
  rt.options.sync = sp::sync_for_run(*in.plan, flags, rt.sync_notes);
  rt.options.clip_grad = args.clip_grad;
  rt.options.decay_1d = !args.no_decay_1d;
  if (const char* no_copies = std::getenv("SPINDLE_TEST_NO_TP_COPIES"); no_copies && std::string(no_copies) == "1")
    rt.options.tp_copies = false;
  const std::vector<std::vector<int>> device_groups = se::Executor::device_groups(*in.model, *in.plan);
  se::GroupComms groups;
#ifdef SPINDLE_HAVE_NCCL
  if (rt.use_nccl) {
    auto nw = se::NcclComm::create(*rt.world, args.comm_timeout_s);
    groups = se::create_nccl_group_comms(*nw, device_groups);
    rt.nccl_world = std::move(nw);
  }
#endif
  if (!rt.use_nccl) groups = se::create_group_comms(*rt.world, device_groups);
  if (rt.emulated) {
    // A world of its own (MPI_Comm_dup): its messages never meet rt.world's.
    rt.nccl_world = std::make_unique<se::NcclEmulation>(rt.world->duplicate(), rt.emulated);
    for (auto& [members, comm] : groups) comm = std::make_unique<se::NcclEmulation>(std::move(comm), rt.emulated);
  }
  rt.executor = std::make_unique<se::Executor>(*in.model, *in.plan, rt.nccl_world ? *rt.nccl_world : *rt.world,
                                               std::move(groups), *rt.backend, rt.options);
}

// Under SPINDLE_TEST_EMULATE_DEVICE: rank 0 prints the device-memory calls
// every rank made, the evidence that the run took the executor's NCCL
// branches (run_checks.sh device-paths reads it). Collective over `world`.
void report_emulated_calls(se::Comm& world, const se::DeviceCalls& calls) {
  std::vector<float> sums{static_cast<float>(calls.exchanges), static_cast<float>(calls.collectives)};
  world.all_reduce_sum(sums);
  if (world.rank() == 0)
    std::printf("spindle-run: emulated device memory: %.0f exchanges and %.0f collectives over all ranks\n", sums[0],
                sums[1]);
}

// AdamW's settings but the rate (the schedule's line says that):
// "betas 0.9, 0.999, eps 1e-08, weight decay 0.01" and, without decay on
// 1-D tensors (`decay_1d` false), " (not on 1-D tensors)".
std::string adamw_text(const se::AdamWConfig& c, bool decay_1d) {
  return "betas " + sp::number_text(c.beta1) + ", " + sp::number_text(c.beta2) + ", eps " + sp::number_text(c.eps) +
         ", weight decay " + sp::number_text(c.weight_decay) + (decay_1d ? "" : " (not on 1-D tensors)");
}

// Rank 0 prints what runs where: the model, the plan, the ranks, backend and
// seed, every rank's local rank and, with a GPU, the transports.
void print_banner(const Args& args, const Inputs& in, const Runtime& rt, int rank, int size) {
  const sp::Model& model = *in.model;
  const sp::Plan& plan = *in.plan;
  if (rank == 0)
    std::printf("spindle-run: %s (%s), plan %s (%s, %zu waves) on %d rank%s, backend %s, seed %llu\n",
                model.name.c_str(), args.model_path.c_str(), args.plan_path.c_str(), plan.strategy.c_str(),
                plan.waves.size(), size, size == 1 ? "" : "s", rt.backend->name(),
                static_cast<unsigned long long>(args.seed));
  if (rank == 0) {
    std::string list;
    for (const std::string& l : in.locals) list += (list.empty() ? "" : ",") + l;
    std::printf("spindle-run: local ranks %s (%s)\n", list.c_str(), in.local_source.c_str());
    std::printf("spindle-run: learning rate %s\n", se::describe_lr_schedule(args.schedule).c_str());
    std::printf("spindle-run: AdamW %s\n", adamw_text(rt.options.adamw, rt.options.decay_1d).c_str());
    if (args.clip_grad > 0)
      std::printf("spindle-run: gradient clipping: the global L2 norm to at most %s (--clip-grad)\n",
                  sp::number_text(args.clip_grad).c_str());
    else if (rt.options.sync.grad_norm)
      std::printf("spindle-run: gradient norm computed every step (the plan's x-lowering), not clipped "
                  "(--clip-grad)\n");
    for (const std::string& note : rt.sync_notes)
      std::printf("spindle-run: note: %s; its predictions describe another run\n", note.c_str());
    // Evaluation on the samples trained on (the train split named twice).
    if (in.data && in.eval_data) {
      std::string tasks;
      for (int t : se::tasks_evaluated_on_training_data(*in.data, *in.eval_data))
        tasks += (tasks.empty() ? "" : ", ") + model.tasks[static_cast<size_t>(t)].name;
      if (!tasks.empty())
        std::printf("spindle-run: warning: --eval-data reads the training data of task(s) %s (the same folders "
                    "as --data): their evaluation measures the samples trained on, not unseen ones\n",
                    tasks.c_str());
    }
    // More evaluation batches than one pass holds: samples counted twice.
    if (in.eval_data && args.eval_batches > 0) {
      std::string tasks;
      for (int t : se::tasks_evaluated_past_one_pass(*in.eval_data, args.eval_batches))
        tasks += (tasks.empty() ? "" : ", ") + model.tasks[static_cast<size_t>(t)].name + " (" +
                 std::to_string(in.eval_data->task(t).per_epoch) + " batches a pass)";
      if (!tasks.empty())
        std::printf("spindle-run: warning: --eval-batches %d is more than one pass over the evaluation set of "
                    "task(s) %s: the batches after a pass repeat its samples, which count twice\n",
                    args.eval_batches, tasks.c_str());
    }
    // The gradient sync in effect (sync_for_run: the plan's unless a flag
    // overrode it), as DDP users look for their bucket layout.
    const sp::GradSync& sync = rt.options.sync;
    std::string how;
    if (!sync.overlap)
      how = std::string("after the backward pass, blocking") +
            (args.no_overlap ? " (--no-overlap)" : " (the plan's x-lowering: planned with --no-overlap)");
    else if (plan.bucket_starts == sp::BucketStarts::when_ready)
      how = "during the backward pass, each started when ready (the plan's x-lowering), on " +
            std::to_string(rt.executor->bucket_communicators()) + " communicators of their own";
    else
      how = "during the backward pass, started in one global order";
    const int buckets = rt.executor->buckets();
    std::printf("spindle-run: gradient sync: rank 0 all-reduces %d bucket%s of at most %.3g MiB, %s\n", buckets,
                buckets == 1 ? "" : "s", static_cast<double>(sync.bucket_bytes) / (1 << 20), how.c_str());
    if (rt.gpu >= 0)
      std::printf("spindle-run: rank 0 on GPU %d; group communicators and inter-wave transfers over %s\n", rt.gpu,
                  rt.use_nccl ? "NCCL" : "MPI (host-staged)");
    if (rt.emulated)
      std::printf("spindle-run: SPINDLE_TEST_EMULATE_DEVICE=1: the CPU backend posing as a device's, group "
                  "communicators and inter-wave transfers over MPI under NCCL's rules (a test mode)\n");
    if (rt.options.host_threads > 1)
      std::printf("spindle-run: parameters seeded%s on %d host threads per rank\n",
                  in.data ? "" : " and synthetic data drawn", rt.options.host_threads);
  }
}

// Step 3 of run, with a checkpoint to resume from (in.ck): every rank checks
// it against the model and flags (all_ok) and loads its state into
// `executor`; rank 0 reports it (re-plan, data changes, another --lr). Frees
// in.ck. False when it does not fit this run (rank 0 printed why).
// Collective over MPI_COMM_WORLD.
bool resume(const Args& args, Inputs& in, se::Executor& executor, int rank, int size) {
  const sp::Model& model = *in.model;
  std::optional<se::Checkpoint>& ck = in.ck;
  bool replan = false;
  std::string note;
  std::string error = check_checkpoint(*ck, model, args, executor.param_shapes(), &replan, &note);
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  // The tensors this rank holds shards of, each read from the checkpoint's
  // files as the executor asks for it, the tensors of one parameter
  // ("M/k.r") kept until the next parameter's are asked for: the rank
  // holds one parameter's full state beside its own, not its whole state
  // twice. A read that fails leaves the rest unread and fails the resume.
  int read_here = 0;   // the tensors whose values this rank read
  std::string kept_param;
  executor.load_state(
      [&](const std::string& name) -> const se::TensorState* {
        if (!error.empty() || !ck->index.count(name)) return nullptr;
        if (const std::string param = name.substr(0, name.rfind('/')); param != kept_param) {
          ck->state.tensors.clear();
          kept_param = param;
        }
        if (!ck->state.tensors.count(name)) {
          if (const sp::Status read = se::read_checkpoint_tensors(*ck, {name}); !read) {
            error = read.error().message;
            return nullptr;
          }
          ++read_here;
        }
        return &ck->state.tensors.at(name);
      },
      ck->meta.step);
  ck->state.tensors.clear();
  if (!all_ok(MPI_COMM_WORLD, rank, error)) return false;
  std::vector<int> read(static_cast<size_t>(rank == 0 ? size : 1), 0);
  MPI_CHECK(MPI_Gather(&read_here, 1, MPI_INT, read.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (rank == 0) {
    std::printf("spindle-run: resumed from %s (step %lld; written under plan %s, %s on %d devices%s)\n",
                ck->path.c_str(), static_cast<long long>(ck->meta.step), ck->meta.plan_sha256.substr(0, 12).c_str(),
                ck->meta.plan_strategy.c_str(), ck->meta.plan_devices,
                ck->meta.plan_devices != size ? ", re-sharded by parameter" : "");
    std::string counts;
    for (int r = 0; r < size; ++r) counts += (r ? "," : "") + std::to_string(read[static_cast<size_t>(r)]);
    std::string verifiers;
    for (int f = 0; f < se::kCheckpointFiles; ++f)
      verifiers += std::string(f ? ", " : "") + se::checkpoint_file(f) + " by rank " +
                   std::to_string(se::checkpoint_file_rank(f, size));
    std::printf("spindle-run: checkpoint files verified (SHA-256): %s; each rank read the values of the tensors it "
                "holds: %s of %zu by rank\n",
                verifiers.c_str(), counts.c_str(), ck->index.size());
    if (replan)
      std::printf("spindle-run: re-planned: model %s changed (sha256 %s -> %s): %s\n", model.name.c_str(),
                  ck->meta.model_sha256.substr(0, 12).c_str(), model.sha256.substr(0, 12).c_str(), note.c_str());
    // What the steps to come train with, against the checkpoint's: moot
    // when there are none (the checkpoint only evaluated, or nothing).
    const bool trains = executor.steps_done() < args.steps;
    if (trains)
      for (const std::string& line : data_changes(model, ck->meta.data_tasks, in.data.get()))
        std::printf("spindle-run: data: %s\n", line.c_str());
    // The optimizer's settings, each warned about when it changed.
    auto changed = [](bool differs, const std::string& was, const std::string& now) {
      if (differs)
        std::printf("spindle-run: warning: the checkpoint was trained with %s, continuing with %s\n", was.c_str(),
                    now.c_str());
    };
    auto clip = [](double c) { return c > 0 ? "--clip-grad " + sp::number_text(c) : std::string("no clipping"); };
    const se::AdamWConfig was{ck->meta.lr, ck->meta.beta1, ck->meta.beta2, ck->meta.eps, ck->meta.weight_decay};
    const std::string adamw_was = adamw_text(was, ck->meta.decay_1d);
    const std::string adamw_now = adamw_text(executor.adamw(), !args.no_decay_1d);
    changed(trains && !se::same_lr_schedule(ck->meta.lr_schedule, args.schedule),
            "learning rate " + se::describe_lr_schedule(ck->meta.lr_schedule), se::describe_lr_schedule(args.schedule));
    changed(trains && adamw_was != adamw_now, "AdamW " + adamw_was, adamw_now);
    changed(trains && ck->meta.clip_grad != args.clip_grad, clip(ck->meta.clip_grad), clip(args.clip_grad));
  }
  in.resumed_samples = ck->meta.task_samples;
  in.resumed_step = ck->meta.samples_step;
  ck.reset();  // free the full tensors
  return true;
}

// What every checkpoint of this run records but its step and data position
// (set when it is saved): model, plan, seed, batches and AdamW settings.
se::CheckpointMeta checkpoint_meta(const Args& args, const Inputs& in, const se::ExecOptions& options) {
  const sp::Model& model = *in.model;
  se::CheckpointMeta meta;
  meta.model_name = model.name;
  meta.model_sha256 = model.sha256;
  meta.plan_sha256 = in.plan_sha;
  meta.plan_strategy = in.plan->strategy;
  meta.plan_devices = in.plan->devices;
  meta.seed = args.seed;
  for (const sp::Task& t : model.tasks) meta.task_batch[t.name] = t.batch;
  meta.task_samples = in.resumed_samples;
  meta.samples_step = in.resumed_step;
  meta.lr = static_cast<float>(args.lr);
  meta.lr_schedule = args.schedule;
  meta.clip_grad = args.clip_grad;
  meta.decay_1d = !args.no_decay_1d;
  meta.beta1 = options.adamw.beta1;
  meta.beta2 = options.adamw.beta2;
  meta.eps = options.adamw.eps;
  meta.weight_decay = options.adamw.weight_decay;
  return meta;
}

// What the training loop (step 4 of run) and its steps work with. The
// references point into run's Inputs and Runtime, which outlive it.
struct Training {
  const Args& args;
  int rank, size;
  const sp::Model& model;
  se::Executor& executor;
  se::FileSource* data;                  // null: synthetic training data
  se::FileSource* eval_data;             // null: no evaluation
  std::vector<se::DataRead> reads;       // this rank's rows of a training batch
  std::vector<se::DataRead> eval_reads;  // ... of an evaluation batch
  se::CheckpointMeta meta;               // step and data_tasks set by each save
  int64_t samples_per_step;              // the tasks' batches, summed
  double flops_per_step;                 // model FLOPs of a step (sp::model_flops_per_step)
  bool gpu;                              // the backend runs on GPUs (the step line says "per GPU")
  std::ofstream metrics;                 // rank 0 with --metrics: opened for appending at its first line
  std::chrono::steady_clock::time_point start;   // of the run (--exit-duration-mins counts from it)
  // Rank 0: the steps since the last printed line (--log-interval), whose
  // step times and losses the next line averages.
  struct Window {
    int steps = 0;
    double ms = 0;
    std::vector<double> loss;
  } window = {};
  // Rank 0, --overwrite into a folder holding another run's checkpoints:
  // they are removed just before this run's first save (write_checkpoint),
  // so a run refused or failed before it (bad data at step 1) loses none.
  bool overwrite_pending = false;
  // Memory per rank: what the check before allocating counted
  // (memory_as_run, every rank), and on rank 0 the most the backend held
  // in a step so far (StepCounters::peak_bytes) and that step.
  std::vector<int64_t> counted_bytes = {};
  std::vector<int64_t> peak_bytes = {};
  std::vector<int64_t> peak_step = {};
};

// Before training, on rank 0: with --overwrite into a folder holding
// another run's checkpoints, marks them for removal at the first save.
void mark_overwrite(Training& tr) {
  const Args& args = tr.args;
  tr.overwrite_pending = tr.rank == 0 && !args.resume && args.overwrite && !args.checkpoint_dir.empty() &&
                         !se::list_checkpoints(args.checkpoint_dir).empty();
}

// Rank 0, after training: the rank whose backend held the largest share of
// what the memory check counted for it (memory_as_run) at its peak step:
// how close the run came to the count, which has to stay above it.
void report_memory(const Training& tr, int64_t device_bytes) {
  if (tr.rank != 0 || tr.counted_bytes.size() != tr.peak_bytes.size()) return;
  size_t worst = tr.peak_bytes.size();
  double share = -1;
  for (size_t r = 0; r < tr.peak_bytes.size(); ++r) {
    if (tr.peak_bytes[r] < 0 || tr.counted_bytes[r] <= 0) continue;
    const double s = static_cast<double>(tr.peak_bytes[r]) / static_cast<double>(tr.counted_bytes[r]);
    if (s > share) {
      share = s;
      worst = r;
    }
  }
  if (worst == tr.peak_bytes.size()) return;
  const int64_t most = *std::max_element(tr.peak_bytes.begin(), tr.peak_bytes.end());
  std::printf("spindle-run: memory: rank %zu held at most %s in a step (step %lld), %.1f%% of the %s counted for it "
              "before the run (of %s a device%s; --metrics: each rank's peak_bytes)\n",
              worst, sp::human_bytes(static_cast<double>(tr.peak_bytes[worst]), 2).c_str(),
              static_cast<long long>(tr.peak_step[worst]), 100.0 * share,
              sp::human_bytes(static_cast<double>(tr.counted_bytes[worst]), 2).c_str(),
              sp::human_bytes(static_cast<double>(device_bytes), 2).c_str(),
              most > device_bytes ? "; a rank held more than that: on devices of this size the run would not fit"
                                  : "");
  std::fflush(stdout);
}

// Rank 0: appends `line` to --metrics (when given), opening it at the
// first line, so that a run refused before its first step leaves no empty
// file. Throws std::runtime_error when that fails (a disk full).
void append_metrics(Training& tr, const nlohmann::json& line) {
  if (tr.rank != 0 || tr.args.metrics_path.empty()) return;
  if (!tr.metrics.is_open()) {
    tr.metrics.open(tr.args.metrics_path, std::ios::app);
    if (!tr.metrics) throw std::runtime_error("cannot open --metrics file " + tr.args.metrics_path);
  }
  tr.metrics << line.dump() << "\n" << std::flush;
  if (!tr.metrics) throw std::runtime_error(tr.args.metrics_path + ": write failed (--metrics; disk full?)");
}

// Rank 0: one line when the tensor-parallel copies of replicated tensors
// differ from TP rank 0's (se::ReplicaDrift), which a checkpoint or
// --dump-params keeps. The programs keep them equal (their copy exchange
// sets them to rank 0's after every step, or they step alike), so a
// difference is a defect of the runtime.
void warn_drift(const se::ReplicaDrift& drift, int64_t step) {
  if (drift.tensors == 0) return;
  std::printf("spindle-run: warning: after step %lld the tensor-parallel copies of %d replicated tensor%s differ from "
              "TP rank 0's in %lld value%s (at most %.2g relative, %s), though the programs keep them equal "
              "(docs/runtime.md, \"Tensor-parallel copies\"): please report it; TP rank 0's are kept\n",
              static_cast<long long>(step), drift.tensors, drift.tensors == 1 ? "" : "s",
              static_cast<long long>(drift.values), drift.values == 1 ? "" : "s", drift.max_relative,
              drift.worst.c_str());
}

// The save's writers (write_checkpoint's first step): rank 0 begins the
// checkpoint of the steps done (its folder, every file laid out, params.bin
// its own), the ranks of the other files join it (se::checkpoint_file_rank)
// in the folder rank 0 made. Null on a rank that writes no file; `error`
// set where one could not start (every rank goes on: the gather that
// follows is collective). Collective over MPI_COMM_WORLD.
std::optional<se::CheckpointWriter> start_writers(Training& tr, const std::array<bool, se::kCheckpointFiles>& mine,
                                                  std::string& error) {
  std::optional<se::CheckpointWriter> writer;
  tr.meta.step = tr.executor.steps_done();   // every writer's messages name the step
  if (tr.rank == 0) {
    if (tr.data) tr.meta.data_tasks = data_position(tr.model, *tr.data, tr.meta.step);
    auto begun = se::CheckpointWriter::begin(tr.args.checkpoint_dir, tr.meta, tr.executor.param_shapes(), mine);
    if (begun.ok())
      writer.emplace(std::move(*begun));
    else
      error = begun.error().message;
  }
  // The folder rank 0 made ("" when it could not).
  const std::string folder = all_gather_strings(MPI_COMM_WORLD, writer ? writer->temp_dir() : "")[0];
  if (tr.rank != 0 && (mine[0] || mine[1] || mine[2]) && !folder.empty()) {
    auto joined = se::CheckpointWriter::join(folder, tr.meta, tr.executor.param_shapes(), mine);
    if (joined.ok())
      writer.emplace(std::move(*joined));
    else
      error = joined.error().message + " (each checkpoint file is written by its own rank: --checkpoint " +
              tr.args.checkpoint_dir + " must be one folder that every rank sees, e.g. on a shared filesystem)";
  }
  return writer;
}

// The joined writers' files closed and hashed, gathered for rank 0's
// manifest (write_checkpoint's third step): their "files" entries, merged,
// or nullopt when a rank's save failed (its `error`; rank 0 then removes
// the folder). A joined writer is destroyed here, its files closed before
// rank 0 may remove the folder. Collective over MPI_COMM_WORLD.
std::optional<nlohmann::json> close_joined(Training& tr, std::optional<se::CheckpointWriter>& writer,
                                           std::string& error) {
  nlohmann::json closed = nlohmann::json::object();
  if (tr.rank != 0 && writer) {
    if (error.empty()) {
      if (auto files = writer->close_files(); files.ok())
        closed = std::move(*files);
      else
        error = files.error().message;
    }
    writer.reset();
  }
  const std::vector<std::string> reports = all_gather_strings(MPI_COMM_WORLD, error.empty() ? closed.dump() : "");
  nlohmann::json joined = nlohmann::json::object();
  for (const std::string& report : reports) {
    if (report.empty()) return std::nullopt;
    joined.update(nlohmann::json::parse(report));
  }
  return joined;
}

// Collective: the checkpoint of the steps done so far (keeping --keep),
// its path and the time it took, ms, printed by rank 0. False on every
// rank when it could not be written (the first rank's reason printed by
// rank 0): a write failed, or the state is not finite (training diverged:
// se::CheckpointWriter refuses it). Each tensor file is written by its own
// rank (se::checkpoint_file_rank: params.bin by rank 0, which makes the
// folder and finishes the save), a tensor at a time as its parameter's
// shards come in, so no rank holds more than one parameter's parts.
bool write_checkpoint(Training& tr) {
  const auto t0 = std::chrono::steady_clock::now();
  std::array<int, se::kCheckpointFiles> writers{};
  for (int f = 0; f < se::kCheckpointFiles; ++f) writers[static_cast<size_t>(f)] = se::checkpoint_file_rank(f, tr.size);
  const std::array<bool, se::kCheckpointFiles> mine = se::checkpoint_files_of(tr.rank, tr.size);
  // 1. The writers start.
  std::string error;
  std::optional<se::CheckpointWriter> writer = start_writers(tr, mine, error);
  const int64_t step = tr.meta.step;
  // 2. Every rank sends its shards' parts to their files' ranks, which
  //    write them as they come (whether or not the writers could start:
  //    the gather is collective).
  se::ReplicaDrift drift;
  tr.executor.gather_state(
      [&](const std::string& name, int part, const se::Tensor& full, int64_t adam_steps) {
        if (!writer || !error.empty()) return;
        if (const sp::Status st = writer->add_part(name, part, full, adam_steps); !st) error = st.error().message;
      },
      writers, &drift);
  if (const char* at = std::getenv("SPINDLE_TEST_SIGNAL_IN_SAVE");
      at && std::atoll(at) == step && tr.rank == (tr.size > 1 ? 1 : 0))
    std::raise(SIGTERM);   // the test hook (header)
  // 3. The other files' hashes to rank 0.
  const std::optional<nlohmann::json> joined = close_joined(tr, writer, error);
  // 4. --overwrite: this run owns the folder from its first save on (not
  //    when that save is refused: a state that is not finite keeps the old
  //    ones).
  if (tr.rank == 0 && joined && tr.overwrite_pending) {
    const sp::Status st = se::remove_checkpoints(tr.args.checkpoint_dir, writer->temp_dir());
    if (st.ok())
      std::printf("spindle-run: --overwrite: removed the checkpoints of another run from %s\n",
                  tr.args.checkpoint_dir.c_str());
    else
      error = st.error().message;
    tr.overwrite_pending = false;
  }
  // 5. Rank 0 writes the manifest and puts the folder in place.
  if (tr.rank == 0 && joined && error.empty()) {
    warn_drift(drift, step);
    std::string pruning;
    const auto path = writer->finish(tr.args.keep, &pruning, *joined);
    if (path.ok())
      std::printf("spindle-run: saved checkpoint %s (%.1f ms)\n", path->c_str(),
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    else
      error = path.error().message;
    if (!pruning.empty()) std::printf("spindle-run: warning: %s\n", pruning.c_str());
    std::fflush(stdout);
  }
  writer.reset();   // a save that did not finish leaves no folder behind (rank 0's writer removes it)
  return all_ok(MPI_COMM_WORLD, tr.rank, error);
}

// Evaluation after step `step`: forward passes over the evaluation set,
// per task the mean loss and retrieval accuracy over its batches; rank 0
// prints them and appends them to --metrics. False when a bad value stopped
// every rank (the error printed). Collective over MPI_COMM_WORLD.
bool evaluate(Training& tr, int64_t step) {
  if (!tr.eval_data) return true;
  const Args& args = tr.args;
  se::FileSource& eval_data = *tr.eval_data;
  const size_t tasks = tr.model.tasks.size();
  int64_t passes = args.eval_batches;
  if (passes == 0) {  // one pass: the longest task's batches; shorter tasks stop at their own
    passes = 1;
    for (size_t t = 0; t < tasks; ++t) passes = std::max(passes, eval_data.task(static_cast<int>(t)).per_epoch);
  }
  std::vector<double> loss(tasks), ab(tasks), ba(tasks), queries(tasks);
  std::vector<int64_t> batches(tasks);
  for (int64_t b = 0; b < passes; ++b) {
    if (!all_ok(MPI_COMM_WORLD, tr.rank, eval_data.prepare(tr.eval_reads, b))) return false;
    const se::EvalStats e = tr.executor.evaluate(eval_data, b);
    eval_data.release();
    for (size_t t = 0; t < tasks; ++t) {
      const se::TaskFiles& tf = eval_data.task(static_cast<int>(t));
      if (args.eval_batches == 0 && !tf.synthetic && b >= tf.per_epoch) continue;
      ++batches[t];
      loss[t] += e.task_loss[t];
      ab[t] += e.hits_ab[t];
      ba[t] += e.hits_ba[t];
      queries[t] += e.queries[t];
    }
  }
  if (tr.rank != 0) return true;
  std::string line = "evaluation at iteration " + std::to_string(step) + " |";
  nlohmann::json j = {{"step", step}, {"eval", nlohmann::json::object()}};
  char buf[256];
  for (size_t t = 0; t < tasks; ++t) {
    const std::string& name = tr.model.tasks[t].name;
    nlohmann::json& jt = j["eval"][name];
    jt["loss"] = loss[t] / static_cast<double>(batches[t]);
    jt["batches"] = batches[t];
    std::snprintf(buf, sizeof buf, " %s loss: %.6f |", name.c_str(), loss[t] / static_cast<double>(batches[t]));
    line += buf;
    if (queries[t] > 0) {
      const double acc = (ab[t] + ba[t]) / (2 * queries[t]);
      jt["acc"] = acc;
      jt["acc_a_to_b"] = ab[t] / queries[t];
      jt["acc_b_to_a"] = ba[t] / queries[t];
      std::snprintf(buf, sizeof buf, " %s acc: %.4f (%.4f, %.4f) |", name.c_str(), acc, ab[t] / queries[t],
                    ba[t] / queries[t]);
      line += buf;
    }
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  append_metrics(tr, j);
  return true;
}

// Model FLOPs per device and second over a step of `step_ms`, in TFLOP/s
// (Megatron-LM's throughput per GPU: the model's FLOPs, not the
// hardware's, so recomputation or idle devices lower it).
double tflops_per_device(const Training& tr, double step_ms) {
  return tr.flops_per_step / (step_ms / 1000.0) / tr.size / 1e12;
}

// Rank 0: the step line of step `st` with the means of the steps since the
// last line (--log-interval), if any step is waiting for one; the window is
// then empty. Other ranks: nothing.
void print_step_line(Training& tr, const se::StepStats& st, double lr) {
  Training::Window& w = tr.window;
  if (tr.rank != 0 || w.steps == 0) return;
  se::StepStats mean = st;
  mean.step_ms = w.ms / w.steps;
  for (size_t t = 0; t < mean.task_loss.size(); ++t) mean.task_loss[t] = w.loss[t] / w.steps;
  int64_t consumed = 0;
  for (const auto& [task, n] : se::samples_read(tr.meta, st.step)) consumed += n;
  std::printf("%s\n", log_line(tr.model, mean, tr.args.steps, tr.samples_per_step, consumed, lr,
                                tflops_per_device(tr, mean.step_ms), tr.gpu)
                          .c_str());
  std::fflush(stdout);
  w = {};
}

// After step `st`: every rank's counters gathered on rank 0 (one small
// gather per step), which appends the step's object to --metrics (throws
// std::runtime_error when that write fails) and, every --log-interval
// steps and after the last (`last`: the run stops after this one, else
// --steps), prints the log line: as Megatron-LM's, step
// time and losses are the means over the steps since the line before.
// Collective over MPI_COMM_WORLD.
void report_step(Training& tr, const se::StepStats& st, double lr, bool last) {
  const std::vector<double> per_rank = gather_counters(st.counters, tr.rank, tr.size);
  if (tr.rank == 0) {
    tr.peak_bytes.resize(static_cast<size_t>(tr.size), -1);
    tr.peak_step.resize(static_cast<size_t>(tr.size), 0);
    for (size_t r = 0; r < tr.peak_bytes.size(); ++r) {
      const auto held = static_cast<int64_t>(per_rank[r * kCounterFields + kPeakField]);
      if (held > tr.peak_bytes[r]) {
        tr.peak_bytes[r] = held;
        tr.peak_step[r] = st.step;
      }
    }
    Training::Window& w = tr.window;
    w.loss.resize(st.task_loss.size(), 0.0);
    for (size_t t = 0; t < st.task_loss.size(); ++t) w.loss[t] += st.task_loss[t];
    w.ms += st.step_ms;
    ++w.steps;
    if (st.step % tr.args.log_interval == 0 || st.step == tr.args.steps || last) print_step_line(tr, st, lr);
  }
  if (tr.rank == 0 && !tr.args.metrics_path.empty()) {
    nlohmann::json j = {{"step", st.step},
                        {"step_ms", st.step_ms},
                        {"samples_per_s", static_cast<double>(tr.samples_per_step) * 1000.0 / st.step_ms},
                        {"lr", lr},
                        {"tflops_per_device", tflops_per_device(tr, st.step_ms)}};
    double total = 0;
    for (size_t t = 0; t < tr.model.tasks.size(); ++t) {
      j["loss"][tr.model.tasks[t].name] = st.task_loss[t];
      total += st.task_loss[t];
    }
    j["total_loss"] = total;
    if (st.grad_norm) j["grad_norm"] = *st.grad_norm;
    j["ranks"] = counters_json(per_rank, tr.size);
    append_metrics(tr, j);
  }
}

// --dump-grads: the full gradients of the step just trained, written by rank
// 0. Throws std::runtime_error when writing fails. Collective.
void dump_grads(Training& tr) {
  const auto grads = tr.executor.gather_grads();
  if (tr.rank == 0) {
    const sp::Status written =
        sp::write_file_atomic(tr.args.grads_path, params_json(grads, tr.executor.steps_done()).dump() + "\n");
    if (!written.ok()) throw std::runtime_error(written.error().message);
  }
}

// Whether step `st`'s losses, and its gradient norm when the programs
// compute it (the same on every rank: the update it scaled is not to be
// kept either), are all finite.
bool step_finite(const se::StepStats& st) {
  for (double l : st.task_loss)
    if (!std::isfinite(l)) return false;
  return !st.grad_norm || std::isfinite(*st.grad_norm);
}

// After step `st` (reported): whether every task's loss is finite. A loss
// that is not (inf or nan: training diverged, as with a task weight or
// learning rate too large, or data of huge values) stops the run before
// anything of the step is saved: no gradients, checkpoint, evaluation or
// final outputs, so --checkpoint keeps only the steps before it (as
// Megatron-LM's --check-for-nan-in-loss-and-grad stops the run). The
// losses were reduced over every rank (Executor::step): every rank decides
// the same, and rank 0 prints the one message.
bool losses_finite(const Training& tr, const se::StepStats& st) {
  if (step_finite(st)) return true;
  std::string bad;   // the tasks whose loss is not finite; none: the gradient norm
  for (size_t t = 0; t < st.task_loss.size(); ++t)
    if (!std::isfinite(st.task_loss[t]))
      bad += (bad.empty() ? "" : ", ") + tr.model.tasks[t].name + " " + sp::number_text(st.task_loss[t]);
  if (tr.rank == 0) {
    const std::string what = bad.empty() ? "gradient norm not finite (" + sp::number_text(*st.grad_norm) + ")"
                                         : "loss not finite (" + bad + ")";
    // Step 1 runs on the initial parameters: no update, so no learning
    // rate, has played a part yet (a model whose embeddings are constant,
    // e.g. pooled from a width of 1, normalises 0 by 0).
    const bool initial = st.step == 1;
    std::string message = "spindle-run: error: step " + std::to_string(st.step) + ": " + what +
                          (initial ? ": at the initial parameters, before any update"
                                   : ": training diverged; stopped before anything of this step was saved");
    if (!tr.args.checkpoint_dir.empty() && !initial)
      message += " (--resume continues from the newest checkpoint in " + tr.args.checkpoint_dir + ")";
    message += initial ? ". Check the data (huge or constant values), the task weights, and the model's widths (a "
                         "width of 1 under a LayerNorm or a pool_project gives constant embeddings)"
                       : ". Lower --lr (" + sp::number_text(tr.args.lr) + " here) or the task weights, or check the data";
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }
  return false;
}

// With --exit-duration-mins: whether the run has lasted that long, as
// rank 0's clock says (one broadcast, so every rank decides the same);
// the minutes it has lasted in *mins (rank 0). Collective over
// MPI_COMM_WORLD.
bool out_of_time(const Training& tr, double* mins) {
  if (tr.args.exit_duration_mins <= 0) return false;
  *mins = std::chrono::duration<double>(std::chrono::steady_clock::now() - tr.start).count() / 60.0;
  int stop = tr.rank == 0 && *mins >= tr.args.exit_duration_mins ? 1 : 0;
  MPI_CHECK(MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return stop != 0;
}

// --exit-signal-handler (Megatron-LM's): the signal a rank received, 0
// while none. Set by the handler alone (async-signal-safe).
volatile std::sig_atomic_t g_exit_signal = 0;

extern "C" void on_exit_signal(int signo) { g_exit_signal = signo; }

// Installs on_exit_signal for SIGTERM (what Slurm sends at a time limit or
// preemption, and `scancel` by default) and SIGUSR1 (what mpirun forwards
// to every rank, and `sbatch --signal=USR1@SECONDS` sends ahead of the
// limit). Called after MPI_Init, so the handlers are ours.
void install_exit_signal_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;   // a system call under way goes on
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

// With --exit-signal-handler: the signal any rank has received so far (the
// largest number), 0 for none; one all-reduce, so every rank decides the
// same even where the signal reached the ranks at different steps.
// Collective over MPI_COMM_WORLD.
int exit_signal_received(const Training& tr) {
  if (!tr.args.exit_signal_handler) return 0;
  int mine = static_cast<int>(g_exit_signal), any = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return any;
}

// Step 4 of run: trains steps (steps done + 1) .. --steps. Each step reads
// its data (--data), runs the executor's step, reports it, stops when a
// loss is not finite, and when due dumps the gradients (the first step),
// saves a checkpoint (every --every steps and the last) and evaluates
// (every --eval-every steps and the last); with --exit-duration-mins it
// saves and stops early once out of time. Returns the exit code: 0;
// kExitInvalid when a bad data value stopped every rank before a step or
// an evaluation; kExitFailure when a loss was not finite or a checkpoint
// could not be saved (the error printed). Collective over MPI_COMM_WORLD.
int train(Training& tr) {
  const Args& args = tr.args;
  const char* die = std::getenv("SPINDLE_TEST_DIE_AT_STEP");
  const char* fail = std::getenv("SPINDLE_TEST_THROW_AT_STEP");
  const int die_rank = tr.size > 1 ? 1 : 0;
  const int first_step = static_cast<int>(tr.executor.steps_done()) + 1;
  for (int s = first_step; s <= args.steps; ++s) {
    if (die && std::atoi(die) == s && tr.rank == die_rank) {
      std::fprintf(stderr, "spindle-run: rank %d: SPINDLE_TEST_DIE_AT_STEP=%d: exiting\n", tr.rank, s);
      std::fflush(stderr);
      _exit(9);
    }
    if (fail && std::atoi(fail) == s && tr.rank == die_rank)
      throw std::runtime_error("SPINDLE_TEST_THROW_AT_STEP=" + std::to_string(s) + ": a failure inside a step");
    if (tr.data && !all_ok(MPI_COMM_WORLD, tr.rank, tr.data->prepare(tr.reads, s - 1))) return kExitInvalid;
    const double lr = se::lr_at(args.schedule, s);
    tr.executor.set_learning_rate(static_cast<float>(lr));
    const se::StepStats st = tr.executor.step();
    if (tr.data) tr.data->release();
    double mins = 0;   // --exit-duration-mins: out of time after this step (not the last)?
    const bool late = s < args.steps && out_of_time(tr, &mins);
    int signo = s < args.steps ? exit_signal_received(tr) : 0;   // --exit-signal-handler
    bool stop = late || signo != 0;
    // A step that diverged is the run's last: its line is printed whatever
    // --log-interval says (with the means of the steps before it).
    report_step(tr, st, lr, stop || !step_finite(st));
    if (!losses_finite(tr, st)) return kExitFailure;
    if (!args.grads_path.empty() && s == first_step) dump_grads(tr);
    const bool saves = !args.checkpoint_dir.empty() && (s % args.every == 0 || s == args.steps);
    if (saves && !write_checkpoint(tr)) return kExitFailure;
    const bool evaluates = (args.eval_every > 0 && s % args.eval_every == 0) || s == args.steps;
    if (evaluates && !evaluate(tr, s)) return kExitInvalid;
    // A signal that came during this step's save or evaluation, either of
    // which can take longer than a step: stop after this step, not the next
    // (the step's line, if --log-interval held it back, is printed now).
    if (!stop && s < args.steps && (saves || evaluates)) {
      signo = exit_signal_received(tr);
      stop = signo != 0;
      if (stop) print_step_line(tr, st, lr);
    }
    // Out of time (--exit-duration-mins, Megatron-LM's
    // --exit-duration-in-mins) or told to stop (--exit-signal-handler): a
    // checkpoint of this step, unless it just saved one, and exit 0, so
    // that a job near its time limit or preempted stops where --resume
    // takes it up instead of being killed and losing the steps since the
    // last checkpoint.
    if (stop) {
      if (s % args.every != 0 && !write_checkpoint(tr)) return kExitFailure;
      if (tr.rank == 0) {
        char minutes[32];
        std::snprintf(minutes, sizeof minutes, "%.2f", mins);
        const std::string why = late ? "--exit-duration-mins " + sp::number_text(args.exit_duration_mins) + ": " +
                                           minutes + " min after the start"
                                     : std::string(signo == SIGTERM ? "SIGTERM" : "SIGUSR1") +
                                           " received (--exit-signal-handler)";
        std::printf("spindle-run: %s, step %d of %d done; stopping (--resume goes on from the checkpoint of step %d)\n",
                    why.c_str(), s, args.steps, s);
        std::fflush(stdout);
      }
      return 0;
    }
  }
  return 0;
}

// Step 5 of run: the measured trace of every rank (--trace) and the final
// parameters (--dump-params), written by rank 0. Throws std::runtime_error
// when writing fails. Collective over MPI_COMM_WORLD.
// With nothing to train: --dump-grads (the first trained step's) has
// nothing to hold, said rather than skipped in silence.
void note_no_grads(const Args& args, int rank) {
  if (rank == 0 && !args.grads_path.empty())
    std::printf("spindle-run: note: --dump-grads %s not written: no step was trained\n", args.grads_path.c_str());
}

void write_outputs(const Args& args, se::Executor& executor, int rank, int size) {
  if (!args.trace_path.empty()) {
    nlohmann::json mine = nlohmann::json::array();
    for (const sp::TraceEvent& e : executor.trace())
      mine.push_back({e.name, e.cat, e.device, e.track, e.start_us, e.dur_us, e.args});
    const std::vector<std::string> all = all_gather_strings(MPI_COMM_WORLD, mine.dump());
    if (rank == 0) {
      std::vector<sp::TraceEvent> events;
      for (const std::string& s : all)
        for (const auto& e : nlohmann::json::parse(s))
          events.push_back({e[0], e[1], e[2], e[3], e[4], e[5], e[6]});
      const sp::Status st = sp::write_file_atomic(args.trace_path, sp::trace_to_json(events, size));
      if (!st.ok()) throw std::runtime_error(st.error().message);
    }
  }
  if (!args.dump_path.empty()) {
    se::ReplicaDrift drift;
    const auto params = executor.gather_params(&drift);
    if (rank == 0) {
      warn_drift(drift, executor.steps_done());
      const sp::Status st =
          sp::write_file_atomic(args.dump_path, params_json(params, executor.steps_done()).dump() + "\n");
      if (!st.ok()) throw std::runtime_error(st.error().message);
    }
  }
}

// A failure while training (an exception): said with the rank, then the
// whole job ends with exit 1 (MPI_Abort), nothing hangs.
[[noreturn]] void abort_job(int rank, const char* what) {
  std::fprintf(stderr, "spindle-run: error: rank %d: %s\n", rank, what);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, kExitFailure);
  std::_Exit(kExitFailure);   // MPI_Abort does not return
}

int run_on(const Args& args, Inputs& in, Runtime& rt, int rank, int size,
           std::chrono::steady_clock::time_point start);

// This rank's whole run, in the five steps below (2-5 in run_on). Returns
// the exit code: 0, kExitInvalid when an input, a checkpoint or a data
// value was refused, kExitFailure when training diverged or a checkpoint
// could not be saved (every rank agrees). A failure while training (an
// exception) aborts the job (abort_job). Collective over MPI_COMM_WORLD.
int run(const Args& args, int rank, int size) {
  const auto start = std::chrono::steady_clock::now();
  // 1. Inputs: load and check on every rank; all ranks agree before going on.
  Inputs in;
  if (!load_inputs(args, rank, size, in)) return kExitInvalid;
  // 2. Communicators and backend. A failure from here on aborts the job
  // while they are still up: unwinding first would destroy them, and an
  // NCCL communicator's destructor waits for its collectives, which the
  // other ranks, waiting for this one, never finish (the job hung until
  // their --comm-timeout blamed a stalled peer, the error never printed).
  Runtime rt = start_runtime(args, in);
  try {
    return run_on(args, in, rt, rank, size, start);
  } catch (const std::exception& e) {
    abort_job(rank, e.what());
  }
}

// Steps 2-5 of run on the runtime `rt` made for `in`.
int run_on(const Args& args, Inputs& in, Runtime& rt, int rank, int size,
           std::chrono::steady_clock::time_point start) {
  // 2. The executor, once the plan's memory is known to fit as this run
  // holds it.
  if (!all_ok(MPI_COMM_WORLD, rank, memory_error(args, in, rt))) return kExitInvalid;
  if (rank == 0) warn_memory_margin(args, in, rt);
  build_executor(args, in, rt);
  se::Executor& executor = *rt.executor;
  executor.set_data(in.data.get());
  std::vector<se::DataRead> reads = executor.data_reads(false), eval_reads = executor.data_reads(true);
  print_banner(args, in, rt, rank, size);

  // 3. Resume: the checkpoint's state, if any. At or past --steps there is
  // nothing to train; with --eval-data the checkpoint is evaluated once
  // (Megatron-LM's --skip-train), else the run ends here.
  if (in.ck && !resume(args, in, executor, rank, size)) return kExitInvalid;
  const bool nothing_to_train = executor.steps_done() >= args.steps;
  if (nothing_to_train) {
    if (rank == 0)
      std::printf("spindle-run: the checkpoint is at step %lld, --steps %d: nothing to train%s\n",
                  static_cast<long long>(executor.steps_done()), args.steps,
                  in.eval_data ? "; evaluating it (--eval-data)" : "");
    if (!in.eval_data) {
      write_outputs(args, executor, rank, size);   // the checkpoint's parameters; a trace of nothing
      note_no_grads(args, rank);
      rt.world->barrier();
      return 0;
    }
  }

  // 4. Training (or the evaluation of the checkpoint alone).
  int64_t samples_per_step = 0;
  for (const sp::Task& t : in.model->tasks) samples_per_step += t.batch;
  Training tr{args,
              rank,
              size,
              *in.model,
              executor,
              in.data.get(),
              in.eval_data.get(),
              std::move(reads),
              std::move(eval_reads),
              checkpoint_meta(args, in, rt.options),
              samples_per_step,
              sp::model_flops_per_step(in.graph),
              rt.backend->device() == se::Device::cuda && !rt.emulated,
              std::ofstream(),
              start};
  mark_overwrite(tr);
  tr.counted_bytes = rt.counted_bytes;   // what memory_error checked
  rt.world->barrier();
  executor.reset_clock();
  if (nothing_to_train) {
    if (!evaluate(tr, executor.steps_done())) return kExitInvalid;
  } else if (const int code = train(tr); code != 0) {
    return code;
  }
  report_memory(tr, in.plan->memory_bytes);
  if (rank == 0 && tr.metrics.is_open()) {
    tr.metrics.close();
    if (tr.metrics.fail()) throw std::runtime_error(args.metrics_path + ": write failed on close (--metrics)");
  }
  // 5. Outputs: the measured trace of every rank, the final parameters
  // (with nothing to train, the checkpoint's, and the trace of its
  // evaluation; they were skipped, exit 0, without a word).
  write_outputs(args, executor, rank, size);
  if (nothing_to_train) note_no_grads(args, rank);
  if (rt.emulated) report_emulated_calls(*rt.world, *rt.emulated);
  rt.world->barrier();
  return 0;
}

// The command line (docs/spec/cli.md): every option and flag into `args`.
// The options in --help's groups, as Megatron-LM's arguments are grouped
// (each option_defaults()->group call names the group of those after it).
void add_options(CLI::App& app, Args& args) {
  app.option_defaults()->group("Run");
  app.add_option("plan", args.plan_path, "wave plan (JSON, from spindle-plan)")->required()->check(spindle::apps::non_empty_path());
  app.add_option("--model", args.model_path, "model description (YAML) the plan was made for")->required()->check(spindle::apps::non_empty_path());
  app.add_option("--steps", args.steps, "training steps")
      ->capture_default_str()
      ->check(spindle::apps::integer_in(1, kMaxSteps));
  app.add_option("--backend", args.backend, "compute backend: cpu | cuda")->capture_default_str();
  app.add_option("--seed", args.seed, "seed of parameters and synthetic data")
      ->capture_default_str()
      ->check(spindle::apps::uint64_decimal());  // before conversion: "-1" would wrap to 2^64 - 1
  app.option_defaults()->group("Data and evaluation");
  app.add_option("--data", args.data_path, "training data (DATA.yaml, docs/spec/data.md); default: synthetic")
      ->check(spindle::apps::non_empty_path());
  CLI::Option* eval =
      app.add_option("--eval-data", args.eval_path, "evaluation data (same format)")->check(spindle::apps::non_empty_path());
  app.add_option("--eval-every", args.eval_every, "evaluate after every K-th step (and after the last)")
      ->needs(eval)
      ->check(spindle::apps::integer_in(1, kMaxSteps));
  app.add_option("--eval-batches", args.eval_batches, "batches per task and evaluation (default: one pass)")
      ->needs(eval)
      ->check(spindle::apps::integer_in(1, kMaxSteps));
  app.option_defaults()->group("Optimizer and learning rate");
  app.add_option("--lr", args.lr, "AdamW learning rate (the peak, with a schedule)")->capture_default_str();
  app.add_option("--lr-warmup-steps", args.lr_warmup_steps,
                 "rise linearly from 0 to --lr over this many steps (Megatron-LM's --lr-warmup-iters)")
      ->check(spindle::apps::integer_in(0, kMaxSteps));
  app.add_option("--lr-decay-style", args.lr_decay_style,
                 "after the warm-up: constant | linear | cosine decay from --lr to --min-lr (Megatron-LM's "
                 "--lr-decay-style)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  app.add_option("--lr-decay-steps", args.lr_decay_steps,
                 "the decay reaches --min-lr at step N + 1 and stays there (default: --steps; Megatron-LM's "
                 "--lr-decay-iters)")
      ->check(spindle::apps::integer_in(1, kMaxSteps));
  app.add_option("--min-lr", args.min_lr, "the rate linear or cosine decay ends at (default 0)");
  app.add_option("--clip-grad", args.clip_grad,
                 "clip the gradients' global L2 norm to at most this before each AdamW step (Megatron-LM's --clip-grad, "
                 "PyTorch's clip_grad_norm_; the step line shows the norm); 0: no clipping")
      ->capture_default_str();
  app.add_option("--weight-decay", args.weight_decay,
                 "AdamW's decoupled weight decay (Megatron-LM's --weight-decay), on every tensor unless --no-weight-decay-1d")
      ->capture_default_str();
  app.add_flag("--no-weight-decay-1d", args.no_decay_1d,
               "no weight decay on 1-D tensors (biases, LayerNorm gains and biases), as Megatron-LM by default "
               "(default here: every tensor decays)");
  app.add_option("--adam-beta1", args.adam_beta1, "AdamW's first-moment factor")->capture_default_str();
  app.add_option("--adam-beta2", args.adam_beta2, "AdamW's second-moment factor")->capture_default_str();
  app.add_option("--adam-eps", args.adam_eps, "AdamW's epsilon, added to the update's denominator")
      ->capture_default_str();
  app.option_defaults()->group("Checkpoints");
  CLI::Option* ckpt =
      app.add_option("--checkpoint", args.checkpoint_dir, "save checkpoints into DIR (step-N directories)")
          ->check(spindle::apps::non_empty_path());
  app.add_option("--every", args.every, "save a checkpoint every K steps (and at the end)")
      ->capture_default_str()
      ->check(spindle::apps::integer_in(1, kMaxSteps))
      ->needs(ckpt);
  app.add_option("--keep", args.keep, "complete checkpoints to keep (newest)")
      ->capture_default_str()
      ->check(spindle::apps::integer_in(1, kMaxSteps))
      ->needs(ckpt);
  app.add_option("--exit-duration-mins", args.exit_duration_mins,
                 "after the first step that ends this many minutes after the start, save a checkpoint and exit 0, "
                 "for --resume to go on (Megatron-LM's --exit-duration-in-mins; a job's time limit)")
      ->needs(ckpt);
  app.add_flag("--exit-signal-handler", args.exit_signal_handler,
               "on SIGTERM or SIGUSR1 (to mpirun, which passes SIGUSR1 on; sbatch --signal=USR1@SECONDS), finish the "
               "step under way, save a checkpoint and exit 0, for --resume to go on (Megatron-LM's "
               "--exit-signal-handler; preemption)")
      ->needs(ckpt);
  CLI::Option* resume =
      app.add_flag("--resume", args.resume, "continue from the newest complete checkpoint in --checkpoint DIR")
          ->needs(ckpt);
  app.add_flag("--overwrite", args.overwrite,
               "a fresh run into a --checkpoint DIR holding another run's checkpoints deletes them")
      ->needs(ckpt)
      ->excludes(resume);
  app.option_defaults()->group("Logging and tracing");
  app.add_option("--log-interval", args.log_interval,
                 "print the step line every N steps and after the last, its step time and losses the means over "
                 "those steps (Megatron-LM's --log-interval; --metrics keeps every step)")
      ->capture_default_str()
      ->check(spindle::apps::integer_in(1, kMaxSteps));
  app.add_option("--metrics", args.metrics_path, "append one JSON object per step (rank 0)")->check(spindle::apps::non_empty_path());
  CLI::Option* trace =
      app.add_option("--trace", args.trace_path, "write the measured timeline of all ranks (Chrome trace)")
          ->check(spindle::apps::non_empty_path());
  app.add_option("--trace-steps", args.trace_steps,
                 "record the trace of these steps only, FIRST:LAST, FIRST: (to the end) or FIRST, numbered as "
                 "--metrics numbers them (default: every step; as Megatron-LM's --profile-step-start/-end)")
      ->needs(trace)
      ->check(spindle::apps::step_range());
  app.option_defaults()->group("Communication");
  app.add_flag("--no-overlap", args.no_overlap,
               "all-reduce each gradient bucket after the backward pass, blocking, instead of starting it "
               "during the backward pass (same results; for comparison)");
  app.add_option("--bucket-mb", args.bucket_mb,
                 "gradient buckets of at most this many MiB, as PyTorch DDP's bucket_cap_mb (default: what the plan "
                 "was made with, spindle-plan --bucket-mb; 25 unless given there)");
  app.add_flag("--no-early-transfers", args.no_early,
               "send each transfer in its wave's exchange instead of right after the compute that made it, "
               "whatever the plan says (same results)");
  app.add_option("--comm-timeout", args.comm_timeout_s,
                 "NCCL: seconds a collective or transfer waits for its peers before the job ends with a message "
                 "naming the rank (a stalled or dead peer)")
      ->capture_default_str();
  app.option_defaults()->group("Dumps (tests and debugging)");
  app.add_option("--dump-params", args.dump_path, "write every final parameter (JSON)")->check(spindle::apps::non_empty_path());
  app.add_option("--dump-grads", args.grads_path,
                 "write every full gradient of the first step trained, after the gradient sync (JSON; for tests)")
      ->check(spindle::apps::non_empty_path());
}

// After parsing: what the flags given and their values make (whether
// --bucket-mb and --min-lr were given, the learning-rate schedule, the
// trace window, already checked by the parser).
void finish_args(const CLI::App& app, Args& args) {
  args.bucket_mb_given = app.count("--bucket-mb") > 0;
  args.min_lr_given = app.count("--min-lr") > 0;
  // Constant: no decay length (what a checkpoint records and a resume
  // compares, whatever --steps is).
  const se::LrDecay decay = *se::parse_lr_decay(args.lr_decay_style);   // one of IsMember's
  args.schedule = {args.lr, args.min_lr, args.lr_warmup_steps,
                   decay == se::LrDecay::constant ? 0 : args.lr_decay_steps > 0 ? args.lr_decay_steps : args.steps,
                   decay};
  if (!args.trace_steps.empty()) args.trace_window = *spindle::apps::parse_step_range(args.trace_steps);   // checked
}

}  // namespace

int main(int argc, char** argv) {
  spindle::plan::keep_freed_host_memory(std::getenv("GLIBC_TUNABLES"));  // util/host_memory.h
  Args args;
  CLI::App app{"spindle-run: train a model under a wave plan, one MPI rank per device"};
  spindle::apps::init_app(app, "spindle-run");
  add_options(app, args);
  // The command line is read before MPI starts: --help or a bad flag is
  // answered without it (a process started by hand would otherwise start
  // Open MPI's singleton server first: 0.4 s here), and a process that ends
  // before MPI_Init leaves mpirun nothing to report but the exit code.
  // Every rank parses the same line: the launcher's rank 0 (or a process
  // started alone) speaks for all.
  spindle::apps::refuse_empty_values(app);   // once every option is added
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return spindle::apps::end_before_mpi(&argc, &argv, e.get_exit_code() == 0 ? 0 : kExitInvalid, [&] { app.exit(e); });
  }
  finish_args(app, args);
  // The numbers too (they need no file): a refused --lr ends here, without
  // Open MPI's start-up.
  if (const std::string error = check_numbers(args); !error.empty())
    return spindle::apps::end_before_mpi(&argc, &argv, kExitInvalid, [&] {
      std::fprintf(stderr, "spindle-run: error: %s\n", error.c_str());
      std::fflush(stderr);
    });

  se::MpiSession session(&argc, &argv);
  if (args.exit_signal_handler) install_exit_signal_handler();   // after MPI_Init: ours, not Open MPI's
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));

  try {
    return run(args, rank, size);
  } catch (const std::exception& e) {
    abort_job(rank, e.what());
  }
}
