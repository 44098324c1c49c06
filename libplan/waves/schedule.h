// Wavefront scheduling (docs/planner.md step 7; the paper's Algorithm 1): turns
// the discretised allocation of every MetaOp into abstract waves, i.e. slots
// with a device count but no concrete devices yet (placement comes after).
#pragma once

#include <vector>

#include "libplan/alloc/alloc.h"

namespace spindle::plan {

// One MetaOp as the scheduler sees it. Items are indexed by MetaOp id.
struct ScheduleItem {
  int level = 0;                   // MetaLevel
  std::vector<int> inputs;         // MetaOp ids (indices into the items), ascending
  int length = 0;                  // operators, L >= 1
  std::vector<int> valid;          // valid device counts, ascending, non-empty
  // time_ms[n]: one operator on n devices, ms; defined for every n in
  // `valid` (size > valid.back()); other entries are ignored.
  std::vector<double> time_ms;
  std::vector<AllocTuple> tuples;  // discretised allocation, counts summing to L
};

struct ScheduleOptions {
  // false (the paper): levels run one after another; a level's first wave
  // starts after the previous level's last wave.
  // true (beyond the paper): one pool for all levels; a MetaOp is ready as
  // soon as each of its inputs finished in an earlier wave.
  bool cross_level = false;
  // true: the paper's Algorithm 1 as written (see schedule_waves). false (our
  // default): each wave first gives every ready MetaOp its smallest tuple
  // (most remaining work first), then widens tuples where devices allow (see
  // widen_by_work), and picks the wave length, among those at which
  // some slot ends an operator, that leaves the fewest devices idle
  // (busy device-ms per ms; ties: the longer) rather than the shortest tuple's.
  bool paper_rules = false;
  // Without paper_rules, when > 1: each wave tries this many of the
  // best-filling lengths, each followed by a greedy rollout of the rest of
  // the level (or pool), and keeps the one that finishes first. Costs about
  // lookahead x waves more drafting; 1 or 0 is purely greedy. Bounded by a
  // step budget: at most 16384 / (MetaOps in the pool) lengths are tried, so
  // large pools (hundreds of tasks) are scheduled near-linearly.
  int lookahead = 0;
  // Without paper_rules: a ready MetaOp whose remaining work (ms on its
  // tuples) is below this fraction of the largest one's waits for a later
  // wave unless idle devices remain (it has slack; the devices go to the
  // critical MetaOps first). 0 disables.
  double defer_fraction = 0;
  // Without paper_rules: widen tuples in order of remaining work (true) or in
  // the paper's order, more devices first (false).
  bool widen_by_work = true;
  // When > 0: the idle-device extension (see schedule_waves) never grows a
  // slot beyond this many devices (slots already wider keep their size).
  // The planner sets it to the island size, so that a MetaOp's tail does not
  // spread over islands for a small gain in compute (its activations would
  // cross the slow link twice).
  int extend_cap = 0;
  // Without paper_rules: true (our default), a slot whose wave is longer
  // than its tuple keeps running the MetaOp's next operators on the same
  // devices, whatever tuple the allocation meant them for. false: only the
  // operators of its own tuple and of tuples no wider than the slot (at
  // least one); a wider tuple's operators wait for a slot of their width.
  // Without wave barriers a MetaOp's chain run narrower than allocated can
  // become the makespan (multitask-clip-10 on 32 devices: two of a chain's
  // 16-device operators ran on 8, 4.9 ms longer), which this avoids at
  // some cost in fill; the planner tries both (docs/planner.md, step 7).
  bool narrow_tails = true;
};

// One slot of an abstract wave: operators first..first+count-1 of `metaop`
// on `devices` devices, taking ms = count * T(devices).
struct AbstractSlot {
  int metaop = 0;
  int first = 0;
  int count = 0;
  int devices = 0;
  double ms = 0;
};

struct AbstractWave {
  std::vector<AbstractSlot> slots;   // ascending metaop id, device counts summing to <= N
  double ms = 0;                     // longest slot
};

// Per wave, with paper_rules: propose tuples (one per ready MetaOp, more
// devices first, then longer time, then lower id) first-fit into `devices`;
// give idle devices to the ready MetaOp with the most remaining work (a
// larger valid count, or a first count for one left out whose single
// operator fits in the longest proposed tuple); align every slot to the
// shortest one's time (or to the longest single operator among the slots,
// when that is longer), scheduling the operators that fit within 1% (at least
// one; a slot whose tuple is shorter continues with the MetaOp's later
// operators on the same devices); re-queue the rest. Without paper_rules the
// proposal and the alignment are ours (see ScheduleOptions).
// Deterministic; every wave schedules at least one operator, so it ends.
// Requires every valid count <= devices.
std::vector<AbstractWave> schedule_waves(const std::vector<ScheduleItem>& items, int devices,
                                         const ScheduleOptions& options = {});

// Level `level` scheduled as schedule_waves does level by level (options'
// cross_level is ignored), after `before`: waves that complete every MetaOp
// of the lower levels and may already run some operators of this level (see
// fill_idle). Returns only the new waves, which complete the level.
std::vector<AbstractWave> schedule_level(const std::vector<ScheduleItem>& items, int devices,
                                         const ScheduleOptions& options,
                                         const std::vector<AbstractWave>& before, int level);

// Whether some slot of `waves` (a schedule of `items`) runs operators that
// the allocation gave a wider tuple: more operators than its MetaOp had
// left in tuples of at most its device count, and more than one (a slot
// narrower than every tuple left runs one operator under either rule),
// consuming each slot's operators as narrow_tails false does (a tuple of
// its device count first, then the narrower ones, then the wider). A
// schedule made with narrow_tails false never does.
bool narrows_tails(const std::vector<ScheduleItem>& items, const std::vector<AbstractWave>& waves);

// Beyond the paper: puts operators of level `level` into the idle devices
// (those in no slot) of waves[from..], never lengthening a wave: in each
// wave, MetaOps of the level with no operator in `waves` yet (other than
// those this call adds) and no slot in that wave, whose inputs finished in
// an earlier wave, most remaining work first (device-ms on the smallest
// valid count; ties: the lower id), each on the valid count that fits the
// most operators in the wave's ms (ties: fewer devices). Slots stay in
// ascending MetaOp order; each MetaOp's operators stay in order. Returns the
// number of slots added (0: `waves` unchanged); deterministic. Lower levels
// must be complete in `waves`.
int fill_idle(const std::vector<ScheduleItem>& items, int devices, std::vector<AbstractWave>& waves,
              size_t from, int level);

}  // namespace spindle::plan
