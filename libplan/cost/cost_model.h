// The planner's one cost interface (docs/architecture.md, convention 2). The allocator,
// scheduler and placer ask it for an operator's scaling curve and for the
// time of moving bytes; they never read profiles or clusters themselves.
//
// Implementations: TableCostModel (curves and links given directly, for
// tests) and ProfileCostModel (the same table, filled from a profile
// database; links from a cluster).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "libplan/cost/curve.h"
#include "libplan/graph/op_graph.h"
#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/rules/links.h"
#include "libplan/util/status.h"

namespace spindle::plan {

class CostModel {
 public:
  virtual ~CostModel() = default;

  // Scaling curve of one operator of workload `w` (time of ONE operator, ms,
  // on n devices in data parallel). nullptr when the model has no data for w.
  virtual const ScalingCurve* curve(const Workload& w) const = 0;

  // Parameter bytes of one operator of `w` (model dtype), and activation
  // bytes it keeps for backward per sample.
  virtual int64_t param_bytes(const Workload& w) const = 0;
  virtual int64_t activation_bytes_per_sample(const Workload& w) const = 0;

  // Point-to-point: time to move `bytes` from one device to another, ms.
  virtual double p2p_ms(double bytes, bool cross_island) const = 0;
  // Ring all-reduce of `bytes` over `devices` (sorted device ids), ms:
  // 2 (p-1)/p * bytes / bw + 2 (p-1) * latency, slowest link deciding, plus
  // the call's software overhead collective_overhead_ms(overhead(),
  // Collective::allreduce, bytes) (rules/links.h); 0 for p <= 1.
  virtual double allreduce_ms(double bytes, const std::vector<int>& devices) const = 0;
  // Time of a ring all-gather that leaves `bytes` in all (every member's
  // chunk, padding included) on each of `devices`, ms: (p-1)/p * bytes / bw
  // + (p-1) * latency, slowest link deciding, plus the call's software
  // overhead collective_overhead_ms(overhead(), Collective::allgather,
  // bytes); 0 for p <= 1. ZeRO-1 gathers a bucket's stepped values so.
  virtual double allgather_ms(double bytes, const std::vector<int>& devices) const = 0;
  // Time of a ring reduce-scatter of `bytes` in all (every member's block)
  // over `devices`, ms: a ring reduce-scatter moves what a ring all-gather
  // moves, with its own software overhead (Collective::reduce_scatter).
  // ZeRO-1 sums a bucket's gradients so.
  virtual double reduce_scatter_ms(double bytes, const std::vector<int>& devices) const {
    return allgather_ms(bytes, devices);
  }
  // The runtime's software cost around messages and all-reduces
  // (rules/links.h); all zero unless the profile carries figures.
  virtual CommOverhead overhead() const { return {}; }
  // Time of one device's optimizer step over `values` parameter values, ms
  // (rules/memory.h's optimizer_ms at the profile's "x-optimizer" rate); 0
  // when the profile does not carry one.
  virtual double optimizer_ms(int64_t /*values*/) const { return 0; }
  // Time of one device's norm_sum over `values` gradient values, ms
  // (rules/memory.h's norm_sum_ms at the same rate); 0 without one.
  virtual double norm_sum_ms(int64_t /*values*/) const { return 0; }
  // Whether a started all-reduce moves only while every member of its group
  // is inside a communication call or polls between instructions (MPI, as
  // spindle-run runs it on CPUs: a profile's x-links "progress": "calls"),
  // rather than beside the compute (NCCL on its own stream; analytic
  // profiles). docs/simulation.md.
  virtual bool allreduce_progress_in_calls() const { return false; }
  // Share of one operator's time (curve) spent in its forward, in [0, 1],
  // as measured (a profile's "x-forward_share"); -1 when not known (the
  // simulation then takes SimOptions::forward_share). has_forward_shares:
  // whether any workload has one (false: no caller need ask).
  virtual double forward_share(const Workload& /*w*/) const { return -1; }
  virtual bool has_forward_shares() const { return false; }
};

// Ring all-reduce and all-gather costs of spec/cluster.md (rules/links.h)
// over the given cluster's links.
double ring_allreduce_ms(const Cluster& cluster, double bytes, const std::vector<int>& devices);
double ring_allgather_ms(const Cluster& cluster, double bytes, const std::vector<int>& devices);

// Curves and sizes looked up by workload, links from a Cluster. Filled by
// hand in tests (set), or from a profile by ProfileCostModel::create.
class TableCostModel : public CostModel {
 public:
  explicit TableCostModel(Cluster cluster) : cluster_(cluster), allreduce_cluster_(std::move(cluster)) {}
  void set(const Workload& w, ScalingCurve curve, int64_t param_bytes = 0,
           int64_t activation_bytes_per_sample = 0);
  // The forward's share of w's time (after set(w, ...)), in [0, 1].
  void set_forward_share(const Workload& w, double share);
  // Uses measured link figures (a profile's "x-links") in place of the
  // cluster's: p2p_ms takes the p2p fits, allreduce_ms the all-reduce fits;
  // links not measured (gbytes_per_s == 0) keep the cluster's figures; and
  // how a started all-reduce progresses (ProfileLinks::progress_in_calls).
  void use_measured_links(const ProfileLinks& links);
  // Prices the runtime's software overhead (a profile's "comm_overhead").
  void set_overhead(const CommOverhead& overhead) { overhead_ = overhead; }
  CommOverhead overhead() const override { return overhead_; }
  // Prices the optimizer step at `gbytes_per_s` (a profile's "x-optimizer").
  void set_optimizer_rate(double gbytes_per_s) { optimizer_gbytes_per_s_ = gbytes_per_s; }
  double optimizer_ms(int64_t values) const override;
  double norm_sum_ms(int64_t values) const override;
  bool allreduce_progress_in_calls() const override { return progress_in_calls_; }
  const ScalingCurve* curve(const Workload& w) const override;
  int64_t param_bytes(const Workload& w) const override;
  int64_t activation_bytes_per_sample(const Workload& w) const override;
  double forward_share(const Workload& w) const override;
  bool has_forward_shares() const override { return forward_shares_ > 0; }
  double p2p_ms(double bytes, bool cross_island) const override;
  double allreduce_ms(double bytes, const std::vector<int>& devices) const override;
  double allgather_ms(double bytes, const std::vector<int>& devices) const override;
  double reduce_scatter_ms(double bytes, const std::vector<int>& devices) const override;

 protected:
  // A bucket's collective `c` over `devices`, ms: the ring formula plus
  // collective_overhead_ms; 0 for p <= 1.
  double collective_ms(Collective c, double bytes, const std::vector<int>& devices) const;
  struct Entry {
    ScalingCurve curve;
    int64_t param_bytes = 0;
    int64_t activation_bytes_per_sample = 0;
    double forward_share = -1;   // -1: not known
  };
  // By Workload::key(), for callers that already hold the key (set() and
  // the lookups compute it).
  bool has_entry(const std::string& key) const { return entries_.count(key) != 0; }
  void set_entry(const std::string& key, Entry entry) {
    if (auto it = entries_.find(key); it != entries_.end() && it->second.forward_share >= 0) --forward_shares_;
    if (entry.forward_share >= 0) ++forward_shares_;
    entries_[key] = std::move(entry);
  }

 private:
  std::map<std::string, Entry> entries_;   // by Workload::key()
  Cluster cluster_;             // links for p2p_ms
  Cluster allreduce_cluster_;   // links for allreduce_ms (differ only when measured)
  CommOverhead overhead_;       // zero unless set
  double optimizer_gbytes_per_s_ = 0;   // 0: the optimizer step is not priced
  bool progress_in_calls_ = false;      // set by use_measured_links
  int forward_shares_ = 0;      // entries with a forward share
};

// Backed by a profile database and a cluster. create() fits every curve
// once and fails, naming the profile file and the workload, when an operator
// of `graph` has no entry.
class ProfileCostModel final : public TableCostModel {
 public:
  static Result<std::unique_ptr<ProfileCostModel>> create(const Profile& profile,
                                                          const Cluster& cluster,
                                                          const OpGraph& graph);

 private:
  using TableCostModel::TableCostModel;
};

}  // namespace spindle::plan
