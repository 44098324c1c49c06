// Time to move bytes over the cluster's links (docs/spec/cluster.md), in
// milliseconds. The planner's cost model, the simulator and the analytic
// profiler price every message with these functions.
#pragma once

#include <optional>
#include <vector>

namespace spindle::plan {

// Bytes per value that spindle-run moves between devices: activations, their
// gradients and parameter gradients cross every boundary in fp32, whatever
// the model dtype (kernels may compute in bf16 inside an operator). The
// lowering's byte counts and every estimate of them (placement) use it.
inline constexpr int kWireBytesPerValue = 4;

// Islands are runs of `devices_per_island` consecutive device ids
// (docs/spec/cluster.md); a figure below 1 counts as 1.
inline int island_of(int device, int devices_per_island) {
  return device / (devices_per_island > 1 ? devices_per_island : 1);
}
// Islands that `devices` devices span (the last may be partial).
inline int island_count(int devices, int devices_per_island) {
  const int k = devices_per_island > 1 ? devices_per_island : 1;
  return (devices + k - 1) / k;
}

// The one of `count` replicas at `replicas` (count >= 1) that device `d`
// takes a copy from: `d` itself when it is one, else the first on d's
// island, else the first. Re-sharding (rules/rows.h) and the
// tensor-parallel copies (lower.cpp, lower_copies) both follow it.
inline int nearest_replica(const int* replicas, int count, int d, int devices_per_island) {
  for (int r = 0; r < count; ++r)
    if (replicas[r] == d) return d;
  for (int r = 0; r < count; ++r)
    if (island_of(replicas[r], devices_per_island) == island_of(d, devices_per_island)) return replicas[r];
  return replicas[0];
}

struct Link {
  double gbytes_per_s = 0;   // per direction (per device inside an island, per island across)
  double latency_us = 0;
};

// One message of `bytes` over `link`: latency + bytes / bandwidth, ms.
double link_ms(const Link& link, double bytes);

// The bytes each of `p` members sends (and receives) in a ring all-reduce
// of `bytes`: 2 (p-1)/p * bytes (a reduce-scatter, then an all-gather);
// 0 for p <= 1. What the ring formula below divides by the bandwidth; the
// lowering orders buckets by it, the profiler fits links with it.
inline double ring_allreduce_bytes(double bytes, int p) {
  return p > 1 ? 2.0 * (p - 1.0) / p * bytes : 0.0;
}

// Ring all-reduce of `bytes` over `devices` (sorted device ids, islands of
// `devices_per_island`): 2 (p-1)/p * bytes / bandwidth + 2 (p-1) * latency
// over the intra-island link when every device is on one island, else over
// the inter-island link (the slowest link decides). 0 for p <= 1.
double ring_allreduce_ms(const Link& intra_island, const Link& inter_island, int devices_per_island,
                         double bytes, const std::vector<int>& devices);

// Ring all-gather (or reduce-scatter) of `bytes` in all, bytes / p from
// each of `devices` (sorted device ids, islands of `devices_per_island`):
// (p-1)/p * bytes / bandwidth + (p-1) * latency over the link
// ring_allreduce_ms would use. 0 for p <= 1.
double ring_allgather_ms(const Link& intra_island, const Link& inter_island, int devices_per_island,
                         double bytes, const std::vector<int>& devices);

// Devices 0 .. n-1: the group a profile point's collectives run over (a
// block from an island's start, as placement packs slices).
std::vector<int> first_devices(int n);

// The runtime's software cost around the wire (docs/simulation.md,
// "Software overhead"), on the device that runs the exchange or all-reduce.
// Every figure >= 0; a zero figure (the default) prices nothing, so a
// CommOverhead{} leaves every time as the link formulas above give it.
struct CommOverhead {
  double exchange_us = 0;        // per exchange instruction that moves at least one message, per device:
                                 // posting and completing the exchange call, bookkeeping
  double message_us = 0;         // per message the device sends or receives in an exchange
  double pack_gbytes_per_s = 0;  // rate of the host or device copies around the wire: the rows a
                                 // device sends are packed once, the rows it receives unpacked once,
                                 // an all-gather's values packed and unpacked (0: copies are free)
  double allreduce_us = 0;       // per all-reduce call, beyond the ring formula's latency terms
  // Measured on a host backend only (spindle-profile --measure, the
  // executor's own instructions; 0 in analytic profiles, where a device
  // backend's host runs ahead of its kernels and a local piece is a view):
  double instruction_us = 0;     // per exchange, post_send, post_recv and wait_sends instruction of a
                                 // device, whatever it moves: the executor's bookkeeping around it
  double accumulate_gbytes_per_s = 0;  // rate at which a backward exchange adds each gradient piece it
                                       // gets, local or received, into its producer's output gradient
                                       // (a zeroed buffer, then an add; 0: free)
  // ZeRO-1's collectives as the executor runs them (fitted from its own
  // buckets, host backends only), per call beyond the ring formula's
  // latency terms and the copies, >= 0. Absent (analytic profiles, files
  // written before them): allreduce_us.
  std::optional<double> reduce_scatter_us;
  std::optional<double> allgather_us;
  bool any() const {
    return exchange_us > 0 || message_us > 0 || pack_gbytes_per_s > 0 || allreduce_us > 0 || instruction_us > 0 ||
           accumulate_gbytes_per_s > 0 || reduce_scatter_us.value_or(0) > 0 || allgather_us.value_or(0) > 0;
  }
};

// A bucket's collective: the gradient all-reduce (optimizer state
// replicated), or ZeRO-1's reduce-scatter of the gradients and all-gather
// of the stepped values.
enum class Collective { allreduce, reduce_scatter, allgather };

// Time to copy `bytes` once at `o.pack_gbytes_per_s`, ms (0 when the rate is 0).
double pack_ms(const CommOverhead& o, double bytes);
// Software time of one exchange (or post_send) on one device before its
// messages leave, ms: instruction_us, plus, when `messages` (the messages it
// sends and receives) is not 0, exchange_us + messages x message_us +
// pack_ms(sent_bytes). After its last message arrives it spends
// pack_ms(received_bytes) unpacking and, in a backward exchange,
// accumulate_ms of every piece it gets.
double exchange_overhead_ms(const CommOverhead& o, int messages, double sent_bytes);
// The executor's bookkeeping of one exchange, post_send, post_recv or
// wait_sends instruction, ms: instruction_us.
double instruction_ms(const CommOverhead& o);
// Time to add `bytes` of gradient pieces into output gradients at
// `o.accumulate_gbytes_per_s`, ms (0 when the rate is 0).
double accumulate_ms(const CommOverhead& o, double bytes);
// Software time of collective `c` of a bucket of `bytes` on each device of
// its group, ms: its fixed cost per call (allreduce_us, reduce_scatter_us
// or allgather_us, the last two allreduce_us when absent), and for the
// all-gather 2 pack_ms(bytes) (the owned values packed, the gathered ones
// copied into the tensors). The all-reduce and reduce-scatter copy
// nothing: the gradients are views of the bucket's flat buffer on the host
// and over NCCL (Executor::bind_bucket_views; a device backend over MPI,
// which stages the buffer in host memory, copies unpriced). Added to the
// ring formula for p >= 2.
double collective_overhead_ms(const CommOverhead& o, Collective c, double bytes);

}  // namespace spindle::plan
