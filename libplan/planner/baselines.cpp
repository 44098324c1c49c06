#include "libplan/planner/baselines.h"

#include <algorithm>
#include <map>

#include "libplan/alloc/alloc.h"

namespace spindle::plan {

namespace {

const MetaOp& metaop(const BaselineInput& in, int id) {
  return in.contraction->metaops[static_cast<size_t>(id)];
}
const std::vector<int>& valid_of(const BaselineInput& in, int id) {
  return (*in.valid)[static_cast<size_t>(id)];
}
// L * T(n): the whole MetaOp on n devices.
double whole_ms(const BaselineInput& in, int id, int n) {
  return metaop(in, id).length() * (*in.curves)[static_cast<size_t>(id)]->time_ms(n);
}

// Largest valid count of MetaOp id at most n; 0 when none.
int largest_valid_at_most(const BaselineInput& in, int id, int n) {
  int best = 0;
  for (int v : valid_of(in, id))
    if (v <= n) best = v;
  return best;
}

// MetaOp ids of each task, ascending (topological).
std::vector<std::vector<int>> metaops_by_task(const BaselineInput& in) {
  std::vector<std::vector<int>> by_task(static_cast<size_t>(in.tasks));
  for (const MetaOp& m : in.contraction->metaops) by_task[static_cast<size_t>(m.task)].push_back(m.id);
  return by_task;
}

// Smallest share of a task: every MetaOp needs one valid count within it.
int smallest_share(const BaselineInput& in, const std::vector<int>& ids) {
  int share = 0;
  for (int id : ids) share = std::max(share, valid_of(in, id).front());
  return share;
}

// Packs items in order into consecutive groups whose sizes sum to at most
// `capacity` (an item larger than the capacity gets a group of its own).
std::vector<std::vector<int>> pack_in_order(const std::vector<int>& items,
                                            const std::vector<int>& sizes, int capacity) {
  std::vector<std::vector<int>> groups;
  int used = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (groups.empty() || used + sizes[i] > capacity) {
      groups.emplace_back();
      used = 0;
    }
    groups.back().push_back(items[i]);
    used += sizes[i];
  }
  return groups;
}

AbstractWave make_wave(std::vector<AbstractSlot> slots) {
  std::sort(slots.begin(), slots.end(),
            [](const AbstractSlot& a, const AbstractSlot& b) { return a.metaop < b.metaop; });
  AbstractWave w;
  for (const AbstractSlot& s : slots) w.ms = std::max(w.ms, s.ms);
  w.slots = std::move(slots);
  return w;
}

// Device counts for MetaOps `ids` running side by side on `devices` devices,
// from their relaxed optimum (see intra_task_waves). Requires the smallest
// valid counts to fit.
std::vector<int> side_by_side_counts(const BaselineInput& in, const std::vector<int>& ids,
                                     int devices) {
  std::vector<AllocItem> items;
  for (int id : ids)
    items.push_back({metaop(in, id).length(), (*in.curves)[static_cast<size_t>(id)],
                     valid_of(in, id).back()});
  const RelaxedAllocation relaxed = relax_level(items, devices);
  std::vector<int> n(ids.size());
  int used = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int floor_n = largest_valid_at_most(
        in, ids[k], static_cast<int>(relaxed.n_star[k] * (1 + 1e-9) + 1e-9));
    n[k] = std::max(floor_n, valid_of(in, ids[k]).front());
    used += n[k];
  }
  // Too many (smallest counts forced up): step down the MetaOp that stays
  // fastest after the step.
  while (used > devices) {
    size_t best = ids.size();
    int best_n = 0;
    double best_ms = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      const int lower = largest_valid_at_most(in, ids[k], n[k] - 1);
      if (lower == 0) continue;
      const double ms = whole_ms(in, ids[k], lower);
      if (best == ids.size() || ms < best_ms) {
        best = k;
        best_n = lower;
        best_ms = ms;
      }
    }
    if (best == ids.size()) break;   // cannot happen when the smallest counts fit
    used -= n[best] - best_n;
    n[best] = best_n;
  }
  // Idle devices: widen the slowest MetaOp while its next valid count fits.
  for (;;) {
    size_t slowest = 0;
    for (size_t k = 1; k < ids.size(); ++k)
      if (whole_ms(in, ids[k], n[k]) > whole_ms(in, ids[slowest], n[slowest])) slowest = k;
    const std::vector<int>& valid = valid_of(in, ids[slowest]);
    const auto next = std::upper_bound(valid.begin(), valid.end(), n[slowest]);
    if (next == valid.end() || used - n[slowest] + *next > devices) break;
    used += *next - n[slowest];
    n[slowest] = *next;
  }
  return n;
}

}  // namespace

AbstractSlot whole_metaop_slot(const BaselineInput& in, int id, int n) {
  return {id, 0, metaop(in, id).length(), n, whole_ms(in, id, n)};
}

std::vector<int> task_level_shares(const BaselineInput& in, const std::vector<int>& tasks,
                                   int devices) {
  const std::vector<std::vector<int>> by_task = metaops_by_task(in);
  std::vector<int> share(tasks.size());
  std::vector<std::vector<int>> candidates(tasks.size());   // ascending, above the share
  int used = 0;
  for (size_t t = 0; t < tasks.size(); ++t) {
    const std::vector<int>& ids = by_task[static_cast<size_t>(tasks[t])];
    share[t] = smallest_share(in, ids);
    used += share[t];
    for (int id : ids)
      for (int v : valid_of(in, id))
        if (v > share[t] && v <= devices) candidates[t].push_back(v);
    std::sort(candidates[t].begin(), candidates[t].end());
    candidates[t].erase(std::unique(candidates[t].begin(), candidates[t].end()),
                        candidates[t].end());
  }
  // T(n) of a task: its MetaOps one after another within n devices.
  auto task_ms = [&](size_t t, int n) {
    double ms = 0;
    for (int id : by_task[static_cast<size_t>(tasks[t])])
      ms += whole_ms(in, id, largest_valid_at_most(in, id, n));
    return ms;
  };
  std::vector<size_t> next(tasks.size(), 0);   // index of the next share in candidates
  for (;;) {
    size_t best = tasks.size();
    double best_gain = 0;
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (next[t] >= candidates[t].size()) continue;
      const int n2 = candidates[t][next[t]];
      if (used - share[t] + n2 > devices) continue;
      const double gain = (task_ms(t, share[t]) - task_ms(t, n2)) / (n2 - share[t]);
      if (best == tasks.size() || gain > best_gain) {
        best = t;
        best_gain = gain;
      }
    }
    if (best == tasks.size()) break;
    const int n2 = candidates[best][next[best]++];
    used += n2 - share[best];
    share[best] = n2;
  }
  return share;
}

std::vector<AbstractWave> task_level_waves(const BaselineInput& in) {
  const std::vector<std::vector<int>> by_task = metaops_by_task(in);
  std::vector<int> tasks;
  std::vector<int> smallest;
  for (int t = 0; t < in.tasks; ++t) {
    if (by_task[static_cast<size_t>(t)].empty()) continue;
    tasks.push_back(t);
    smallest.push_back(smallest_share(in, by_task[static_cast<size_t>(t)]));
  }
  // Fallback when the smallest shares do not fit: groups of tasks, one after
  // another (a single group when they fit).
  std::vector<AbstractWave> waves;
  for (const std::vector<int>& group : pack_in_order(tasks, smallest, in.devices)) {
    const std::vector<int> share = task_level_shares(in, group, in.devices);
    size_t depth = 0;
    for (int t : group) depth = std::max(depth, by_task[static_cast<size_t>(t)].size());
    for (size_t k = 0; k < depth; ++k) {
      std::vector<AbstractSlot> slots;
      for (size_t g = 0; g < group.size(); ++g) {
        const std::vector<int>& ids = by_task[static_cast<size_t>(group[g])];
        if (k >= ids.size()) continue;
        slots.push_back(whole_metaop_slot(in, ids[k], largest_valid_at_most(in, ids[k], share[g])));
      }
      waves.push_back(make_wave(std::move(slots)));
    }
  }
  return waves;
}

std::vector<AbstractWave> intra_task_waves(const BaselineInput& in) {
  const std::vector<std::vector<int>> by_task = metaops_by_task(in);
  std::vector<AbstractWave> waves;
  for (const std::vector<int>& ids : by_task) {
    std::map<int, std::vector<int>> by_level;   // ascending level, ids ascending
    for (int id : ids) by_level[metaop(in, id).level].push_back(id);
    for (const auto& [level, level_ids] : by_level) {
      std::vector<int> smallest;
      for (int id : level_ids) smallest.push_back(valid_of(in, id).front());
      for (const std::vector<int>& group : pack_in_order(level_ids, smallest, in.devices)) {
        const std::vector<int> n = side_by_side_counts(in, group, in.devices);
        std::vector<AbstractSlot> slots;
        for (size_t k = 0; k < group.size(); ++k) slots.push_back(whole_metaop_slot(in, group[k], n[k]));
        waves.push_back(make_wave(std::move(slots)));
      }
    }
  }
  return waves;
}

}  // namespace spindle::plan
