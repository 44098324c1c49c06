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

// Relative least squares: t = intercept + slope * x minimising
// sum ((intercept + slope x_i - t_i) / t_i)^2 (every t_i > 0), intercept
// forced >= 0 as in fit_line. Small sizes weigh as much as large ones, so a
// fixed per-call cost that only shows at small sizes is fitted (as
// NCCL-tests-style alpha-beta fits do). Same errors as fit_line.
plan::Result<LineFit> fit_line_relative(const std::vector<double>& x, const std::vector<double>& t);

// Copies around the wire (rules/links.h CommOverhead): `ms` of one copy of
// `bytes` (allocate + copy, as the runtime packs a message), fitted by
// fit_line_relative: pack_gbytes_per_s from the slope, copy_us the
// intercept (per copy, i.e. per message).
struct CopyFit {
  double pack_gbytes_per_s = 0;
  double copy_us = 0;
};
plan::Result<CopyFit> fit_copy(const std::vector<double>& bytes, const std::vector<double>& ms);

// All-reduce as alpha + beta * bytes (fit_line_relative over
// x = 2 (p-1)/p * bytes): the link's bandwidth is 1 / beta; its latency is
// `p2p_latency_us` (a ring step is one message); the rest of alpha is the
// call's fixed cost, allreduce_us = max(0, alpha - 2 (p-1) p2p_latency_us),
// so ring_allreduce_ms + allreduce_us reproduces the fit at p = ranks.
struct AllreduceFit {
  plan::Link link;
  double allreduce_us = 0;
};
plan::Result<AllreduceFit> fit_allreduce(const std::vector<double>& bytes, const std::vector<double>& ms, int ranks,
                                         double p2p_latency_us);

// Exchange overhead from `ms`, the time of one exchange in which each of two
// ranks sends k = `messages`[i] messages to the other and receives k; the
// simulation prices it as exchange_us + 2k message_us + k wire_ms, with
// wire_ms what one message costs beyond the software (its p2p_ms plus
// packing and unpacking its bytes). The residual t - k wire_ms is fitted as
// exchange_us + 2k message_us by least squares, both clamped >= 0 (a
// negative slope gives message_us 0 and exchange_us the mean residual).
// Needs two or more distinct k.
struct ExchangeFit {
  double exchange_us = 0;
  double message_us = 0;
};
plan::Result<ExchangeFit> fit_exchange(const std::vector<double>& messages, const std::vector<double>& ms,
                                       double wire_ms);

// The executor's own cost around its transfers (rules/links.h
// CommOverhead::instruction_us, message_us, accumulate_gbytes_per_s), from
// instructions of spindle-run's programs that never wait for a peer: each
// sample is one instruction's wall time, us, less the packing of what it
// sends, against the messages it posts (sends; its receives are priced in
// the exchange that completes them) and the bytes it adds into output
// gradients (a backward exchange's pieces):
//   us = instruction_us + messages x message_us + accumulated_bytes / rate.
// Least squares with every figure >= 0: the best fit over every subset of
// the three terms whose figures all come out >= 0; a term whose feature is
// 0 in every sample gets 0 (accumulate_gbytes_per_s 0: not priced). Needs
// two or more samples.
struct OverheadSample {
  double us = 0;
  double messages = 0;
  double accumulated_bytes = 0;
};
struct ExecutorOverheadFit {
  double instruction_us = 0;
  double message_us = 0;
  double accumulate_gbytes_per_s = 0;
  double rms_residual_us = 0;   // of the samples around the fit
};
plan::Result<ExecutorOverheadFit> fit_executor_overhead(const std::vector<OverheadSample>& samples);

// Leave-one-out check of ScalingCurve::fit on one entry's points: for every
// interior point i (not the first nor the last: the curve does not
// extrapolate), the curve is fitted without i and its relative error at
// n_i is |T(n_i) - ms_i| / ms_i. Empty when there are fewer than 3 points.
std::vector<double> leave_one_out_errors(const std::vector<plan::ProfilePoint>& points);

}  // namespace spindle::exec
