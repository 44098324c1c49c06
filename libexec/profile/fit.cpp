#include "libexec/profile/fit.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include <Eigen/Dense>

#include "libplan/cost/curve.h"
#include "libplan/rules/links.h"

namespace spindle::exec {

namespace {

// Quantile q in [0, 1] of sorted values, linear between order statistics.
double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double f = pos - static_cast<double>(lo);
  return sorted[lo] * (1.0 - f) + sorted[hi] * f;
}

}  // namespace

TimingStats timing_stats(std::vector<double> samples) {
  if (samples.empty()) return {};
  std::sort(samples.begin(), samples.end());
  return {quantile(samples, 0.5), quantile(samples, 0.1), quantile(samples, 0.9)};
}

namespace {

// Least squares of t = intercept + slope x with weight 1 (relative false)
// or 1 / t^2 (relative true: every point's relative error weighs the same);
// a negative intercept is refitted through the origin. The contract of
// fit_line and fit_line_relative (fit.h).
plan::Result<LineFit> fit_weighted_line(const std::vector<double>& x, const std::vector<double>& t, bool relative) {
  if (x.size() != t.size() || x.size() < 2) return plan::Error{"line fit: needs at least two points"};
  double sw = 0, sx = 0, st = 0, sxx = 0, sxt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (relative && !(t[i] > 0)) return plan::Error{"line fit: times must be positive"};
    const double w = relative ? 1.0 / (t[i] * t[i]) : 1.0;
    sw += w;
    sx += w * x[i];
    st += w * t[i];
    sxx += w * x[i] * x[i];
    sxt += w * x[i] * t[i];
  }
  const double den = sw * sxx - sx * sx;
  if (!(den > 1e-12 * sw * sxx)) return plan::Error{"line fit: needs at least two distinct sizes"};
  LineFit f;
  f.slope = (sw * sxt - sx * st) / den;
  f.intercept = (st - f.slope * sx) / sw;
  if (f.intercept < 0) {   // through the origin
    f.intercept = 0;
    f.slope = sxt / sxx;
  }
  if (!(f.slope > 0) || !std::isfinite(f.slope))
    return plan::Error{"line fit: time does not grow with size (slope " + std::to_string(f.slope) + ")"};
  for (size_t i = 0; i < x.size(); ++i)
    if (t[i] > 0)
      f.max_rel_residual = std::max(f.max_rel_residual, std::abs(f.intercept + f.slope * x[i] - t[i]) / t[i]);
  return f;
}

}  // namespace

plan::Result<LineFit> fit_line(const std::vector<double>& x, const std::vector<double>& t) {
  return fit_weighted_line(x, t, false);
}

plan::Result<plan::Link> fit_p2p_link(const std::vector<double>& bytes, const std::vector<double>& ms) {
  auto f = fit_line(bytes, ms);
  SPINDLE_TRY(f);
  // slope: ms per byte -> GB/s = 1e-6 / slope; intercept ms -> us.
  return plan::Link{1e-6 / f->slope, f->intercept * 1e3};
}

plan::Result<LineFit> fit_line_relative(const std::vector<double>& x, const std::vector<double>& t) {
  return fit_weighted_line(x, t, true);
}

plan::Result<CopyFit> fit_copy(const std::vector<double>& bytes, const std::vector<double>& ms) {
  auto f = fit_line_relative(bytes, ms);
  SPINDLE_TRY(f);
  return CopyFit{1e-6 / f->slope, f->intercept * 1e3};
}

plan::Result<AllreduceFit> fit_allreduce(const std::vector<double>& bytes, const std::vector<double>& ms, int ranks,
                                         double p2p_latency_us) {
  if (ranks < 2) return plan::Error{"all-reduce fit: needs at least two ranks"};
  const double p = ranks;
  std::vector<double> x;
  for (double b : bytes) x.push_back(plan::ring_allreduce_bytes(b, ranks));
  auto f = fit_line_relative(x, ms);
  SPINDLE_TRY(f);
  const double latency_us = std::max(p2p_latency_us, 0.0);
  AllreduceFit out;
  out.link = plan::Link{1e-6 / f->slope, latency_us};
  out.allreduce_us = std::max(0.0, f->intercept * 1e3 - 2.0 * (p - 1.0) * latency_us);
  return out;
}

plan::Result<ExchangeFit> fit_exchange(const std::vector<double>& messages, const std::vector<double>& ms,
                                       double wire_ms) {
  if (messages.size() != ms.size() || messages.size() < 2) return plan::Error{"exchange fit: needs two or more points"};
  const double n = static_cast<double>(messages.size());
  double sk = 0, sr = 0, skk = 0, skr = 0;
  for (size_t i = 0; i < ms.size(); ++i) {
    const double k = 2.0 * messages[i];   // messages sent and received per rank
    const double r = ms[i] - messages[i] * wire_ms;
    sk += k, sr += r, skk += k * k, skr += k * r;
  }
  const double den = n * skk - sk * sk;
  if (!(den > 1e-12 * n * skk)) return plan::Error{"exchange fit: needs two or more distinct message counts"};
  double slope = (n * skr - sk * sr) / den;
  double intercept = (sr - slope * sk) / n;
  if (slope < 0) {
    slope = 0;
    intercept = sr / n;
  }
  if (intercept < 0) {   // through the origin
    intercept = 0;
    slope = std::max(0.0, skr / skk);
  }
  return ExchangeFit{intercept * 1e3, slope * 1e3};
}

plan::Result<ExecutorOverheadFit> fit_executor_overhead(const std::vector<OverheadSample>& samples) {
  if (samples.size() < 2) return plan::Error{"executor overhead fit: needs two or more instructions"};
  const Eigen::Index n = static_cast<Eigen::Index>(samples.size());
  // Columns: 1, messages, accumulated bytes in GB (so the figure is in us per GB).
  Eigen::MatrixXd x(n, 3);
  Eigen::VectorXd y(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const OverheadSample& s = samples[static_cast<size_t>(i)];
    x(i, 0) = 1.0;
    x(i, 1) = s.messages;
    x(i, 2) = s.accumulated_bytes * 1e-9;
    y(i) = s.us;
  }
  Eigen::Vector3d best = Eigen::Vector3d::Zero();
  double best_sq = y.squaredNorm();   // every figure 0
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<Eigen::Index> cols;
    for (Eigen::Index c = 0; c < 3; ++c)
      if ((mask >> c & 1) && x.col(c).cwiseAbs().maxCoeff() > 0) cols.push_back(c);
    if (cols.size() != static_cast<size_t>(std::popcount(static_cast<unsigned>(mask)))) continue;   // a term never seen
    Eigen::MatrixXd sub(n, static_cast<Eigen::Index>(cols.size()));
    for (size_t k = 0; k < cols.size(); ++k) sub.col(static_cast<Eigen::Index>(k)) = x.col(cols[k]);
    const Eigen::VectorXd b = sub.colPivHouseholderQr().solve(y);
    if ((b.array() < 0).any() || !b.allFinite()) continue;
    const double sq = (sub * b - y).squaredNorm();
    if (sq < best_sq) {
      best_sq = sq;
      best.setZero();
      for (size_t k = 0; k < cols.size(); ++k) best(cols[k]) = b(static_cast<Eigen::Index>(k));
    }
  }
  ExecutorOverheadFit f;
  f.instruction_us = best(0);
  f.message_us = best(1);
  // best(2) us per GB: GB/s = 1e6 / best(2).
  f.accumulate_gbytes_per_s = best(2) > 0 ? 1e6 / best(2) : 0.0;
  f.rms_residual_us = std::sqrt(best_sq / static_cast<double>(n));
  return f;
}

std::vector<double> leave_one_out_errors(const std::vector<plan::ProfilePoint>& points) {
  std::vector<double> errors;
  if (points.size() < 3) return errors;
  for (size_t i = 1; i + 1 < points.size(); ++i) {
    std::vector<plan::ProfilePoint> rest;
    for (size_t j = 0; j < points.size(); ++j)
      if (j != i) rest.push_back(points[j]);
    auto curve = plan::ScalingCurve::fit(rest);
    if (!curve.ok()) continue;   // only invalid points fail, and the full fit would too
    const double predicted = curve->time_ms(points[i].devices);
    errors.push_back(std::abs(predicted - points[i].ms) / points[i].ms);
  }
  return errors;
}

}  // namespace spindle::exec
