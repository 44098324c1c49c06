#include "libplan/lower/lower.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "libplan/model/ops.h"
#include "libplan/rules/devices.h"
#include "libplan/rules/links.h"

namespace spindle::plan {

namespace {

// The slices of the plan with their graph operators, devices, layouts and
// producers; checks that the plan names the model's operators.
Status lower_slices(const Plan& plan, const LowerContext& ctx, Lowered& out) {
  const OpGraph& graph = *ctx.graph;
  // What errors name (made only for one).
  auto where = [&] { return plan.model_name.empty() ? std::string("plan") : "plan for " + plan.model_name; };
  // Graph operator named `id`, -1 when none. A MetaOp's operators are
  // usually consecutive in the graph: the one after `prev` is tried first.
  auto find_op = [&](const std::string& id, int prev) {
    const auto next = static_cast<size_t>(prev + 1);
    if (prev >= 0 && next < graph.ops.size() && graph.ops[next].id == id) return static_cast<int>(next);
    const auto it = ctx.op_index.find(id);
    return it == ctx.op_index.end() ? -1 : it->second;
  };
  out.slice_of.assign(graph.ops.size(), -1);
  size_t slices = 0;
  for (const Wave& wave : plan.waves) slices += wave.slices.size();
  out.slices.reserve(slices);
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const Wave& wave = plan.waves[w];
    if (wave.index != static_cast<int>(w))
      return Error{where() + ": waves[" + std::to_string(w) + "].index is " + std::to_string(wave.index)};
    for (size_t k = 0; k < wave.slices.size(); ++k) {
      const Slice& s = wave.slices[k];
      auto sh = [&] {
        return where() + ": waves[" + std::to_string(wave.index) + "].slices[" + std::to_string(k) + "]";
      };
      if (s.metaop < 0 || s.metaop >= static_cast<int>(plan.metaops.size()))
        return Error{sh() + " names unknown MetaOp " + std::to_string(s.metaop)};
      const PlanMetaOp& m = plan.metaops[static_cast<size_t>(s.metaop)];
      if (s.count < 1 || s.first < 0 || s.first + s.count > static_cast<int>(m.operators.size()))
        return Error{sh() + ": operators " + std::to_string(s.first) + " + " + std::to_string(s.count) +
                     " outside MetaOp " + std::to_string(s.metaop)};
      LoweredSlice info;
      info.wave = wave.index;
      info.metaop = s.metaop;
      info.devices = s.devices;
      std::sort(info.devices.begin(), info.devices.end());
      for (int d : info.devices)
        if (d < 0 || d >= plan.devices) return Error{sh() + ": device " + std::to_string(d) + " outside the plan"};
      info.ops.reserve(static_cast<size_t>(s.count));
      for (int j = s.first, prev = -1; j < s.first + s.count; ++j) {
        prev = find_op(m.operators[static_cast<size_t>(j)], prev);
        if (prev < 0) return Error{sh() + " names unknown operator " + m.operators[static_cast<size_t>(j)]};
        info.ops.push_back(prev);
      }
      const Operator& first = graph.ops[static_cast<size_t>(info.ops[0])];
      info.layout = {first.workload.batch, static_cast<int>(info.devices.size()), first.tensor_parallel};
      if (!valid_device_count(info.layout.devices, info.layout.tp, info.layout.batch))
        return Error{sh() + ": " + std::to_string(info.layout.devices) + " devices do not split batch " +
                     std::to_string(info.layout.batch) + " with tensor_parallel " + std::to_string(info.layout.tp)};
      info.producers = ctx.producers[static_cast<size_t>(info.ops[0])];
      const int index = static_cast<int>(out.slices.size());
      for (int o : info.ops) out.slice_of[static_cast<size_t>(o)] = index;
      out.slices.push_back(std::move(info));
    }
  }
  for (size_t o = 0; o < graph.ops.size(); ++o)
    if (out.slice_of[o] < 0) return Error{where() + ": operator " + graph.ops[o].id + " is in no slice"};
  return {};
}

// Every transfer: forward exchanges wave by wave, then backward exchanges
// from the last wave to the first; inside one, consumer slices in plan
// order, their inputs in order, the moves of rules/rows.h in order.
Status lower_transfers(const Plan& plan, const LowerContext& ctx, Lowered& out) {
  const OpGraph& graph = *ctx.graph;
  const int waves = static_cast<int>(plan.waves.size());
  // Made in slice order, then put in exchange order by a stable counting
  // sort on the exchange: forward of wave w is exchange w, backward of wave
  // w is exchange 2 waves - 1 - w. `made` is kept from one lowering to the
  // next on its thread (the planner lowers hundreds of candidates).
  thread_local std::vector<Transfer> made;
  made.clear();
  for (size_t si = 0; si < out.slices.size(); ++si) {
    const LoweredSlice& c = out.slices[si];
    for (size_t k = 0; k < c.producers.size(); ++k) {
      const int p = c.producers[k];
      const LoweredSlice& ps = out.slices[static_cast<size_t>(out.slice_of[static_cast<size_t>(p)])];
      const Operator& pop = graph.ops[static_cast<size_t>(p)];
      if (ps.wave >= c.wave)
        return Error{"plan: operator " + graph.ops[static_cast<size_t>(c.ops[0])].id + " runs no later than its input " +
                     pop.id};
      if (ps.layout.batch != c.layout.batch)
        return Error{"plan: operator " + graph.ops[static_cast<size_t>(c.ops[0])].id + " (batch " +
                     std::to_string(c.layout.batch) + ") reads " + pop.id + " (batch " +
                     std::to_string(ps.layout.batch) + ")"};
      const int64_t per_row = ctx.out_values_per_row[static_cast<size_t>(p)];
      auto make = [&](Direction dir, const RowMove& m) {
        Transfer t;
        t.dir = dir;
        t.wave = c.wave;
        t.slice = static_cast<int>(si);
        t.input = static_cast<int>(k);
        t.producer = p;
        t.src = m.src;
        t.dst = m.dst;
        t.rows = m.rows;
        t.values = m.rows.size() * per_row;
        t.bytes = m.src == m.dst ? 0 : t.values * kWireBytesPerValue;
        made.push_back(t);
      };
      for_each_reshard_move(ps.devices, ps.layout.tp, c.devices, c.layout.tp, c.layout.batch,
                            plan.devices_per_island, [&](const RowMove& m) { make(Direction::forward, m); });
      for_each_reshard_move(c.devices, c.layout.tp, ps.devices, ps.layout.tp, c.layout.batch,
                            plan.devices_per_island, [&](const RowMove& m) { make(Direction::backward, m); });
    }
  }
  auto exchange = [&](const Transfer& t) {
    return static_cast<size_t>(t.dir == Direction::forward ? t.wave : 2 * waves - 1 - t.wave);
  };
  std::vector<size_t> next(2 * static_cast<size_t>(waves) + 1, 0);
  for (const Transfer& t : made) ++next[exchange(t) + 1];
  for (size_t e = 1; e < next.size(); ++e) next[e] += next[e - 1];
  out.transfers.resize(made.size());
  for (const Transfer& t : made) out.transfers[next[exchange(t)]++] = t;
  return {};
}

// Orders the buckets so that all-reduces over disjoint groups overlap:
// list scheduling, largest estimated time first (the ring's traffic per
// device, rules/links.h ring_allreduce_bytes), each bucket starting when every device of its
// group is free; the buckets are then sorted by that start (ties: the
// earlier scheduled first). Every device runs its buckets in this one
// order, so blocking all-reduces cannot deadlock; ordered by device list
// instead, buckets over overlapping groups would wait for each other in a
// chain across the cluster.
void order_buckets(std::vector<Bucket>& buckets, int devices) {
  auto estimate = [](const Bucket& b) {
    return ring_allreduce_bytes(static_cast<double>(b.bytes), static_cast<int>(b.devices.size()));
  };
  std::vector<size_t> by_size(buckets.size());
  for (size_t i = 0; i < by_size.size(); ++i) by_size[i] = i;
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return estimate(buckets[a]) > estimate(buckets[b]); });
  std::vector<double> free_at(static_cast<size_t>(std::max(devices, 0)), 0.0);
  std::vector<std::pair<double, size_t>> start;  // (start, rank in by_size)
  for (size_t r = 0; r < by_size.size(); ++r) {
    const Bucket& b = buckets[by_size[r]];
    double t = 0;
    for (int d : b.devices) t = std::max(t, free_at[static_cast<size_t>(d)]);
    for (int d : b.devices) free_at[static_cast<size_t>(d)] = t + estimate(b);
    start.push_back({t, r});
  }
  std::sort(start.begin(), start.end());
  std::vector<Bucket> ordered;
  ordered.reserve(buckets.size());
  for (const auto& [t, r] : start) ordered.push_back(std::move(buckets[by_size[r]]));
  buckets = std::move(ordered);
}

// Sorted, without repeats.
std::vector<int> sorted_unique(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

ParamIds param_ids(const OpGraph& graph) {
  ParamIds ids;
  std::map<std::string, int> index;
  ids.of_op.reserve(graph.ops.size());
  for (const Operator& op : graph.ops) {
    if (op_param_count(op.workload.op, op.workload.dims, 1) == 0) {
      ids.of_op.push_back(-1);
      continue;
    }
    const auto [it, added] = index.emplace(op.param, static_cast<int>(ids.names.size()));
    if (added) ids.names.push_back(op.param);
    ids.of_op.push_back(it->second);
  }
  for (const auto& [name, id] : index) ids.sorted.push_back(id);
  return ids;
}

// Parameter shards, their holders and the gradient buckets.
// With `runtime_maps` false, shard_devices, param_tp, param_op and each
// bucket's shards stay empty (its params say the same).
// Cuts bucket `b` into pieces of at most `cap` bytes (a larger shard alone),
// its shards in the order their gradients become final: latest first wave
// first (the backward pass runs the waves backwards), then key order.
// `first_wave` and `shard_values` (one shard's values) by param id.
void split_bucket(Bucket b, const std::vector<int>& first_wave, const std::vector<int64_t>& shard_values, int64_t cap,
                  std::vector<Bucket>& out) {
  const std::vector<int>& param_of = b.params;
  std::vector<size_t> order(param_of.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return first_wave[static_cast<size_t>(param_of[x])] > first_wave[static_cast<size_t>(param_of[y])];
  });
  Bucket piece;
  auto close = [&] {
    if (piece.params.empty()) return;
    piece.devices = b.devices;
    piece.bytes = piece.values * kWireBytesPerValue;
    out.push_back(std::move(piece));
    piece = Bucket{};
  };
  for (size_t i : order) {
    const int p = param_of[i];
    const int64_t values = shard_values[static_cast<size_t>(p)];
    if (!piece.params.empty() && (piece.values + values) * kWireBytesPerValue > cap) close();
    piece.first_wave = first_wave[static_cast<size_t>(p)];   // non-increasing: the piece's earliest
    if (!b.shards.empty()) piece.shards.push_back(std::move(b.shards[i]));
    piece.params.push_back(p);
    piece.ranks.push_back(b.ranks[i]);
    piece.values += values;
  }
  close();
}

// lower_shards' working memory: one per thread, reused from one lowering to
// the next (the planner lowers hundreds of candidates), so that a lowering
// allocates only its results. Every list is cleared before it is used.
struct ShardScratch {
  std::vector<std::vector<int>> users;    // by param: the slices using it, ascending, each once
  std::vector<int> first_op;              // by param: its first operator, in slice order; -1: unused
  std::vector<std::vector<int>> by_rank;  // one param's holders by tensor-parallel rank
  std::vector<char> marked;               // by device: holders_by_rank's scratch, all 0 between calls
  // Every shard with two holders or more, in key order (param name, then
  // rank), its holders pool[begin, end).
  struct Reduced {
    size_t begin = 0, end = 0;
    int param = 0, rank = 0;
  };
  std::vector<int> pool;
  std::vector<Reduced> reduced;
  std::vector<size_t> by_holders;         // indices into reduced, by holders (stable)
};

ShardScratch& thread_shard_scratch() {
  thread_local ShardScratch scratch;
  return scratch;
}

// The holders of a param used by `slices` (ascending) into `by_rank`, by
// tensor-parallel rank (`tp` of them): the devices of those slices at that
// rank, ascending, without repeats. `marked` (one entry per device, all 0)
// is working memory, left all 0.
void holders_by_rank(const std::vector<int>& slices, int tp, const Lowered& out,
                     std::vector<std::vector<int>>& by_rank, std::vector<char>& marked) {
  by_rank.resize(static_cast<size_t>(tp));
  for (std::vector<int>& list : by_rank) list.clear();
  for (int s : slices) {
    const LoweredSlice& slice = out.slices[static_cast<size_t>(s)];
    for (size_t i = 0; i < slice.devices.size(); ++i)
      by_rank[static_cast<size_t>(slice.layout.tp_rank_of(static_cast<int>(i)))].push_back(slice.devices[i]);
  }
  for (std::vector<int>& list : by_rank) {
    if (slices.size() > 1) {   // one slice's devices are ascending; several slices' are not
      // A param shared by many slices (an encoder every task uses) has
      // hundreds of holders: marking them and reading the devices in order
      // costs less than sorting them once n log2 n passes the device count.
      const auto n = static_cast<double>(list.size());
      if (n * std::log2(std::max(n, 2.0)) > static_cast<double>(out.devices)) {
        marked.resize(static_cast<size_t>(out.devices), 0);
        for (int d : list) marked[static_cast<size_t>(d)] = 1;
        list.clear();
        for (int d = 0; d < out.devices; ++d)
          if (marked[static_cast<size_t>(d)]) {
            list.push_back(d);
            marked[static_cast<size_t>(d)] = 0;
          }
        continue;
      }
      std::sort(list.begin(), list.end());
    }
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
}

// Whether the TP copies of a parameter used by `slices`, held by
// `by_rank` (holders_by_rank), step alike with no copying: at most two
// holders at each TP rank, and one map from rank 0's holders to rank k's
// that every row group of every slice using it follows. Then rank 0's
// holder and its image run the same slices on the same rows, in the same
// program order, so their gradients of the whole tensors are the same
// bits, and their all-reduces add the same two terms (fp32 addition of two
// terms does not depend on their order), or none.
bool copies_step_alike(const std::vector<int>& slices, const std::vector<std::vector<int>>& by_rank,
                       const Lowered& out) {
  const std::vector<int>& first = by_rank[0];
  if (first.size() > 2) return false;
  for (const std::vector<int>& h : by_rank)
    if (h.size() != first.size()) return false;
  // image[k * 2 + i]: the device at TP rank k of rank 0's holder i's row groups.
  std::vector<int> image(by_rank.size() * 2, -1);
  for (int s : slices) {
    const LoweredSlice& slice = out.slices[static_cast<size_t>(s)];
    const int tp = slice.layout.tp;
    for (int g = 0; g < slice.layout.groups(); ++g) {
      const int d0 = slice.devices[static_cast<size_t>(g * tp)];
      const size_t i = d0 == first[0] ? 0 : 1;
      for (int k = 1; k < tp; ++k) {
        int& to = image[static_cast<size_t>(k) * 2 + i];
        const int dk = slice.devices[static_cast<size_t>(g * tp + k)];
        if (to >= 0 && to != dk) return false;
        to = dk;
      }
    }
  }
  for (size_t k = 1; k < by_rank.size(); ++k)
    if (first.size() == 2 && image[k * 2] == image[k * 2 + 1]) return false;
  return true;
}

// The gradient sync a lowering of `plan` follows: options.sync, or when it
// is empty the plan's own (planned_sync).
GradSync lowering_sync(const LowerOptions& options, const Plan& plan) {
  return options.sync.value_or(planned_sync(plan));
}

void lower_shards(const LowerContext& ctx, const LowerOptions& options, const GradSync& sync, Lowered& out) {
  const bool runtime_maps = options.runtime_maps;
  const ParamIds& ids = ctx.params;
  const OpGraph& graph = *ctx.graph;
  const size_t params = ids.names.size();
  ShardScratch& sc = thread_shard_scratch();
  // The slices using each param (ascending, each once) and its first
  // operator (in slice order).
  sc.users.resize(params);
  for (std::vector<int>& u : sc.users) u.clear();
  sc.first_op.assign(params, -1);
  for (size_t s = 0; s < out.slices.size(); ++s)
    for (int o : out.slices[s].ops) {
      const int p = ids.of_op[static_cast<size_t>(o)];
      if (p < 0) continue;
      if (sc.first_op[static_cast<size_t>(p)] < 0) sc.first_op[static_cast<size_t>(p)] = o;
      std::vector<int>& u = sc.users[static_cast<size_t>(p)];
      if (u.empty() || u.back() != static_cast<int>(s)) u.push_back(static_cast<int>(s));
    }
  // Every shard, in key order (param name, then rank): the order of a
  // bucket's shards.
  sc.pool.clear();
  sc.reduced.clear();
  std::vector<int64_t> shard_values(params, 0);   // by param: one shard's values
  out.unreduced_values.assign(static_cast<size_t>(std::max(out.devices, 0)), 0);
  out.unreduced_norm_values.assign(out.unreduced_values.size(), 0);
  for (int p : ids.sorted) {
    const int first = sc.first_op[static_cast<size_t>(p)];
    if (first < 0) continue;
    const std::string& name = ids.names[static_cast<size_t>(p)];
    const Operator& op = graph.ops[static_cast<size_t>(first)];
    if (runtime_maps) {
      out.param_tp[name] = op.tensor_parallel;
      out.param_op.emplace(name, first);
    }
    const int64_t values = ctx.shard_values[static_cast<size_t>(first)];
    shard_values[static_cast<size_t>(p)] = values;
    holders_by_rank(sc.users[static_cast<size_t>(p)], op.tensor_parallel, out, sc.by_rank, sc.marked);
    if (ctx.copy_values[static_cast<size_t>(p)] > 0 && !copies_step_alike(sc.users[static_cast<size_t>(p)], sc.by_rank, out))
      out.copy_holders.push_back({p, first, sc.by_rank});
    for (size_t rank = 0; rank < sc.by_rank.size(); ++rank) {
      const std::vector<int>& list = sc.by_rank[rank];
      if (runtime_maps && !list.empty())
        out.shard_devices.emplace_hint(out.shard_devices.end(), ShardKey{name, static_cast<int>(rank)}, list);
      if (list.size() < 2) {   // one holder: nothing to all-reduce
        if (list.empty()) continue;
        out.unreduced_values[static_cast<size_t>(list.front())] += values;
        for (const LowerContext::NormTensor& t : ctx.param_tensors[static_cast<size_t>(p)])
          if (tp_copy_counts(t.shard_axis, static_cast<int>(rank)))
            out.unreduced_norm_values[static_cast<size_t>(list.front())] += t.values;
        continue;
      }
      const size_t begin = sc.pool.size();
      sc.pool.insert(sc.pool.end(), list.begin(), list.end());
      sc.reduced.push_back({begin, sc.pool.size(), p, static_cast<int>(rank)});
    }
  }
  std::vector<int> first_wave(params, 0);
  for (size_t p = 0; p < params; ++p)
    if (!sc.users[p].empty()) first_wave[p] = out.slices[static_cast<size_t>(sc.users[p].front())].wave;
  // One bucket per holder list, the lists in ascending (lexicographic)
  // order, each bucket's shards in key order; then cut into pieces.
  auto holders = [&](size_t r) {
    const ShardScratch::Reduced& x = sc.reduced[r];
    return std::span<const int>(sc.pool.data() + x.begin, sc.pool.data() + x.end);
  };
  sc.by_holders.resize(sc.reduced.size());
  std::iota(sc.by_holders.begin(), sc.by_holders.end(), size_t{0});
  std::stable_sort(sc.by_holders.begin(), sc.by_holders.end(), [&](size_t a, size_t b) {
    const std::span<const int> x = holders(a), y = holders(b);
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
  });
  for (size_t i = 0; i < sc.by_holders.size();) {
    const std::span<const int> list = holders(sc.by_holders[i]);
    Bucket b;
    b.devices.assign(list.begin(), list.end());
    for (; i < sc.by_holders.size() && std::ranges::equal(holders(sc.by_holders[i]), list); ++i) {
      const ShardScratch::Reduced& x = sc.reduced[sc.by_holders[i]];
      if (runtime_maps) b.shards.emplace_back(ids.names[static_cast<size_t>(x.param)], x.rank);
      b.params.push_back(x.param);
      b.ranks.push_back(x.rank);
      b.values += shard_values[static_cast<size_t>(x.param)];
    }
    split_bucket(std::move(b), first_wave, shard_values, sync.bucket_bytes, out.buckets);
  }
  order_buckets(out.buckets, out.devices);
  // Started as their gradients become final: the global order follows
  // readiness (latest first wave first), else one ready late would hold
  // back the ones after it.
  if (sync.overlap)
    std::stable_sort(out.buckets.begin(), out.buckets.end(),
                     [](const Bucket& a, const Bucket& b) { return a.first_wave > b.first_wave; });
}

// What one device takes part in, gathered in one pass over the whole
// lowering (so that building every program is linear in their sizes).
// Views into DeviceShares' lists.
struct DeviceShare {
  std::span<const int> slices;     // ascending (so wave by wave)
  std::span<const int> transfers;  // ascending: grouped by exchange, in exchange order
  std::span<const int> buckets;    // ascending: the global bucket order
};

// Every device's share, each kind in one list for all devices, device by
// device (three allocations, not three per device).
class DeviceShares {
 public:
  explicit DeviceShares(const Lowered& l);
  DeviceShare of(int d) const {
    return {part(slices_, slice_at_, d), part(transfers_, transfer_at_, d), part(buckets_, bucket_at_, d)};
  }

 private:
  static std::span<const int> part(const std::vector<int>& list, const std::vector<size_t>& at, int d) {
    return {list.data() + at[static_cast<size_t>(d)], list.data() + at[static_cast<size_t>(d) + 1]};
  }
  // list[at[d], at[d + 1]): device d's, by kind.
  std::vector<int> slices_, transfers_, buckets_;
  std::vector<size_t> slice_at_, transfer_at_, bucket_at_;
};

DeviceShares::DeviceShares(const Lowered& l) {
  const size_t devices = static_cast<size_t>(l.devices);
  slice_at_.assign(devices + 1, 0);
  transfer_at_.assign(devices + 1, 0);
  bucket_at_.assign(devices + 1, 0);
  // Counted first, then each device's start, then filled in order (the
  // starts advance to each device's end).
  for (const LoweredSlice& s : l.slices)
    for (int d : s.devices) ++slice_at_[static_cast<size_t>(d) + 1];
  for (const Transfer& tr : l.transfers) {
    ++transfer_at_[static_cast<size_t>(tr.src) + 1];
    if (tr.dst != tr.src) ++transfer_at_[static_cast<size_t>(tr.dst) + 1];
  }
  for (const Bucket& b : l.buckets)
    for (int d : b.devices) ++bucket_at_[static_cast<size_t>(d) + 1];
  for (size_t d = 0; d < devices; ++d) {
    slice_at_[d + 1] += slice_at_[d];
    transfer_at_[d + 1] += transfer_at_[d];
    bucket_at_[d + 1] += bucket_at_[d];
  }
  slices_.resize(slice_at_[devices]);
  transfers_.resize(transfer_at_[devices]);
  buckets_.resize(bucket_at_[devices]);
  std::vector<size_t> next(slice_at_.begin(), slice_at_.end() - 1);
  for (size_t s = 0; s < l.slices.size(); ++s)
    for (int d : l.slices[s].devices) slices_[next[static_cast<size_t>(d)]++] = static_cast<int>(s);
  next.assign(transfer_at_.begin(), transfer_at_.end() - 1);
  for (size_t t = 0; t < l.transfers.size(); ++t) {
    const Transfer& tr = l.transfers[t];
    transfers_[next[static_cast<size_t>(tr.src)]++] = static_cast<int>(t);
    if (tr.dst != tr.src) transfers_[next[static_cast<size_t>(tr.dst)]++] = static_cast<int>(t);
  }
  next.assign(bucket_at_.begin(), bucket_at_.end() - 1);
  for (size_t b = 0; b < l.buckets.size(); ++b)
    for (int d : l.buckets[b].devices) buckets_[next[static_cast<size_t>(d)]++] = static_cast<int>(b);
}

// A run of a device's transfers (DeviceShare::transfers, which is in
// exchange order): the transfers of one exchange of the device, in
// program order.
struct ExchangeRun {
  Direction dir;
  int wave;
  size_t begin, end;   // in DeviceShare::transfers
  bool receives;       // the device receives one of them
};

// ProgramBuilder's working memory, made once by lower_programs and used by
// the builder of every device in turn (so that a lowering allocates its
// lists once, not once per device). Between builders param_bwd holds
// empty lists and last_step -1s, by param id; each builder clears the
// other lists before it uses them.
struct BuilderScratch {
  explicit BuilderScratch(size_t params) : param_bwd(params), last_step(params, -1) {}
  std::vector<std::vector<int>> param_bwd;
  std::vector<int> last_step;
  std::vector<size_t> wave_begin;
  std::vector<ExchangeRun> runs;
  std::vector<std::pair<int, int>> sends_after;
  std::vector<int> posted, posted_sends, touched, ready_step, reductions, stepped, ready_order;
  std::vector<size_t> ready_place;
};

// Builds device d's program in the order of the header, with its
// dependencies (lower_programs runs one per device): the forward pass wave
// by wave, the backward pass in reverse with the gradient all-reduces, the
// optimizer; the exchanges between, or, with early transfers, posted
// receives and sends around them.
class ProgramBuilder {
 public:
  // `scratch` has ids.names.size() params (BuilderScratch). With `deps`
  // false, every Instr::deps is left empty (LowerOptions). Sets
  // `starts_matter` when the two bucket-start rules would give d other
  // programs.
  ProgramBuilder(const Lowered& l, const LowerContext& ctx, const DeviceShare& mine, int waves, int d,
                 BuilderScratch& scratch, bool deps, const GradSync& sync, BucketStarts starts,
                 bool& starts_matter);

  Program build() &&;

 private:
  using Run = ExchangeRun;
  bool received(const Transfer& tr) const { return tr.dst == d_ && tr.src != d_; }   // a message to d
  bool sent_early(const Transfer& tr) const { return early_ && tr.src == d_ && tr.dst != d_; }
  const Transfer& transfer(int t) const { return l_.transfers[static_cast<size_t>(t)]; }
  const LoweredSlice& slice(int s) const { return l_.slices[static_cast<size_t>(s)]; }
  // Appends `in` with its dependencies `deps` (kept only with deps_), both
  // built first because it may not be emitted (an empty exchange or
  // post_send); returns its index.
  int add(const Instr& in, std::vector<int> deps = {}) {
    prog_.instrs.push_back(in);
    if (deps_ && !deps.empty()) deps_of(last()) = std::move(deps);
    return last();
  }
  // The dependencies of instruction i (Program::deps; with deps_ only),
  // the list made on first use. The reference is valid until the next call.
  std::vector<int>& deps_of(int i) {
    if (prog_.deps.size() <= static_cast<size_t>(i)) prog_.deps.resize(static_cast<size_t>(i) + 1);
    return prog_.deps[static_cast<size_t>(i)];
  }
  // Appends an instruction of `kind` made in place, for the caller to fill
  // (the reference is valid until the next instruction is appended).
  Instr& append(InstrKind kind) {
    Instr& in = prog_.instrs.emplace_back();
    in.kind = kind;
    return in;
  }
  int last() const { return static_cast<int>(prog_.instrs.size()) - 1; }

  void find_runs();
  template <class Keep>
  bool take(const Run& r, Instr& in, Keep keep);
  void post_next_receives(int after);
  bool exchange_of(Direction dir, int w, Instr& in, std::vector<int>& deps);
  void post_sends(int slice, int at);
  void forward_pass();
  void find_ready_steps();
  void reduce(size_t i, InstrKind kind);
  void start_ready(int step);
  void backward_pass();
  void step_shards(int b, std::span<const int> after);
  void sync_and_step();
  void copy_exchange();
  int grad_norm();
  void gather(int b);
  void start_gathers();
  void wait_gathers(size_t k);

  const Lowered& l_;
  const LowerContext& ctx_;
  const ParamIds& ids_;   // ctx_.params
  const DeviceShare mine_;
  const int waves_, d_;
  // From the scratch: by param id (BuilderScratch).
  std::vector<std::vector<int>>& param_bwd_;
  std::vector<int>& last_step_;
  const bool deps_, overlap_, early_, norm_;
  const BucketStarts starts_;
  bool& starts_matter_;

  Program prog_;
  // The lists below are the scratch's, but for fwd_of_, bwd_of_ and grad_in_.
  std::vector<size_t>& wave_begin_;   // mine.slices of wave w: [wave_begin_[w], wave_begin_[w + 1])
  std::vector<Run>& runs_;
  // With early transfers an exchange keeps what d receives or copies; what
  // d sends leaves in post_sends (sends_after_, by the slice whose compute
  // made it: the producer's for a forward transfer, the consumer's for a
  // backward one), in transfer order. (slice, transfer), sorted.
  std::vector<std::pair<int, int>>& sends_after_;
  // Exchanges in program order: next_run_ is the next one to emit, and
  // posted_[r] the post_recv that posted run r's receives (-1: none).
  size_t next_run_ = 0;
  size_t copies_begin_ = 0;   // mine.transfers from here on are copies (Direction::copy)
  std::vector<int>& posted_;
  std::vector<int>& posted_sends_;   // the post_sends made
  // Only the dependencies need these: each slice's forward and backward.
  std::vector<int> fwd_of_, bwd_of_;
  // What each producer's output gradient waits for on d: the backward
  // exchanges that deliver it (several consumers may add into it).
  std::map<int, std::vector<int>> grad_in_;
  std::vector<int>& touched_;        // params whose param_bwd_ list is filled
  // With overlap: the backward step (0, 1, ... in program order) after
  // which each of mine.buckets' gradients on d are final.
  std::vector<int>& ready_step_;
  // The all-reduce of bucket mine.buckets[i] (blocking, or its start);
  // -1 until it is made.
  std::vector<int>& reductions_;
  std::vector<int>& stepped_;        // find_ready_steps': params whose last_step_ it set
  // With overlap and buckets started when ready: mine.buckets' indices
  // by the backward step after which each is ready (ready_step_, -1 as 0),
  // ascending within a step; next_ready_ the first not yet started.
  std::vector<int>& ready_order_;
  std::vector<size_t>& ready_place_;   // find_ready_steps' scratch
  size_t next_ready_ = 0;
  size_t started_ = 0;               // in order: leading buckets started
  // With the gathers at the step's start (Lowered::gathers_at_start): their
  // waits, as (k, allgather_start) in program order: the wait of that start
  // goes right before the forward of mine.slices[k] (start_gathers);
  // next_gather_ the first not yet made.
  std::vector<std::pair<size_t, int>> gather_waits_;
  size_t next_gather_ = 0;
};

ProgramBuilder::ProgramBuilder(const Lowered& l, const LowerContext& ctx, const DeviceShare& mine, int waves, int d,
                               BuilderScratch& scratch, bool deps, const GradSync& sync, BucketStarts starts,
                               bool& starts_matter)
    : l_(l), ctx_(ctx), ids_(ctx.params), mine_(mine), waves_(waves), d_(d), param_bwd_(scratch.param_bwd),
      last_step_(scratch.last_step), deps_(deps), overlap_(sync.overlap),
      early_(sync.overlap && sync.early_transfers), norm_(sync.grad_norm), starts_(starts),
      starts_matter_(starts_matter),
      wave_begin_(scratch.wave_begin), runs_(scratch.runs), sends_after_(scratch.sends_after),
      posted_(scratch.posted), posted_sends_(scratch.posted_sends), fwd_of_(deps ? l.slices.size() : 0, -1),
      bwd_of_(deps ? l.slices.size() : 0, -1), touched_(scratch.touched), ready_step_(scratch.ready_step),
      reductions_(scratch.reductions), stepped_(scratch.stepped), ready_order_(scratch.ready_order),
      ready_place_(scratch.ready_place) {
  runs_.clear();
  sends_after_.clear();
  posted_.clear();
  posted_sends_.clear();
  touched_.clear();
  ready_step_.clear();
  reductions_.assign(mine.buckets.size(), -1);
  prog_.device = d;
  // Forward and backward of each slice, an exchange per wave and direction
  // at most (with early transfers, a post_recv before each and a post_send
  // after a compute at most), per bucket its all-reduce (with overlap, its
  // start and wait) and an optimizer step at most, the last optimizer step
  // and the wait for the sends.
  prog_.instrs.reserve((early_ ? 4 : 2) * (mine.slices.size() + static_cast<size_t>(waves)) +
                       (l.sharded_state ? 5 : 3) * mine.buckets.size() + 3);
  prog_.transfers.reserve(early_ ? 2 * mine.transfers.size() : mine.transfers.size());
  wave_begin_.assign(static_cast<size_t>(waves) + 1, 0);
  for (int s : mine.slices) ++wave_begin_[static_cast<size_t>(slice(s).wave) + 1];
  for (size_t w = 0; w < static_cast<size_t>(waves); ++w) wave_begin_[w + 1] += wave_begin_[w];
}

Program ProgramBuilder::build() && {
  find_runs();
  if (l_.gathers_at_start) start_gathers();
  post_next_receives(-1);
  forward_pass();
  if (l_.gathers_at_start) wait_gathers(mine_.slices.size());
  if (overlap_) find_ready_steps();
  backward_pass();
  sync_and_step();
  copy_exchange();
  // Last, the wait for every send posted early to be delivered (their
  // buffers are then free for the next step).
  if (!posted_sends_.empty()) {
    append(InstrKind::wait_sends);
    if (deps_) deps_of(last()) = posted_sends_;
  }
  if (deps_) prog_.deps.resize(prog_.instrs.size());   // an empty list for each instruction without
  for (int p : touched_) param_bwd_[static_cast<size_t>(p)].clear();
  return std::move(prog_);
}

void ProgramBuilder::find_runs() {
  copies_begin_ = mine_.transfers.size();
  for (size_t i = 0; i < mine_.transfers.size(); ++i) {
    const int t = mine_.transfers[i];
    const Transfer& tr = transfer(t);
    if (tr.dir == Direction::copy) {   // the copies come last: copy_exchange's
      copies_begin_ = i;
      break;
    }
    if (runs_.empty() || runs_.back().dir != tr.dir || runs_.back().wave != tr.wave)
      runs_.push_back({tr.dir, tr.wave, i, i, false});
    runs_.back().end = i + 1;
    runs_.back().receives |= received(tr);
    if (sent_early(tr))
      sends_after_.push_back(
          {tr.dir == Direction::forward ? l_.slice_of[static_cast<size_t>(tr.producer)] : tr.slice, t});
  }
  std::sort(sends_after_.begin(), sends_after_.end());
  posted_.assign(runs_.size(), -1);
}

// Appends to prog_.transfers the transfers of run r that `keep` takes, as
// the range of `in`; false when it took none.
template <class Keep>
bool ProgramBuilder::take(const Run& r, Instr& in, Keep keep) {
  in.transfers_begin = static_cast<int>(prog_.transfers.size());
  for (size_t i = r.begin; i < r.end; ++i)
    if (keep(transfer(mine_.transfers[i]))) prog_.transfers.push_back(mine_.transfers[i]);
  in.transfers_end = static_cast<int>(prog_.transfers.size());
  return in.transfers_end > in.transfers_begin;
}

// With early transfers: the post_recv of the next exchange with receives
// (after instruction `after`, the exchange before it, or at the program's
// start: -1).
void ProgramBuilder::post_next_receives(int after) {
  if (!early_) return;
  size_t r = next_run_;
  while (r < runs_.size() && !runs_[r].receives) ++r;
  if (r == runs_.size() || posted_[r] >= 0) return;
  Instr in;
  in.kind = InstrKind::post_recv;
  in.dir = runs_[r].dir;
  in.wave = runs_[r].wave;
  take(runs_[r], in, [&](const Transfer& tr) { return received(tr); });
  std::vector<int> deps;
  if (deps_ && after >= 0) deps.push_back(after);
  posted_[r] = add(in, std::move(deps));
}

// The exchange (dir, w) of d into `in`, and with deps_ what it waits for
// into `deps`: false when d has none.
bool ProgramBuilder::exchange_of(Direction dir, int w, Instr& in, std::vector<int>& deps) {
  if (next_run_ >= runs_.size() || runs_[next_run_].dir != dir || runs_[next_run_].wave != w) return false;
  const bool any = take(runs_[next_run_], in, [&](const Transfer& tr) { return !sent_early(tr); });
  if (deps_ && posted_[next_run_] >= 0) deps.push_back(posted_[next_run_]);
  ++next_run_;
  in.kind = InstrKind::exchange;
  in.wave = w;
  in.dir = dir;
  return any;
}

// With early transfers: the post_send of what compute instruction `at`
// (slice `s`) made for other devices.
void ProgramBuilder::post_sends(int s, int at) {
  if (!early_) return;
  auto it = std::lower_bound(sends_after_.begin(), sends_after_.end(), std::pair{s, -1});
  if (it == sends_after_.end() || it->first != s) return;
  Instr in;
  in.kind = InstrKind::post_send;
  in.wave = slice(s).wave;
  in.dir = prog_.instrs[static_cast<size_t>(at)].kind == InstrKind::forward ? Direction::forward : Direction::backward;
  in.slice = s;
  in.transfers_begin = static_cast<int>(prog_.transfers.size());
  for (; it != sends_after_.end() && it->first == s; ++it)
    if (transfer(it->second).dir == in.dir) prog_.transfers.push_back(it->second);
  in.transfers_end = static_cast<int>(prog_.transfers.size());
  if (in.transfers_end == in.transfers_begin) return;
  posted_sends_.push_back(add(in, deps_ ? std::vector<int>{at} : std::vector<int>{}));
}

// Per wave: its forward exchange, then the forward of each of d's slices.
void ProgramBuilder::forward_pass() {
  for (int w = 0; w < waves_; ++w) {
    int ex = -1;
    std::vector<int> deps;   // the exchange's (with deps_)
    if (Instr in; exchange_of(Direction::forward, w, in, deps)) {
      if (deps_) {
        for (int t : prog_.transfers_of(in))  // the forward of every slice whose output d sends or copies
          if (transfer(t).src == d_)
            deps.push_back(fwd_of_[static_cast<size_t>(l_.slice_of[static_cast<size_t>(transfer(t).producer)])]);
      }
      ex = add(in, sorted_unique(std::move(deps)));
      post_next_receives(ex);
    }
    for (size_t k = wave_begin_[static_cast<size_t>(w)]; k < wave_begin_[static_cast<size_t>(w) + 1]; ++k) {
      const int s = mine_.slices[k];
      const size_t waits = next_gather_;
      wait_gathers(k);
      Instr& in = append(InstrKind::forward);
      in.wave = w;
      in.slice = s;
      if (deps_ && ex >= 0 && !slice(s).producers.empty()) deps_of(last()).push_back(ex);
      if (deps_)   // the waits just made, right before it
        for (int i = last() - static_cast<int>(next_gather_ - waits); i < last(); ++i) deps_of(last()).push_back(i);
      const int at = last();
      if (deps_) fwd_of_[static_cast<size_t>(s)] = at;
      post_sends(s, at);
    }
  }
}

// ready_step_: for each of d's buckets, the last backward step of d using
// one of its parameters (last_step_, by param id, is scratch).
void ProgramBuilder::find_ready_steps() {
  stepped_.clear();
  int step = 0;
  for (int w = waves_ - 1; w >= 0; --w)
    for (size_t k = wave_begin_[static_cast<size_t>(w) + 1]; k-- > wave_begin_[static_cast<size_t>(w)]; ++step)
      for (int o : slice(mine_.slices[k]).ops)
        if (const int p = ids_.of_op[static_cast<size_t>(o)]; p >= 0) {
          if (last_step_[static_cast<size_t>(p)] < 0) stepped_.push_back(p);
          last_step_[static_cast<size_t>(p)] = step;
        }
  ready_step_.reserve(mine_.buckets.size());
  for (int b : mine_.buckets) {
    int ready = -1;
    for (int p : l_.buckets[static_cast<size_t>(b)].params) ready = std::max(ready, last_step_[static_cast<size_t>(p)]);
    ready_step_.push_back(ready);
  }
  for (int p : stepped_) last_step_[static_cast<size_t>(p)] = -1;
  // In order starts bucket i after step max(ready_step[0..i]), when ready
  // after ready_step[i]: the same programs iff they never decrease.
  for (size_t i = 1; i < ready_step_.size(); ++i)
    if (ready_step_[i] < ready_step_[i - 1]) starts_matter_ = true;
  if (starts_ != BucketStarts::when_ready) return;
  // Started when ready: by ready step (-1 as the first), ascending within
  // one; a counting sort on the step (it costs less than a sort here).
  auto step_of = [&](size_t i) { return static_cast<size_t>(std::max(ready_step_[i], 0)); };
  std::vector<size_t>& place = ready_place_;   // by step: where its next bucket goes
  place.assign(mine_.slices.size() + 2, 0);
  for (size_t i = 0; i < ready_step_.size(); ++i) ++place[step_of(i) + 1];
  std::partial_sum(place.begin(), place.end(), place.begin());
  ready_order_.resize(ready_step_.size());
  for (size_t i = 0; i < ready_step_.size(); ++i) ready_order_[place[step_of(i)]++] = static_cast<int>(i);
}

// The all-reduce of bucket mine.buckets[i] (blocking, or its start), after
// the backward of every slice of d that uses one of its parameters.
void ProgramBuilder::reduce(size_t i, InstrKind kind) {
  const int b = mine_.buckets[i];
  Instr& in = append(kind);
  in.bucket = b;
  if (deps_) {
    std::vector<int>& deps = deps_of(last());
    for (int p : l_.buckets[static_cast<size_t>(b)].params) {
      const std::vector<int>& after = param_bwd_[static_cast<size_t>(p)];
      deps.insert(deps.end(), after.begin(), after.end());
    }
    deps = sorted_unique(std::move(deps));
  }
  reductions_[i] = last();
}

// With overlap, the starts of the buckets ready after backward step `step`
// (Plan::bucket_starts): in order, the ready ones whose predecessors all
// started (a bucket ready early waits for the ones before it); when ready,
// every ready one.
void ProgramBuilder::start_ready(int step) {
  if (starts_ == BucketStarts::in_order) {
    while (started_ < mine_.buckets.size() && ready_step_[started_] <= step)
      reduce(started_++, InstrKind::allreduce_start);
    return;
  }
  // Steps come in order: those ready before this one have started.
  for (; next_ready_ < ready_order_.size(); ++next_ready_) {
    const auto i = static_cast<size_t>(ready_order_[next_ready_]);
    if (ready_step_[i] > step) break;
    reduce(i, InstrKind::allreduce_start);
  }
}

// Per wave, last first: the backward of each of d's slices (in reverse),
// with overlap each followed by the starts of the buckets it makes ready,
// then the wave's backward exchange. The instructions a parameter's
// gradient on d waits for (param_bwd_, by param id) are the backward of
// every slice of d that uses it.
void ProgramBuilder::backward_pass() {
  int step = 0;
  for (int w = waves_ - 1; w >= 0; --w) {
    for (size_t k = wave_begin_[static_cast<size_t>(w) + 1]; k-- > wave_begin_[static_cast<size_t>(w)];) {
      const int slice_id = mine_.slices[k];
      Instr& in = append(InstrKind::backward);
      in.wave = w;
      in.slice = slice_id;
      const LoweredSlice& s = slice(slice_id);
      if (deps_) {
        std::vector<int>& deps = deps_of(last());
        deps.push_back(fwd_of_[static_cast<size_t>(slice_id)]);
        if (auto g = grad_in_.find(s.ops.back()); g != grad_in_.end())
          deps.insert(deps.end(), g->second.begin(), g->second.end());
        deps = sorted_unique(std::move(deps));
      }
      const int at = last();
      post_sends(slice_id, at);
      if (deps_) {
        bwd_of_[static_cast<size_t>(slice_id)] = at;
        for (int o : s.ops)
          if (const int p = ids_.of_op[static_cast<size_t>(o)]; p >= 0) {
            if (param_bwd_[static_cast<size_t>(p)].empty()) touched_.push_back(p);
            param_bwd_[static_cast<size_t>(p)].push_back(at);
          }
      }
      if (overlap_) start_ready(step);
      ++step;
    }
    std::vector<int> deps;   // the exchange's (with deps_)
    if (Instr in; exchange_of(Direction::backward, w, in, deps)) {
      if (deps_) {
        for (int t : prog_.transfers_of(in))  // the backward of every consumer slice whose input gradient d sends
          if (transfer(t).src == d_) deps.push_back(bwd_of_[static_cast<size_t>(transfer(t).slice)]);
      }
      const int ex = add(in, sorted_unique(std::move(deps)));
      post_next_receives(ex);
      if (deps_)
        for (int t : prog_.transfers_of(prog_.instrs[static_cast<size_t>(ex)]))
          if (transfer(t).dst == d_) grad_in_[transfer(t).producer].push_back(ex);
    }
  }
}

// The optimizer step of bucket b's shards (b >= 0), or of every shard of d
// in no bucket (b = -1: last, after every backward and reduction); with
// deps, after the instructions `after` (and, for b = -1, every backward).
void ProgramBuilder::step_shards(int b, std::span<const int> after) {
  Instr& in = append(InstrKind::optimizer);
  in.bucket = b;
  if (b >= 0) {
    in.values = l_.owned(b, d_).size();
  } else {   // what no bucket's step stepped: d's own shards, and without overlap every bucket's
    in.values = l_.unreduced_values[static_cast<size_t>(d_)];
    if (!overlap_)
      for (int k : mine_.buckets) in.values += l_.owned(k, d_).size();
  }
  if (deps_) {
    std::vector<int> deps(after.begin(), after.end());
    if (b < 0)
      for (int s : bwd_of_)
        if (s >= 0) deps.push_back(s);
    deps_of(last()) = sorted_unique(std::move(deps));
  }
}

// After the backward pass. With overlap every bucket has started (its last
// backward has run); each wait follows its start, in the same order, and
// the optimizer step of the bucket's shards follows its wait: it need not
// wait for the others. Without: blocking all-reduces, then one step.
void ProgramBuilder::sync_and_step() {
  if (overlap_) {
    for (size_t i = 0; i < mine_.buckets.size(); ++i) {
      Instr& in = append(InstrKind::allreduce_wait);
      in.bucket = mine_.buckets[i];
      if (deps_) deps_of(last()).push_back(reductions_[i]);
      reductions_[i] = last();
      if (norm_) continue;   // every step after the norm (below)
      step_shards(mine_.buckets[i], {&reductions_[i], 1});
      if (!l_.gathers_at_start) gather(mine_.buckets[i]);   // sharded, Plan::param_gather after_step
    }
    if (!norm_) return step_shards(-1, {});
    const int norm = grad_norm();   // every step scales its gradients by the clipping factor
    for (int b : mine_.buckets) {
      step_shards(b, {&norm, 1});
      if (!l_.gathers_at_start) gather(b);
    }
    step_shards(-1, {&norm, 1});
  } else {
    for (size_t i = 0; i < mine_.buckets.size(); ++i) reduce(i, InstrKind::allreduce);
    const int norm = norm_ ? grad_norm() : -1;   // after every all-reduce, before the step
    step_shards(-1, norm_ ? std::span<const int>(&norm, 1) : std::span<const int>(reductions_));
    for (int b : mine_.buckets) gather(b);
  }
}

// After every optimizer step (and all-gather after one) of d: the copy
// exchange of its copies (Direction::copy), if it has any.
void ProgramBuilder::copy_exchange() {
  if (copies_begin_ == mine_.transfers.size()) return;
  std::vector<int> deps;   // every optimizer step and all-gather of d
  if (deps_)
    for (int i = 0; i <= last(); ++i) {
      const InstrKind kind = prog_.instrs[static_cast<size_t>(i)].kind;
      if (kind == InstrKind::optimizer || kind == InstrKind::allgather) deps.push_back(i);
    }
  Instr in;
  in.kind = InstrKind::exchange;
  in.dir = Direction::copy;
  in.transfers_begin = static_cast<int>(prog_.transfers.size());
  prog_.transfers.insert(prog_.transfers.end(), mine_.transfers.begin() + static_cast<std::ptrdiff_t>(copies_begin_),
                         mine_.transfers.end());
  in.transfers_end = static_cast<int>(prog_.transfers.size());
  add(in, std::move(deps));
}

// With GradSync::grad_norm, after every all-reduce (or wait) of d's
// buckets: the sum of the squares of the gradient values d counts
// (norm_sum, Lowered::norm_values: its buckets' summed, its own shards'
// from the backward pass), then the all-reduce of that sum over every
// device (grad_norm). Returns the grad_norm's index.
int ProgramBuilder::grad_norm() {
  append(InstrKind::norm_sum).values = l_.norm_values(d_, ctx_);
  if (deps_) {
    std::vector<int> deps(reductions_.begin(), reductions_.end());
    for (int s : bwd_of_)
      if (s >= 0) deps.push_back(s);
    deps_of(last()) = sorted_unique(std::move(deps));
  }
  const int sum = last();
  append(InstrKind::grad_norm);
  if (deps_) deps_of(last()) = {sum};
  return last();
}

// With overlap and sharded state, the program's first instructions: the
// allgather_start of each of d's buckets, in the gather order (by the
// bucket's first wave, then its index: one order on every device, as the
// bucket's communicator needs), and gather_waits_, where each is waited
// for (in the same order). last_step_ (by param id, -1 when unset) is scratch here: the first
// forward k of d using each parameter.
void ProgramBuilder::start_gathers() {
  stepped_.clear();
  for (size_t k = 0; k < mine_.slices.size(); ++k)
    for (int o : slice(mine_.slices[k]).ops)
      if (const int p = ids_.of_op[static_cast<size_t>(o)]; p >= 0 && last_step_[static_cast<size_t>(p)] < 0) {
        last_step_[static_cast<size_t>(p)] = static_cast<int>(k);
        stepped_.push_back(p);
      }
  std::vector<int> order(mine_.buckets.begin(), mine_.buckets.end());
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return std::pair{l_.buckets[static_cast<size_t>(a)].first_wave, a} <
           std::pair{l_.buckets[static_cast<size_t>(b)].first_wave, b};
  });
  gather_waits_.clear();
  for (int b : order) {
    Instr& in = append(InstrKind::allgather_start);
    in.bucket = b;
    // d holds every shard of its buckets because a slice of its uses it,
    // so some forward of d uses one; a bucket used by none (never) is
    // waited for after the forward pass.
    size_t first = mine_.slices.size();
    for (int p : l_.buckets[static_cast<size_t>(b)].params)
      if (const int k = last_step_[static_cast<size_t>(p)]; k >= 0) first = std::min(first, static_cast<size_t>(k));
    gather_waits_.push_back({first, last()});
  }
  for (int p : stepped_) last_step_[static_cast<size_t>(p)] = -1;
  // Waited for in the order started (a communicator's started collectives
  // are, Comm::wait_all_reduce): a gather needed later than one started
  // after it is waited for with that one.
  for (size_t j = gather_waits_.size(); j-- > 1;)
    gather_waits_[j - 1].first = std::min(gather_waits_[j - 1].first, gather_waits_[j].first);
  next_gather_ = 0;
}

// The allgather_wait of every gather first needed by the forward of
// mine.slices[k] (k = mine.slices.size(): every one left), in gather order.
void ProgramBuilder::wait_gathers(size_t k) {
  for (; next_gather_ < gather_waits_.size() && gather_waits_[next_gather_].first <= k; ++next_gather_) {
    const int start = gather_waits_[next_gather_].second;
    const int b = prog_.instrs[static_cast<size_t>(start)].bucket;
    Instr& in = append(InstrKind::allgather_wait);
    in.bucket = b;
    if (deps_) deps_of(last()).push_back(start);
  }
}

// Without overlap, with sharded optimizer state, the blocking all-gather
// of bucket b's stepped values, after the optimizer step (the last
// instruction).
void ProgramBuilder::gather(int b) {
  if (!l_.sharded_state) return;
  const int step = last();
  Instr& in = append(InstrKind::allgather);
  in.bucket = b;
  if (deps_) deps_of(last()).push_back(step);
}

const char* kind_name(InstrKind k) {
  switch (k) {
    case InstrKind::exchange: return "exchange";
    case InstrKind::forward: return "forward";
    case InstrKind::backward: return "backward";
    case InstrKind::allreduce: return "allreduce";
    case InstrKind::allreduce_start: return "allreduce_start";
    case InstrKind::allreduce_wait: return "allreduce_wait";
    case InstrKind::optimizer: return "optimizer";
    case InstrKind::post_send: return "post_send";
    case InstrKind::post_recv: return "post_recv";
    case InstrKind::wait_sends: return "wait_sends";
    case InstrKind::allgather: return "allgather";
    case InstrKind::allgather_start: return "allgather_start";
    case InstrKind::allgather_wait: return "allgather_wait";
    case InstrKind::grad_norm: return "grad_norm";
    case InstrKind::norm_sum: return "norm_sum";
  }
  return "?";
}

const char* dir_name(Direction d) {
  return d == Direction::forward ? "forward" : d == Direction::backward ? "backward" : "copy";
}

}  // namespace

int Lowered::position(int slice, int device) const {
  const auto& d = slices[static_cast<size_t>(slice)].devices;
  const auto it = std::lower_bound(d.begin(), d.end(), device);
  return it == d.end() || *it != device ? -1 : static_cast<int>(it - d.begin());
}

ProgramBytes Lowered::bytes(int device) const {
  ProgramBytes b;
  for (const Transfer& t : transfers) {
    if (t.src == t.dst) continue;
    if (t.src == device) b.sent += t.bytes;
    if (t.dst == device) b.received += t.bytes;
  }
  for (size_t k = 0; k < buckets.size(); ++k)
    if (std::binary_search(buckets[k].devices.begin(), buckets[k].devices.end(), device)) {
      b.reduced += sharded_state ? gather_bytes(static_cast<int>(k)) : buckets[k].bytes;
      b.gathered += gather_bytes(static_cast<int>(k));
    }
  return b;
}

ValueRange Lowered::owned(int bucket, int device) const {
  const Bucket& b = buckets[static_cast<size_t>(bucket)];
  if (!sharded_state) return {0, b.values};
  const auto at = std::lower_bound(b.devices.begin(), b.devices.end(), device);
  return owned_values(b.values, static_cast<int>(b.devices.size()), static_cast<int>(at - b.devices.begin()));
}

int64_t Lowered::flat_values(int bucket) const {
  const Bucket& b = buckets[static_cast<size_t>(bucket)];
  if (!sharded_state) return b.values;
  const auto members = static_cast<int64_t>(b.devices.size());
  return members * owned_chunk(b.values, static_cast<int>(members));
}

int64_t Lowered::gather_bytes(int bucket) const { return sharded_state ? flat_values(bucket) * kWireBytesPerValue : 0; }

bool Lowered::counts_holders_in_norm(const std::vector<int>& holders, int device) const {
  if (holders.empty()) return false;
  return sharded_state ? std::binary_search(holders.begin(), holders.end(), device) : holders.front() == device;
}

bool Lowered::counts_in_norm(const ShardKey& key, int device) const {
  const auto it = shard_devices.find(key);
  return it != shard_devices.end() && counts_holders_in_norm(it->second, device);
}

int64_t Lowered::norm_values(int device, const LowerContext& context) const {
  int64_t values = unreduced_norm_values[static_cast<size_t>(device)];
  for (size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    if (!counts_holders_in_norm(b.devices, device)) continue;
    // Its part of the bucket's flat layout (shards in order, each its
    // tensors in order), less the copies TP ranks > 0 leave out.
    const ValueRange own = owned(static_cast<int>(k), device);
    int64_t at = 0;
    for (size_t i = 0; i < b.params.size(); ++i)
      for (const LowerContext::NormTensor& t : context.param_tensors[static_cast<size_t>(b.params[i])]) {
        if (tp_copy_counts(t.shard_axis, b.ranks[i]))
          values += std::max<int64_t>(0, std::min(at + t.values, own.end) - std::max(at, own.begin));
        at += t.values;
      }
  }
  return values;
}

Result<LowerContext> lower_context(const Model& model, const OpGraph& graph) {
  LowerContext ctx;
  ctx.model = &model;
  ctx.graph = &graph;
  ctx.params = param_ids(graph);
  // Last operator of every (task, node), for a node's ordered inputs:
  // node_last[task_first[t] + n].
  std::vector<size_t> task_first(model.tasks.size() + 1, 0);
  for (size_t t = 0; t < model.tasks.size(); ++t) task_first[t + 1] = task_first[t] + model.tasks[t].nodes.size();
  std::vector<int> node_last(task_first.back(), -1);
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const Operator& op = graph.ops[i];
    if (op.task < 0 || static_cast<size_t>(op.task) >= model.tasks.size() || op.node < 0 ||
        static_cast<size_t>(op.node) >= model.tasks[static_cast<size_t>(op.task)].nodes.size())
      return Error{"lowering: operator " + op.id + " is not of the model's graph"};
    node_last[task_first[static_cast<size_t>(op.task)] + static_cast<size_t>(op.node)] = static_cast<int>(i);
  }
  ctx.producers.resize(graph.ops.size());
  ctx.shard_values.assign(graph.ops.size(), 0);
  ctx.param_tensors.assign(ctx.params.names.size(), {});
  ctx.copy_values.assign(ctx.params.names.size(), 0);
  ctx.out_values_per_row.resize(graph.ops.size());
  ctx.op_index.reserve(graph.ops.size());
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const Operator& op = graph.ops[i];
    ctx.op_index.emplace(op.id, static_cast<int>(i));
    ctx.out_values_per_row[i] = op_out_values_per_sample(op.workload.op, op.workload.dims, op.workload.seq);
    const Task& task = model.tasks[static_cast<size_t>(op.task)];
    const Node& node = task.nodes[static_cast<size_t>(op.node)];
    if (op.block == 0 && op.rep == 0) {
      for (const std::string& in : node.inputs) {
        size_t n = 0;
        while (n < task.nodes.size() && task.nodes[n].id != in) ++n;
        if (n == task.nodes.size() || node_last[task_first[static_cast<size_t>(op.task)] + n] < 0)
          return Error{"lowering: input '" + in + "' of operator " + op.id + " is no node of the graph"};
        ctx.producers[i].push_back(node_last[task_first[static_cast<size_t>(op.task)] + n]);
      }
    } else {
      ctx.producers[i] = op.inputs;
    }
    if (ctx.params.of_op[i] >= 0) {
      const Module* module = model.find_module(node.module);
      if (module == nullptr) return Error{"lowering: operator " + op.id + " has no module '" + node.module + "'"};
      // The parameter's tensors at one TP rank, from its first operator
      // (all of them have its shapes); the shard's values are their sum
      // (op_shard_param_count).
      std::vector<LowerContext::NormTensor>& tensors = ctx.param_tensors[static_cast<size_t>(ctx.params.of_op[i])];
      if (tensors.empty()) {
        const size_t p = static_cast<size_t>(ctx.params.of_op[i]);
        for (const ParamTensor& t : op_param_tensors(op.workload.op, op.workload.dims, module->max_seq)) {
          tensors.push_back({t.shard_values(op.tensor_parallel), t.shard_axis});
          if (op.tensor_parallel > 1 && t.shard_axis < 0) ctx.copy_values[p] += tensors.back().values;
        }
      }
      for (const LowerContext::NormTensor& t : tensors) ctx.shard_values[i] += t.values;
    }
  }
  return ctx;
}

Result<Lowered> lower_header(const Plan& plan, const LowerContext& ctx, const LowerOptions& options) {
  Lowered out;
  out.devices = plan.devices;
  SPINDLE_TRY(lower_slices(plan, ctx, out));
  lower_shards(ctx, options, lowering_sync(options, plan), out);
  out.sharded_state = plan.optimizer_state == OptimizerState::sharded;
  out.gathers_at_start =
      plan.param_gather == ParamGather::next_step && param_gather_applies(plan, lowering_sync(options, plan));
  return out;
}

namespace {

// Transfer::adds of every backward transfer, from each receiving device's
// program order: the first piece of a producer's gradient on a device is
// taken as it is when it covers all of that device's rows of the producer.
void mark_adds(Lowered& out) {
  std::vector<int> seen_on(out.slice_of.size(), -1);   // by producer: the last device that got a piece of it
  for (int d = 0; d < out.devices; ++d) {
    const Program& prog = out.programs[static_cast<size_t>(d)];
    for (const Instr& in : prog.instrs) {
      if (in.kind != InstrKind::exchange || in.dir != Direction::backward) continue;
      for (int t : prog.transfers_of(in)) {
        Transfer& tr = out.transfers[static_cast<size_t>(t)];
        if (tr.dst != d) continue;
        int& seen = seen_on[static_cast<size_t>(tr.producer)];
        const int ps = out.slice_of[static_cast<size_t>(tr.producer)];
        const RowRange mine = out.slices[static_cast<size_t>(ps)].layout.rows_of(out.position(ps, d));
        tr.adds = seen == d || !(tr.rows == mine);
        seen = d;
      }
    }
  }
}

// Where each shard of a parameter with copies sits in its bucket's flat
// layout (its bucket, its first value there), by (param id, TP rank):
// only with the values' all-gathers at the next step's start, where each
// member holds its own chunk stepped at the step's end.
using ShardPlaces = std::map<std::pair<int, int>, std::pair<int, int64_t>>;

ShardPlaces copy_shard_places(const LowerContext& ctx, const Lowered& out) {
  ShardPlaces places;
  for (size_t b = 0; b < out.buckets.size(); ++b) {
    const Bucket& bucket = out.buckets[b];
    int64_t at = 0;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const auto p = static_cast<size_t>(bucket.params[i]);
      if (ctx.copy_values[p] > 0) places[{bucket.params[i], bucket.ranks[i]}] = {static_cast<int>(b), at};
      for (const LowerContext::NormTensor& t : ctx.param_tensors[p]) at += t.values;
    }
  }
  return places;
}

// The values of param p's whole tensors, laid end to end (Transfer's copy
// layout), that `device`, one of the `holders` of its shard at TP rank k,
// holds stepped at the end of a step: all of them, or with `places` (the
// gathers at the next step's start) those in its own chunk of the shard's
// bucket. One range: a chunk is contiguous in the bucket, and so are the
// whole tensors' values in it in that layout.
RowRange stepped_copy_values(const LowerContext& ctx, const Lowered& out, const ShardPlaces* places, int p, int k,
                             const std::vector<int>& holders, int device) {
  const int64_t whole = ctx.copy_values[static_cast<size_t>(p)];
  if (places == nullptr || holders.size() < 2) return {0, whole};
  const auto [bucket, shard_at] = places->at({p, k});
  const ValueRange own = out.owned(bucket, device);
  RowRange r{whole, 0};
  int64_t flat = shard_at, laid = 0;   // the tensor's first value in the bucket and in the copy layout
  for (const LowerContext::NormTensor& t : ctx.param_tensors[static_cast<size_t>(p)]) {
    if (t.shard_axis < 0) {
      const int64_t lo = std::max(own.begin, flat), hi = std::min(own.end, flat + t.values);
      if (lo < hi) r = {std::min(r.begin, laid + lo - flat), std::max(r.end, laid + hi - flat)};
      laid += t.values;
    }
    flat += t.values;
  }
  return r.begin < r.end ? r : RowRange{};
}

// The copies (Direction::copy), appended to out.transfers after the
// exchanges'. Every holder of a copy at TP rank k > 0 takes all of it from
// one holder of TP rank 0's, the nearest (rules/links.h nearest_replica,
// the rule re-sharding follows). With the gathers at the next step's start,
// each member of the copy's bucket takes its own chunk instead, from the
// members of TP rank 0's bucket whose chunks hold those values. One
// transfer per (sender, receiver, k), its pieces (Lowered::copy_runs) in
// parameter name order. None for a parameter whose copies step alike
// (copies_step_alike: not in Lowered::copy_holders).
void lower_copies(const Plan& plan, const LowerContext& ctx, Lowered& out) {
  out.copy_runs.clear();
  if (out.copy_holders.empty()) return;
  const bool by_chunk = out.sharded_state && out.gathers_at_start;
  const ShardPlaces places = by_chunk ? copy_shard_places(ctx, out) : ShardPlaces{};
  const ShardPlaces* chunks = by_chunk ? &places : nullptr;
  // Every parameter's copy into one holder at one TP rank, from one
  // holder of rank 0's.
  struct Copy {
    int src = 0, dst = 0, k = 0, op = 0;
    RowRange values;
  };
  std::vector<Copy> copies;
  std::vector<RowRange> have;   // by chunk: what each holder of rank 0's copy holds stepped
  for (const Lowered::CopyHolders& h : out.copy_holders) {
    const int p = h.param;
    const std::vector<int>& first = h.by_rank[0];
    if (by_chunk) {
      have.clear();
      for (int src : first) have.push_back(stepped_copy_values(ctx, out, chunks, p, 0, first, src));
    }
    for (size_t k = 1; k < h.by_rank.size(); ++k) {
      const std::vector<int>& holders = h.by_rank[k];
      for (int dst : holders) {
        const RowRange want = stepped_copy_values(ctx, out, chunks, p, static_cast<int>(k), holders, dst);
        if (want.size() == 0) continue;
        if (!by_chunk) {
          const int src = nearest_replica(first.data(), static_cast<int>(first.size()), dst, plan.devices_per_island);
          copies.push_back({src, dst, static_cast<int>(k), h.op, want});
          continue;
        }
        for (size_t i = 0; i < first.size(); ++i) {
          const RowRange both{std::max(have[i].begin, want.begin), std::min(have[i].end, want.end)};
          if (both.size() > 0) copies.push_back({first[i], dst, static_cast<int>(k), h.op, both});
        }
      }
    }
  }
  // The copies of one (sender, receiver, k) as one transfer, its pieces
  // in parameter name order.
  std::stable_sort(copies.begin(), copies.end(), [](const Copy& a, const Copy& b) {
    return std::tuple{a.src, a.dst, a.k} < std::tuple{b.src, b.dst, b.k};
  });
  for (size_t i = 0; i < copies.size();) {
    const Copy& c = copies[i];
    Transfer t;
    t.dir = Direction::copy;
    t.adds = false;
    t.wave = -1;
    t.slice = c.k;
    t.input = static_cast<int>(out.copy_runs.size());
    t.producer = c.op;
    t.src = c.src;
    t.dst = c.dst;
    std::vector<Lowered::CopyPiece>& run = out.copy_runs.emplace_back();
    for (; i < copies.size() && copies[i].src == c.src && copies[i].dst == c.dst && copies[i].k == c.k; ++i) {
      run.push_back({copies[i].op, copies[i].values.begin, copies[i].values.end});
      t.values += copies[i].values.size();
    }
    t.rows = {0, t.values};
    t.bytes = t.src == t.dst ? 0 : t.values * kWireBytesPerValue;
    out.transfers.push_back(t);
  }
}

}  // namespace

Status lower_programs(const Plan& plan, const LowerContext& ctx, Lowered& out, const LowerOptions& options) {
  SPINDLE_TRY(lower_transfers(plan, ctx, out));
  if (options.copies) lower_copies(plan, ctx, out);
  const ParamIds& ids = ctx.params;
  const DeviceShares shares(out);
  BuilderScratch scratch(ids.names.size());
  // Transfers posted early when the caller allows it and the plan asks for it.
  GradSync sync = lowering_sync(options, plan);
  sync.early_transfers = sync.early_transfers && plan.early_transfers;
  out.grad_norm = sync.grad_norm;
  out.all_devices.clear();
  if (sync.grad_norm)
    for (int d = 0; d < plan.devices; ++d) out.all_devices.push_back(d);
  out.programs.reserve(static_cast<size_t>(plan.devices));
  out.bucket_starts_matter = false;
  for (int d = 0; d < plan.devices; ++d)
    out.programs.push_back(ProgramBuilder(out, ctx, shares.of(d), static_cast<int>(plan.waves.size()),
                                          d, scratch, options.deps, sync, plan.bucket_starts,
                                          out.bucket_starts_matter)
                               .build());
  mark_adds(out);
  return {};
}

Result<Lowered> lower(const Plan& plan, const Model& model, const OpGraph& graph, const LowerOptions& options) {
  const Result<LowerContext> ctx = lower_context(model, graph);
  if (!ctx) return ctx.error();
  Result<Lowered> out = lower_header(plan, *ctx, options);
  if (!out) return out;
  SPINDLE_TRY(lower_programs(plan, *ctx, *out, options));
  return out;
}

namespace {
// A bucket's shards as the program JSON names them: "param@tp_rank".
nlohmann::json shard_names(const Bucket& b) {
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardKey& k : b.shards) shards.push_back(k.first + "@" + std::to_string(k.second));
  return shards;
}
}  // namespace

std::string program_json(const Lowered& l, const OpGraph& graph, int device) {
  using nlohmann::json;
  const Program& prog = l.programs.at(static_cast<size_t>(device));
  auto rows = [](const RowRange& r) { return json::array({r.begin, r.end}); };
  json instrs = json::array();
  for (size_t i = 0; i < prog.instrs.size(); ++i) {
    const Instr& in = prog.instrs[i];
    json j = {{"i", i}, {"kind", kind_name(in.kind)}, {"deps", i < prog.deps.size() ? prog.deps[i] : std::vector<int>{}}};
    switch (in.kind) {
      case InstrKind::post_send:
        j["slice"] = in.slice;
        [[fallthrough]];
      case InstrKind::post_recv:
      case InstrKind::exchange: {
        j["wave"] = in.wave;
        j["dir"] = dir_name(in.dir);
        json sends = json::array(), recvs = json::array(), copies = json::array();
        for (int t : prog.transfers_of(in)) {
          const Transfer& tr = l.transfers[static_cast<size_t>(t)];
          json entry;
          if (tr.dir == Direction::copy) {   // TP rank 0's whole tensors of its params into TP rank tp_rank's
            json params = json::array();
            for (const Lowered::CopyPiece& p : l.copy_runs[static_cast<size_t>(tr.input)])
              params.push_back({{"param", graph.ops[static_cast<size_t>(p.op)].param}, {"values", {p.begin, p.end}}});
            entry = {{"params", std::move(params)}, {"tp_rank", tr.slice}, {"values", rows(tr.rows)}};
          } else {
            entry = {{"tensor", graph.ops[static_cast<size_t>(tr.producer)].id}, {"rows", rows(tr.rows)}};
          }
          json* list = &copies;
          if (tr.src != tr.dst) {   // a message: its peer, bytes and tag
            const bool sent = tr.src == device;
            entry[sent ? "to" : "from"] = sent ? tr.dst : tr.src;
            entry["bytes"] = tr.bytes;
            entry["tag"] = t;
            list = sent ? &sends : &recvs;
          }
          if (in.dir == Direction::backward && tr.dst == device) entry["adds"] = tr.adds;
          list->push_back(std::move(entry));
        }
        if (in.kind != InstrKind::post_recv) j["sends"] = sends;
        if (in.kind != InstrKind::post_send) j["recvs"] = recvs;
        if (in.kind == InstrKind::exchange) j["copies"] = copies;
        break;
      }
      case InstrKind::forward:
      case InstrKind::backward: {
        const LoweredSlice& s = l.slices[static_cast<size_t>(in.slice)];
        const int pos = l.position(in.slice, device);
        j["wave"] = in.wave;
        j["metaop"] = s.metaop;
        j["operators"] = json::array({graph.ops[static_cast<size_t>(s.ops.front())].id,
                                      graph.ops[static_cast<size_t>(s.ops.back())].id});
        j["count"] = s.ops.size();
        j["rows"] = rows(s.layout.rows_of(pos));
        j["tp_rank"] = s.layout.tp_rank_of(pos);
        j["group"] = s.devices;
        break;
      }
      case InstrKind::allreduce_wait:
        j["group"] = l.buckets[static_cast<size_t>(in.bucket)].devices;
        break;
      case InstrKind::allreduce:
      case InstrKind::allreduce_start: {
        const Bucket& b = l.buckets[static_cast<size_t>(in.bucket)];
        j["group"] = b.devices;
        j["shards"] = shard_names(b);
        j["bytes"] = l.sharded_state ? l.gather_bytes(in.bucket) : b.bytes;
        if (l.sharded_state) j["reduce_scatter"] = true;   // each member gets the sum of its chunk alone
        break;
      }
      case InstrKind::wait_sends: break;
      case InstrKind::grad_norm: j["bytes"] = kNormBytes; break;   // over every device
      case InstrKind::norm_sum: j["values"] = in.values; break;      // the gradient values it reads
      case InstrKind::optimizer:   // a bucket's shards (sharded: this device's chunk of them); else every other one held here
        if (in.bucket >= 0) {
          j["shards"] = shard_names(l.buckets[static_cast<size_t>(in.bucket)]);
          if (l.sharded_state) {
            const ValueRange own = l.owned(in.bucket, device);
            j["chunk"] = {own.begin, own.end};
          }
        }
        j["values"] = in.values;
        break;
      case InstrKind::allgather:
      case InstrKind::allgather_start:
        j["group"] = l.buckets[static_cast<size_t>(in.bucket)].devices;
        j["bytes"] = l.gather_bytes(in.bucket);
        break;
      case InstrKind::allgather_wait:
        j["group"] = l.buckets[static_cast<size_t>(in.bucket)].devices;
        break;
    }
    instrs.push_back(std::move(j));
  }
  // One instruction per line, keys sorted: diffable and deterministic.
  const ProgramBytes b = l.bytes(device);
  json bytes = {{"sent", b.sent}, {"received", b.received}, {"reduced", b.reduced}};
  if (l.sharded_state) bytes["gathered"] = b.gathered;
  std::string out = "{\n \"format\": \"spindle-program\",\n \"version\": " + std::to_string(kProgramVersion) +
                    ",\n \"device\": " + std::to_string(device) + ",\n \"devices\": " + std::to_string(l.devices) +
                    ",\n \"bytes\": " + bytes.dump() + ",\n \"instructions\": [";
  for (size_t i = 0; i < instrs.size(); ++i) out += (i ? ",\n  " : "\n  ") + instrs[i].dump();
  out += instrs.empty() ? "]\n}\n" : "\n ]\n}\n";
  return out;
}

GradSync sync_for_run(const Plan& plan, const SyncFlags& flags, std::vector<std::string>& notes) {
  GradSync sync = planned_sync(plan);
  auto mib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", static_cast<double>(bytes) / (1 << 20));
    return std::string(text);
  };
  if (flags.no_overlap && plan.overlap) {
    sync.overlap = false;
    notes.push_back("--no-overlap: the plan was simulated with its all-reduces overlapping the backward pass");
  }
  if (flags.no_early_transfers && plan.overlap && plan.early_transfers)
    notes.push_back("--no-early-transfers: the plan was simulated with its transfers posted early");
  sync.early_transfers = !flags.no_early_transfers;
  if (flags.grad_norm && !plan.grad_norm) {
    sync.grad_norm = true;
    notes.push_back("the gradient norm before the optimizer (spindle-run --clip-grad, spindle-plan --grad-norm): "
                    "the plan was simulated without it");
  }
  if (flags.bucket_bytes && *flags.bucket_bytes != plan.bucket_bytes) {
    sync.bucket_bytes = *flags.bucket_bytes;
    notes.push_back("--bucket-mb " + mib(*flags.bucket_bytes) + ": the plan was simulated with buckets of " +
                    mib(plan.bucket_bytes) + " MiB (spindle-plan --bucket-mb)");
  }
  return sync;
}

}  // namespace spindle::plan
