// Time to move bytes over the cluster's links (docs/spec/cluster.md), in
// milliseconds. The planner's cost model, the simulator and the analytic
// profiler price every message with these functions.
#pragma once

#include <vector>

namespace spindle::plan {

// Bytes per value that spindle-run moves between devices: activations, their
// gradients and parameter gradients cross every boundary in fp32, whatever
// the model dtype (kernels may compute in bf16 inside an operator). The
// lowering's byte counts and every estimate of them (placement) use it.
inline constexpr int kWireBytesPerValue = 4;

struct Link {
  double gbytes_per_s = 0;   // per direction (per device inside an island, per island across)
  double latency_us = 0;
};

// One message of `bytes` over `link`: latency + bytes / bandwidth, ms.
double link_ms(const Link& link, double bytes);

// Ring all-reduce of `bytes` over `devices` (sorted device ids, islands of
// `devices_per_island`): 2 (p-1)/p * bytes / bandwidth + 2 (p-1) * latency
// over the intra-island link when every device is on one island, else over
// the inter-island link (the slowest link decides). 0 for p <= 1.
double ring_allreduce_ms(const Link& intra_island, const Link& inter_island, int devices_per_island,
                         double bytes, const std::vector<int>& devices);

}  // namespace spindle::plan
