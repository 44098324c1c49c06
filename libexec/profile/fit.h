// Pure helpers of `spindle-profile --measure` (docs/profiling.md): summary
// statistics of repeated timings, the least-squares link fit
// t = latency + bytes / bandwidth, and the leave-one-out error of the
// planner's piecewise scaling curve. No clocks, no communication: tested on
// synthetic numbers.
#pragma once

#include <vector>

#include "libplan/io/profile.h"
#include "libplan/util/status.h"

namespace spindle::exec {

// Median and the 10th / 90th percentiles (linear interpolation between order
// statistics) of `samples` (any order, at least one).
struct TimingStats {
  double median = 0;
  double p10 = 0;
  double p90 = 0;
  // (p90 - p10) / median: the relative spread written to the profile; 0 when
  // the median is 0.
  double spread() const { return median > 0 ? (p90 - p10) / median : 0.0; }
};
TimingStats timing_stats(std::vector<double> samples);

// Straight line t = intercept + slope * x fitted by least squares, with the
// intercept forced >= 0 (a negative one is refitted through the origin).
// Needs at least two distinct x and a positive slope; error otherwise.
struct LineFit {
  double intercept = 0;
  double slope = 0;
  double max_rel_residual = 0;   // max over points of |fit - t| / t
};
plan::Result<LineFit> fit_line(const std::vector<double>& x, const std::vector<double>& t);

// Link figures from timings: p2p `ms` of one send of `bytes`, fitted as
// latency + bytes / bandwidth.
plan::Result<plan::Link> fit_p2p_link(const std::vector<double>& bytes, const std::vector<double>& ms);
// From ring all-reduces of `bytes` over `ranks` (>= 2) ranks, fitted with the
// cost model's formula 2 (p-1)/p * bytes / bandwidth + 2 (p-1) * latency.
plan::Result<plan::Link> fit_allreduce_link(const std::vector<double>& bytes, const std::vector<double>& ms,
                                            int ranks);

// Leave-one-out check of ScalingCurve::fit on one entry's points: for every
// interior point i (not the first nor the last: the curve does not
// extrapolate), the curve is fitted without i and its relative error at
// n_i is |T(n_i) - ms_i| / ms_i. Empty when there are fewer than 3 points.
std::vector<double> leave_one_out_errors(const std::vector<plan::ProfilePoint>& points);

}  // namespace spindle::exec
