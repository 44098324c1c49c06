// The Spindle strategy's portfolio of schedules (docs/planner.md, step 7):
// the wavefront scheduler (schedule.h) run with a small deterministic set of
// variants on two roundings of the relaxed optimum, then the per-level
// combination of the level-by-level drafts and its extension into idle
// devices. Returns a few distinct schedules; the planner places and costs
// each and keeps the best.
#pragma once

#include <vector>

#include "libplan/waves/schedule.h"

namespace spindle::plan {

struct PortfolioInput {
  // The MetaOps with the paper's rounding (l_hi rounded per MetaOp) and with
  // the per-level rounding (discretise_level; empty when both agree).
  const std::vector<ScheduleItem>* items = nullptr;
  const std::vector<ScheduleItem>* level_rounded = nullptr;
  int levels = 0;          // MetaLevels (items[].level < levels)
  int devices = 0;         // of the cluster
  int island = 0;          // devices per island (<= 0 or >= devices: one island)
  bool start_early = false;  // also schedule every level as one pool (beyond the paper)
  bool narrow_tails = true;  // ScheduleOptions::narrow_tails of every variant
};

// Scheduler variants tried: lengths tried per wave by the rollout variants.
inline constexpr int kLookahead = 8;
// Schedules returned: at most kScheduleCandidates of the paper's rounding,
// then the per-level combination and the extended combination, each with a
// compute time within kCandidateSlack of the shortest of the paper's rounding.
inline constexpr int kScheduleCandidates = 4;
inline constexpr double kCandidateSlack = 0.01;
inline constexpr double kDeferFractions[] = {0.0, 0.2, 0.3};
// Waves before a level whose idle devices the extended combination tries to
// give to the level's first operators (the last 1..kFillWaves).
inline constexpr int kFillWaves = 4;

// Same waves: in each, the same slots (MetaOp, operators, device count) in
// the same order.
bool same_schedule(const std::vector<AbstractWave>& a, const std::vector<AbstractWave>& b);

struct PortfolioSchedules {
  std::vector<std::vector<AbstractWave>> schedules;
  // Some variant's schedule (not the paper's rules, which ignore
  // narrow_tails) ran operators the allocation gave a wider tuple on fewer
  // devices (narrows_tails). When false, the same portfolio with
  // narrow_tails false would almost always schedule the same.
  bool narrowed_tails = false;
};

// Requires items non-empty. Deterministic.
PortfolioSchedules schedule_portfolio(const PortfolioInput& in);

}  // namespace spindle::plan
