#include "libplan/rules/links.h"

#include <cstddef>
#include <numeric>

namespace spindle::plan {

double link_ms(const Link& link, double bytes) {
  return link.latency_us / 1000.0 + bytes / (link.gbytes_per_s * 1e9) * 1000.0;
}

namespace {

// The link a ring over `devices` runs at: the intra-island one when every
// device is on one island, else the inter-island one (the slowest decides).
const Link& ring_link(const Link& intra_island, const Link& inter_island, int devices_per_island,
                      const std::vector<int>& devices) {
  const int island = island_of(devices.front(), devices_per_island);
  for (int d : devices)
    if (island_of(d, devices_per_island) != island) return inter_island;
  return intra_island;
}

}  // namespace

double ring_allreduce_ms(const Link& intra_island, const Link& inter_island, int devices_per_island,
                         double bytes, const std::vector<int>& devices) {
  const size_t p = devices.size();
  if (p <= 1) return 0.0;
  const Link& link = ring_link(intra_island, inter_island, devices_per_island, devices);
  const double steps = double(p - 1);
  const double transfer_ms = ring_allreduce_bytes(bytes, static_cast<int>(p)) / (link.gbytes_per_s * 1e9) * 1e3;
  const double latency_ms = 2.0 * steps * link.latency_us * 1e-3;
  return transfer_ms + latency_ms;
}

double ring_allgather_ms(const Link& intra_island, const Link& inter_island, int devices_per_island,
                         double bytes, const std::vector<int>& devices) {
  const size_t p = devices.size();
  if (p <= 1) return 0.0;
  const Link& link = ring_link(intra_island, inter_island, devices_per_island, devices);
  const double n = double(p);
  return (n - 1.0) / n * bytes / (link.gbytes_per_s * 1e9) * 1e3 + (n - 1.0) * link.latency_us * 1e-3;
}

std::vector<int> first_devices(int n) {
  std::vector<int> v(static_cast<size_t>(n > 0 ? n : 0));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

double pack_ms(const CommOverhead& o, double bytes) {
  return o.pack_gbytes_per_s > 0 ? bytes / (o.pack_gbytes_per_s * 1e9) * 1e3 : 0.0;
}

double instruction_ms(const CommOverhead& o) { return o.instruction_us * 1e-3; }

double exchange_overhead_ms(const CommOverhead& o, int messages, double sent_bytes) {
  if (messages <= 0) return instruction_ms(o);
  return instruction_ms(o) + (o.exchange_us + messages * o.message_us) * 1e-3 + pack_ms(o, sent_bytes);
}

double accumulate_ms(const CommOverhead& o, double bytes) {
  return o.accumulate_gbytes_per_s > 0 ? bytes / (o.accumulate_gbytes_per_s * 1e9) * 1e3 : 0.0;
}

double collective_overhead_ms(const CommOverhead& o, Collective c, double bytes) {
  const double fixed_us = c == Collective::reduce_scatter ? o.reduce_scatter_us.value_or(o.allreduce_us)
                          : c == Collective::allgather    ? o.allgather_us.value_or(o.allreduce_us)
                                                          : o.allreduce_us;
  // The gradients are views of their bucket's flat buffer (the host, and
  // device memory over NCCL): the all-reduce and the reduce-scatter copy
  // nothing; the all-gather packs the owned values and copies the gathered
  // ones into the tensors.
  return fixed_us * 1e-3 + (c == Collective::allgather ? 2.0 * pack_ms(o, bytes) : 0.0);
}

}  // namespace spindle::plan
