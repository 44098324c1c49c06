#include "libplan/waves/schedule.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

#include "libplan/util/radix_sort.h"

namespace spindle::plan {

namespace {

// Relative overrun of the aligned wave time a slot may take to fit one more
// operator (also absorbs rounding of exact multiples). Default 1%.
constexpr double kAlignSlack = 0.01;

// Lookahead budget: lengths tried per wave x MetaOps of the pool, at most
// this (so up to 2048 MetaOps a pool keeps a lookahead of 8; the shipped
// workloads have at most a few dozen per level).
constexpr int kLookaheadBudget = 16384;

// Slots of a wave up to which candidate lengths are merged run by run rather
// than sorted at once (see draft).
constexpr size_t kMergeRunsUpTo = 32;
// Candidate lengths, or ready MetaOps, from which they are sorted by their
// bits (radix_sort_non_negative, radix_order_descending) rather than by
// std::sort or a heap: the same order, sooner from about this many on
// (this VM, lengths as the scheduler makes them: 289 of them sort in 9.6
// us against 11.0, 1850 in 51 against 93, 128 in 4.8 against 4.2; ready
// MetaOps, 40% of them popped from the heap: 256 in 8.1 us against 9.8,
// 900 in 27 against 42, 128 in 4.6 against 4.3). The 50-task workload
// averages 289 lengths and 50 ready MetaOps a draft, the 1000-task one
// 1850 and 900.
constexpr size_t kRadixSortFrom = 256;

// Mutable per-MetaOp state while scheduling.
struct ItemState {
  std::vector<AllocTuple> queue;   // remaining tuples (count > 0), in order
  int next = 0;                    // first operator not yet scheduled
  int remaining = 0;               // operators not yet scheduled
  int finished_wave = -1;          // wave of its last slot, -1 while running
};

double tuple_ms(const ScheduleItem& it, const AllocTuple& t) {
  return t.count * it.time_ms[static_cast<size_t>(t.devices)];
}

double remaining_work_ms(const ScheduleItem& it, const ItemState& st) {
  double sum = 0;
  for (const AllocTuple& t : st.queue) sum += tuple_ms(it, t);
  return sum;
}

// A slot chosen for the current wave, before alignment.
struct Pick {
  int metaop = 0;
  int devices = 0;
  int tuple = -1;       // index into the queue of the proposed tuple; -1 if none
  int align_count = 0;  // operators of the proposed tuple: the time it asks for
};

// Removes `count` operators from the state's queue, from tuple `first_tuple`
// first, then from the others in order, those of at most `max_devices`
// devices before the wider ones.
void consume(ItemState& st, int first_tuple, int count, int max_devices) {
  auto take = [&](AllocTuple& t) {
    const int k = std::min(t.count, count);
    t.count -= k;
    count -= k;
  };
  if (first_tuple >= 0) take(st.queue[static_cast<size_t>(first_tuple)]);
  for (AllocTuple& t : st.queue) {
    if (count == 0) break;
    if (t.devices <= max_devices) take(t);
  }
  for (AllocTuple& t : st.queue) {
    if (count == 0) break;
    take(t);
  }
  st.queue.erase(std::remove_if(st.queue.begin(), st.queue.end(),
                                [](const AllocTuple& t) { return t.count == 0; }),
                 st.queue.end());
}

// Operators left in the queued tuples of at most `devices` devices.
int ops_no_wider(const ItemState& st, int devices) {
  int n = 0;
  for (const AllocTuple& t : st.queue)
    if (t.devices <= devices) n += t.count;
  return n;
}

// The first queued tuple of exactly `devices` devices; -1 if none.
int tuple_of(const ItemState& st, int devices) {
  for (size_t t = 0; t < st.queue.size(); ++t)
    if (st.queue[t].devices == devices) return static_cast<int>(t);
  return -1;
}

// A tuple proposed for the current wave.
struct Candidate {
  int devices;
  double ms;
  int metaop;
  int tuple;
};

bool by_devices_then_time(const Candidate& a, const Candidate& b) {
  if (a.devices != b.devices) return a.devices > b.devices;
  if (a.ms != b.ms) return a.ms > b.ms;
  if (a.metaop != b.metaop) return a.metaop < b.metaop;
  return a.tuple < b.tuple;
}

// Operators a slot of per-operator time t_ms runs in a wave aligned to
// align_ms: those that fit within kAlignSlack, at least one, at most `remaining`.
int fitting_count(double align_ms, double t_ms, int remaining) {
  const double fit = std::floor(align_ms / t_ms * (1 + kAlignSlack));
  return std::clamp(static_cast<int>(std::min(fit, 1e9)), 1, remaining);
}

// The next wave before its length is fixed: the slots (device counts) and,
// without paper_rules, the candidate lengths with their fill.
struct WaveDraft {
  std::vector<Pick> picks;          // ascending metaop id
  double paper_align_ms = 0;        // shortest tuple, or longest single operator
  std::vector<double> lengths_ms;   // candidate alignments, ascending
  std::vector<double> fills;        // busy device-ms per ms of each candidate
  // Per candidate: lengths with the same value run every slot with the
  // same operator count, hence commit to the same wave and state.
  std::vector<int> counts_id;
};

class PoolScheduler {
 public:
  PoolScheduler(const std::vector<ScheduleItem>& items, int devices, const ScheduleOptions& options)
      : items_(items), devices_(devices), options_(options), pick_of_(items.size(), -1),
        work_(items.size()) {}

  // Drafts wave `wave` of `pool` from `state`; false when the pool is done.
  bool draft(const std::vector<ItemState>& state, const std::vector<int>& pool, int wave, WaveDraft& d);
  // The alignment the options choose without lookahead.
  double default_align(const WaveDraft& d) const;
  // The most operators pick `pk` may run in one wave: every remaining one,
  // or without narrow_tails those of the queued tuples no wider than it,
  // its own among them (a pick is never narrower than its tuple: proposing,
  // widening and extending only grow it), at least 1.
  int slot_limit(const ItemState& st, const Pick& pk) const {
    if (options_.narrow_tails || options_.paper_rules) return st.remaining;
    return std::clamp(ops_no_wider(st, pk.devices), 1, st.remaining);
  }
  // Applies a draft aligned to align_ms: advances `state`; appends the
  // slots to `out` when not null (out->ms is left to the caller). Returns the
  // wave's length, ms (its longest slot).
  double commit(std::vector<ItemState>& state, const WaveDraft& d, double align_ms, int wave,
                AbstractWave* out) const;
  // Completes the pool greedily from `state` (consumed: left at the end of
  // the pool); returns the time it takes, the sum of its waves' ms in order.
  // With `waves_ms`, also appends each wave's ms to it.
  double rollout(std::vector<ItemState>& state, const std::vector<int>& pool, int wave,
                 std::vector<double>* waves_ms);

 private:
  // ready_ by remaining work, most first (ties: the lower id), produced on
  // demand from a heap: a wave whose devices fill after k MetaOps costs
  // O(ready + k log ready) rather than a sort of every ready MetaOp (with
  // few devices and many tasks, most are never reached). From
  // kRadixSortFrom ready MetaOps they are all ordered at once by their
  // work's bits (radix_order_descending: the same order, sooner there even
  // when only 40% are reached; 1000 tasks have about 900 ready a draft).
  void start_by_work() {
    keyed_.clear();
    order_.clear();
    if (ready_.size() >= kRadixSortFrom) {
      order_ = ready_;   // ascending: ties stay by id
      if (radix_order_descending(order_, work_, radix_items_)) return;
      order_.clear();
    }
    for (int m : ready_) keyed_.emplace_back(-work_[static_cast<size_t>(m)], m);
    std::make_heap(keyed_.begin(), keyed_.end(), std::greater<>());
  }
  // The i-th ready MetaOp in that order; -1 past the last.
  int by_work(size_t i) {
    while (order_.size() <= i && !keyed_.empty()) {
      std::pop_heap(keyed_.begin(), keyed_.end(), std::greater<>());
      order_.push_back(keyed_.back().second);
      keyed_.pop_back();
    }
    return i < order_.size() ? order_[i] : -1;
  }

  // The steps of draft, in order (contracts at their definitions).
  bool collect_ready(const std::vector<ItemState>& state, const std::vector<int>& pool, int wave);
  void propose_first_fit(const std::vector<ItemState>& state, std::vector<Pick>& picks, int& free);
  void propose_smallest_then_widen(const std::vector<ItemState>& state, std::vector<Pick>& picks, int& free);
  void extend(const std::vector<ItemState>& state, std::vector<Pick>& picks, int free);
  void candidate_lengths(const std::vector<ItemState>& state, double longest_op_ms, WaveDraft& d);
  void candidate_fills(const std::vector<ItemState>& state, WaveDraft& d);

  double op_ms(const Pick& pk) const {
    return items_[static_cast<size_t>(pk.metaop)].time_ms[static_cast<size_t>(pk.devices)];
  }

  const std::vector<ScheduleItem>& items_;
  int devices_;
  ScheduleOptions options_;
  std::vector<int> pick_of_;   // scratch: index into the draft's picks, -1 when none
  std::vector<double> work_;   // scratch: remaining work per ready MetaOp, ms
  std::vector<int> ready_, order_;
  std::vector<std::pair<double, int>> keyed_;   // heap of start_by_work / by_work
  // Scratch: per pick, its operator count at the current candidate length
  // (0 before the first), the length from which it may grow (+infinity once
  // it runs all its remaining operators) and its busy device-ms.
  struct SlotFit {
    double op_ms;
    int remaining, devices, count;
    double next_ms;
    double busy_ms;   // count * op_ms * devices
  };
  std::vector<SlotFit> fits_;
  std::vector<Candidate> cands_;
  std::vector<double> merged_;   // scratch: candidate lengths merged so far
  std::vector<uint64_t> sort_keys_;   // scratch of radix_sort_non_negative
  std::vector<RadixItem> radix_items_;   // scratch of radix_order_descending
  WaveDraft rollout_draft_;
};

// Step 1 of draft: ready_ = the MetaOps of `pool` with operators left whose
// inputs all finished before wave `wave`, ascending; work_ of each = its
// remaining work, ms. False when no MetaOp of the pool has operators left.
bool PoolScheduler::collect_ready(const std::vector<ItemState>& state, const std::vector<int>& pool, int wave) {
  ready_.clear();
  bool pending = false;
  for (int m : pool) {
    const ItemState& st = state[static_cast<size_t>(m)];
    if (st.remaining == 0) continue;
    pending = true;
    bool inputs_done = true;
    for (int in : items_[static_cast<size_t>(m)].inputs) {
      const int f = state[static_cast<size_t>(in)].finished_wave;
      if (f < 0 || f >= wave) inputs_done = false;
    }
    if (inputs_done) ready_.push_back(m);
  }
  if (!pending) return false;
  assert(!ready_.empty());  // inputs outside the pool finished before it started

  for (int m : ready_)
    work_[static_cast<size_t>(m)] =
        remaining_work_ms(items_[static_cast<size_t>(m)], state[static_cast<size_t>(m)]);
  return true;
}

// Step 2 of draft with paper_rules: first fit over every queued tuple of the
// ready MetaOps, more devices first, then longer time, then lower id; at
// most one slot per MetaOp. Appends to `picks` (pick_of_ set) and takes the
// devices from `free`.
void PoolScheduler::propose_first_fit(const std::vector<ItemState>& state, std::vector<Pick>& picks, int& free) {
  // Propose: first fit, more devices first, then longer time, then lower id.
  cands_.clear();
  for (int m : ready_) {
    const ScheduleItem& it = items_[static_cast<size_t>(m)];
    const ItemState& st = state[static_cast<size_t>(m)];
    for (size_t t = 0; t < st.queue.size(); ++t)
      cands_.push_back({st.queue[t].devices, tuple_ms(it, st.queue[t]), m, static_cast<int>(t)});
  }
  std::sort(cands_.begin(), cands_.end(), by_devices_then_time);
  for (const Candidate& c : cands_) {
    if (pick_of_[static_cast<size_t>(c.metaop)] >= 0 || c.devices > free) continue;
    pick_of_[static_cast<size_t>(c.metaop)] = static_cast<int>(picks.size());
    const AllocTuple& t = state[static_cast<size_t>(c.metaop)].queue[static_cast<size_t>(c.tuple)];
    picks.push_back({c.metaop, c.devices, c.tuple, t.count});
    free -= c.devices;
  }
}

// Step 2 of draft without paper_rules: each ready MetaOp, most remaining
// work first, gets its smallest tuple where it fits (those with less than
// defer_fraction of the most work wait for a later wave), then wider tuples
// of the same MetaOps replace them where the devices allow. Appends to `picks` (pick_of_ set) and takes
// the devices from `free`.
void PoolScheduler::propose_smallest_then_widen(const std::vector<ItemState>& state, std::vector<Pick>& picks,
                                                int& free) {
  // Propose: every ready MetaOp first gets its smallest tuple (most
  // remaining work first), so none is starved by a few wide tuples...
  // ready_ is ascending, so ties on work go to the lower id: the order a
  // stable sort by work gives, without its temporary buffer.
  start_by_work();
  const double defer_below_ms =
      by_work(0) < 0 ? 0 : options_.defer_fraction * work_[static_cast<size_t>(by_work(0))];
  for (size_t i = 0; free > 0; ++i) {   // once no device is free, no tuple fits
    const int m = by_work(i);
    if (m < 0) break;
    if (work_[static_cast<size_t>(m)] < defer_below_ms) break;   // has slack: runs later
    const ItemState& st = state[static_cast<size_t>(m)];
    int best = 0;
    for (size_t t = 1; t < st.queue.size(); ++t)
      if (st.queue[t].devices < st.queue[static_cast<size_t>(best)].devices) best = static_cast<int>(t);
    const AllocTuple& t = st.queue[static_cast<size_t>(best)];
    if (t.devices > free) continue;   // waits: a starved slot would stretch the wave
    pick_of_[static_cast<size_t>(m)] = static_cast<int>(picks.size());
    picks.push_back({m, t.devices, best, t.count});
    free -= t.devices;
  }
  // ...then wider tuples replace them where the devices allow: with
  // widen_by_work the MetaOp with the most remaining work (the level's
  // critical path) first, then (or else) in the paper's order (more
  // devices, longer time, lower id).
  cands_.clear();
  for (const Pick& pk : picks) {
    const ScheduleItem& it = items_[static_cast<size_t>(pk.metaop)];
    const ItemState& st = state[static_cast<size_t>(pk.metaop)];
    for (size_t t = 0; t < st.queue.size(); ++t)
      if (st.queue[t].devices > pk.devices)
        cands_.push_back({st.queue[t].devices, tuple_ms(it, st.queue[t]), pk.metaop, static_cast<int>(t)});
  }
  std::sort(cands_.begin(), cands_.end(), [&](const Candidate& a, const Candidate& b) {
    const double wa = work_[static_cast<size_t>(a.metaop)], wb = work_[static_cast<size_t>(b.metaop)];
    if (options_.widen_by_work && wa != wb) return wa > wb;
    return by_devices_then_time(a, b);
  });
  for (const Candidate& c : cands_) {
    Pick& pk = picks[static_cast<size_t>(pick_of_[static_cast<size_t>(c.metaop)])];
    if (pk.devices >= c.devices || c.devices - pk.devices > free) continue;
    free -= c.devices - pk.devices;
    pk.devices = c.devices;
    pk.tuple = c.tuple;
    pk.align_count = state[static_cast<size_t>(c.metaop)].queue[static_cast<size_t>(c.tuple)].count;
  }
}

// Step 3 of draft: the `free` devices left after proposing go to ready
// MetaOps (see below); grown or added slots in `picks` ask to run all their
// MetaOp's remaining operators. Needs the by_work order (started here with
// paper_rules; propose_smallest_then_widen started it otherwise).
void PoolScheduler::extend(const std::vector<ItemState>& state, std::vector<Pick>& picks, int free) {
  // Extend: idle devices go to the ready MetaOp with the most remaining
  // work that can use them (each MetaOp at most once: it takes the largest
  // valid count that fits, so it cannot grow again in this wave). A MetaOp
  // left out joins only if one operator on those devices fits in the
  // longest proposed tuple: a starved slot must not stretch the wave.
  double proposed_ms = 0;
  for (const Pick& pk : picks)
    proposed_ms = std::max(proposed_ms, pk.align_count * items_[static_cast<size_t>(pk.metaop)]
                                                              .time_ms[static_cast<size_t>(pk.devices)]);
  //
  // One pass in order of remaining work (ties: the lower id) picks the same
  // MetaOps as rescanning for the most work each time: free only shrinks, so
  // a MetaOp that cannot use the idle devices now cannot later either (its
  // largest fitting count only shrinks, its one-operator time only grows),
  // and one that grew took the largest count it could.
  if (options_.paper_rules) start_by_work();
  for (size_t i = 0; free > 0; ++i) {
    const int m = by_work(i);
    if (m < 0) break;
    int best = -1, best_devices = 0;
    {
      const ScheduleItem& it = items_[static_cast<size_t>(m)];
      const int p = pick_of_[static_cast<size_t>(m)];
      const int have = p >= 0 ? picks[static_cast<size_t>(p)].devices : 0;
      int most = have + free;
      if (options_.extend_cap > 0) most = std::min(most, std::max(have, options_.extend_cap));
      const auto up = std::upper_bound(it.valid.begin(), it.valid.end(), most);
      if (up == it.valid.begin() || *(up - 1) <= have) continue;
      if (p < 0 && !picks.empty() && it.time_ms[static_cast<size_t>(*(up - 1))] > proposed_ms * (1 + kAlignSlack))
        continue;
      best = m;
      best_devices = *(up - 1);
    }
    const int p = pick_of_[static_cast<size_t>(best)];
    const int total = state[static_cast<size_t>(best)].remaining;
    if (p >= 0) {
      Pick& pk = picks[static_cast<size_t>(p)];
      free -= best_devices - pk.devices;
      pk.devices = best_devices;
      pk.align_count = total;
    } else {
      pick_of_[static_cast<size_t>(best)] = static_cast<int>(picks.size());
      picks.push_back({best, best_devices, -1, total});
      free -= best_devices;
    }
  }
}

// Step 5 of draft, without paper_rules: d.lengths_ms = the candidate
// alignments, ascending and distinct, for d.picks (ascending metaop);
// longest_op_ms is the longest single operator of any slot, ms.
void PoolScheduler::candidate_lengths(const std::vector<ItemState>& state, double longest_op_ms, WaveDraft& d) {
  // Candidate lengths: wherever some slot ends an operator, ascending and
  // distinct: each slot's multiples k * t (k from the first reaching the
  // longest operator up to its remaining operators). Each run is ascending:
  // with few slots each is merged into the lengths so far (linear per run,
  // cheaper than a sort for the shipped workloads); with many, merging costs
  // slots x lengths (quadratic in the tasks), so they are sorted once. Both
  // give the same list.
  const bool merge_runs = d.picks.size() <= kMergeRunsUpTo;
  for (const Pick& pk : d.picks) {
    const double t = op_ms(pk);
    const int r = state[static_cast<size_t>(pk.metaop)].remaining;
    const size_t from = d.lengths_ms.size();
    for (int k = std::max(1, static_cast<int>(std::ceil(longest_op_ms / t * (1 - 1e-12)))); k <= r; ++k)
      d.lengths_ms.push_back(k * t);
    if (!merge_runs || from == 0 || from == d.lengths_ms.size()) continue;
    merged_.resize(d.lengths_ms.size());
    std::merge(d.lengths_ms.begin(), d.lengths_ms.begin() + static_cast<std::ptrdiff_t>(from),
               d.lengths_ms.begin() + static_cast<std::ptrdiff_t>(from), d.lengths_ms.end(), merged_.begin());
    d.lengths_ms.swap(merged_);
  }
  if (!merge_runs && (d.lengths_ms.size() < kRadixSortFrom || !radix_sort_non_negative(d.lengths_ms, sort_keys_)))
    std::sort(d.lengths_ms.begin(), d.lengths_ms.end());
  d.lengths_ms.erase(std::unique(d.lengths_ms.begin(), d.lengths_ms.end()), d.lengths_ms.end());
}

// Step 6 of draft, without paper_rules: d.fills and d.counts_id, one per
// d.lengths_ms (see WaveDraft), for d.picks.
void PoolScheduler::candidate_fills(const std::vector<ItemState>& state, WaveDraft& d) {
  // Fill of each length: busy device-ms per ms of the longest slot. A
  // slot's operator count only grows with the length, so it is recomputed
  // only once the length may have reached the next count (a threshold a hair
  // early, so no change is missed): the same counts, far fewer divisions.
  // Below the earliest such threshold (`next_change_ms`) no count changes,
  // so the fill is the previous length's, bit for bit; otherwise busy is
  // summed over the slots in order as always, and the longest slot, which
  // only grows, is kept up to date.
  fits_.clear();
  for (const Pick& pk : d.picks)
    fits_.push_back({op_ms(pk), slot_limit(state[static_cast<size_t>(pk.metaop)], pk), pk.devices, 0, 0.0, 0.0});
  d.fills.reserve(d.lengths_ms.size());
  d.counts_id.reserve(d.lengths_ms.size());
  int counts_id = -1;
  double fill = 0, length = 0;
  double next_change_ms = 0;   // every next_ms starts at 0: the first length computes
  for (double len : d.lengths_ms) {
    if (len >= next_change_ms) {
      double busy = 0;
      next_change_ms = std::numeric_limits<double>::infinity();
      for (SlotFit& f : fits_) {
        if (len >= f.next_ms) {
          f.count = fitting_count(len, f.op_ms, f.remaining);
          const double ms = f.count * f.op_ms;
          f.busy_ms = ms * f.devices;
          length = std::max(length, ms);
          f.next_ms = f.count < f.remaining ? (f.count + 1) * f.op_ms / (1 + kAlignSlack) * (1 - 1e-9)
                                            : std::numeric_limits<double>::infinity();
        }
        next_change_ms = std::min(next_change_ms, f.next_ms);
        busy += f.busy_ms;
      }
      fill = busy / length;
      ++counts_id;
    }
    d.fills.push_back(fill);
    d.counts_id.push_back(counts_id);
  }
}

bool PoolScheduler::draft(const std::vector<ItemState>& state, const std::vector<int>& pool,
                          int wave, WaveDraft& d) {
  // 1. The ready MetaOps and their remaining work.
  if (!collect_ready(state, pool, wave)) return false;

  // 2-3. The slots: propose tuples, then give idle devices away.
  std::vector<Pick>& picks = d.picks;
  picks.clear();
  int free = devices_;
  if (options_.paper_rules) {
    propose_first_fit(state, picks, free);
  } else {
    propose_smallest_then_widen(state, picks, free);
  }
  extend(state, picks, free);
  for (const Pick& pk : picks) pick_of_[static_cast<size_t>(pk.metaop)] = -1;
  std::sort(picks.begin(), picks.end(),
            [](const Pick& a, const Pick& b) { return a.metaop < b.metaop; });

  // 4. The paper's alignment: the shortest tuple's time. Every slot runs at
  // least one operator, so the wave lasts at least the longest single
  // operator: align to that when it is longer, so the others fill it.
  double shortest_ms = std::numeric_limits<double>::infinity();
  double longest_op_ms = 0;
  for (const Pick& pk : picks) {
    shortest_ms = std::min(shortest_ms, pk.align_count * op_ms(pk));
    longest_op_ms = std::max(longest_op_ms, op_ms(pk));
  }
  d.paper_align_ms = std::max(shortest_ms, longest_op_ms);
  d.lengths_ms.clear();
  d.fills.clear();
  d.counts_id.clear();
  if (options_.paper_rules) return true;

  // 5-6. The candidate lengths and their fill.
  candidate_lengths(state, longest_op_ms, d);
  candidate_fills(state, d);
  return true;
}

double PoolScheduler::default_align(const WaveDraft& d) const {
  if (options_.paper_rules || d.lengths_ms.empty()) return d.paper_align_ms;
  // Best fill; ties: the longer wave (fewer boundaries).
  size_t best = 0;
  for (size_t c = 1; c < d.fills.size(); ++c)
    if (d.fills[c] >= d.fills[best]) best = c;
  return d.lengths_ms[best];
}

double PoolScheduler::commit(std::vector<ItemState>& state, const WaveDraft& d, double align_ms, int wave,
                             AbstractWave* out) const {
  double wave_ms = 0;
  for (const Pick& pk : d.picks) {
    ItemState& st = state[static_cast<size_t>(pk.metaop)];
    const double t = op_ms(pk);
    // A slot whose tuple ends early keeps going with the MetaOp's later
    // operators on the same devices rather than leave them idle.
    const int count = fitting_count(align_ms, t, slot_limit(st, pk));
    if (out != nullptr) out->slots.push_back({pk.metaop, st.next, count, pk.devices, count * t});
    wave_ms = std::max(wave_ms, count * t);
    st.next += count;
    st.remaining -= count;
    consume(st, pk.tuple, count, options_.narrow_tails ? std::numeric_limits<int>::max() : pk.devices);
    if (st.remaining == 0) st.finished_wave = wave;
  }
  return wave_ms;
}

double PoolScheduler::rollout(std::vector<ItemState>& state, const std::vector<int>& pool, int wave,
                              std::vector<double>* waves_ms) {
  double total = 0;
  while (draft(state, pool, wave, rollout_draft_)) {
    const double ms = commit(state, rollout_draft_, default_align(rollout_draft_), wave, nullptr);
    if (waves_ms != nullptr) waves_ms->push_back(ms);
    total += ms;
    ++wave;
  }
  return total;
}

// Runs waves until every MetaOp of `pool` is scheduled, appending to `out`.
// With lookahead, each wave tries the `lookahead` best-filling lengths, each
// followed by a greedy rollout of the rest of the pool, and keeps the one
// that finishes the pool first (ties: the better fill).
//
// Candidates with the operator counts of one tried before are skipped (the
// same wave, the same total: never strictly better).
// Reuse: the greedy rollout that followed the length chosen for a wave is
// exactly what trying the default (best-filling) length at the next wave
// would replay (same state, same drafts, same default lengths), so its waves'
// ms are kept (`greedy_ms`, from `greedy_at`) and summed in the same order
// instead of rolling out again; committing the default length (no lookahead)
// just moves along that record.
void run_pool(const std::vector<ScheduleItem>& items, std::vector<ItemState>& state,
              const std::vector<int>& pool, int devices, const ScheduleOptions& options,
              std::vector<AbstractWave>& out) {
  PoolScheduler sched(items, devices, options);
  WaveDraft d;
  std::vector<size_t> by_fill;
  // Scratch state of the rollouts. Commits change only MetaOps of the pool,
  // so after this full copy only those are reset from `state` per trial.
  std::vector<ItemState> trial = state;
  // Per wave, the ms of the greedy continuation from `state` (the default
  // length at every wave), from index greedy_at on; valid when greedy_known.
  std::vector<double> greedy_ms, trial_ms, best_ms;
  std::vector<int> tried_counts;   // counts_id of the lengths tried at this wave
  size_t greedy_at = 0;
  bool greedy_known = false;
  // The lookahead's budget in steps, not time (style: deterministic): each
  // tried length rolls out the rest of the pool, so the lengths tried shrink
  // as the pool grows and the scheduler stays near-linear in the MetaOps.
  const int lookahead =
      options.lookahead > 1
          ? std::min(options.lookahead, std::max(1, kLookaheadBudget / std::max(1, static_cast<int>(pool.size()))))
          : options.lookahead;
  for (;;) {
    const int wave = static_cast<int>(out.size());
    if (!sched.draft(state, pool, wave, d)) return;
    double align_ms = sched.default_align(d);
    if (lookahead > 1 && !options.paper_rules && d.lengths_ms.size() > 1) {
      // The `lookahead` best fills (ties: the longer first). The order is
      // total, so only those need sorting.
      by_fill.resize(d.lengths_ms.size());
      std::iota(by_fill.begin(), by_fill.end(), size_t{0});
      const auto tried = std::min(by_fill.size(), static_cast<size_t>(lookahead));
      std::partial_sort(by_fill.begin(), by_fill.begin() + static_cast<std::ptrdiff_t>(tried), by_fill.end(),
                        [&](size_t a, size_t b) {
                          if (d.fills[a] != d.fills[b]) return d.fills[a] > d.fills[b];
                          return a > b;   // longer first
                        });
      by_fill.resize(tried);
      double best_total = std::numeric_limits<double>::infinity();
      const double default_ms = align_ms;
      bool chosen = false;
      tried_counts.clear();
      for (size_t c : by_fill) {
        // A length running every slot with the same operator counts as one
        // tried before gives the same wave and total: it cannot be better.
        if (std::find(tried_counts.begin(), tried_counts.end(), d.counts_id[c]) != tried_counts.end()) continue;
        tried_counts.push_back(d.counts_id[c]);
        double total = 0;
        trial_ms.clear();
        if (greedy_known && greedy_at < greedy_ms.size() && d.lengths_ms[c] == default_ms) {
          // This wave and the rollout after it are the recorded greedy waves:
          // the same sum, first wave + (0 + the rest in order).
          double rest = 0;
          for (size_t k = greedy_at + 1; k < greedy_ms.size(); ++k) {
            rest += greedy_ms[k];
            trial_ms.push_back(greedy_ms[k]);
          }
          total = greedy_ms[greedy_at] + rest;
        } else {
          for (int m : pool) trial[static_cast<size_t>(m)] = state[static_cast<size_t>(m)];
          const double first_ms = sched.commit(trial, d, d.lengths_ms[c], wave, nullptr);
          total = first_ms + sched.rollout(trial, pool, wave + 1, &trial_ms);
        }
        if (total < best_total * (1 - 1e-12)) {
          best_total = total;
          align_ms = d.lengths_ms[c];
          best_ms.swap(trial_ms);
          chosen = true;
        }
      }
      // The greedy continuation after the chosen length is its rollout.
      greedy_ms.swap(best_ms);
      greedy_at = 0;
      greedy_known = chosen;
    } else if (greedy_known) {
      ++greedy_at;   // the default length: the next recorded greedy wave
    }
    AbstractWave w;
    w.ms = sched.commit(state, d, align_ms, wave, &w);
    out.push_back(std::move(w));
  }
}

// The state before any wave: each MetaOp's tuples as its queue.
std::vector<ItemState> initial_state(const std::vector<ScheduleItem>& items, int devices) {
  (void)devices;   // checked by the assertion only
  std::vector<ItemState> state(items.size());
  for (size_t m = 0; m < items.size(); ++m) {
    ItemState& st = state[m];
    for (const AllocTuple& t : items[m].tuples)
      if (t.count > 0) st.queue.push_back(t);
    st.remaining = items[m].length;
    assert(!items[m].valid.empty() && items[m].valid.back() <= devices);
    // Operators the allocation left out (should not happen) run on the
    // smallest valid count.
    int covered = 0;
    for (const AllocTuple& t : st.queue) covered += t.count;
    if (covered < st.remaining) st.queue.push_back({items[m].valid.front(), st.remaining - covered});
  }
  return state;
}

// Advances `state` by the slots of wave `wave`, consuming each slot's
// operators from a tuple of its device count first, when there is one.
void apply_wave(std::vector<ItemState>& state, const AbstractWave& w, int wave) {
  for (const AbstractSlot& s : w.slots) {
    ItemState& st = state[static_cast<size_t>(s.metaop)];
    st.next += s.count;
    st.remaining -= s.count;
    consume(st, tuple_of(st, s.devices), s.count, std::numeric_limits<int>::max());
    if (st.remaining == 0) st.finished_wave = wave;
  }
}

std::vector<int> level_pool(const std::vector<ScheduleItem>& items, int level) {
  std::vector<int> pool;
  for (size_t m = 0; m < items.size(); ++m)
    if (items[m].level == level) pool.push_back(static_cast<int>(m));
  return pool;
}

}  // namespace

bool narrows_tails(const std::vector<ScheduleItem>& items, const std::vector<AbstractWave>& waves) {
  std::vector<ItemState> state = initial_state(items, std::numeric_limits<int>::max());
  for (const AbstractWave& w : waves)
    for (const AbstractSlot& s : w.slots) {
      ItemState& st = state[static_cast<size_t>(s.metaop)];
      if (s.count > std::max(ops_no_wider(st, s.devices), 1)) return true;
      consume(st, tuple_of(st, s.devices), s.count, s.devices);
    }
  return false;
}

std::vector<AbstractWave> schedule_waves(const std::vector<ScheduleItem>& items, int devices,
                                         const ScheduleOptions& options) {
  std::vector<ItemState> state = initial_state(items, devices);
  int levels = 0;
  for (const ScheduleItem& it : items) levels = std::max(levels, it.level + 1);
  std::vector<AbstractWave> out;
  std::vector<int> pool;
  if (options.cross_level) {
    for (size_t m = 0; m < items.size(); ++m) pool.push_back(static_cast<int>(m));
    run_pool(items, state, pool, devices, options, out);
    return out;
  }
  for (int level = 0; level < levels; ++level)
    run_pool(items, state, level_pool(items, level), devices, options, out);
  return out;
}

std::vector<AbstractWave> schedule_level(const std::vector<ScheduleItem>& items, int devices,
                                         const ScheduleOptions& options,
                                         const std::vector<AbstractWave>& before, int level) {
  std::vector<ItemState> state = initial_state(items, devices);
  for (size_t w = 0; w < before.size(); ++w) apply_wave(state, before[w], static_cast<int>(w));
  std::vector<AbstractWave> out = before;
  ScheduleOptions o = options;
  o.cross_level = false;
  run_pool(items, state, level_pool(items, level), devices, o, out);
  out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(before.size()));
  return out;
}

int fill_idle(const std::vector<ScheduleItem>& items, int devices, std::vector<AbstractWave>& waves,
              size_t from, int level) {
  std::vector<ItemState> state = initial_state(items, devices);
  for (size_t w = 0; w < waves.size(); ++w) apply_wave(state, waves[w], static_cast<int>(w));
  const std::vector<int> pool = level_pool(items, level);
  // Operators of the level already in the waves (none expected): left alone.
  std::vector<int> done(items.size(), 0);
  for (int m : pool) done[static_cast<size_t>(m)] = state[static_cast<size_t>(m)].next;
  std::vector<int> next(items.size(), 0);
  for (int m : pool) next[static_cast<size_t>(m)] = done[static_cast<size_t>(m)];
  int added = 0;
  std::vector<int> order;
  for (size_t w = from; w < waves.size(); ++w) {
    AbstractWave& wave = waves[w];
    int free = devices;
    for (const AbstractSlot& s : wave.slots) free -= s.devices;
    order.clear();
    for (int m : pool) {
      const ScheduleItem& it = items[static_cast<size_t>(m)];
      if (next[static_cast<size_t>(m)] == it.length || done[static_cast<size_t>(m)] > 0) continue;
      bool in_wave = false;
      for (const AbstractSlot& s : wave.slots) in_wave = in_wave || s.metaop == m;
      bool inputs_done = true;
      for (int in : it.inputs) {
        const int f = state[static_cast<size_t>(in)].finished_wave;
        if (f < 0 || f >= static_cast<int>(w)) inputs_done = false;
      }
      if (!in_wave && inputs_done) order.push_back(m);
    }
    // Most remaining work first (ms on one device; ties: the lower id).
    auto work = [&](int m) {
      const ScheduleItem& it = items[static_cast<size_t>(m)];
      const int n = it.valid.front();
      return (it.length - next[static_cast<size_t>(m)]) * it.time_ms[static_cast<size_t>(n)] * n;
    };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work(a) > work(b); });
    bool changed = false;
    for (int m : order) {
      const ScheduleItem& it = items[static_cast<size_t>(m)];
      const int left = it.length - next[static_cast<size_t>(m)];
      // The valid count that fits the most operators within the wave
      // (ties: fewer devices), never lengthening it.
      int best_n = 0, best_count = 0;
      for (int n : it.valid) {
        if (n > free) break;
        const double t = it.time_ms[static_cast<size_t>(n)];
        const int count = std::min(left, static_cast<int>(std::floor(wave.ms / t * (1 + 1e-12))));
        if (count > best_count) {
          best_n = n;
          best_count = count;
        }
      }
      if (best_count == 0) continue;
      const double t = it.time_ms[static_cast<size_t>(best_n)];
      wave.slots.push_back({m, next[static_cast<size_t>(m)], best_count, best_n, best_count * t});
      wave.ms = std::max(wave.ms, best_count * t);
      next[static_cast<size_t>(m)] += best_count;
      free -= best_n;
      ++added;
      changed = true;
    }
    if (changed)
      std::sort(wave.slots.begin(), wave.slots.end(),
                [](const AbstractSlot& a, const AbstractSlot& b) { return a.metaop < b.metaop; });
  }
  return added;
}

}  // namespace spindle::plan
