#include "libplan/place/place.h"

#include "libplan/rules/rows.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

namespace spindle::plan {

namespace {

// Sweeps of the final improvement over the waves (Improver).
constexpr int kImproveSweeps = 2;
// Exchanges the final improvement tries at most, times the devices (an
// exchange costs about a device count of work): 100 on 16 devices.
constexpr int kImproveWork = 1600;

// Everything placement has decided so far; copied for backtracking.
struct State {
  std::vector<std::vector<int>> last;   // per MetaOp: devices of its latest slice
  std::vector<char> has;                // [device * params + p]: device holds parameter p
  std::vector<char> in_island;          // [p * islands + i]: parameter p is held in island i
  std::vector<double> mem;              // per device: bytes charged
};

// A group of devices holding `bytes` of a slot's input, spread evenly.
struct Source {
  const std::vector<int>* devices;
  double bytes;
};

// Devices of each slot of a previous placement, by (MetaOp, first operator).
using Hint = std::map<std::pair<int, int>, std::vector<int>>;

class Placer {
 public:
  Placer(const PlaceInput& in, const std::vector<AbstractWave>& waves,
         const std::vector<WavePlacement>* previous, const Hint* hint)
      : in_(in), hint_(hint) {
    n_ = in.devices;
    island_ = in.devices_per_island > 0 ? in.devices_per_island : in.devices;
    islands_ = island_count(n_, island_);
    params_ = in.param_bytes.size();
    consumers_.resize(in.metaops.size());
    for (size_t c = 0; c < in.metaops.size(); ++c)
      for (int m : in.metaops[c].inputs) consumers_[static_cast<size_t>(m)].push_back(static_cast<int>(c));
    if (islands_ > 1) {
      // A parameter that must span islands anyway costs nothing more when it
      // does: one used on more devices than an island holds in some wave, or
      // (refinement passes) one that spanned islands in the previous pass.
      std::vector<char> spans(params_, 0);
      std::vector<int> devices_in_wave(params_);
      std::vector<std::vector<char>> island_seen(params_);
      for (size_t w = 0; w < waves.size(); ++w) {
        std::fill(devices_in_wave.begin(), devices_in_wave.end(), 0);
        for (size_t si = 0; si < waves[w].slots.size(); ++si) {
          const AbstractSlot& slot = waves[w].slots[si];
          const PlaceMetaOp& m = in.metaops[static_cast<size_t>(slot.metaop)];
          for (int k = slot.first; k < slot.first + slot.count; ++k) {
            const int p = m.param[static_cast<size_t>(k)];
            if (p < 0) continue;
            const auto pu = static_cast<size_t>(p);
            if ((devices_in_wave[pu] += slot.devices) > island_) spans[pu] = 1;
            if (previous == nullptr) continue;
            auto& seen = island_seen[pu];
            seen.resize(static_cast<size_t>(islands_), 0);
            for (int d : (*previous)[w].slot_devices[si]) seen[static_cast<size_t>(island_of(d))] = 1;
            if (std::count(seen.begin(), seen.end(), 1) > 1) spans[pu] = 1;
          }
        }
      }
      // Extra cost of an all-reduce crossing islands rather than staying in one.
      cross_sync_per_param_.resize(params_);
      for (size_t p = 0; p < params_; ++p) {
        const double b = in.param_bytes[p];
        cross_sync_per_param_[p] = b > 0 && !spans[p]
            ? in.cost->allreduce_ms(b, {0, island_}) - in.cost->allreduce_ms(b, {0, 1})
            : 0.0;
      }
    }
  }

  State initial() const {
    State s;
    s.last.resize(in_.metaops.size());
    s.has.assign(static_cast<size_t>(n_) * params_, 0);
    s.in_island.assign(params_ * static_cast<size_t>(islands_), 0);
    s.mem.assign(static_cast<size_t>(n_), 0.0);
    return s;
  }

  // Places one wave into `s` (the steps of place_islands); nullopt when
  // memory does not allow it, and then `s` is left partly updated: the
  // caller restores it from its own copy. `balance`: choose devices by free
  // memory first; `ignore_memory`: place anyway (never nullopt).
  std::optional<WavePlacement> place_wave(State& s, const AbstractWave& wave, bool balance,
                                          bool ignore_memory) const;

 private:
  // Buffers place_wave reuses from slot to slot (sized once per wave).
  struct SlotScratch {
    SlotScratch(int devices, int islands)
        : held(static_cast<size_t>(devices)), held_island(static_cast<size_t>(islands)),
          island_candidates(static_cast<size_t>(islands)), candidates_known(static_cast<size_t>(islands)),
          cost_of_island(static_cast<size_t>(islands)) {}
    std::vector<double> held;                          // input bytes per device
    std::vector<double> held_island;                   // input bytes per island
    std::vector<int> held_on;                          // the devices whose held the last slot set
    std::vector<std::vector<int>> island_candidates;   // per island: free devices that fit
    std::vector<char> candidates_known;                // per island: 0, 1 known, 2 known and best first
    std::vector<int> slot_params;                      // the slot's parameters, in operator order
    std::vector<int> sole_island_k;                    // its operators whose parameter is in exactly one island
    std::vector<double> cost_of_island;                // best_island's: per island, island_cost(i)
  };

  // Where one slot of a wave may go given the state so far (steps 2-3 of
  // place_wave): its inputs per device and island, the devices each island
  // can give it, what putting it on an island costs. Valid until the slot
  // is committed.
  class SlotChoice {
   public:
    SlotChoice(const Placer& p, const State& s, const std::vector<char>& used, const AbstractSlot& slot,
               bool balance, bool ignore_memory, SlotScratch& scratch);
    // The slot's devices (unsorted); fewer than slot.devices when memory
    // leaves no room.
    std::vector<int> devices();

   private:
    double need_on(int d);
    // Free devices of island i that fit, in no set order (their number and
    // memory are what most islands are asked for)...
    const std::vector<int>& candidates(int i);
    // ...and the same, best first, for the islands devices are taken from.
    const std::vector<int>& ordered(int i);
    double island_cost(int i) const;             // ms of putting the slot into island i
    int best_island(int k, const std::vector<char>& skip);   // among those with k candidates; -1: none
    void take_whole_islands(std::vector<int>& devs, std::vector<char>& skip, int& rest);
    void take_fragments(std::vector<int>& devs, int& rest);

    const Placer& p_;
    const State& s_;
    const std::vector<char>& used_;
    const AbstractSlot& slot_;
    const PlaceMetaOp& m_;
    bool balance_, ignore_memory_;
    SlotScratch& x_;
    double total_ = 0;   // input bytes
    bool fresh_known_ = false;
    double fresh_bytes_ = 0;
  };

  // Step 1 of place_wave.
  void keep_previous_devices(State& s, const AbstractWave& wave, bool ignore_memory, std::vector<char>& used,
                             WavePlacement& placed) const;
  // The slots step 1 left, in the order steps 2-3 place them.
  std::vector<size_t> remaining_in_order(const State& s, const AbstractWave& wave,
                                         const WavePlacement& placed) const;

  int island_of(int d) const { return plan::island_of(d, island_); }

  double need(const State& s, const AbstractSlot& slot, int d) const {
    const size_t base = static_cast<size_t>(d) * params_;
    return slot_bytes_per_device(in_, slot, [&](int p) { return s.has[base + static_cast<size_t>(p)] != 0; });
  }
  bool fits(const State& s, const AbstractSlot& slot, int d, bool ignore_memory) const {
    if (ignore_memory || in_.memory_bytes <= 0) return true;
    return s.mem[static_cast<size_t>(d)] + need(s, slot, d) <= in_.memory_bytes;
  }

  std::vector<Source> sources(const State& s, const AbstractSlot& slot) const {
    const PlaceMetaOp& m = in_.metaops[static_cast<size_t>(slot.metaop)];
    std::vector<Source> out;
    const double batch = static_cast<double>(m.batch);
    if (slot.first > 0) {
      const auto& prev = s.last[static_cast<size_t>(slot.metaop)];
      if (!prev.empty()) out.push_back({&prev, batch * m.out_bytes_per_sample});
    } else {
      for (int im : m.inputs) {
        const auto& prev = s.last[static_cast<size_t>(im)];
        if (!prev.empty())
          out.push_back({&prev, batch * in_.metaops[static_cast<size_t>(im)].out_bytes_per_sample});
      }
    }
    if (hint_ == nullptr) return out;
    // Where the slot's output went in the hint: its MetaOp's next slice, or
    // after its last operator the first slices of its consumers.
    auto hinted = [&](int metaop, int first) -> const std::vector<int>* {
      auto it = hint_->find({metaop, first});
      return it == hint_->end() ? nullptr : &it->second;
    };
    const int end = slot.first + slot.count;
    if (end < static_cast<int>(m.param.size())) {
      if (const auto* d = hinted(slot.metaop, end)) out.push_back({d, batch * m.out_bytes_per_sample});
    } else {
      for (int c : consumers_[static_cast<size_t>(slot.metaop)]) {
        const PlaceMetaOp& cm = in_.metaops[static_cast<size_t>(c)];
        if (const auto* d = hinted(c, 0))
          out.push_back({d, static_cast<double>(cm.batch) * m.out_bytes_per_sample});
      }
    }
    return out;
  }

  // Commits `devs` to `slot`: memory, parameters, used devices.
  void take(State& s, std::vector<char>& used, const AbstractSlot& slot, const std::vector<int>& devs) const {
    const PlaceMetaOp& m = in_.metaops[static_cast<size_t>(slot.metaop)];
    for (int d : devs) {
      s.mem[static_cast<size_t>(d)] += need(s, slot, d);
      used[static_cast<size_t>(d)] = 1;
    }
    for (int k = slot.first; k < slot.first + slot.count; ++k) {
      const int p = m.param[static_cast<size_t>(k)];
      if (p < 0) continue;
      for (int d : devs) {
        s.has[static_cast<size_t>(d) * params_ + static_cast<size_t>(p)] = 1;
        s.in_island[static_cast<size_t>(p) * static_cast<size_t>(islands_) + static_cast<size_t>(island_of(d))] = 1;
      }
    }
  }


  const PlaceInput& in_;
  const Hint* hint_;
  std::vector<std::vector<int>> consumers_;   // per MetaOp: MetaOps taking it as input
  int n_ = 0, island_ = 1, islands_ = 1;
  size_t params_ = 0;
  std::vector<double> cross_sync_per_param_;
};

std::optional<WavePlacement> Placer::place_wave(State& s, const AbstractWave& wave, bool balance,
                                               bool ignore_memory) const {
  WavePlacement placed;
  placed.slot_devices.resize(wave.slots.size());
  std::vector<char> used(static_cast<size_t>(n_), 0);
  // 1. A slot with the device count of its MetaOp's previous slice keeps
  //    those devices when they are free and fit.
  keep_previous_devices(s, wave, ignore_memory, used, placed);
  // 2-3. The others, larger slots first, each into whole islands and one
  //    best island, else wherever there is room.
  SlotScratch scratch(n_, islands_);
  for (size_t si : remaining_in_order(s, wave, placed)) {
    const AbstractSlot& slot = wave.slots[si];
    SlotChoice choice(*this, s, used, slot, balance, ignore_memory, scratch);
    std::vector<int> devs = choice.devices();
    if (static_cast<int>(devs.size()) < slot.devices) return std::nullopt;   // memory: no device left
    std::sort(devs.begin(), devs.end());
    placed.slot_devices[si] = devs;
    take(s, used, slot, devs);
  }
  for (size_t si = 0; si < wave.slots.size(); ++si)
    s.last[static_cast<size_t>(wave.slots[si].metaop)] = placed.slot_devices[si];
  return placed;
}

void Placer::keep_previous_devices(State& s, const AbstractWave& wave, bool ignore_memory, std::vector<char>& used,
                                   WavePlacement& placed) const {
  for (size_t si = 0; si < wave.slots.size(); ++si) {
    const AbstractSlot& slot = wave.slots[si];
    const auto& prev = s.last[static_cast<size_t>(slot.metaop)];
    if (static_cast<int>(prev.size()) != slot.devices) continue;
    bool ok = true;
    for (int d : prev) ok = ok && !used[static_cast<size_t>(d)] && fits(s, slot, d, ignore_memory);
    if (!ok) continue;
    placed.slot_devices[si] = prev;
    take(s, used, slot, prev);
  }
}

std::vector<size_t> Placer::remaining_in_order(const State& s, const AbstractWave& wave,
                                               const WavePlacement& placed) const {
  // Larger slots first, then more input bytes, then lower MetaOp id.
  std::vector<size_t> order;
  std::vector<double> input_bytes(wave.slots.size(), 0.0);
  for (size_t si = 0; si < wave.slots.size(); ++si) {
    if (!placed.slot_devices[si].empty()) continue;
    order.push_back(si);
    for (const Source& src : sources(s, wave.slots[si])) input_bytes[si] += src.bytes;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const AbstractSlot& x = wave.slots[a];
    const AbstractSlot& y = wave.slots[b];
    return std::make_tuple(-x.devices, -input_bytes[a], x.metaop) <
           std::make_tuple(-y.devices, -input_bytes[b], y.metaop);
  });
  return order;
}

Placer::SlotChoice::SlotChoice(const Placer& p, const State& s, const std::vector<char>& used,
                               const AbstractSlot& slot, bool balance, bool ignore_memory, SlotScratch& scratch)
    : p_(p), s_(s), used_(used), slot_(slot), m_(p.in_.metaops[static_cast<size_t>(slot.metaop)]),
      balance_(balance), ignore_memory_(ignore_memory), x_(scratch) {
  // Where the slot's inputs are: bytes per device and per island. Only
  // the devices the slot before set are cleared (a wave places hundreds of
  // slots on a thousand devices).
  for (int d : x_.held_on) x_.held[static_cast<size_t>(d)] = 0.0;
  x_.held_on.clear();
  std::fill(x_.held_island.begin(), x_.held_island.end(), 0.0);
  for (const Source& src : p_.sources(s_, slot_)) {
    total_ += src.bytes;
    const double per_device = src.bytes / static_cast<double>(src.devices->size());
    for (int d : *src.devices) {
      x_.held[static_cast<size_t>(d)] += per_device;
      x_.held_island[static_cast<size_t>(p_.island_of(d))] += per_device;
      x_.held_on.push_back(d);
    }
  }
  x_.slot_params.clear();
  for (int k = slot_.first; k < slot_.first + slot_.count; ++k)
    if (m_.param[static_cast<size_t>(k)] >= 0) x_.slot_params.push_back(m_.param[static_cast<size_t>(k)]);
  std::fill(x_.candidates_known.begin(), x_.candidates_known.end(), 0);
  // The slot's parameters held so far in exactly one island (its operators,
  // in order): the ones island_cost may charge.
  x_.sole_island_k.clear();
  if (!p_.cross_sync_per_param_.empty()) {
    for (int k = slot_.first; k < slot_.first + slot_.count; ++k) {
      const int q = m_.param[static_cast<size_t>(k)];
      if (q < 0) continue;
      const size_t row = static_cast<size_t>(q) * static_cast<size_t>(p_.islands_);
      int held_in = 0;
      for (int j = 0; j < p_.islands_; ++j) held_in += s_.in_island[row + static_cast<size_t>(j)];
      if (held_in == 1) x_.sole_island_k.push_back(k);
    }
  }
}

double Placer::SlotChoice::need_on(int d) {
  // What the slot charges device d (need()): the same for every device
  // holding none of its parameters, so that sum is made once.
  const size_t base = static_cast<size_t>(d) * p_.params_;
  for (int q : x_.slot_params)
    if (s_.has[base + static_cast<size_t>(q)]) return p_.need(s_, slot_, d);
  if (!fresh_known_) {
    fresh_bytes_ = p_.need(s_, slot_, d);
    fresh_known_ = true;
  }
  return fresh_bytes_;
}

const std::vector<int>& Placer::SlotChoice::candidates(int i) {
  // Computed once per island and slot: what they depend on (used, memory,
  // parameters held, held) changes only when the slot is committed.
  std::vector<int>& c = x_.island_candidates[static_cast<size_t>(i)];
  if (x_.candidates_known[static_cast<size_t>(i)]) return c;
  x_.candidates_known[static_cast<size_t>(i)] = 1;
  c.clear();
  const bool check_memory = !ignore_memory_ && p_.in_.memory_bytes > 0;   // as fits()
  for (int d = i * p_.island_; d < std::min(p_.n_, (i + 1) * p_.island_); ++d)
    if (!used_[static_cast<size_t>(d)] &&
        (!check_memory || s_.mem[static_cast<size_t>(d)] + need_on(d) <= p_.in_.memory_bytes))
      c.push_back(d);
  return c;
}

const std::vector<int>& Placer::SlotChoice::ordered(int i) {
  (void)candidates(i);
  std::vector<int>& c = x_.island_candidates[static_cast<size_t>(i)];
  if (x_.candidates_known[static_cast<size_t>(i)] == 2) return c;
  x_.candidates_known[static_cast<size_t>(i)] = 2;
  // A total order (ties: the device index), so the list it starts from
  // does not matter.
  std::sort(c.begin(), c.end(), [&](int a, int b) {
    const auto au = static_cast<size_t>(a), bu = static_cast<size_t>(b);
    if (balance_ && s_.mem[au] != s_.mem[bu]) return s_.mem[au] < s_.mem[bu];
    if (x_.held[au] != x_.held[bu]) return x_.held[au] > x_.held[bu];
    if (s_.mem[au] != s_.mem[bu]) return s_.mem[au] < s_.mem[bu];
    return a < b;
  });
  return c;
}

double Placer::SlotChoice::island_cost(int i) const {
  const double outside = total_ - x_.held_island[static_cast<size_t>(i)];
  double ms = outside > 0 ? 2.0 * (p_.in_.cost->p2p_ms(outside, true) - p_.in_.cost->p2p_ms(outside, false)) : 0.0;
  for (int k : x_.sole_island_k) {
    const int q = m_.param[static_cast<size_t>(k)];
    if (!s_.in_island[static_cast<size_t>(q) * static_cast<size_t>(p_.islands_) + static_cast<size_t>(i)])
      ms += p_.cross_sync_per_param_[static_cast<size_t>(q)];
  }
  return ms;
}

int Placer::SlotChoice::best_island(int k, const std::vector<char>& skip) {
  // The least key (island_cost, with balance the candidates' used memory,
  // minus the inputs held, i) over the islands not skipped with k
  // candidates or more. Its first part needs no candidates: the islands are
  // taken cheapest first, a cost at a time, and candidates are listed only
  // for the islands of the cheapest cost at which one has k of them (the
  // others cannot hold the least key). Usually that is the first cost.
  std::vector<double>& cost = x_.cost_of_island;
  for (int i = 0; i < p_.islands_; ++i)
    if (!skip[static_cast<size_t>(i)]) cost[static_cast<size_t>(i)] = island_cost(i);
  bool first = true;
  double above = 0;   // after the first round: the costs up to this one are done
  for (;;) {
    bool any = false;
    double level = 0;   // the next cost
    for (int i = 0; i < p_.islands_; ++i) {
      if (skip[static_cast<size_t>(i)]) continue;
      const double c = cost[static_cast<size_t>(i)];
      if ((first || c > above) && (!any || c < level)) {
        level = c;
        any = true;
      }
    }
    if (!any) return -1;
    int best = -1;
    std::tuple<double, double, int> best_key{};
    for (int i = 0; i < p_.islands_; ++i) {
      if (skip[static_cast<size_t>(i)] || cost[static_cast<size_t>(i)] != level) continue;
      const std::vector<int>& c = candidates(i);
      if (static_cast<int>(c.size()) < k) continue;
      double free_mem = 0;
      if (balance_)
        for (int d : c) free_mem -= s_.mem[static_cast<size_t>(d)];
      const std::tuple<double, double, int> key{balance_ ? free_mem : 0.0, -x_.held_island[static_cast<size_t>(i)], i};
      if (best < 0 || key < best_key) {
        best = i;
        best_key = key;
      }
    }
    if (best >= 0) return best;
    above = level;
    first = false;
  }
}

std::vector<int> Placer::SlotChoice::devices() {
  std::vector<int> devs;
  std::vector<char> skip(static_cast<size_t>(p_.islands_), 0);
  int rest = slot_.devices;
  if (slot_.devices > p_.island_) take_whole_islands(devs, skip, rest);
  if (rest > 0) {
    // One island for what is left of the slot.
    const int i = best_island(rest, skip);
    if (i >= 0) {
      const std::vector<int>& c = ordered(i);
      devs.insert(devs.end(), c.begin(), c.begin() + rest);
      rest = 0;
    }
  }
  if (rest > 0) take_fragments(devs, rest);
  return devs;
}

void Placer::SlotChoice::take_whole_islands(std::vector<int>& devs, std::vector<char>& skip, int& rest) {
  // Whole free islands, those holding most of the inputs first.
  std::vector<int> whole;
  for (int i = 0; i < p_.islands_; ++i)
    if (static_cast<int>(candidates(i).size()) == std::min(p_.n_, (i + 1) * p_.island_) - i * p_.island_)
      whole.push_back(i);
  std::stable_sort(whole.begin(), whole.end(), [&](int a, int b) {
    return x_.held_island[static_cast<size_t>(a)] > x_.held_island[static_cast<size_t>(b)];
  });
  for (int i : whole) {
    const int size = std::min(p_.n_, (i + 1) * p_.island_) - i * p_.island_;
    if (size > rest) continue;
    for (int d = i * p_.island_; d < i * p_.island_ + size; ++d) devs.push_back(d);
    skip[static_cast<size_t>(i)] = 1;
    rest -= size;
    if (rest < p_.island_) break;
  }
}

void Placer::SlotChoice::take_fragments(std::vector<int>& devs, int& rest) {
  // Fragmented: islands with the most room first.
  std::vector<std::pair<int, std::vector<int>>> room;
  for (int i = 0; i < p_.islands_; ++i) {
    std::vector<int> c = ordered(i);
    c.erase(std::remove_if(c.begin(), c.end(),
                           [&](int d) { return std::find(devs.begin(), devs.end(), d) != devs.end(); }),
            c.end());
    if (!c.empty()) room.emplace_back(i, std::move(c));
  }
  std::stable_sort(room.begin(), room.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  for (const auto& [i, c] : room)
    for (int d : c)
      if (rest > 0) devs.push_back(d), --rest;
}

// One placement of every wave by `placer` (the steps of place_islands, with
// backtracking). `over_memory`: set when some wave had to be placed ignoring
// memory.
std::vector<WavePlacement> place_all(const Placer& placer, const std::vector<AbstractWave>& waves,
                                     bool& over_memory) {
  constexpr size_t kBacktrack = 4;
  over_memory = false;
  std::vector<WavePlacement> out;
  out.reserve(waves.size());
  State state = placer.initial();
  // The state before each of the last kBacktrack + 1 waves, oldest first: a
  // ring of copies assigned over each other (their storage is reused).
  std::vector<State> ring(kBacktrack + 1);
  size_t ring_first = 0, ring_size = 0;
  auto before = [&](size_t i) -> State& { return ring[(ring_first + i) % ring.size()]; };
  for (size_t w = 0; w < waves.size(); ++w) {
    if (ring_size < ring.size()) {
      before(ring_size++) = state;
    } else {
      before(0) = state;
      ring_first = (ring_first + 1) % ring.size();
    }
    if (auto p = placer.place_wave(state, waves[w], false, false)) {
      out.push_back(std::move(*p));
      continue;
    }
    state = before(ring_size - 1);   // place_wave left it partly updated
    // Backtrack: place the last few waves again, devices by free memory.
    bool done = false;
    for (size_t back = 1; back < ring_size && !done; ++back) {
      const size_t from = w - back;
      State s = before(ring_size - 1 - back);
      std::vector<WavePlacement> again;
      for (size_t v = from; v <= w; ++v) {
        auto p = placer.place_wave(s, waves[v], true, false);
        if (!p) break;
        again.push_back(std::move(*p));
      }
      if (again.size() != back + 1) continue;
      out.resize(from);
      for (auto& p : again) out.push_back(std::move(p));
      state = std::move(s);
      done = true;
    }
    if (!done) {
      // No placement fits: place it anyway; check_plan_memory names the device.
      out.push_back(*placer.place_wave(state, waves[w], true, true));
      over_memory = true;
    }
    ring_size = 0;   // snapshots before the re-placed waves are stale
  }
  return out;
}


// The final improvement of a placement across islands: exchanges of two
// devices of one wave (between two slots, or a slot and an idle device), kept
// when the predicted transfers plus gradient synchronisation (as cost_plan
// computes them) get shorter, the transfers no longer, and no device passes
// the memory. Candidates: the slots whose inputs or outputs cross islands,
// most bytes first; for each of its devices, one device per occupant (slot or
// idle) of each other island holding the slot's inputs or readers. Bounded by
// sweeps and a count of exchanges tried: deterministic.
class Improver {
 public:
  // Improves `placed` (placements of `waves`) in place, in run().
  Improver(const std::vector<AbstractWave>& waves, const PlaceInput& in, std::vector<WavePlacement>& placed)
      : in_(in) {
    n_ = in.devices;
    per_island_ = in.devices_per_island > 0 ? in.devices_per_island : n_;
    islands_ = island_count(n_, per_island_);
    // Slots in wave order, their inputs (as costing: the MetaOp's previous
    // slice, else the final slices of its inputs) and who reads their output.
    std::vector<int> last(in.metaops.size(), -1), final_slot(in.metaops.size(), -1);
    for (size_t w = 0; w < waves.size(); ++w) {
      wave_first_.push_back(static_cast<int>(slots_.size()));
      for (size_t si = 0; si < waves[w].slots.size(); ++si) {
        slots_.push_back({static_cast<int>(w), &waves[w].slots[si], &placed[w].slot_devices[si], {}, {}});
        final_slot[static_cast<size_t>(waves[w].slots[si].metaop)] = static_cast<int>(slots_.size()) - 1;
      }
    }
    wave_first_.push_back(static_cast<int>(slots_.size()));
    readers_.resize(slots_.size());
    for (size_t id = 0; id < slots_.size(); ++id) {
      const AbstractSlot& slot = *slots_[id].slot;
      const PlaceMetaOp& m = in.metaops[static_cast<size_t>(slot.metaop)];
      auto edge = [&](int src, int ksrc, double bytes) {
        if (src < 0 || bytes <= 0) return;
        slots_[id].inputs.push_back({src, ksrc, m.tensor_parallel, m.batch, bytes});
        readers_[static_cast<size_t>(src)].push_back(static_cast<int>(id));
      };
      if (slot.first > 0) {
        edge(last[static_cast<size_t>(slot.metaop)], m.tensor_parallel, m.out_bytes_per_sample);
      } else {
        for (int im : m.inputs)
          edge(final_slot[static_cast<size_t>(im)], in.metaops[static_cast<size_t>(im)].tensor_parallel,
               in.metaops[static_cast<size_t>(im)].out_bytes_per_sample);
      }
      // `last` moves on once the whole wave is read (slots of one wave read
      // the previous waves only).
      if (static_cast<int>(id) + 1 == wave_first_[static_cast<size_t>(slots_[id].wave) + 1])
        for (int j = wave_first_[static_cast<size_t>(slots_[id].wave)]; j <= static_cast<int>(id); ++j)
          last[static_cast<size_t>(slots_[static_cast<size_t>(j)].slot->metaop)] = j;
      for (int k = slot.first; k < slot.first + slot.count; ++k) {
        const int p = m.param[static_cast<size_t>(k)];
        if (p >= 0 && in.param_bytes[static_cast<size_t>(p)] > 0) slots_[id].params.push_back(p);
      }
      std::sort(slots_[id].params.begin(), slots_[id].params.end());
      slots_[id].params.erase(std::unique(slots_[id].params.begin(), slots_[id].params.end()),
                              slots_[id].params.end());
    }
    scratch_inter_.assign(static_cast<size_t>(2 * islands_), 0.0);
    wave_intra_.assign(waves.size() * intra_stride(), 0.0);
    wave_inter_.assign(waves.size() * inter_stride(), 0.0);
    wave_ms_.resize(waves.size());
    for (size_t w = 0; w < waves.size(); ++w) wave_ms_[w] = wave_ms(static_cast<int>(w));
    // Parameters: devices running each (counted per slot) for memory; the
    // holders of each shard (parameter, tensor-parallel rank: a device's
    // position in its slot modulo K, as the lowering) and its all-reduce.
    const size_t params = in.param_bytes.size();
    count_.assign(params * static_cast<size_t>(n_), 0);
    tensor_parallel_.assign(params, 1);
    for (const SlotRef& s : slots_)
      for (int p : s.params)
        tensor_parallel_[static_cast<size_t>(p)] = in.metaops[static_cast<size_t>(s.slot->metaop)].tensor_parallel;
    shard_first_.assign(params + 1, 0);
    for (size_t p = 0; p < params; ++p) shard_first_[p + 1] = shard_first_[p] + tensor_parallel_[p];
    const auto shards = static_cast<size_t>(shard_first_[params]);
    shard_count_.assign(shards * static_cast<size_t>(n_), 0);
    for (size_t id = 0; id < slots_.size(); ++id) count_slot(static_cast<int>(id), +1);
    shard_ms_.assign(shards, 0.0);
    sync_.assign(static_cast<size_t>(n_), 0.0);
    for (size_t sh = 0; sh < shards; ++sh) add_shard(static_cast<int>(sh));
  }

  // The bytes counted now (placement_bytes).
  PlacementBytes bytes() const {
    PlacementBytes out;
    for (size_t w = 0; w + 1 < wave_first_.size(); ++w) {
      const double* intra = &wave_intra_[w * intra_stride()];
      const double* inter = &wave_inter_[w * inter_stride()];
      out.forward.push_back({{intra, intra + n_}, {inter, inter + islands_}});
      out.backward.push_back({{intra + n_, intra + 2 * n_}, {inter + islands_, inter + 2 * islands_}});
    }
    out.reduced.assign(static_cast<size_t>(n_), 0.0);
    for (size_t p = 0; p + 1 < shard_first_.size(); ++p)
      for (int sh = shard_first_[p]; sh < shard_first_[p + 1]; ++sh) {
        const int* count = &shard_count_[static_cast<size_t>(sh) * static_cast<size_t>(n_)];
        if (std::count_if(count, count + n_, [](int c) { return c > 0; }) < 2) continue;
        for (int d = 0; d < n_; ++d)
          if (count[d] > 0) out.reduced[static_cast<size_t>(d)] += in_.param_sync_bytes[p];
      }
    return out;
  }

  // Up to `sweeps` sweeps and `evals` exchanges tried in all. Each sweep
  // takes the slots by the bytes their inputs and outputs move across
  // islands, most first (ties: wave order).
  void run(int sweeps, int evals) {
    if (islands_ < 2) return;
    evals_left_ = evals;
    double best = objective();
    std::vector<int> slot_of(static_cast<size_t>(n_));
    std::vector<char> wanted(static_cast<size_t>(islands_));
    std::vector<std::pair<double, int>> order;
    for (int sweep = 0; sweep < sweeps; ++sweep) {
      order.clear();
      cross_bytes(crossing_);
      for (int id = 0; id < static_cast<int>(slots_.size()); ++id)
        if (crossing_[static_cast<size_t>(id)] > 0.5) order.push_back({-crossing_[static_cast<size_t>(id)], id});
      std::sort(order.begin(), order.end());
      bool improved = false;
      for (const auto& [minus_bytes, a] : order) {
        const SlotRef& sa = slots_[static_cast<size_t>(a)];
        const int first = wave_first_[static_cast<size_t>(sa.wave)], end = wave_first_[static_cast<size_t>(sa.wave) + 1];
        // Islands holding the slot's inputs or readers.
        std::fill(wanted.begin(), wanted.end(), 0);
        for (const Edge& e : sa.inputs)
          for (int d : *slots_[static_cast<size_t>(e.src)].devices) wanted[static_cast<size_t>(island_of(d, per_island_))] = 1;
        for (int r : readers_[static_cast<size_t>(a)])
          for (int d : *slots_[static_cast<size_t>(r)].devices) wanted[static_cast<size_t>(island_of(d, per_island_))] = 1;
        for (size_t xi = 0; xi < sa.devices->size(); ++xi) {
          std::fill(slot_of.begin(), slot_of.end(), -1);
          for (int b = first; b < end; ++b)
            for (int d : *slots_[static_cast<size_t>(b)].devices) slot_of[static_cast<size_t>(d)] = b;
          const int x = (*sa.devices)[xi];
          for (int y = 0; y < n_; ++y) {
            if (island_of(y, per_island_) == island_of(x, per_island_) ||
                !wanted[static_cast<size_t>(island_of(y, per_island_))])
              continue;
            const int b = slot_of[static_cast<size_t>(y)];
            if (b == a) continue;
            // One device per occupant (a slot, or idle) of y's island: the first.
            bool seen = false;
            for (int z = island_of(y, per_island_) * per_island_; z < y && !seen; ++z)
              seen = slot_of[static_cast<size_t>(z)] == b;
            if (seen) continue;
            if (evals_left_-- <= 0) return;
            if (try_swap(a, x, b, y, best)) {
              improved = true;
              break;   // x moved: the next device of the slot
            }
          }
        }
      }
      if (!improved) break;
    }
  }

 private:
  struct Edge {
    int src;            // slot id
    int ksrc, kdst;     // tensor_parallel of source and destination
    int64_t batch;      // rows moved
    double bytes_per_sample;
  };
  struct SlotRef {
    int wave;
    const AbstractSlot* slot;
    std::vector<int>* devices;
    std::vector<Edge> inputs;
    std::vector<int> params;   // with bytes, ascending, once each
  };

  double transfer_ms() const {
    double ms = 0;
    for (double t : wave_ms_) ms += t;
    return ms;
  }

  double objective() const {
    double ms = 0;
    for (double t : wave_ms_) ms += t;
    return ms + *std::max_element(sync_.begin(), sync_.end());
  }

  // Per wave, bytes delivered by its forward exchange ([0, n) by device,
  // [0, islands) by island) then by its backward one ([n, 2n), [islands,
  // 2 islands)).
  size_t intra_stride() const { return 2 * static_cast<size_t>(n_); }
  size_t inter_stride() const { return 2 * static_cast<size_t>(islands_); }

  // The wave's transfer time: its forward exchange, then its backward one.
  // Recomputes wave w's traffic from its edges; returns its time.
  double wave_ms(int w) {
    double* intra = &wave_intra_[static_cast<size_t>(w) * intra_stride()];
    double* inter = &wave_inter_[static_cast<size_t>(w) * inter_stride()];
    std::fill(intra, intra + intra_stride(), 0.0);
    std::fill(inter, inter + inter_stride(), 0.0);
    for (int id = wave_first_[static_cast<size_t>(w)]; id < wave_first_[static_cast<size_t>(w) + 1]; ++id)
      for (const Edge& e : slots_[static_cast<size_t>(id)].inputs) add_edge(e, id, 1.0);
    return traffic_ms(w);
  }

  // Wave w's time from its traffic: per exchange (forward, backward) the
  // slowest destination device (intra-island bytes) or island (inter-island
  // bytes), as if each exchange ended on a barrier (a proxy for the
  // simulation, cheap to update). Link times grow with bytes, so the largest
  // byte counts decide. Byte counts below half a byte are rounding left by
  // subtracting an edge.
  double traffic_ms(int w) const {
    double total = 0;
    for (int dir = 0; dir < 2; ++dir) {
      const double* intra = &wave_intra_[static_cast<size_t>(w) * intra_stride() + static_cast<size_t>(dir * n_)];
      const double* inter = &wave_inter_[static_cast<size_t>(w) * inter_stride() + static_cast<size_t>(dir * islands_)];
      const double most_intra = *std::max_element(intra, intra + n_);
      const double most_inter = *std::max_element(inter, inter + islands_);
      double ms = 0;
      if (most_intra > 0.5) ms = std::max(ms, in_.cost->p2p_ms(most_intra, false));
      if (most_inter > 0.5) ms = std::max(ms, in_.cost->p2p_ms(most_inter, true));
      total += ms;
    }
    return total;
  }

  // Bytes the inputs and outputs of every slot move across islands.
  void cross_bytes(std::vector<double>& bytes) {
    bytes.assign(slots_.size(), 0.0);
    for (size_t id = 0; id < slots_.size(); ++id)
      for (const Edge& e : slots_[id].inputs) {
        std::fill(scratch_inter_.begin(), scratch_inter_.end(), 0.0);
        add_edge_to(e, static_cast<int>(id), 1.0, nullptr, scratch_inter_.data());
        double b = 0;
        for (double x : scratch_inter_) b += x;
        bytes[id] += b;
        bytes[static_cast<size_t>(e.src)] += b;
      }
  }

  // Adds (sign 1) or takes off (-1) the bytes edge `e` into slot `id` moves,
  // the moves of the lowering (rules/rows.h): forward, the activations from
  // the source slot's devices to slot id's; backward, their gradients the
  // other way. Into its wave's intra-island bytes by destination device and
  // inter-island bytes by destination island (layout: intra_stride).
  void add_edge(const Edge& e, int id, double sign) {
    const int w = slots_[static_cast<size_t>(id)].wave;
    add_edge_to(e, id, sign, &wave_intra_[static_cast<size_t>(w) * intra_stride()],
                &wave_inter_[static_cast<size_t>(w) * inter_stride()]);
  }
  void add_edge_to(const Edge& e, int id, double sign, double* intra, double* inter) const {
    const std::vector<int>& dst = *slots_[static_cast<size_t>(id)].devices;
    const std::vector<int>& src = *slots_[static_cast<size_t>(e.src)].devices;
    if (src == dst && e.ksrc == e.kdst) return;   // every row stays where it is
    auto add = [&](int dir) {
      return [&, dir](const RowMove& m) {
        if (m.src == m.dst) return;
        const double bytes = sign * static_cast<double>(m.rows.size()) * e.bytes_per_sample;
        if (island_of(m.src, per_island_) == island_of(m.dst, per_island_)) {
          if (intra != nullptr) intra[dir * n_ + m.dst] += bytes;
        } else {
          inter[dir * islands_ + island_of(m.dst, per_island_)] += bytes;
        }
      };
    };
    for_each_reshard_move_both_ways(src, e.ksrc, dst, e.kdst, e.batch, per_island_, add(0), add(1));
  }

  // Counts (sign +1) or uncounts (-1) slot id's devices as holders of the
  // shards of its parameters.
  void count_slot(int id, int sign) {
    const SlotRef& s = slots_[static_cast<size_t>(id)];
    for (int p : s.params) {
      // The device at position i holds its TP rank's shard (rules/rows.h; rows do not matter here).
      const RowLayout layout{0, static_cast<int>(s.devices->size()), tensor_parallel_[static_cast<size_t>(p)]};
      for (size_t i = 0; i < s.devices->size(); ++i) {
        const auto sh =
            static_cast<size_t>(shard_first_[static_cast<size_t>(p)] + layout.tp_rank_of(static_cast<int>(i)));
        shard_count_[sh * static_cast<size_t>(n_) + static_cast<size_t>((*s.devices)[i])] += sign;
      }
    }
  }

  // Shard sh's all-reduce over its holders, when there are two or more (as
  // the lowering's buckets), added to their sync time.
  void add_shard(int sh) {
    const int* count = &shard_count_[static_cast<size_t>(sh) * static_cast<size_t>(n_)];
    group_.clear();
    for (int d = 0; d < n_; ++d)
      if (count[d] > 0) group_.push_back(d);
    const auto p = static_cast<size_t>(std::upper_bound(shard_first_.begin(), shard_first_.end(), sh) - shard_first_.begin() - 1);
    const double ms = group_.size() >= 2 ? in_.cost->allreduce_ms(in_.param_sync_bytes[p], group_) : 0.0;
    shard_ms_[static_cast<size_t>(sh)] = ms;
    for (int d : group_) sync_[static_cast<size_t>(d)] += ms;
  }
  // Takes shard sh's all-reduce off its holders.
  void remove_shard(int sh) {
    const int* count = &shard_count_[static_cast<size_t>(sh) * static_cast<size_t>(n_)];
    const double ms = shard_ms_[static_cast<size_t>(sh)];
    if (ms == 0) return;
    for (int d = 0; d < n_; ++d)
      if (count[d] > 0) sync_[static_cast<size_t>(d)] -= ms;
  }

  // Moves slot `id` from device `from` to `to` (its list kept ascending).
  void move(int id, int from, int to) {
    std::vector<int>& devs = *slots_[static_cast<size_t>(id)].devices;
    count_slot(id, -1);   // positions, hence shard ranks, change with the order
    *std::find(devs.begin(), devs.end(), from) = to;
    std::sort(devs.begin(), devs.end());
    count_slot(id, +1);
    for (int p : slots_[static_cast<size_t>(id)].params) {
      const size_t row = static_cast<size_t>(p) * static_cast<size_t>(n_);
      --count_[row + static_cast<size_t>(from)];
      ++count_[row + static_cast<size_t>(to)];
    }
  }

  // Bytes each device holds, as cost_plan: per parameter it runs, weights and
  // gradients plus the optimizer state sharded over the data-parallel
  // replicas; the activations of every slot on it. One shard per parameter
  // and device: cost_plan counts a shard per tensor-parallel rank a device
  // runs it at (held_shards), which only differs where two slices of one
  // tensor-parallel module share a device at other positions, and the
  // plan's memory check (check_plan_memory) reads cost_plan's figure.
  void memory(std::vector<double>& mem) const {
    mem.assign(static_cast<size_t>(n_), 0.0);
    for (size_t p = 0; p < in_.param_bytes.size(); ++p) {
      const size_t row = p * static_cast<size_t>(n_);
      int on = 0;
      for (int d = 0; d < n_; ++d) on += count_[row + static_cast<size_t>(d)] > 0;
      if (on == 0) continue;
      const double bytes = param_state_bytes(in_.param_bytes[p], in_.dtype_bytes, param_replicas(on, tensor_parallel_[p]),
                                             in_.optimizer_state);
      for (int d = 0; d < n_; ++d)
        if (count_[row + static_cast<size_t>(d)] > 0) mem[static_cast<size_t>(d)] += bytes;
    }
    for (const SlotRef& s : slots_) {
      const PlaceMetaOp& m = in_.metaops[static_cast<size_t>(s.slot->metaop)];
      double act = 0;
      for (int k = s.slot->first; k < s.slot->first + s.slot->count; ++k)
        act += activation_bytes(m.act_bytes_per_sample[static_cast<size_t>(k)], m.batch,
                                static_cast<int>(s.devices->size()));
      for (int d : *s.devices) mem[static_cast<size_t>(d)] += act;
    }
  }

  // Exchanges device x of slot a with device y of slot b (-1: y idle); kept
  // when the objective drops below `best` (updated) within memory.
  bool try_swap(int a, int x, int b, int y, double& best) {
    // Parameters whose devices change: those of a and of b.
    changed_.clear();
    changed_.insert(changed_.end(), slots_[static_cast<size_t>(a)].params.begin(),
                    slots_[static_cast<size_t>(a)].params.end());
    if (b >= 0)
      changed_.insert(changed_.end(), slots_[static_cast<size_t>(b)].params.begin(),
                      slots_[static_cast<size_t>(b)].params.end());
    std::sort(changed_.begin(), changed_.end());
    changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
    // Waves whose transfers change: the wave and those of the readers.
    waves_touched_.clear();
    waves_touched_.push_back(slots_[static_cast<size_t>(a)].wave);
    for (int s : {a, b})
      if (s >= 0)
        for (int r : readers_[static_cast<size_t>(s)]) waves_touched_.push_back(slots_[static_cast<size_t>(r)].wave);
    std::sort(waves_touched_.begin(), waves_touched_.end());
    waves_touched_.erase(std::unique(waves_touched_.begin(), waves_touched_.end()), waves_touched_.end());

    const double transfer_before = transfer_ms();
    sync_before_ = sync_;
    // The shards of the changed parameters: their all-reduces come off now
    // and go back on over their holders after the exchange.
    saved_ms_.clear();
    for (int p : changed_)
      for (int sh = shard_first_[static_cast<size_t>(p)]; sh < shard_first_[static_cast<size_t>(p) + 1]; ++sh) {
        saved_ms_.push_back(shard_ms_[static_cast<size_t>(sh)]);
        remove_shard(sh);
      }
    // Edges whose bytes change: into a and b, and out of them.
    edges_touched_.clear();
    for (int s : {a, b}) {
      if (s < 0) continue;
      for (const Edge& e : slots_[static_cast<size_t>(s)].inputs) edges_touched_.push_back({&e, s});
      for (int r : readers_[static_cast<size_t>(s)])
        for (const Edge& e : slots_[static_cast<size_t>(r)].inputs)
          if (e.src == s) edges_touched_.push_back({&e, r});
    }
    saved_traffic_.clear();
    for (int w : waves_touched_) {
      const double* intra = &wave_intra_[static_cast<size_t>(w) * intra_stride()];
      const double* inter = &wave_inter_[static_cast<size_t>(w) * inter_stride()];
      saved_traffic_.insert(saved_traffic_.end(), intra, intra + intra_stride());
      saved_traffic_.insert(saved_traffic_.end(), inter, inter + inter_stride());
    }
    for (const auto& [e, dst] : edges_touched_) add_edge(*e, dst, -1.0);
    move(a, x, y);
    if (b >= 0) move(b, y, x);
    for (const auto& [e, dst] : edges_touched_) add_edge(*e, dst, 1.0);
    for (int p : changed_)
      for (int sh = shard_first_[static_cast<size_t>(p)]; sh < shard_first_[static_cast<size_t>(p) + 1]; ++sh)
        add_shard(sh);
    saved_wave_.clear();
    for (int w : waves_touched_) {
      saved_wave_.push_back(wave_ms_[static_cast<size_t>(w)]);
      wave_ms_[static_cast<size_t>(w)] = traffic_ms(w);
    }
    const double now = objective();
    bool keep = now < best - 1e-9 && transfer_ms() <= transfer_before + 1e-9;
    if (keep && in_.memory_bytes > 0) {
      memory(mem_);
      for (double bytes : mem_) keep = keep && bytes <= in_.memory_bytes;
    }
    if (keep) {
      // Recomputed from the edges: no rounding carried forward.
      for (int w : waves_touched_) wave_ms_[static_cast<size_t>(w)] = wave_ms(w);
      best = objective();
      return true;
    }
    move(a, y, x);
    if (b >= 0) move(b, x, y);
    sync_ = sync_before_;
    size_t k = 0;
    for (int p : changed_)
      for (int sh = shard_first_[static_cast<size_t>(p)]; sh < shard_first_[static_cast<size_t>(p) + 1]; ++sh)
        shard_ms_[static_cast<size_t>(sh)] = saved_ms_[k++];
    size_t at = 0;
    for (size_t i = 0; i < waves_touched_.size(); ++i) {
      const int w = waves_touched_[i];
      wave_ms_[static_cast<size_t>(w)] = saved_wave_[i];
      std::copy(saved_traffic_.begin() + static_cast<std::ptrdiff_t>(at),
                saved_traffic_.begin() + static_cast<std::ptrdiff_t>(at + intra_stride()),
                wave_intra_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(w) * intra_stride()));
      at += intra_stride();
      std::copy(saved_traffic_.begin() + static_cast<std::ptrdiff_t>(at),
                saved_traffic_.begin() + static_cast<std::ptrdiff_t>(at + inter_stride()),
                wave_inter_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(w) * inter_stride()));
      at += inter_stride();
    }
    return false;
  }

  int evals_left_ = 0;
  const PlaceInput& in_;
  int n_ = 0, per_island_ = 1, islands_ = 1;
  std::vector<SlotRef> slots_;                 // every slot, wave by wave
  std::vector<int> wave_first_;                // per wave: its first slot id; then the count
  std::vector<std::vector<int>> readers_;      // per slot: slots taking its output
  std::vector<double> wave_ms_;                // per wave: transfer ms
  std::vector<int> count_;                     // [p * n + d]: slots running p on d (memory)
  std::vector<int> tensor_parallel_;           // per parameter
  std::vector<int> shard_first_;               // per parameter: its first shard; then the shard count
  std::vector<int> shard_count_;               // [shard * n + d]: slots holding the shard on d
  std::vector<double> shard_ms_, sync_;        // per shard all-reduce; per device sum
  // Scratch.
  std::vector<double> wave_intra_, wave_inter_;   // [w * intra_stride() + ...]: bytes moved (wave_ms)
  std::vector<double> scratch_inter_, crossing_;
  std::vector<double> mem_, saved_ms_, saved_wave_, sync_before_, saved_traffic_;
  std::vector<std::pair<const Edge*, int>> edges_touched_;   // (edge, destination slot)
  std::vector<int> group_, changed_, waves_touched_;
};

}  // namespace

std::vector<WavePlacement> place_islands(const std::vector<AbstractWave>& waves, const PlaceInput& in,
                                         const std::vector<WavePlacement>* previous) {
  assert(in.cost != nullptr && in.devices >= 1);
  Hint hint;
  if (previous != nullptr) {
    assert(previous->size() == waves.size());
    for (size_t w = 0; w < waves.size(); ++w)
      for (size_t s = 0; s < waves[w].slots.size(); ++s)
        hint[{waves[w].slots[s].metaop, waves[w].slots[s].first}] = (*previous)[w].slot_devices[s];
  }
  const Placer placer(in, waves, previous, previous != nullptr ? &hint : nullptr);
  bool over_memory = false;
  std::vector<WavePlacement> out = place_all(placer, waves, over_memory);
  // The first pass only: the later ones follow where its outputs went.
  if (previous == nullptr && !over_memory)
    Improver(waves, in, out).run(kImproveSweeps, std::max(1, kImproveWork / in.devices));
  return out;
}

PlacementBytes placement_bytes(const std::vector<AbstractWave>& waves, const PlaceInput& in,
                               const std::vector<WavePlacement>& placed) {
  std::vector<WavePlacement> copy = placed;
  return Improver(waves, in, copy).bytes();
}

std::vector<WavePlacement> place_sequential(const std::vector<AbstractWave>& waves, int devices) {
  std::vector<WavePlacement> out;
  out.reserve(waves.size());
  for (const AbstractWave& wave : waves) {
    WavePlacement placed;
    int next = 0;
    for (const AbstractSlot& slot : wave.slots) {
      assert(next + slot.devices <= devices);
      std::vector<int> devs(static_cast<size_t>(slot.devices));
      std::iota(devs.begin(), devs.end(), next);
      next += slot.devices;
      placed.slot_devices.push_back(std::move(devs));
    }
    out.push_back(std::move(placed));
  }
  (void)devices;
  return out;
}

}  // namespace spindle::plan
