// Boundary shifts (docs/planner.md, step 9): a local search on a placed
// plan that moves operators between the slices of one MetaOp's chain (or
// of every chain after one wave), then swaps one island's slices between
// two adjacent waves.
//
// The scheduler cuts a MetaOp of L operators into slices wave by wave, each
// slice as long as its wave allows; placement then gives every slice its
// devices. With no wave barriers (what spindle-run executes and the
// simulation prices) where a chain is cut is a choice of its own: one
// operator more on the wide slice and one fewer on the narrow one shortens
// the chain, one fewer on a slice whose devices a late all-reduce or
// transfer holds back shortens another device's wait. The schedule cannot
// see either; the simulation of the placed plan can.
#pragma once

#include <functional>

#include "libplan/plan/plan.h"
#include "libplan/planner/cost_plan.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// How many simulations the planner spends on single boundary shifts per plan
// (PlanRequest::shift_simulations' default; --shift-simulations takes 0 to
// kMaxShiftSimulations), before kShiftDevices caps it (wave shifts get
// their own on top: shift_budget). On multitask-clip-10,
// a800-8x8, 64 (the cap there) take its plan from 180.9 to 172.9 ms. On 32
// devices and fewer 128 fit under the cap, and they took ofasys-7 on
// a800-2x8 from a compute gap of 3.05% to 2.98% and 314.7 to 314.3 ms, and
// made no bench/plan_time row slower, for 10-50% more planning time there
// (bench/history.md, plan_time).
inline constexpr int kShiftSimulations = 128;
inline constexpr int kMaxShiftSimulations = 1 << 20;
// A simulation costs about as much as the plan has devices: a plan gets at
// most this many devices' worth of them (128 on 32 devices or fewer, 64 on
// 64, 4 on 1024; the 50 tasks on 1024 devices of bench/plan_time stay under
// 1 s).
inline constexpr int kShiftDevices = 4096;
// Shifts simulated side by side (the development machine has 2 cores).
// The batch is part of the search's definition: of a batch the first kept
// shift wins, the others were simulated and count against the budget all
// the same, so the plan depends on it and not on the machine.
inline constexpr int kShiftBatch = 2;
// On a machine with more threads, up to this many batches are simulated
// at once, each formed as if those before it keep nothing; those after
// the first that keeps a shift are dropped, uncounted. The plan is the
// one of a batch at a time (shift_boundaries); the wall time falls where
// threads would otherwise idle.
inline constexpr int kMaxShiftRounds = 8;
// The scan's list puts one wave shift before each this many single shifts
// (before each 2, a bench/paper compute gap grew past 3%; before each 3,
// 6 of 14 plans gained, more than before each 4, 6 or 8;
// docs/planner.md, "Wave shifts").
inline constexpr int kSinglesPerWaveShift = 3;

// The two makespans of one plan (ms): `ms`, with communication priced, and
// `compute_ms`, with communication and optimizer steps priced at 0 (what
// its compute gap is read from).
struct ShiftTimes {
  double ms = 0;
  double compute_ms = 0;
};
// `plan` simulated: `compute_ms` (infinity once it cannot finish by
// `compute_bound_ms`), then, only when compute_ms is no more than
// compute_bound_ms, `ms` (infinity once it cannot finish by `bound_ms`);
// else ms is infinity, not simulated (a shift over either bound is not
// kept: the compute-only makespan, one pass over the programs, costs a
// fifth of the makespan's simulation, so it goes first). One call for
// both, so that the plan is lowered once.
using ShiftSimulate =
    std::function<Result<ShiftTimes>(const Plan& plan, double bound_ms, double compute_bound_ms)>;
// Whether `plan` fits its devices' memory.
using ShiftFits = std::function<bool(const Plan& plan)>;
// The ShiftFits of the planner: a shifted copy of a costed plan costed
// again (cost_plan over `tables`, which cost_tables built from the plan's
// MetaOps), then check_plan_memory. A shift moves an operator's parameters
// and activations from one slice's devices to another's, while the copy
// still carries the memory figures of the plan it was copied from: read
// as they are, a shift could take a device over its memory unnoticed.
ShiftFits shift_memory_fits(CostTables tables, const CostModel& cost, const Model& model);

// One shift: slice `cut` of a MetaOp's chain gives its last operator to
// slice cut + 1 (forward), or slice cut + 1 gives its first to slice cut.
// A *wave shift* (wave >= 0; metaop and cut unused) makes that move at
// every cut right after a slice of plan.waves[wave], all in the same
// direction: the wave ends one operator sooner (forward) or later on every
// chain that goes on after it. Where several chains tie on the makespan,
// or one chain's devices wait for another's, no single shift helps and a
// wave shift can (multitask-clip-7 on a800-2x8: 303.9 -> 297.4 ms).
// A *wave swap* (island >= 0; metaop, cut and forward unused) moves no
// operator: the slices inside island `island` (devices_per_island each)
// of waves `wave` and wave + 1 trade waves, so that the island runs them
// in the other order (its backward pass too, in reverse). On
// multitask-clip-10, a800-4x8, island 3 ran thermal-image's wave-9 slice
// before the depth-image slice that devices 8-15 wait for in the backward
// pass; swapped, 195.9 -> 193.7 ms.
struct Shift {
  int metaop = 0;
  int cut = 0;           // between the MetaOp's slices cut and cut + 1, in chain order
  bool forward = true;   // true: slice cut gives one; false: slice cut + 1 gives one
  int wave = -1;         // >= 0: a wave shift of this wave (or the first wave of a swap)
  int island = -1;       // >= 0: a wave swap on this island
  bool operator==(const Shift&) const = default;
};

// Applies `s` to `plan` when both slices keep at least one operator: counts
// and firsts move, each slice's ms is its count times its time per
// operator, the two waves' ms their longest slice. Returns false (plan
// unchanged) when the giving slice has one operator or the MetaOp has no
// such cut. A wave shift makes each of its single shifts that applies and
// returns true when two or more did (one alone is a single shift, which
// the search tries as such); else false, the plan unchanged. A wave swap
// returns false (plan unchanged) when a slice of either wave has devices
// both on and off the island, when no slice of the two waves is inside
// it, when a wave would be left without slices, or when the plan would
// break rule 1, 2 or 3 of spec/plan.md (check_wave_order).
bool apply_shift(Plan& plan, const Shift& s);

// The simulations shift_boundaries gets for `plan`: for single shifts at
// most `max`, and at most kShiftDevices over the devices its slices use;
// plus one per wave shift (two per wave), at most as many again. Without
// the wave shifts' own share, the single shifts they pushed out of the
// budget left 2 of bench/paper's plans slower than before wave shifts and
// a third's compute gap larger (docs/planner.md, "Wave shifts").
int shift_budget(const Plan& plan, int max);

// Local search in two scans, each as described next: the shifts (single
// and wave shifts) with at most `max_simulations`, then from where they
// leave the plan the wave swaps (every pair of adjacent waves, waves in
// order, every island) with at most half as many more, one per swap that
// applies. The second scan keeps only what the first's rule keeps, so it
// never leaves a plan or its compute gap worse than the shifts did. (In
// the shifts' list instead, the swaps took another path on ofasys-7 on
// a800-2x8 that ended over a 3% gap. With as many simulations as the
// shifts, no shipped plan came out faster than with half, and 50 tasks on
// 1024 devices planned 7-10% slower, near bench/plan_time's 1 s.)
// The shifts' list: every cut of every MetaOp with two slices or more
// (MetaOps by device-ms, most first), both ways, and every wave shift
// (waves in order, forward then backward; one before each
// kSinglesPerWaveShift single shifts). Each list is scanned in a cycle; a
// kept move is tried again at once, then the scan goes on after it. A scan
// ends when a round through its whole list keeps none or its simulations
// are spent. A move is kept when the
// plan gets no slower on either count, the makespan and the compute-only
// makespan, and faster on one: it never trades compute for communication,
// whose prediction is the less certain of the two (bench/README.md, loop),
// so the compute gap never grows. Shifts are simulated in batches of
// kShiftBatch, side by side on the planner's threads, each bounded by the
// makespan so far; of a batch the first kept one wins. The batches do not
// depend on the threads: the result is the same on any number of them.
// With 2 x kShiftBatch threads or more, the batches that follow are
// simulated ahead at the same time (kMaxShiftRounds), and dropped without
// counting when an earlier one keeps a shift: the same result sooner.
// `given` holds both makespans of `plan` as given. Returns the plan's
// makespan, at most given.ms.
Result<double> shift_boundaries(Plan& plan, const ShiftTimes& given, int max_simulations,
                                const ShiftSimulate& simulate, const ShiftFits& fits);

}  // namespace spindle::plan
