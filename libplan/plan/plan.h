// The wave plan (spec/plan.md): the data every strategy produces and
// spindle-run executes. Reader, writer and checker live beside it
// (plan_io.h, check.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libplan/graph/op_graph.h"
#include "libplan/rules/memory.h"

namespace spindle::plan {

inline constexpr int kPlanVersion = 1;

struct PlanMetaOp {
  int id = 0;
  std::string task;                    // task name
  Workload workload;                   // op, dims, seq, batch
  int tensor_parallel = 1;             // of the module (extension key)
  std::vector<std::string> operators;  // operator ids "T/N/k.r", in chain order
  int level = 0;                       // MetaLevel, > level of every input
  std::vector<int> inputs;             // MetaOp ids, ascending
};

struct Slice {
  int metaop = 0;
  int first = 0;                       // position in the MetaOp's operators
  int count = 0;
  std::vector<int> devices;            // ascending device ids
  double ms = 0;                       // predicted compute time of the slice
};

struct Wave {
  int index = 0;
  double ms = 0;                       // longest slice
  double transfer_ms = 0;              // inter-wave transfers feeding this wave
  std::vector<Slice> slices;           // ordered by metaop id
};

struct ParamGroup {
  std::string param;                   // "M/k.r"
  std::vector<int> devices;            // ascending
};

struct Predicted {
  double iteration_ms = 0;             // compute + transfer + sync
  double compute_ms = 0;               // sum of wave.ms
  double transfer_ms = 0;              // sum of wave.transfer_ms
  double sync_ms = 0;                  // gradient all-reduce
  double relaxed_optimum_ms = 0;       // sum over levels of C*
  std::vector<int64_t> memory_bytes;   // peak estimate per device
  // Makespan of the simulated lowered programs (libplan/sim: no wave
  // barriers, what spindle-run executes): the planner's objective. 0 when
  // the plan was not simulated (a plan file without the field).
  double simulated_ms = 0;
};

// When a device starts the all-reduce of a gradient bucket during the
// backward pass (docs/lowering.md, "Bucket starts"). in_order: in the one
// global bucket order, so a bucket ready early waits for the ones before
// it (PyTorch DDP's rule). when_ready: as soon as its gradients on the
// device are final, keeping the global order only among the buckets of one
// device group (they share a communicator, whose collectives every member
// must start in one order). The planner keeps whichever simulates faster;
// the plan file says which as "x-lowering": {"bucket_starts": "when-ready"}
// (absent: in-order), so spindle-run lowers the same programs.
enum class BucketStarts { in_order, when_ready };
// Gradient buckets (GradSync::bucket_bytes, lower.h): --bucket-mb's default
// (PyTorch DDP's bucket_cap_mb default, 25 MiB) and range, in MiB and in
// the bytes bucket_bytes_of_mb makes of them.
inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;
inline constexpr double kMinBucketMb = 0.001, kMaxBucketMb = 1 << 20;
inline constexpr int64_t kMinBucketBytes = static_cast<int64_t>(kMinBucketMb * (1 << 20));   // 1048
inline constexpr int64_t kMaxBucketBytes = int64_t{1} << 40;
// When, with sharded optimizer state (ZeRO-1) and overlap, each bucket's
// members all-gather the values they stepped (docs/lowering.md, "Sharded
// optimizer state"). next_step: started as the next step opens, each
// waited for right before the first forward that needs it (Megatron's
// overlap_param_gather); after_step: blocking, right after the bucket's
// optimizer step. The planner searches with after_step and then keeps
// whichever simulates faster; the plan file says which as "x-lowering":
// {"param_gather": "next-step"} (absent: after-step, as plans made before
// the choice lower). Without overlap the gathers always follow the step.
enum class ParamGather { after_step, next_step };
// The other rule.
inline BucketStarts other_rule(BucketStarts s) {
  return s == BucketStarts::in_order ? BucketStarts::when_ready : BucketStarts::in_order;
}

struct Plan {
  std::string strategy = "spindle";
  std::string model_name;
  std::string model_sha256;
  std::string cluster_name;
  int devices = 0;
  int devices_per_island = 0;
  int64_t memory_bytes = 0;            // per device
  std::string profile_sha256;          // "" for an in-memory analytic profile
  std::vector<PlanMetaOp> metaops;     // id == index
  std::vector<Wave> waves;             // execution order, index == position
  std::vector<ParamGroup> param_groups;  // sorted by param
  Predicted predicted;
  BucketStarts bucket_starts = BucketStarts::in_order;
  // Transfers posted early (docs/lowering.md): each device sends rows as
  // soon as it has computed them and posts its receives one exchange
  // ahead; false keeps every transfer in its wave's exchange. The planner
  // keeps whichever simulates faster (false also when asked for
  // --no-early-transfers); written as "x-lowering": {"early_transfers":
  // false} (absent: true), so spindle-run lowers the same programs.
  bool early_transfers = true;
  ParamGather param_gather = ParamGather::after_step;
  // How the plan was made to synchronise gradients (GradSync, lower.h:
  // spindle-plan --no-overlap and --bucket-mb): written as "x-lowering":
  // {"overlap": false} and {"bucket_bytes": N} when not the defaults, so
  // that spindle-run, given neither flag, lowers the programs the planner
  // simulated (planned_sync).
  bool overlap = true;
  int64_t bucket_bytes = kDefaultBucketBytes;
  // The programs compute the global gradient norm before the optimizer
  // (GradSync::grad_norm; spindle-plan --grad-norm, for runs with
  // spindle-run --clip-grad): written as "x-lowering": {"grad_norm": true}.
  bool grad_norm = false;
  // How predicted.memory_bytes counts the optimizer state (rules/memory.h;
  // spindle-plan --optimizer-state): written as "x-memory":
  // {"optimizer_state": "replicated"} when not the default, sharded.
  OptimizerState optimizer_state = OptimizerState::sharded;
  double planning_ms = 0;              // not serialised (keeps bytes deterministic)
  // Not serialised: why --optimizer-state auto (PlanRequest::
  // choose_optimizer_state) sharded the state; none when it did not.
  // does_not_fit: replicated, over the plan's own count (rule 6);
  // does_not_fit_as_run: within it, but over what spindle-run holds on GPUs
  // (memory_as_run).
  enum class ShardedBecause { none, does_not_fit, does_not_fit_as_run, faster } sharded_because = ShardedBecause::none;
  double replicated_ms = 0;            // with `faster`: the plan's simulation with the state replicated
  // Not serialised: with PlanRequest::fewer_islands, the shares of the
  // cluster Spindle planned on (its own islands, then halves: islands, the
  // plan's simulated makespan at its best bucket cap, ms), in the order
  // planned; empty when it planned on the cluster's own islands alone.
  struct Share {
    int islands = 0;
    double ms = 0;
  };
  std::vector<Share> shares_planned;
  // Not serialised: set when Spindle's own schedules did not fit the
  // devices' memory and a baseline's schedule that fits was planned
  // instead (make_plan): that baseline, and the peak bytes of a device
  // under Spindle's fastest own plan.
  struct FittedFrom {
    std::string strategy;
    int64_t own_peak_bytes = 0;
  };
  std::optional<FittedFrom> fitted_from;
};

}  // namespace spindle::plan
