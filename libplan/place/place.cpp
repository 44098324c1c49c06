#include "libplan/place/place.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

namespace spindle::plan {

namespace {

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
    islands_ = (n_ + island_ - 1) / island_;
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
  int island_of(int d) const { return d / island_; }

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
  const size_t slots = wave.slots.size();
  WavePlacement placed;
  placed.slot_devices.resize(slots);
  State& next = s;   // updated in place (see the contract)
  std::vector<char> used(static_cast<size_t>(n_), 0);

  // 1. Same device count as the MetaOp's previous slice: keep its devices.
  for (size_t si = 0; si < slots; ++si) {
    const AbstractSlot& slot = wave.slots[si];
    const auto& prev = next.last[static_cast<size_t>(slot.metaop)];
    if (static_cast<int>(prev.size()) != slot.devices) continue;
    bool ok = true;
    for (int d : prev) ok = ok && !used[static_cast<size_t>(d)] && fits(next, slot, d, ignore_memory);
    if (!ok) continue;
    placed.slot_devices[si] = prev;
    take(next, used, slot, prev);
  }

  // The rest: larger slots first, then more input bytes, then lower MetaOp id.
  std::vector<size_t> order;
  std::vector<double> input_bytes(slots, 0.0);
  for (size_t si = 0; si < slots; ++si) {
    if (!placed.slot_devices[si].empty()) continue;
    order.push_back(si);
    for (const Source& src : sources(next, wave.slots[si])) input_bytes[si] += src.bytes;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const AbstractSlot& x = wave.slots[a];
    const AbstractSlot& y = wave.slots[b];
    return std::make_tuple(-x.devices, -input_bytes[a], x.metaop) <
           std::make_tuple(-y.devices, -input_bytes[b], y.metaop);
  });

  std::vector<double> held(static_cast<size_t>(n_));
  std::vector<double> held_island(static_cast<size_t>(islands_));
  std::vector<std::vector<int>> island_candidates(static_cast<size_t>(islands_));
  std::vector<char> candidates_known(static_cast<size_t>(islands_));
  std::vector<int> slot_params;     // per slot: its parameters, in operator order
  std::vector<int> sole_island_k;   // per slot: operators whose parameter is held in exactly one island
  for (size_t si : order) {
    const AbstractSlot& slot = wave.slots[si];
    const PlaceMetaOp& m = in_.metaops[static_cast<size_t>(slot.metaop)];
    // Where the slot's inputs are: bytes per device and per island.
    std::fill(held.begin(), held.end(), 0.0);
    std::fill(held_island.begin(), held_island.end(), 0.0);
    double total = 0;
    for (const Source& src : sources(next, slot)) {
      total += src.bytes;
      const double per_device = src.bytes / static_cast<double>(src.devices->size());
      for (int d : *src.devices) {
        held[static_cast<size_t>(d)] += per_device;
        held_island[static_cast<size_t>(island_of(d))] += per_device;
      }
    }
    // What the slot charges device d (need()): the same for every device
    // holding none of its parameters, so that sum is made once.
    slot_params.clear();
    for (int k = slot.first; k < slot.first + slot.count; ++k)
      if (m.param[static_cast<size_t>(k)] >= 0) slot_params.push_back(m.param[static_cast<size_t>(k)]);
    bool fresh_known = false;
    double fresh_bytes = 0;
    auto need_on = [&](int d) {
      const size_t base = static_cast<size_t>(d) * params_;
      for (int p : slot_params)
        if (next.has[base + static_cast<size_t>(p)]) return need(next, slot, d);
      if (!fresh_known) {
        fresh_bytes = need(next, slot, d);
        fresh_known = true;
      }
      return fresh_bytes;
    };
    // Free devices of island i that could take the slot, best first.
    // Computed once per island and slot: what they depend on (used, memory,
    // parameters held, held) changes only when the slot is committed.
    std::fill(candidates_known.begin(), candidates_known.end(), 0);
    auto candidates = [&](int i) -> const std::vector<int>& {
      std::vector<int>& c = island_candidates[static_cast<size_t>(i)];
      if (candidates_known[static_cast<size_t>(i)]) return c;
      candidates_known[static_cast<size_t>(i)] = 1;
      c.clear();
      const bool check_memory = !ignore_memory && in_.memory_bytes > 0;   // as fits()
      for (int d = i * island_; d < std::min(n_, (i + 1) * island_); ++d)
        if (!used[static_cast<size_t>(d)] &&
            (!check_memory || next.mem[static_cast<size_t>(d)] + need_on(d) <= in_.memory_bytes))
          c.push_back(d);
      std::sort(c.begin(), c.end(), [&](int a, int b) {
        const auto au = static_cast<size_t>(a), bu = static_cast<size_t>(b);
        if (balance && next.mem[au] != next.mem[bu]) return next.mem[au] < next.mem[bu];
        if (held[au] != held[bu]) return held[au] > held[bu];
        if (next.mem[au] != next.mem[bu]) return next.mem[au] < next.mem[bu];
        return a < b;
      });
      return c;
    };
    // The slot's parameters held so far in exactly one island (its
    // operators, in order): the ones island_cost may charge.
    sole_island_k.clear();
    if (!cross_sync_per_param_.empty()) {
      for (int k = slot.first; k < slot.first + slot.count; ++k) {
        const int p = m.param[static_cast<size_t>(k)];
        if (p < 0) continue;
        const size_t row = static_cast<size_t>(p) * static_cast<size_t>(islands_);
        int held_in = 0;
        for (int j = 0; j < islands_; ++j) held_in += next.in_island[row + static_cast<size_t>(j)];
        if (held_in == 1) sole_island_k.push_back(k);
      }
    }
    // Cost of putting the slot (or `k` of its devices) in island i, ms.
    auto island_cost = [&](int i) {
      const double outside = total - held_island[static_cast<size_t>(i)];
      double ms = outside > 0 ? 2.0 * (in_.cost->p2p_ms(outside, true) - in_.cost->p2p_ms(outside, false)) : 0.0;
      for (int k : sole_island_k) {
        const int p = m.param[static_cast<size_t>(k)];
        if (!next.in_island[static_cast<size_t>(p) * static_cast<size_t>(islands_) + static_cast<size_t>(i)])
          ms += cross_sync_per_param_[static_cast<size_t>(p)];
      }
      return ms;
    };
    // The best island among those with `k` candidates, excluding `skip`.
    auto best_island = [&](int k, const std::vector<char>& skip) {
      int best = -1;
      std::tuple<double, double, double, int> best_key{};
      for (int i = 0; i < islands_; ++i) {
        if (skip[static_cast<size_t>(i)]) continue;
        const std::vector<int>& c = candidates(i);
        if (static_cast<int>(c.size()) < k) continue;
        double free_mem = 0;
        if (balance)
          for (int d : c) free_mem -= next.mem[static_cast<size_t>(d)];
        const std::tuple<double, double, double, int> key{island_cost(i), balance ? free_mem : 0.0,
                                                          -held_island[static_cast<size_t>(i)], i};
        if (best < 0 || key < best_key) {
          best = i;
          best_key = key;
        }
      }
      return best;
    };

    std::vector<int> devs;
    std::vector<char> skip(static_cast<size_t>(islands_), 0);
    int rest = slot.devices;
    if (slot.devices > island_) {
      // 2. Whole free islands, those holding most of the inputs first.
      std::vector<int> whole;
      for (int i = 0; i < islands_; ++i)
        if (static_cast<int>(candidates(i).size()) == std::min(n_, (i + 1) * island_) - i * island_)
          whole.push_back(i);
      std::stable_sort(whole.begin(), whole.end(), [&](int a, int b) {
        return held_island[static_cast<size_t>(a)] > held_island[static_cast<size_t>(b)];
      });
      for (int i : whole) {
        const int size = std::min(n_, (i + 1) * island_) - i * island_;
        if (size > rest) continue;
        for (int d = i * island_; d < i * island_ + size; ++d) devs.push_back(d);
        skip[static_cast<size_t>(i)] = 1;
        rest -= size;
        if (rest < island_) break;
      }
    }
    if (rest > 0) {
      // 3. One island for what is left of the slot.
      const int i = best_island(rest, skip);
      if (i >= 0) {
        const std::vector<int>& c = candidates(i);
        devs.insert(devs.end(), c.begin(), c.begin() + rest);
        rest = 0;
      }
    }
    if (rest > 0) {
      // Fragmented: islands with the most room first.
      std::vector<std::pair<int, std::vector<int>>> room;
      for (int i = 0; i < islands_; ++i) {
        std::vector<int> c = candidates(i);
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
    if (rest > 0) return std::nullopt;   // memory: no device left that can take it
    std::sort(devs.begin(), devs.end());
    placed.slot_devices[si] = devs;
    take(next, used, slot, devs);
  }
  for (size_t si = 0; si < slots; ++si)
    next.last[static_cast<size_t>(wave.slots[si].metaop)] = placed.slot_devices[si];
  return placed;
}

}  // namespace

std::vector<WavePlacement> place_islands(const std::vector<AbstractWave>& waves, const PlaceInput& in,
                                         const std::vector<WavePlacement>* previous) {
  assert(in.cost != nullptr && in.devices >= 1);
  constexpr size_t kBacktrack = 4;
  Hint hint;
  if (previous != nullptr) {
    assert(previous->size() == waves.size());
    for (size_t w = 0; w < waves.size(); ++w)
      for (size_t s = 0; s < waves[w].slots.size(); ++s)
        hint[{waves[w].slots[s].metaop, waves[w].slots[s].first}] = (*previous)[w].slot_devices[s];
  }
  const Placer placer(in, waves, previous, previous != nullptr ? &hint : nullptr);
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
    }
    ring_size = 0;   // snapshots before the re-placed waves are stale
  }
  return out;
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
