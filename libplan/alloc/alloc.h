// Device allocation of one MetaLevel (docs/planner.md, step 5-6): the relaxed
// (continuous) optimum by bisection, then bi-point discretisation onto valid
// device counts.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "libplan/cost/curve.h"
#include "libplan/rules/devices.h"

namespace spindle::plan {

// Valid device counts (rules/devices.h) are the allocator's input: `valid`
// below is valid_device_counts(devices, tensor_parallel, batch).

// One MetaOp as the allocator sees it: L operators, each taking
// curve->time_ms(n) ms on n devices. The curve is not owned.
struct AllocItem {
  int length = 0;                       // L >= 1
  const ScalingCurve* curve = nullptr;
  // Most devices the MetaOp can use (its largest valid count); 0: no cap
  // beyond the cluster.
  int max_devices = 0;
};

// The relaxed optimum of one level: every MetaOp starts at 0 and ends at
// c_star_ms on n_star[m] (real) devices, L_m * T_m(n_star[m]) = c_star_ms and
// sum n_star = devices, each n_star[m] at most its cap (max_devices, else
// `devices`). When the slowest MetaOp cannot go faster on its cap (flat
// curves, batch-limited counts), c_star_ms = max_m L_m T_m(cap_m) and the sum
// of n_star may be below `devices`. A lower bound on every valid plan's time
// for the level.
struct RelaxedAllocation {
  double c_star_ms = 0;
  std::vector<double> n_star;           // same order as the items
  int iterations = 0;                   // bisection steps taken
};

// Bisection on C in [max_m L_m T_m(cap_m), sum_m L_m T_m(1)], at most 100 steps,
// stopping early at relative width 1e-9. `items` must be non-empty, with
// non-null curves; devices >= 1.
RelaxedAllocation relax_level(const std::vector<AllocItem>& items, int devices);

// The level's relaxed optimum as a bound (the plan's relaxed_optimum_ms
// sums these): relax_level's c_star_ms on the items' curves without their
// superlinear speedups (ScalingCurve::without_superlinear), where any curve
// has one; `relaxed` (relax_level of the same items) otherwise. The
// allocation keeps the curves as profiled (a cache effect that makes 2
// devices more than twice as fast as 1 is real there); the equal-finish
// relaxation is no lower bound on such curves.
double relaxed_bound_ms(const std::vector<AllocItem>& items, int devices, const RelaxedAllocation& relaxed);

// A run of `count` consecutive operators on `devices` devices each
// (the paper's allocation tuple).
struct AllocTuple {
  int devices = 0;
  int count = 0;
};

// Bi-point discretisation of one MetaOp (docs/planner.md, step 6). `valid` is the
// ascending list of valid device counts (non-empty). Returns one or two
// tuples, the larger device count first, counts summing to `length`:
//  - n_star within 1e-6 (relative) of a valid count: all L on it;
//  - n_star above every valid count: all L on the largest;
//  - otherwise n_lo < n_star < n_hi, the nearest valid counts (n_lo = 0, a
//    dummy of infinite time, when n_star is below the smallest): l_hi and
//    l_lo = L - l_hi with l_hi T(n_hi) + l_lo T(n_lo) = c_star_ms, l_hi
//    rounded to the nearest integer in [0, L] (all L on n_hi for the dummy).
// Tuples with a zero count are dropped.
std::vector<AllocTuple> discretise(int length, const ScalingCurve& curve, double n_star,
                                   double c_star_ms, const std::vector<int>& valid);
// The same with the per-operator time given as a function of a valid count.
std::vector<AllocTuple> discretise(int length, const std::function<double(int)>& time_ms,
                                   double n_star, double c_star_ms, const std::vector<int>& valid);

// Bi-point discretisation of a whole level (`items`, `relaxed` =
// relax_level(items, devices), `valid` per item) with l_hi rounded down or up
// per MetaOp rather than to the nearest integer: rounding down makes a
// MetaOp longer than C*, rounding up makes it use more device-ms. Of these
// choices it returns the one that minimises the level's bound
// max(longest MetaOp duration, total device-ms / devices), which no schedule
// running exactly those tuples can beat (ties: the least device-ms). A MetaOp of one
// operator whose n* lies between two valid counts thus runs on the larger
// count when the level can afford the area, instead of alone past C* on the
// smaller. Tuples per item, in the order of `items`, as discretise gives them.
std::vector<std::vector<AllocTuple>> discretise_level(const std::vector<AllocItem>& items,
                                                      const RelaxedAllocation& relaxed,
                                                      const std::vector<std::vector<int>>& valid,
                                                      int devices);

}  // namespace spindle::plan
