// Which batch rows each device of a slice holds, and which rows move where
// when the next slice runs on other devices (docs/runtime.md). The planner's
// costing, the lowering (and so the simulator) and the runtime all take their
// messages from reshard_moves: there is no second description of them.
//
// A slice runs on n devices with tensor-parallel degree K (K divides n): the
// device at position i (0-based, in the slice's ascending device list) is in
// data-parallel group g = i / K of G = n / K groups and has TP rank i % K.
// Group g holds batch rows [g*B/G, (g+1)*B/G) of the task batch B (G divides
// B, rules/devices.h); the K devices of a group hold the same rows and the
// same values (activations after a TP layer's all-reduce, and input
// gradients after its backward all-reduce, are identical on the K ranks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "libplan/rules/links.h"

namespace spindle::plan {

// Half-open range of batch rows [begin, end).
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const RowRange&) const = default;
};

// How a batch is laid out over a slice's devices.
struct RowLayout {
  int64_t batch = 0;  // B, the task's global batch
  int devices = 1;    // n
  int tp = 1;         // K; divides n, and n / K divides B

  int groups() const { return devices / tp; }
  int group_of(int position) const { return position / tp; }
  int tp_rank_of(int position) const { return position % tp; }
  RowRange group_rows(int group) const {
    const int64_t g = groups();
    return {group * batch / g, (group + 1) * batch / g};
  }
  RowRange rows_of(int position) const { return group_rows(group_of(position)); }
};

// Intersection of two ranges (size 0 when disjoint).
inline RowRange intersect(RowRange a, RowRange b) {
  const int64_t lo = a.begin > b.begin ? a.begin : b.begin, hi = a.end < b.end ? a.end : b.end;
  return hi > lo ? RowRange{lo, hi} : RowRange{lo, lo};
}

// One piece of a re-sharding: rows `rows` (absolute batch rows) go from
// device `src` to device `dst`. src == dst is a local copy (no message).
struct RowMove {
  int src = 0;
  int dst = 0;
  RowRange rows;
  bool operator==(const RowMove&) const = default;
};

// Rows held by the slice on `from` (ascending device ids, tensor-parallel
// degree from_tp) as needed by the slice on `to` (to_tp), both over batch
// `batch`. For every device of `to` in position order, for every group of
// `from` whose rows overlap that device's rows (ascending rows), one move
// from the group's replica nearest to the receiver: the receiver itself when
// it holds one, else the first replica on the receiver's island (islands of
// `devices_per_island` consecutive ids), else the group's TP rank 0.
//
// Forward (activations): reshard_moves(producer, consumer). Backward (their
// gradients): reshard_moves(consumer, producer). Deterministic: every rank
// and the planner compute the same list. Requires valid layouts (K divides
// n, n / K divides batch); devices_per_island < 1 counts as 1.
std::vector<RowMove> reshard_moves(const std::vector<int>& from, int from_tp, const std::vector<int>& to,
                                   int to_tp, int64_t batch, int devices_per_island);

// The same moves, in the same order, handed to f(const RowMove&) one by one
// without building a list (the planner's costing calls this in its loops).
template <class F>
void for_each_reshard_move(const std::vector<int>& from, int from_tp, const std::vector<int>& to, int to_tp,
                           int64_t batch, int devices_per_island, F&& f);

// A re-sharding's forward moves (producer `from` -> consumer `to`) to
// fwd(const RowMove&) and its backward moves (`to` -> `from`, the gradients)
// to bwd(const RowMove&), each as the two for_each_reshard_move calls would
// give them (the backward ones in another order when both sides have one
// holder per row: then they are the forward moves reversed, the same device
// pairs and rows, and the rows are walked once). For consumers of the moves
// as sums (placement's evaluator); the lowering keeps the calls' order.
template <class Fwd, class Bwd>
void for_each_reshard_move_both_ways(const std::vector<int>& from, int from_tp, const std::vector<int>& to,
                                     int to_tp, int64_t batch, int devices_per_island, Fwd&& fwd, Bwd&& bwd) {
  if (from_tp == 1 && to_tp == 1) {
    for_each_reshard_move(from, 1, to, 1, batch, devices_per_island, [&](const RowMove& m) {
      fwd(m);
      bwd(RowMove{m.dst, m.src, m.rows});
    });
    return;
  }
  for_each_reshard_move(from, from_tp, to, to_tp, batch, devices_per_island, fwd);
  for_each_reshard_move(to, to_tp, from, from_tp, batch, devices_per_island, bwd);
}

// --- implementation of the template ---

template <class F>
void for_each_reshard_move(const std::vector<int>& from, int from_tp, const std::vector<int>& to, int to_tp,
                           int64_t batch, int devices_per_island, F&& f) {
  const RowLayout src{batch, static_cast<int>(from.size()), from_tp};
  const RowLayout dst{batch, static_cast<int>(to.size()), to_tp};
  const int groups = src.groups();
  for (int j = 0; j < dst.devices; ++j) {
    const int d = to[static_cast<size_t>(j)];
    const RowRange need = dst.rows_of(j);
    // Source groups overlapping `need`: their row ranges ascend with g, so
    // start at the first group ending after need.begin: estimated from the
    // row (groups are about batch / groups rows each), then corrected (at
    // most a step or two; this runs in the planner's inner loops).
    int g = batch > 0 ? static_cast<int>(need.begin * groups / batch) : 0;
    g = g < 0 ? 0 : (g > groups - 1 ? groups - 1 : g);
    while (g > 0 && src.group_rows(g - 1).end > need.begin) --g;
    while (g < groups - 1 && src.group_rows(g).end <= need.begin) ++g;
    for (; g < groups; ++g) {
      const RowRange rows = intersect(need, src.group_rows(g));
      if (rows.begin >= need.end) break;
      if (rows.size() <= 0) continue;
      const int* replicas = from.data() + static_cast<size_t>(g) * static_cast<size_t>(from_tp);
      f(RowMove{nearest_replica(replicas, from_tp, d, devices_per_island), d, rows});
    }
  }
}

}  // namespace spindle::plan
