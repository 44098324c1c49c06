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

// Requires items non-empty. Deterministic.
std::vector<std::vector<AbstractWave>> schedule_portfolio(const PortfolioInput& in);

}  // namespace spindle::plan
