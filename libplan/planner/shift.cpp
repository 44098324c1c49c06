#include "libplan/planner/shift.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "libplan/plan/check.h"
#include "libplan/planner/feasibility.h"
#include "libplan/rules/links.h"
#include "libplan/util/parallel.h"

namespace spindle::plan {
namespace {

// Where one slice is: plan.waves[wave].slices[slice].
struct At {
  size_t wave = 0, slice = 0;
};

// The slices of `metaop` in chain order (ascending first operator).
std::vector<At> chain_of(const Plan& plan, int metaop) {
  std::vector<At> at;
  for (size_t w = 0; w < plan.waves.size(); ++w)
    for (size_t k = 0; k < plan.waves[w].slices.size(); ++k)
      if (plan.waves[w].slices[k].metaop == metaop) at.push_back({w, k});
  std::sort(at.begin(), at.end(), [&](const At& a, const At& b) {
    return plan.waves[a.wave].slices[a.slice].first < plan.waves[b.wave].slices[b.slice].first;
  });
  return at;
}

// The scan's list: every cut of every MetaOp with two slices or more, both
// ways, MetaOps by device-ms, most first (ties: the lower id), with each
// wave's two wave shifts among them (below). Empty when no MetaOp has a
// cut.
std::vector<Shift> all_shifts(const Plan& plan) {
  std::vector<double> work(plan.metaops.size(), 0);
  std::vector<int> slices(plan.metaops.size(), 0);
  for (const Wave& w : plan.waves)
    for (const Slice& s : w.slices) {
      if (s.metaop < 0 || static_cast<size_t>(s.metaop) >= work.size()) continue;
      work[static_cast<size_t>(s.metaop)] += s.ms * static_cast<double>(s.devices.size());
      ++slices[static_cast<size_t>(s.metaop)];
    }
  std::vector<int> order(plan.metaops.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return work[static_cast<size_t>(a)] > work[static_cast<size_t>(b)]; });
  std::vector<Shift> singles;
  for (int m : order)
    for (int cut = 0; cut + 1 < slices[static_cast<size_t>(m)]; ++cut) {
      singles.push_back({m, cut, true});
      singles.push_back({m, cut, false});
    }
  if (singles.empty()) return singles;
  // Each wave's two wave shifts, waves in order, one before each
  // kSinglesPerWaveShift single shifts: under a budget neither kind waits
  // for the other's whole list.
  std::vector<Shift> shifts;
  size_t next = 0;
  for (size_t w = 0; w < plan.waves.size(); ++w)
    for (bool forward : {true, false}) {
      shifts.push_back({0, 0, forward, static_cast<int>(w)});
      for (int k = 0; k < kSinglesPerWaveShift && next < singles.size(); ++k) shifts.push_back(singles[next++]);
    }
  shifts.insert(shifts.end(), singles.begin() + static_cast<std::ptrdiff_t>(next), singles.end());
  return shifts;
}

// The single shifts of wave shift `s`: every cut right after a slice of
// its wave, in the wave's slice order.
std::vector<Shift> cuts_after(const Plan& plan, const Shift& s) {
  std::vector<Shift> cuts;
  const size_t w = static_cast<size_t>(s.wave);
  if (w >= plan.waves.size()) return cuts;
  for (size_t k = 0; k < plan.waves[w].slices.size(); ++k) {
    const int metaop = plan.waves[w].slices[k].metaop;
    const std::vector<At> chain = chain_of(plan, metaop);
    for (size_t c = 0; c + 1 < chain.size(); ++c)
      if (chain[c].wave == w && chain[c].slice == k) cuts.push_back({metaop, static_cast<int>(c), s.forward});
  }
  return cuts;
}

// Every wave swap of `plan`: each pair of adjacent waves, waves in order,
// each island (rules/links.h) in order.
std::vector<Shift> all_swaps(const Plan& plan) {
  const int islands = island_count(plan.devices, plan.devices_per_island);
  std::vector<Shift> swaps;
  for (size_t w = 0; w + 1 < plan.waves.size(); ++w)
    for (int i = 0; i < islands; ++i) swaps.push_back({0, 0, true, static_cast<int>(w), i});
  return swaps;
}

// Wave swap `s` (Shift::island) applied, or false with `plan` unchanged.
bool apply_swap(Plan& plan, const Shift& s) {
  const size_t w = static_cast<size_t>(s.wave);
  if (w + 1 >= plan.waves.size() || s.island >= island_count(plan.devices, plan.devices_per_island)) return false;
  auto on_island = [&](int d) { return island_of(d, plan.devices_per_island) == s.island; };
  // Each wave's slices split into those inside the island (they move) and
  // the rest (they stay); none may straddle it.
  std::vector<Slice> moving[2], staying[2];
  for (size_t k = 0; k < 2; ++k)
    for (const Slice& sl : plan.waves[w + k].slices) {
      const auto inside = static_cast<size_t>(std::count_if(sl.devices.begin(), sl.devices.end(), on_island));
      if (inside == 0) staying[k].push_back(sl);
      else if (inside == sl.devices.size()) moving[k].push_back(sl);
      else return false;
    }
  if (moving[0].empty() && moving[1].empty()) return false;
  if (staying[0].empty() && moving[1].empty()) return false;   // a wave left without slices
  if (staying[1].empty() && moving[0].empty()) return false;
  const Wave before[2] = {plan.waves[w], plan.waves[w + 1]};   // only these two change
  for (size_t k = 0; k < 2; ++k) {
    Wave& wave = plan.waves[w + k];
    wave.slices = std::move(staying[k]);
    wave.slices.insert(wave.slices.end(), moving[1 - k].begin(), moving[1 - k].end());
    wave.ms = 0;
    for (const Slice& sl : wave.slices) wave.ms = std::max(wave.ms, sl.ms);
  }
  if (check_wave_order(plan).empty()) return true;
  plan.waves[w] = before[0];
  plan.waves[w + 1] = before[1];
  return false;
}

}  // namespace

bool apply_shift(Plan& plan, const Shift& s) {
  if (s.island >= 0) return s.wave >= 0 && apply_swap(plan, s);
  if (s.wave >= 0) {
    const std::vector<Wave> before = plan.waves;
    int applied = 0;
    for (const Shift& cut : cuts_after(plan, s)) applied += apply_shift(plan, cut) ? 1 : 0;
    if (applied >= 2) return true;
    plan.waves = before;
    return false;
  }
  const std::vector<At> chain = chain_of(plan, s.metaop);
  if (s.cut < 0 || static_cast<size_t>(s.cut) + 1 >= chain.size()) return false;
  const At at_a = chain[static_cast<size_t>(s.cut)], at_b = chain[static_cast<size_t>(s.cut) + 1];
  Slice& a = plan.waves[at_a.wave].slices[at_a.slice];
  Slice& b = plan.waves[at_b.wave].slices[at_b.slice];
  if ((s.forward ? a.count : b.count) < 2) return false;
  const double per_a = a.ms / a.count, per_b = b.ms / b.count;   // ms per operator on each slice's devices
  const int step = s.forward ? 1 : -1;
  a.count -= step;
  b.first -= step;
  b.count += step;
  a.ms = a.count * per_a;
  b.ms = b.count * per_b;
  for (size_t w : {at_a.wave, at_b.wave}) {
    Wave& wave = plan.waves[w];
    wave.ms = 0;
    for (const Slice& slice : wave.slices) wave.ms = std::max(wave.ms, slice.ms);
  }
  return true;
}

int shift_budget(const Plan& plan, int max) {
  // The devices the plan uses: one planned on a share of the islands
  // (plan_beating) simulates, and so shifts, as on that share alone.
  std::vector<char> used(static_cast<size_t>(std::max(plan.devices, 0)), 0);
  for (const Wave& w : plan.waves)
    for (const Slice& s : w.slices)
      for (int d : s.devices)
        if (d >= 0 && d < plan.devices) used[static_cast<size_t>(d)] = 1;
  const int devices = static_cast<int>(std::count(used.begin(), used.end(), 1));
  const int singles = std::min(max, kShiftDevices / std::max(devices, 1));
  const int wave_shifts = static_cast<int>(std::min<size_t>(2 * plan.waves.size(), static_cast<size_t>(std::max(singles, 0))));
  return singles + wave_shifts;
}

namespace {

// One cyclic scan of shift_boundaries over `shifts` from `plan`, whose
// makespans `times` holds, with at most `max_simulations`: `plan` and
// `times` end as the scan leaves them.
Status scan(Plan& plan, ShiftTimes& times, const std::vector<Shift>& shifts, int max_simulations,
            const ShiftSimulate& simulate, const ShiftFits& fits) {
  double& simulated_ms = times.ms;
  double& compute_ms = times.compute_ms;
  if (shifts.empty() || max_simulations <= 0) return {};
  struct Tried {
    Result<ShiftTimes> times = ShiftTimes{};
    bool kept = false;   // no slower on either count, faster on one, and fits
  };
  // Batches run `rounds` at a time on a machine with the threads for it:
  // batch j + 1 is formed as if batch j kept nothing, and when batch j
  // keeps a shift the batches after it are dropped, their simulations not
  // counted (the scan goes on from j as with one batch at a time). So the
  // result and the simulations counted against max_simulations are those
  // of one batch at a time, on any number of threads; more threads only
  // simulate ahead.
  const size_t rounds = std::max<size_t>(1, parallel_workers(kMaxShiftRounds * kShiftBatch) / kShiftBatch);
  const size_t width = rounds * static_cast<size_t>(kShiftBatch);
  // Only the waves change: each scratch plan copies them from `plan`.
  std::vector<Plan> scratch(width, plan);
  std::vector<Tried> tried(width);
  int simulations = 0;
  // The list is scanned in a cycle: a kept shift is tried again at once
  // (a cut that moved once may move again), and when it no longer helps the
  // scan goes on after it, not back to the start: the shifts before it
  // failed a moment ago and are tried again on the next round, so a budget
  // of simulations reaches more distinct cuts. A round through the whole
  // list that keeps none ends the search. (Restarting from the start after
  // each kept shift, as before, gave slower plans in 4 of bench/paper's 13
  // cases and faster in none; on 64 devices multitask-clip-7 and -10 came
  // out 0.4% and 0.1% faster that way.)
  const size_t n = shifts.size();
  size_t pos = 0;      // where the next batch starts
  size_t misses = 0;   // shifts tried (or not applicable) since the last one kept
  // One batch simulated in a round: its shifts and the scan's counters as
  // it leaves them when it keeps nothing.
  struct Batch {
    size_t begin = 0, end = 0;   // into scratch and tried
    std::vector<size_t> at;      // each shift's place in the list
    size_t pos = 0, misses = 0;
    int simulations = 0;
  };
  std::vector<Batch> ahead;
  while (misses < n && simulations < max_simulations) {
    // The next batches: the shifts from `pos` on, cyclically, that apply,
    // kShiftBatch to a batch, each batch's counters as the one before it
    // leaves them when it keeps nothing.
    ahead.clear();
    size_t a_pos = pos, a_misses = misses, used = 0;
    int a_simulations = simulations;
    while (ahead.size() < rounds && a_misses < n && a_simulations < max_simulations) {
      Batch b;
      b.begin = used;
      while (b.at.size() < static_cast<size_t>(kShiftBatch) && a_misses + b.at.size() < n &&
             a_simulations + static_cast<int>(b.at.size()) < max_simulations) {
        scratch[used].waves = plan.waves;
        if (apply_shift(scratch[used], shifts[a_pos])) {
          b.at.push_back(a_pos);
          ++used;
        } else {
          ++a_misses;
        }
        a_pos = (a_pos + 1) % n;
      }
      b.end = used;
      a_simulations += static_cast<int>(b.at.size());
      a_misses += b.at.size();
      b.pos = a_pos;
      b.misses = a_misses;
      b.simulations = a_simulations;
      const bool empty = b.at.empty();
      ahead.push_back(std::move(b));
      if (empty) break;   // nothing left to try in this round of the list
    }
    // Ties within rounding count as equal: a bound a hair above each.
    const double bound = simulated_ms * (1 + 1e-9), compute_bound = compute_ms * (1 + 1e-9);
    parallel_for(used, [&](size_t, size_t k) {
      Tried& t = tried[k];
      t.times = simulate(scratch[k], bound, compute_bound);
      t.kept = false;
      if (!t.times || t.times->ms > bound || t.times->compute_ms > compute_bound) return;
      const bool faster = t.times->ms < simulated_ms * (1 - 1e-9) || t.times->compute_ms < compute_ms * (1 - 1e-9);
      t.kept = faster && fits(scratch[k]);
    });
    // The batches in order, as one at a time would take them: the first
    // kept shift of the first batch that keeps one wins.
    for (const Batch& b : ahead) {
      pos = b.pos;
      misses = b.misses;
      simulations = b.simulations;
      size_t kept = b.end;
      for (size_t k = b.begin; k < b.end; ++k) {
        if (!tried[k].times) return tried[k].times.error();
        if (tried[k].kept) {
          kept = k;
          break;
        }
      }
      if (kept == b.end) continue;
      plan.waves = scratch[kept].waves;
      simulated_ms = std::min(simulated_ms, tried[kept].times->ms);
      compute_ms = std::min(compute_ms, tried[kept].times->compute_ms);
      pos = b.at[kept - b.begin];   // the same shift again next
      misses = 0;
      break;
    }
  }
  return {};
}

}  // namespace

ShiftFits shift_memory_fits(CostTables tables, const CostModel& cost, const Model& model) {
  return [tables = std::move(tables), &cost, &model](const Plan& shifted) {
    Plan costed = shifted;
    cost_plan(costed, tables, cost);
    return check_plan_memory(costed, model).ok();
  };
}

Result<double> shift_boundaries(Plan& plan, const ShiftTimes& given, int max_simulations,
                                const ShiftSimulate& simulate, const ShiftFits& fits) {
  ShiftTimes times = given;
  SPINDLE_TRY(scan(plan, times, all_shifts(plan), max_simulations, simulate, fits));
  const std::vector<Shift> swaps = all_swaps(plan);
  SPINDLE_TRY(scan(plan, times, swaps, std::min(static_cast<int>(swaps.size()), max_simulations / 2), simulate, fits));
  return times.ms;
}

}  // namespace spindle::plan
