// The documented limits on every input (docs/hardening.md, "Limits"), in one
// place, with the checked arithmetic they make safe.
//
// Readers reject a value outside these bounds with an Error naming the file
// and key, before anything is allocated or recursed over. The bounds are
// chosen so that every sum and product the planner forms from accepted
// inputs stays finite in double and in range in int64_t:
//   - a time is at most kMaxMs, a byte figure at most kMaxBytes (2^53, so
//     integer byte counts are exact in double), a device count at most
//     kMaxDevices, an operator count at most kMaxOperators;
//   - so a plan's sum of times is below kMaxOperators * kMaxMs = 2e14 ms and
//     a device's memory below about 2^53 * 2e5 * 10^9 (batch) ~ 2e30 bytes,
//     finite in double; bytes_to_int64 saturates the conversion to int64_t
//     (a figure that large is infeasible on any device and reported so).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace spindle::plan::limits {

// Input documents.
inline constexpr int64_t kMaxYamlBytes = int64_t{4} << 20;    // model, cluster: 4 MiB
inline constexpr int64_t kMaxJsonBytes = int64_t{64} << 20;   // profile, plan: 64 MiB
inline constexpr int kMaxNestingDepth = 64;                   // arrays/objects, sequences/maps

// Models.
inline constexpr int64_t kMaxOperators = 200000;   // operators of the expanded model (repeat included)
inline constexpr int64_t kMaxSize = 1000000000;    // an integer dimension, seq, batch (10^9)
inline constexpr double kMinTemperature = 1e-4;    // contrastive_loss temperature
inline constexpr double kMaxTemperature = 1e4;
// A task's loss weight: a normal float (the runtime weighs in float), so
// that it neither rounds to 0 nor is inf there. A weight that large still
// makes the training diverge, which the runtime stops at that step.
inline constexpr double kMinLossWeight = 1e-30;
inline constexpr double kMaxLossWeight = 1e38;

// Planning: MetaOps x devices of one plan (the scheduler keeps a time per
// MetaOp and device count; placement, lowering and simulation work per
// device). 2^23: multitask-clip-10 (70 MetaOps) on 120 islands of 1000
// took 16 s and 1.5 GB, tiny-clip (21) on 399 of 1000 19 s and 2.4 GB
// (2026-12-07); at 2^26, 240 s and 9.4 GB.
inline constexpr int64_t kMaxMetaOpDevices = int64_t{1} << 23;
// Planning: MetaOps x operators / devices (MetaOps times a lower bound on the
// waves: the scheduler's work), about 10 s of planning at the limit.
inline constexpr int64_t kMaxScheduleWork = 50000000;

// Clusters, profiles and plans.
inline constexpr int64_t kMaxDevices = 1000000;                 // devices of a cluster or plan
inline constexpr double kMaxMs = 1e9;                          // one profiled operator time (11.6 days)
inline constexpr int64_t kMaxBytes = int64_t{1} << 53;         // one byte figure of a profile entry
inline constexpr double kMinRate = 1e-3;                       // smallest TFLOP/s or GB/s figure
inline constexpr double kMaxRate = 1e9;                        // largest TFLOP/s or GB/s figure
inline constexpr double kMaxLatencyUs = 1e9;                   // largest link latency (us)

// `v` as a byte count in int64_t: saturates at the int64_t range (NaN gives
// the maximum, so a broken figure is never mistaken for a small one).
inline int64_t bytes_to_int64(double v) {
  constexpr double kTop = 9223372036854774784.0;  // largest double below 2^63
  if (!(v < kTop)) return std::numeric_limits<int64_t>::max();
  if (v <= 0) return 0;
  return static_cast<int64_t>(v);
}

}  // namespace spindle::plan::limits
