// Row arithmetic of data-parallel slices (design.md, "Runtime semantics").
//
// A slice runs on n devices with tensor-parallel degree K (K divides n): the
// device at position i (0-based, in the slice's ascending device list) is in
// data-parallel group g = i / K of G = n / K groups and has TP rank i % K.
// Group g holds batch rows [g*B/G, (g+1)*B/G) of the task batch B (G divides
// B); the K devices of a group hold the same rows.
//
// Moving an activation from a producer layout to a consumer layout sends each
// consumer device exactly the rows it needs; a TP producer group sends from
// its TP rank 0 only (any replica holds the same values). Gradients move the
// other way: each producer device receives, from TP rank 0 of every consumer
// group that overlaps it, the gradient of the overlapping rows.
#pragma once

#include <cstdint>
#include <vector>

namespace spindle::exec {

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
  RowRange group_rows(int group) const;
  RowRange rows_of(int position) const { return group_rows(group_of(position)); }
};

// Intersection of two ranges (size 0 when disjoint).
RowRange intersect(RowRange a, RowRange b);

// One message of a re-sharding: rows `rows` (absolute batch rows) go from
// position `src` of the sending layout to position `dst` of the receiving one.
struct RowMove {
  int src = 0;
  int dst = 0;
  RowRange rows;
  bool operator==(const RowMove&) const = default;
};

// Activations, producer -> consumer: for every consumer position (ascending),
// one move from TP rank 0 of each overlapping producer group (ascending rows).
// Throws std::invalid_argument when the layouts' batches differ.
std::vector<RowMove> forward_moves(const RowLayout& producer, const RowLayout& consumer);
// Gradients, consumer -> producer: for every producer position (ascending),
// one move from TP rank 0 of each overlapping consumer group; `src` is a
// consumer position and `dst` a producer position.
std::vector<RowMove> backward_moves(const RowLayout& producer, const RowLayout& consumer);

}  // namespace spindle::exec
