// Analytic operator cost model (docs/analytic-profile.md).
//
// time(n) = max(compute, memory) + tensor-parallel all-reduces
//           + batch gathers (contrastive_loss) + op latency
// compute = (F + F_half) / (efficiency_max * peak), where F is the FLOPs one
//           device does, i.e. F / (peak * eff(F)) with
//           eff(F) = efficiency_max * F / (F + F_half), F_half = peak * half_efficiency_us
// memory  = memory_passes * (param_bytes / K + local_batch / K * (kept + output bytes per sample))
//           / memory bandwidth
#include "libplan/cost/analytic.h"

#include "libplan/rules/devices.h"
#include "libplan/rules/memory.h"
#include "libplan/util/limits.h"
#include "libplan/util/units.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "libplan/cost/cost_model.h"
#include "libplan/model/ops.h"

namespace spindle::plan {
namespace {

// ---- Tunables, declared once (docs/analytic-profile.md explains each) ----

// Fraction of the dense peak that a large transformer slice reaches
// (Megatron-LM reports 50-65% model FLOPs utilisation on A100/A800 in bf16).
constexpr double kEfficiencyMax = 0.65;
// Per-device work of one operator (forward + backward) at which it reaches
// half of kEfficiencyMax, as microseconds at the device's peak: 64 us is
// 20 GFLOP on an A800 (312 TFLOP/s), about a ViT-H layer on 0.6 samples or a
// depth-encoder layer on 9 samples. Small slices underuse a device; this is
// why light encoders scale badly. Scaling with the peak keeps the model
// sensible from CPU cores to H200s.
constexpr double kHalfEfficiencyUs = 64.0;
// Fixed cost of one operator, forward plus backward: some tens of kernel
// launches and their tails, ms.
constexpr double kOpLatencyMs = 0.03;
// How often parameters and kept activations cross device memory in one
// forward plus backward (read forward, read backward, write gradient).
constexpr double kMemoryPasses = 3.0;

// The runtime's software cost around the wire (rules/links.h CommOverhead),
// microseconds: an NCCL group call (one exchange) or collective launches a
// kernel and synchronises, a few microseconds; each message in a group adds
// about one; copies around the wire read and write device memory once each
// (pack rate = memory bandwidth / 2).
constexpr double kExchangeUs = 5.0;
constexpr double kMessageUs = 1.0;
constexpr double kAllreduceUs = 5.0;

constexpr AnalyticConstants kConstants{kEfficiencyMax, kHalfEfficiencyUs, kOpLatencyMs,
                                       kMemoryPasses};

double d(const Workload& w, const char* name) {
  auto it = w.dims.find(name);
  if (it == w.dims.end() || !it->is_number()) return 0.0;
  return it->get<double>();
}

// Per-sample sizes of one operator that the time formula needs.
struct OpShape {
  double flops = 0;             // forward + backward, whole operator
  double kept_bytes = 0;        // activations kept for backward
  double output_bytes = 0;      // output activation
  int tp_allreduces = 0;        // Megatron-style all-reduces per fwd+bwd under TP
  double tp_allreduce_bytes = 0;  // size of each, per sample
  double gather_bytes = 0;      // contrastive_loss: embedding bytes per sample gathered over n
};

OpShape shape_of(const Workload& w, DType dtype) {
  const double dt = dtype_bytes(dtype);
  const double s = double(w.seq);
  OpShape r;
  const std::string& op = w.op;
  if (op == "transformer_layer") {
    const double h = d(w, "hidden"), f = d(w, "ffn"), a = d(w, "heads");
    // Forward: QKV 6 s h^2, scores 2 s^2 h, weighted sum 2 s^2 h, output 2 s h^2,
    // MLP 4 s h ffn. Causal attention is counted in full (the runtime computes
    // the whole score matrix and masks it).
    r.flops = 3.0 * (8.0 * s * h * h + 4.0 * s * h * f + 4.0 * s * s * h);
    // Korthikanti et al. (2022), 16-bit: s h (34 + 5 a s / h) for ffn = 4h
    // without recomputation; generalised: attention 11 s h, MLP 3 s h + 4 s ffn,
    // two LayerNorms 4 s h, scaled by dtype_bytes / 2. The 5 a s^2 term (score
    // and softmax matrices) is not kept: GPU training uses fused (flash)
    // attention, which keeps only the fp32 log-sum-exp per head and row.
    r.kept_bytes = s * (18.0 * h + 4.0 * f) * dt / 2.0 + 4.0 * a * s;
    r.output_bytes = s * h * dt;
    r.tp_allreduces = 4;   // 2 forward (after attention, after MLP), 2 backward
    r.tp_allreduce_bytes = s * h * dt;
  } else if (op == "linear") {
    const double in = d(w, "in"), out = d(w, "out");
    r.flops = 6.0 * s * in * out;
    r.kept_bytes = s * in * dt;
    r.output_bytes = s * out * dt;
    r.tp_allreduces = 2;
    r.tp_allreduce_bytes = s * out * dt;
  } else if (op == "patch_embed") {
    const double in = d(w, "in_dim"), h = d(w, "hidden");
    r.flops = 6.0 * s * in * h + 3.0 * s * h;
    r.kept_bytes = s * in * dt;
    r.output_bytes = s * h * dt;
    r.tp_allreduces = 2;
    r.tp_allreduce_bytes = s * h * dt;
  } else if (op == "token_embed") {
    const double h = d(w, "hidden");
    r.flops = 3.0 * s * h;           // position add; the lookup is bytes-bound
    r.kept_bytes = s * 4.0;          // int32 token ids
    r.output_bytes = s * h * dt;
    r.tp_allreduces = 1;             // vocab-parallel lookup, forward
    r.tp_allreduce_bytes = s * h * dt;
  } else if (op == "pool_project") {
    const double in = d(w, "in"), out = d(w, "out");
    r.flops = 6.0 * in * out + 3.0 * (s * in + 8.0 * in);
    r.kept_bytes = 2.0 * in * dt + 8.0;   // LN input and output, mean and rstd (fp32)
    r.output_bytes = out * dt;
    r.tp_allreduces = 2;
    r.tp_allreduce_bytes = out * dt;
  } else if (op == "contrastive_loss") {
    const double dim = d(w, "dim"), b = double(w.batch);
    // Each device scores its rows against the gathered batch in both
    // directions: 2 x (2 b dim) FLOPs per sample forward, softmax 5 b each.
    r.flops = 3.0 * (4.0 * b * dim + 10.0 * b + 6.0 * dim);
    r.kept_bytes = 2.0 * dim * dt + 2.0 * b * 4.0;   // normalised pair, fp32 softmax rows
    r.output_bytes = 0;
    r.gather_bytes = 2.0 * dim * dt;
  } else if (op == "lm_loss") {
    const double h = d(w, "hidden"), v = d(w, "vocab");
    r.flops = 3.0 * (2.0 * s * h * v + 8.0 * s * h + 5.0 * s * v);
    r.kept_bytes = 2.0 * s * h * dt + s * v * 4.0;   // LN in/out, fp32 logits
    r.output_bytes = 0;
    r.tp_allreduces = 1;   // input gradient of the vocab-parallel projection
    r.tp_allreduce_bytes = s * h * dt;
  }
  return r;
}

}  // namespace

const AnalyticConstants& analytic_constants() { return kConstants; }

CommOverhead analytic_comm_overhead(const Cluster& cluster) {
  CommOverhead o;
  o.exchange_us = kExchangeUs;
  o.message_us = kMessageUs;
  o.allreduce_us = kAllreduceUs;
  o.pack_gbytes_per_s = cluster.memory_gbytes_per_s / 2.0;
  return o;
}

double analytic_flops_per_sample(const Workload& w) { return shape_of(w, DType::bf16).flops; }

double model_flops_per_step(const OpGraph& graph) {
  double flops = 0;
  for (const Operator& op : graph.ops) flops += analytic_flops_per_sample(op.workload) * double(op.workload.batch);
  return flops;
}

int64_t analytic_activation_bytes_per_sample(const Workload& w, DType dtype) {
  return limits::bytes_to_int64(std::round(shape_of(w, dtype).kept_bytes));
}

RunActivation analytic_run_activation(const Workload& w, int layer_value_bytes) {
  constexpr double v = kRunActivationValueBytes;   // fp32
  const double s = double(w.seq);
  RunActivation r;
  const std::string& op = w.op;
  if (op == "transformer_layer") {
    const double h = d(w, "hidden"), f = d(w, "ffn"), a = d(w, "heads");
    const double t = layer_value_bytes;
    const double sp = std::ceil(s / 8.0) * 8.0;   // the CUDA backend's padded sequence
    // Whole on every rank, fp32: two [s, h] (the CPU's first LayerNorm's
    // normalised input and the output; the CUDA backend's residual stream
    // and output) and the LayerNorms' row statistics; in the layer's width,
    // three [s, h] (the CPU: the second normalised input and both
    // LayerNorms' outputs; the CUDA backend: both outputs). Split, in the
    // layer's width: q, k, v (at the padded sequence, as the CUDA backend
    // holds them), the heads' output, the MLP's pre- and post-GELU
    // columns, the probabilities.
    r.replicated = v * (2.0 * s * h + 4.0 * s) + t * 3.0 * s * h;
    r.split = t * (3.0 * sp * h + s * h + 2.0 * s * f + a * sp * sp);
  } else if (op == "linear") {
    r.replicated = v * s * (d(w, "in") + d(w, "out"));             // its input, its output
  } else if (op == "patch_embed") {
    r.replicated = v * s * (d(w, "in_dim") + d(w, "hidden"));
  } else if (op == "token_embed") {
    r.replicated = v * s * (1.0 + d(w, "hidden"));                  // the ids (as floats), the output
  } else if (op == "pool_project") {
    r.replicated = v * (2.0 * d(w, "in") + 2.0 + d(w, "out"));      // LayerNorm in and out, mean, rstd, output
  } else if (op == "contrastive_loss") {
    // Per row of the whole batch, which every device of the slice holds:
    // both normalised inputs and their norms, a row and a column of each
    // softmax.
    r.replicated = v * (2.0 * d(w, "dim") + 2.0 + 2.0 * double(w.batch));
  } else if (op == "lm_loss") {
    // The LayerNorm's normalised input, output and statistics, the
    // targets; the probabilities over the rank's vocabulary columns (made
    // in the logits' buffer). Its backward makes dL/dlogits in theirs, then
    // dL/dz and the LayerNorm's gradient temporaries and dL/dx, three [s,
    // h] (libexec/ops/lm_loss.cpp; the CUDA backend two): bounded by twice
    // the replicated part.
    r.replicated = v * (2.0 * s * d(w, "hidden") + 3.0 * s);
    r.split = v * s * d(w, "vocab");
  }
  // The transients: what it keeps, but for two operators.
  r.transient_replicated = r.replicated;
  r.transient_split = r.split;
  if (op == "lm_loss") {
    r.transient_split = 0;   // dL/dlogits in the probabilities' buffer (above)
  } else if (op == "pool_project") {
    // Its backward makes dL/dx over the whole sequence, [s, in], and three
    // [in] (the LayerNorm's and the mean's gradients), beside dL/dy.
    r.transient_replicated = v * (s * d(w, "in") + 3.0 * d(w, "in") + d(w, "out"));
  }
  return r;
}

double analytic_op_ms(const Workload& w, int tensor_parallel, int n, const Cluster& cluster,
                      DType dtype, int64_t param_bytes) {
  const AnalyticConstants& c = kConstants;
  const OpShape sh = shape_of(w, dtype);
  const double k = std::max(tensor_parallel, 1);
  const double local_batch = double(w.batch) * k / double(n);   // per TP group
  const double peak_flops_per_ms = cluster.peak_tflops * 1e12 * 1e-3;

  const double device_flops = sh.flops * local_batch / k;
  const double half_flops = c.half_efficiency_us * 1e-3 * peak_flops_per_ms;
  const double compute_ms = (device_flops + half_flops) / (c.efficiency_max * peak_flops_per_ms);
  const double device_bytes =
      c.memory_passes * (double(param_bytes) / k + local_batch / k * (sh.kept_bytes + sh.output_bytes));
  const double memory_ms = device_bytes / (cluster.memory_gbytes_per_s * 1e9) * 1e3;

  double comm_ms = 0;
  if (tensor_parallel > 1 && sh.tp_allreduces > 0) {
    const std::vector<int> group = first_devices(tensor_parallel);
    comm_ms += sh.tp_allreduces * ring_allreduce_ms(cluster, local_batch * sh.tp_allreduce_bytes, group);
  }
  if (sh.gather_bytes > 0 && n > 1) {
    // All-gather of the embeddings forward, reduce-scatter of their gradients
    // backward, over the slice's n devices.
    comm_ms += 2.0 * ring_allgather_ms(cluster, double(w.batch) * sh.gather_bytes, first_devices(n));
  }
  return std::max(compute_ms, memory_ms) + comm_ms + c.op_latency_ms;
}

double analytic_op_ms(const Workload& w, int tensor_parallel, int n, const Cluster& cluster,
                      DType dtype) {
  const int64_t params = op_param_count(w.op, w.dims, w.seq) * dtype_bytes(dtype);
  return analytic_op_ms(w, tensor_parallel, n, cluster, dtype, params);
}

std::map<std::string, WorkloadUse> workload_uses(const Model& model, const OpGraph& graph) {
  std::map<std::string, WorkloadUse> uses;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const Operator& op = graph.ops[i];
    const std::string key = op.workload.key();
    int64_t max_seq = op.workload.seq;
    if (op.task >= 0 && size_t(op.task) < model.tasks.size()) {
      const Task& t = model.tasks[size_t(op.task)];
      if (op.node >= 0 && size_t(op.node) < t.nodes.size()) {
        const Module* m = model.find_module(t.nodes[size_t(op.node)].module);
        if (m && m->max_seq > 0) max_seq = m->max_seq;
      }
    }
    const int64_t params = op_param_count(op.workload.op, op.workload.dims, max_seq) * dtype_bytes(model.dtype);
    auto it = uses.find(key);
    if (it == uses.end()) {
      uses.emplace(key, WorkloadUse{op.workload, op.tensor_parallel, params, op.id, static_cast<int>(i)});
      continue;
    }
    it->second.param_bytes = std::max(it->second.param_bytes, params);
  }
  return uses;
}

ProfileFit profile_fit(const Profile& profile, const Model& model, const OpGraph& graph, const Cluster& cluster) {
  const std::map<std::string, WorkloadUse> uses = workload_uses(model, graph);
  std::set<std::string> keys;
  for (const ProfileEntry& e : profile.entries) keys.insert(e.workload.key());
  // A workload without its entry: the cost model names it, and nothing
  // here is worth saying before that.
  for (const auto& [key, _] : uses)
    if (!keys.count(key)) return {};
  ProfileFit fit;
  for (size_t i = 0; i < profile.entries.size(); ++i) {
    const ProfileEntry& e = profile.entries[i];
    const auto it = uses.find(e.workload.key());
    if (it == uses.end()) continue;   // an entry the model does not use: harmless
    const WorkloadUse& use = it->second;
    const std::string where =
        "entries[" + std::to_string(i) + "] (" + e.workload.op + ", operator " + use.first_op + ")";
    if (e.param_bytes != use.param_bytes)
      fit.mismatches.push_back(where + ": param_bytes " + std::to_string(e.param_bytes) + ", but in model '" +
                               model.name + "' (dtype " + dtype_name(model.dtype) + ") the operator holds " +
                               std::to_string(use.param_bytes) + ": a profile for another dtype or model?");
    for (const ProfilePoint& pt : e.points)
      if (!valid_device_count(pt.devices, use.tensor_parallel, e.workload.batch)) {
        fit.mismatches.push_back(where + ": a point at " + std::to_string(pt.devices) +
                                 " devices, which its module (tensor_parallel " + std::to_string(use.tensor_parallel) +
                                 ", batch " + std::to_string(e.workload.batch) +
                                 ") cannot run on: a profile for another tensor_parallel?");
        break;
      }
    const std::vector<int> valid = valid_device_counts(cluster.devices(), use.tensor_parallel, e.workload.batch);
    if (!valid.empty() && !e.points.empty() && e.points.back().devices < valid.back())
      fit.short_of_cluster.push_back(where + ": points up to " + std::to_string(e.points.back().devices) +
                                     " devices, " + std::to_string(valid.back()) + " valid");
  }
  return fit;
}

std::vector<int> analytic_valid_counts(int64_t batch, int tensor_parallel, const Cluster& cluster,
                                       const std::vector<int>* device_counts) {
  const std::vector<int> valid = valid_device_counts(cluster.devices(), tensor_parallel, batch);
  if (!device_counts) return valid;
  std::vector<int> out;
  for (int n : *device_counts)
    if (std::binary_search(valid.begin(), valid.end(), n)) out.push_back(n);
  return out;
}

Result<Profile> analytic_profile(const Model& model, const OpGraph& graph, const Cluster& cluster,
                                 const std::vector<int>* device_counts) {
  const std::string cfile = cluster.path.empty() ? std::string("<cluster>") : cluster.path;
  if (!(cluster.peak_tflops > 0)) {
    return make_error(Where{cfile, "device.peak_tflops", cluster.device_line, cluster.device_column},
                      "an analytic profile needs the device's dense peak TFLOP/s (> 0)");
  }
  if (!(cluster.memory_gbytes_per_s > 0)) {
    return make_error(Where{cfile, "device.memory_gbytes_per_s", cluster.device_line, cluster.device_column},
                      "an analytic profile needs the device memory bandwidth in GB/s; add it "
                      "to the cluster description (e.g. 2039 for an A800 80 GB)");
  }
  if (device_counts) {
    for (size_t i = 0; i < device_counts->size(); ++i) {
      const int n = (*device_counts)[i];
      if (n <= 0 || n > cluster.devices()) {
        return Error{"--devices: device count " + std::to_string(n) + " is outside 1.." +
                     std::to_string(cluster.devices()) + " (cluster " + cfile + ")"};
      }
      if (i > 0 && n <= (*device_counts)[i - 1]) {
        return Error{"--devices: device counts must be strictly increasing"};
      }
    }
  }

  SPINDLE_TRY(check_profile_keys(model, graph));   // so one tensor_parallel per workload below
  const std::map<std::string, WorkloadUse> uses = workload_uses(model, graph);

  Profile p;
  p.device = cluster.device_name;
  p.cluster = ProfileCluster{cluster.name, cluster.devices(), cluster.devices_per_island};
  p.source = "analytic";
  // Every figure as a file stores it (profile_figure): the profile in
  // memory and the one spindle-profile writes plan alike.
  p.overhead = analytic_comm_overhead(cluster);
  for (double* f : {&p.overhead->exchange_us, &p.overhead->message_us, &p.overhead->allreduce_us,
                    &p.overhead->pack_gbytes_per_s})
    *f = profile_figure(*f);
  // The optimizer step moves its bytes at the device's memory bandwidth.
  p.optimizer_gbytes_per_s = profile_figure(cluster.memory_gbytes_per_s);
  for (const auto& [key, use] : uses) {
    ProfileEntry e;
    e.workload = use.workload;
    e.param_bytes = use.param_bytes;
    e.activation_bytes_per_sample = analytic_activation_bytes_per_sample(use.workload, model.dtype);
    const std::vector<int> counts =
        analytic_valid_counts(use.workload.batch, use.tensor_parallel, cluster, device_counts);
    if (counts.empty()) {
      return Error{cfile + ": no valid device count for operator " + use.first_op + " (" + key +
                   ", tensor_parallel " + std::to_string(use.tensor_parallel) + ") among " +
                   (device_counts ? std::string("the --devices list")
                                  : "1.." + std::to_string(cluster.devices())) +
                   ": a count must be a multiple n of tensor_parallel with n / tensor_parallel "
                   "dividing the batch"};
    }
    // One point where the cluster allows several counts: the planner refuses
    // such a profile (ProfileCostModel::create), so it is not written.
    if (counts.size() == 1 && several_valid_device_counts(cluster.devices(), use.tensor_parallel, use.workload.batch)) {
      const std::vector<int> valid = analytic_valid_counts(use.workload.batch, use.tensor_parallel, cluster, nullptr);
      std::string listed;
      for (int n : valid) listed += (listed.empty() ? "" : ",") + std::to_string(n);
      return Error{"--devices: operator " + use.first_op + " (" + key + ", tensor_parallel " +
                   std::to_string(use.tensor_parallel) + ") gets one point (" + std::to_string(counts.front()) +
                   (counts.front() == 1 ? " device" : " devices") + "), but " + listed + " are valid on the " + std::to_string(cluster.devices()) +
                   " devices of " + cfile + ": a profile gives at least two points wherever more than one count "
                   "is valid (spec/profile.md), so spindle-plan would refuse it; list another of those counts"};
    }
    // The profile format's bounds (limits.h): a figure beyond them would be
    // written and then refused by every reader. Named at the model's node
    // (file:line:col) that first uses the workload.
    const Operator& first = graph.ops[static_cast<size_t>(use.first_index)];
    const Node& node = model.tasks[static_cast<size_t>(first.task)].nodes[static_cast<size_t>(first.node)];
    const Where at{model.path.empty() ? std::string("<model>") : model.path,
                   "tasks[" + std::to_string(first.task) + "].nodes[" + std::to_string(first.node) + "]",
                   node.mark.line, node.mark.column};
    const std::string what = "operator " + use.first_op + " (" + use.workload.op + ")";
    if (e.param_bytes > limits::kMaxBytes || e.activation_bytes_per_sample > limits::kMaxBytes) {
      return make_error(at, what + ": more than " + number_text(static_cast<double>(limits::kMaxBytes)) +
                                " parameter or activation bytes per sample, beyond what a profile may hold; "
                                "smaller widths or sequences");
    }
    for (int n : counts) {
      const double ms = analytic_op_ms(use.workload, use.tensor_parallel, n, cluster, model.dtype, use.param_bytes);
      if (!(ms <= limits::kMaxMs)) {
        return make_error(at, what + ": would take " + number_text(ms) + " ms on " + std::to_string(n) +
                                  (n == 1 ? " device" : " devices") + " of cluster " + cfile + ", more than the " +
                                  number_text(limits::kMaxMs) +
                                  " ms a profile may hold; a smaller batch, sequence or widths");
      }
      e.points.push_back(ProfilePoint{n, profile_figure(ms), 0.0});
    }
    p.entries.push_back(std::move(e));
  }
  return p;
}

}  // namespace spindle::plan
