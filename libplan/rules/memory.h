// Per-device memory (docs/planner.md, "Memory"): the bytes a device holds
// for the parameters it runs and the activations it keeps for backward. The
// costing, the placement search and the checker's figures all use these.
#pragma once

#include <cstdint>

namespace spindle::plan {

// Bytes one device holds for one parameter shard of `shard_bytes` bytes in
// the model dtype (`dtype_bytes` per value) held by `replicas` data-parallel
// replicas (>= 1): weights and gradients in the model dtype, plus the fp32
// master copy (when the dtype is narrower than fp32) and AdamW's m and v,
// sharded over the replicas as Megatron's distributed optimizer (ZeRO
// stage 1) does.
inline double param_state_bytes(double shard_bytes, int dtype_bytes, double replicas) {
  const double replicated_per_value = 2.0 * dtype_bytes;
  const double optimizer_per_value = 8.0 + (dtype_bytes < 4 ? 4.0 : 0.0);
  return shard_bytes / dtype_bytes * (replicated_per_value + optimizer_per_value / replicas);
}

// Data-parallel replicas of a parameter held by `devices` devices at
// tensor-parallel degree `tensor_parallel` (at least 1).
inline double param_replicas(int devices, int tensor_parallel) {
  const double r = static_cast<double>(devices) / tensor_parallel;
  return r > 1.0 ? r : 1.0;
}

// Bytes one of `devices` devices keeps for backward for one operator that
// keeps `bytes_per_sample` per sample of a batch of `batch`.
inline double activation_bytes(double bytes_per_sample, int64_t batch, int devices) {
  return bytes_per_sample * static_cast<double>(batch) / devices;
}

}  // namespace spindle::plan
