// Analytic cost model of one operator on a cluster's device: the profile that
// `spindle-profile --analytic` writes and `spindle-plan` builds in memory when
// no profile is given. Formulas, constants and limits: docs/analytic-profile.md.
//
// Pure and deterministic: the same model and cluster give the same profile.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "libplan/graph/op_graph.h"
#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/rules/memory.h"
#include "libplan/model/model.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// The model's tunables, each declared once (analytic.cpp) with its default.
struct AnalyticConstants {
  double efficiency_max;        // fraction of peak_tflops reached by very large slices
  double half_efficiency_us;    // per-device work of one operator, in microseconds at peak, at which
                                // efficiency is half of max (= FLOPs / peak FLOP/s)
  double op_latency_ms;         // fixed cost of one operator, forward + backward (kernel launches)
  double memory_passes;         // times parameters and kept activations cross device memory
};
const AnalyticConstants& analytic_constants();

// The analytic profile's software overhead figures (its "comm_overhead"):
// 5 us per exchange, 1 us per message, 5 us per all-reduce call (NCCL-like
// launch costs), copies at half the cluster's memory bandwidth
// (docs/analytic-profile.md).
CommOverhead analytic_comm_overhead(const Cluster& cluster);

// FLOPs of one operator per sample, forward plus backward (3x forward), for
// the whole operator (not divided by tensor parallelism). For contrastive_loss
// it depends on the global batch (each sample meets every other one).
double analytic_flops_per_sample(const Workload& w);

// The model FLOPs of one training step: forward plus backward of every
// operator of `graph` (every task's use of a module counts), each at its
// task's global batch, as analytic_flops_per_sample counts them. What
// spindle-run's "throughput per GPU (TFLOP/s/GPU)" divides by the step time
// and the device count (Megatron-LM's model-FLOPs throughput).
double model_flops_per_step(const OpGraph& graph);

// Bytes one operator keeps for backward per sample, in `dtype` (the full
// operator: a tensor-parallel group holds it spread over its devices).
int64_t analytic_activation_bytes_per_sample(const Workload& w, DType dtype);

// What spindle-run holds for one operator during a step, per row of its
// input, in bytes of fp32 values (kRunActivationValueBytes) whatever the
// model's dtype: the tensors its forward keeps for backward plus its
// output (which the executor holds for the step when the operator ends a
// slice: counted for every operator, an upper bound). `replicated` is held
// whole by each rank of a tensor-parallel group (LayerNorm inputs and
// outputs, the residual stream, the output), `split` is divided over its
// ranks (the heads' and the MLP's columns, the vocabulary's). Unlike the
// count above, which assumes a fused attention kernel (and the planner,
// Megatron-LM's layout), the attention probabilities are held ([heads, s,
// s], s rounded up to a multiple of 8 as the CUDA backend pads it), as both
// backends run attention. `layer_value_bytes` is the width of a
// transformer layer's internals: 4 on the CPU backend and the CUDA
// backend's fp32 mode, 2 in its bf16 mode (docs/gpu.md, "Precision"); the
// residual stream, the outputs and every other operator stay fp32. An
// upper bound of both backends' saved tensors (libexec/ops/*.h,
// libexec/backend/cuda/cuda_backend.cpp). planner/feasibility.h's
// memory_as_run counts a device's activations so.
//
// `transient_*` bound, the same way, what the operator makes at once
// beyond what it keeps (its forward's temporaries, its backward's
// gradients and temporaries); memory_as_run counts twice the largest of a
// device's operators. Equal to what it keeps, but for lm_loss, whose
// logits become its probabilities and whose backward makes dL/dlogits in
// their buffer: its transients are of the hidden width only.
struct RunActivation {
  double replicated = 0;   // bytes per row, on every rank of a TP group
  double split = 0;        // bytes per row, over the TP group's ranks
  double transient_replicated = 0;
  double transient_split = 0;
};
RunActivation analytic_run_activation(const Workload& w, int layer_value_bytes = kRunActivationValueBytes);

// Time of ONE operator, forward plus backward, ms, on each of n devices that
// run it in data parallel over n / tensor_parallel groups of tensor_parallel
// devices, local batch batch * tensor_parallel / n (spec/profile.md). The
// caller passes a valid n (rules/devices.h); `param_bytes` are the operator's
// full parameter bytes.
// Needs cluster.peak_tflops > 0 and cluster.memory_gbytes_per_s > 0.
double analytic_op_ms(const Workload& w, int tensor_parallel, int n, const Cluster& cluster,
                      DType dtype, int64_t param_bytes);
// Same, with param_bytes from the catalogue at max_seq = w.seq.
double analytic_op_ms(const Workload& w, int tensor_parallel, int n, const Cluster& cluster,
                      DType dtype);

// Device counts valid for a workload (rules/devices.h): from `device_counts`
// when given (in its
// order, must be ascending), else every count 1..cluster.devices().
std::vector<int> analytic_valid_counts(int64_t batch, int tensor_parallel, const Cluster& cluster,
                                       const std::vector<int>* device_counts);

// A distinct workload of a model's graph as a profile entry describes it:
// its module's tensor_parallel, and its parameter bytes in the model's
// dtype (position tables at the module's largest seq; the largest over
// the operators sharing the workload).
struct WorkloadUse {
  Workload workload;
  int tensor_parallel = 1;
  int64_t param_bytes = 0;
  std::string first_op;   // the first operator with it, for messages
  int first_index = 0;    // that operator's index in the graph
};
// By Workload::key(), in key order.
std::map<std::string, WorkloadUse> workload_uses(const Model& model, const OpGraph& graph);

// How `profile` suits `model` on `cluster`, looking at the entries the
// model uses; both lists empty when a workload has no entry at all (the
// cost model's error to name, ProfileCostModel::create). One line each,
// "entries[i] (op, operator ID): ...", in entry order.
struct ProfileFit {
  // Made for another model: an entry's param_bytes other than the model's
  // (another dtype or model), or a point at a device count the module
  // cannot run on (another tensor_parallel; the keys hold none).
  // spindle-plan refuses such a profile unless --accept-profile-mismatch.
  std::vector<std::string> mismatches;
  // Points that stop below the largest count the module may run on in
  // `cluster` (a profile made with spindle-profile --devices 1,2, planned
  // on 8): their fitted curves are flat beyond, so the planner never
  // spreads them wider. spindle-plan warns.
  std::vector<std::string> short_of_cluster;
};
ProfileFit profile_fit(const Profile& profile, const Model& model, const OpGraph& graph, const Cluster& cluster);

// One entry per distinct workload of `graph`, points at its valid counts.
// Errors (naming the cluster file and key, or the workload) when the cluster
// lacks device.peak_tflops or device.memory_gbytes_per_s, when a workload has
// no valid device count, or when one workload is used with two different
// tensor_parallel degrees (the profile keys cannot tell them apart).
Result<Profile> analytic_profile(const Model& model, const OpGraph& graph, const Cluster& cluster,
                                 const std::vector<int>* device_counts = nullptr);

}  // namespace spindle::plan
