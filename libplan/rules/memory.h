// Per-device memory (docs/planner.md, "Memory"): the bytes a device holds
// for the parameters it runs and the activations it keeps for backward, and
// the memory traffic of the optimizer step (docs/simulation.md). The
// costing, the placement search, the checker's figures and the simulation
// all use these.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

namespace spindle::plan {

// How a parameter's optimizer state (AdamW's m and v, and the fp32 master
// copy when the dtype is narrower) is held over its data-parallel replicas.
// sharded: each replica holds 1/replicas of it, as Megatron's distributed
// optimizer (ZeRO stage 1) does; what the paper's comparison and the
// baselines assume (bench/paper); spindle-run holds it so (owned_values
// below, docs/runtime.md). replicated: every replica holds all of it.
// Recorded in the plan (Plan::optimizer_state), which spindle-run follows.
enum class OptimizerState { sharded, replicated };

// "sharded" or "replicated" (the plan's x-memory.optimizer_state and
// spindle-plan --optimizer-state), and back; nullopt for any other name.
inline const char* optimizer_state_name(OptimizerState s) {
  return s == OptimizerState::sharded ? "sharded" : "replicated";
}
inline std::optional<OptimizerState> optimizer_state_named(std::string_view name) {
  if (name == "sharded") return OptimizerState::sharded;
  if (name == "replicated") return OptimizerState::replicated;
  return std::nullopt;
}

// Bytes one device holds for one parameter shard of `shard_bytes` bytes in
// the model dtype (`dtype_bytes` per value) held by `replicas` data-parallel
// replicas (>= 1): weights and gradients in the model dtype, plus the
// optimizer state (8 bytes per value for m and v, 4 more for the master
// copy when the dtype is narrower than fp32), divided over the replicas
// when `state` is sharded.
inline double param_state_bytes(double shard_bytes, int dtype_bytes, double replicas, OptimizerState state) {
  const double replicated_per_value = 2.0 * dtype_bytes;
  const double optimizer_per_value = 8.0 + (dtype_bytes < 4 ? 4.0 : 0.0);
  const double holders = state == OptimizerState::sharded ? replicas : 1.0;
  return shard_bytes / dtype_bytes * (replicated_per_value + optimizer_per_value / holders);
}

// Bytes per value of the parameters, their gradients and AdamW's moments
// as spindle-run keeps them on every backend (fp32), whatever the model's
// dtype: memory_as_run counts the parameter state at it.
inline constexpr int kRunParamValueBytes = 4;

// A device's figure as spindle-run holds it (memory_as_run) on a device
// backend within this share of the device's memory is warned of (by
// spindle-plan and spindle-run): what the figure leaves out (the CUDA
// context, cuBLAS's workspace, NCCL's buffers for each communicator) is a
// few hundred MiB to a few GiB, not measured yet.
inline constexpr double kUncountedMarginShare = 0.05;
// Whether `held` bytes fit `memory` bytes but within kUncountedMarginShare.
inline bool within_uncounted_margin(int64_t held, int64_t memory) {
  return held <= memory && static_cast<double>(held) > (1 - kUncountedMarginShare) * static_cast<double>(memory);
}

// AdamW's memory traffic per parameter value it steps, as spindle-run's
// optimizer runs it (fp32: it reads the value, its gradient, m and v, and
// writes the value, m and v back: 7 x 4 bytes). The step is memory-bound.
inline constexpr int kAdamWBytesPerValue = 28;

// Milliseconds one device takes to step `values` parameter values at an
// optimizer rate of `gbytes_per_s` (bytes of kAdamWBytesPerValue per value
// moved per second, 1e9 per GB); 0 when the rate is not known (<= 0).
inline double optimizer_ms(int64_t values, double gbytes_per_s) {
  if (!(gbytes_per_s > 0)) return 0.0;
  return static_cast<double>(values) * kAdamWBytesPerValue / (gbytes_per_s * 1e6);
}

// The gradient norm's memory traffic per gradient value it reads (a
// norm_sum adds up the squares of one fp32 gradient per value: 4 bytes).
// Memory-bound like AdamW's step, so it is priced at the same rate.
inline constexpr int kNormSumBytesPerValue = 4;

// Milliseconds one device takes to add up the squares of `values`
// gradient values (its norm_sum) at the optimizer rate `gbytes_per_s`
// (optimizer_ms's); 0 when the rate is not known (<= 0).
inline double norm_sum_ms(int64_t values, double gbytes_per_s) {
  if (!(gbytes_per_s > 0)) return 0.0;
  return static_cast<double>(values) * kNormSumBytesPerValue / (gbytes_per_s * 1e6);
}

// Data-parallel replicas of a parameter held by `devices` devices at
// tensor-parallel degree `tensor_parallel` (at least 1).
inline double param_replicas(int devices, int tensor_parallel) {
  const double r = static_cast<double>(devices) / tensor_parallel;
  return r > 1.0 ? r : 1.0;
}

// ZeRO stage 1 (a plan whose optimizer_state is sharded): which values of
// a gradient bucket each of its `members` devices steps. The bucket's flat
// buffer (its shards in key order, each shard's tensors in order: the
// all-reduce's layout, `values` long) is cut into `members` chunks of
// owned_chunk values, the last ones shorter or empty where the values run
// out; the member at `index` (its place in the bucket's ascending device
// list) holds the optimizer state of, and steps, chunk `index` alone, then
// the members all-gather the stepped chunks (members x owned_chunk values,
// padding included). The memory formula above divides each shard's state
// over its replicas; a member's chunk holds less than one value more than
// that share of the bucket (the last members may hold fewer).
struct ValueRange {
  int64_t begin = 0, end = 0;   // [begin, end)
  int64_t size() const { return end - begin; }
};
inline int64_t owned_chunk(int64_t values, int members) {
  return members >= 1 && values > 0 ? (values + members - 1) / members : 0;
}
inline ValueRange owned_values(int64_t values, int members, int index) {
  const int64_t chunk = owned_chunk(values, members);
  const int64_t begin = std::min(values, chunk * index);
  return {begin, std::min(values, begin + chunk)};
}

// Bytes per value of the activations spindle-run keeps for backward and
// passes between operators, whatever the model's dtype: fp32 on both
// backends (docs/gpu.md). A plan counts them in the model's dtype, as a
// bf16 Megatron-LM run holds them; what spindle-run checks before it
// allocates (planner/feasibility.h, memory_as_run) counts them so.
inline constexpr int kRunActivationValueBytes = 4;
// Bytes per value of a transformer layer's internals in the CUDA backend's
// bf16 mode, its default (docs/gpu.md, "Precision"): what memory_as_run
// counts for GPUs (`layer_value_bytes`).
inline constexpr int kBf16LayerValueBytes = 2;

// Bytes one of `devices` devices keeps for backward for one operator that
// keeps `bytes_per_sample` per sample of a batch of `batch`.
inline double activation_bytes(double bytes_per_sample, int64_t batch, int devices) {
  return bytes_per_sample * static_cast<double>(batch) / devices;
}

// The same as spindle-run holds it (planner/feasibility.h, memory_as_run):
// one of `devices` devices, in groups of `tensor_parallel`, holds its
// data-parallel group's rows (batch x tensor_parallel / devices; the whole
// batch for an operator that needs it), of each `replicated` bytes whole
// and `split` bytes over the group's ranks (cost/analytic.h,
// RunActivation).
inline double run_activation_bytes(double replicated, double split, int64_t batch, int devices, int tensor_parallel,
                                   bool whole_batch) {
  const double k = std::max(tensor_parallel, 1);
  const double rows = whole_batch ? static_cast<double>(batch) : static_cast<double>(batch) * k / devices;
  return rows * (replicated + split / k);
}

}  // namespace spindle::plan
