#include "libplan/place/simple_place.h"

#include <algorithm>
#include <cassert>
#include <numeric>
#include <tuple>

namespace spindle::plan {

std::vector<WavePlacement> place_simple(const std::vector<AbstractWave>& waves,
                                        const std::vector<std::vector<int>>& metaop_inputs,
                                        int devices, int devices_per_island) {
  const int n_dev = devices;
  const int island = devices_per_island > 0 ? devices_per_island : devices;
  std::vector<WavePlacement> out;
  out.reserve(waves.size());
  std::vector<std::vector<int>> last(metaop_inputs.size());   // devices of the previous slice
  std::vector<char> used(static_cast<size_t>(n_dev));
  std::vector<char> preferred(static_cast<size_t>(n_dev));
  std::vector<int> used_prefix(static_cast<size_t>(n_dev) + 1);
  std::vector<int> pref_prefix(static_cast<size_t>(n_dev) + 1);
  std::vector<size_t> order;

  for (const AbstractWave& wave : waves) {
    WavePlacement placed;
    placed.slot_devices.resize(wave.slots.size());
    std::fill(used.begin(), used.end(), 0);
    order.resize(wave.slots.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const AbstractSlot& x = wave.slots[a];
      const AbstractSlot& y = wave.slots[b];
      if (x.devices != y.devices) return x.devices > y.devices;
      return x.metaop < y.metaop;
    });
    // A slot on as many devices as its MetaOp's previous slice keeps exactly
    // those devices when they are all free: its activations need not move.
    for (size_t si : order) {
      const AbstractSlot& slot = wave.slots[si];
      const std::vector<int>& prev = last[static_cast<size_t>(slot.metaop)];
      if (static_cast<int>(prev.size()) != slot.devices) continue;
      if (std::any_of(prev.begin(), prev.end(), [&](int d) { return used[static_cast<size_t>(d)] != 0; }))
        continue;
      placed.slot_devices[si] = prev;
      for (int d : prev) used[static_cast<size_t>(d)] = 1;
    }
    for (size_t si : order) {
      if (!placed.slot_devices[si].empty()) continue;
      const AbstractSlot& slot = wave.slots[si];
      const int k = slot.devices;
      assert(k >= 1 && k <= n_dev);
      // Devices that already hold this MetaOp's activations.
      std::fill(preferred.begin(), preferred.end(), 0);
      const auto m = static_cast<size_t>(slot.metaop);
      if (!last[m].empty()) {
        for (int d : last[m]) preferred[static_cast<size_t>(d)] = 1;
      } else {
        for (int in : metaop_inputs[m])
          for (int d : last[static_cast<size_t>(in)]) preferred[static_cast<size_t>(d)] = 1;
      }
      for (size_t d = 0; d < static_cast<size_t>(n_dev); ++d) {
        used_prefix[d + 1] = used_prefix[d] + used[d];
        pref_prefix[d + 1] = pref_prefix[d] + preferred[d];
      }
      // Best free contiguous range by (island fit, overlap, aligned, -start).
      int best = -1;
      std::tuple<int, int, int> best_key{-1, -1, -1};
      for (int s = 0; s + k <= n_dev; ++s) {
        const auto a = static_cast<size_t>(s), b = static_cast<size_t>(s + k);
        if (used_prefix[b] != used_prefix[a]) continue;
        const int fits = k <= island ? (s / island == (s + k - 1) / island) : (s % island == 0);
        const int overlap = pref_prefix[b] - pref_prefix[a];
        const int aligned = s % k == 0;
        const std::tuple<int, int, int> key{fits, overlap, aligned};
        if (key > best_key) {   // strict: ties keep the lowest start
          best_key = key;
          best = s;
        }
      }
      std::vector<int>& devs = placed.slot_devices[si];
      if (best >= 0) {
        for (int d = best; d < best + k; ++d) devs.push_back(d);
      } else {
        // Fragmented: preferred free devices first, then the lowest free ids.
        for (int pass = 0; pass < 2 && static_cast<int>(devs.size()) < k; ++pass) {
          for (int d = 0; d < n_dev && static_cast<int>(devs.size()) < k; ++d) {
            const auto du = static_cast<size_t>(d);
            if (used[du] || (pass == 0 && !preferred[du])) continue;
            devs.push_back(d);
            used[du] = 1;   // marked here so the second pass skips it
          }
        }
        std::sort(devs.begin(), devs.end());
        assert(static_cast<int>(devs.size()) == k);
      }
      for (int d : devs) used[static_cast<size_t>(d)] = 1;
    }
    for (size_t si = 0; si < wave.slots.size(); ++si)
      last[static_cast<size_t>(wave.slots[si].metaop)] = placed.slot_devices[si];
    out.push_back(std::move(placed));
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
      (void)devices;
      std::vector<int> devs(static_cast<size_t>(slot.devices));
      std::iota(devs.begin(), devs.end(), next);
      next += slot.devices;
      placed.slot_devices.push_back(std::move(devs));
    }
    out.push_back(std::move(placed));
  }
  return out;
}

}  // namespace spindle::plan
