// Piecewise alpha-beta scaling curves (docs/planner.md, step 4).
//
// How points are assigned to ranges. The curve is linear in x = 1/n on each
// range, T = alpha + beta * x, and continuous, so it is a linear spline in x
// whose knots are a subset of the profiled counts:
//   - the knots are chosen greedily from the smallest count: the next knot is
//     the smallest profiled count at least twice the previous knot, and the
//     largest count is always a knot (1..16 -> knots 1, 2, 4, 8, 16; 3, 6, 12
//     -> all three). A range therefore spans about a factor of two;
//   - every profiled point lies in a range (knots belong to both neighbours);
//     a range holding only its two knots is fitted exactly through them, a
//     range with more points (3, 5, 6, 7 inside [2, 4], [4, 8]) is fitted by
//     least squares;
//   - the knot values are solved together, as one linear least-squares
//     problem over all points (Eigen, QR), with each point predicted by
//     linear interpolation in 1/n between its range's knots. This keeps the
//     curve continuous, and interpolates exactly when no range has an extra
//     point; data that follow alpha + beta / n exactly are recovered exactly.
// Forcing: the knot values are clamped to at least kMinKnotMs (positive) and
// then replaced by their running minimum in n (non-increasing). Each piece is
// then the alpha-beta curve through its two knot values, with beta >= 0.
#include "libplan/cost/curve.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <Eigen/Dense>

namespace spindle::plan {
namespace {

// Smallest knot value a fit may produce, ms (keeps T positive).
constexpr double kMinKnotMs = 1e-9;

std::vector<size_t> choose_knots(const std::vector<ProfilePoint>& points) {
  std::vector<size_t> knots{0};
  const size_t last = points.size() - 1;
  while (knots.back() != last) {
    const double want = 2.0 * points[knots.back()].devices;
    size_t next = knots.back() + 1;
    while (next < last && points[next].devices < want) ++next;
    knots.push_back(next);
  }
  return knots;
}

}  // namespace

Result<ScalingCurve> ScalingCurve::fit(const std::vector<ProfilePoint>& points) {
  if (points.empty()) return Error{"scaling curve: no profiled points"};
  for (size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    if (p.devices <= 0) {
      return Error{"scaling curve: points[" + std::to_string(i) +
                   "].devices: expected a positive count, found " + std::to_string(p.devices)};
    }
    if (i > 0 && p.devices <= points[i - 1].devices) {
      return Error{"scaling curve: points[" + std::to_string(i) +
                   "].devices: device counts must be strictly increasing"};
    }
    if (!(p.ms > 0) || !std::isfinite(p.ms)) {
      return Error{"scaling curve: points[" + std::to_string(i) +
                   "].ms: expected a positive finite time"};
    }
  }
  ScalingCurve c;
  c.min_n_ = points.front().devices;
  c.max_n_ = points.back().devices;
  if (points.size() == 1) {
    c.pieces_.push_back({double(c.min_n_), double(c.max_n_), points[0].ms, 0.0});
    return c;
  }

  const std::vector<size_t> knots = choose_knots(points);
  const size_t k = knots.size();
  std::vector<double> value(k);
  bool exact = true;
  for (size_t j = 0; j + 1 < k; ++j) exact = exact && (knots[j + 1] == knots[j] + 1);
  if (exact) {
    for (size_t j = 0; j < k; ++j) value[j] = points[knots[j]].ms;
  } else {
    // Hat-basis design matrix in x = 1/n: one row per point, one column per knot.
    Eigen::MatrixXd a = Eigen::MatrixXd::Zero(Eigen::Index(points.size()), Eigen::Index(k));
    Eigen::VectorXd b(Eigen::Index(points.size()));
    size_t piece = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      while (piece + 1 < k - 1 && i > knots[piece + 1]) ++piece;
      const double x = 1.0 / points[i].devices;
      const double x_lo = 1.0 / points[knots[piece]].devices;
      const double x_hi = 1.0 / points[knots[piece + 1]].devices;
      const double w_hi = (x_lo - x) / (x_lo - x_hi);   // 0 at the range's low knot
      a(Eigen::Index(i), Eigen::Index(piece)) = 1.0 - w_hi;
      a(Eigen::Index(i), Eigen::Index(piece + 1)) = w_hi;
      b(Eigen::Index(i)) = points[i].ms;
    }
    Eigen::VectorXd v = a.colPivHouseholderQr().solve(b);
    for (size_t j = 0; j < k; ++j) value[j] = v(Eigen::Index(j));
  }
  for (size_t j = 0; j < k; ++j) {
    if (!std::isfinite(value[j])) value[j] = points[knots[j]].ms;
    value[j] = std::max(value[j], kMinKnotMs);
    if (j > 0) value[j] = std::min(value[j], value[j - 1]);
  }
  for (size_t j = 0; j + 1 < k; ++j) {
    const double n_lo = points[knots[j]].devices;
    const double n_hi = points[knots[j + 1]].devices;
    // Through (n_lo, value[j]) and (n_hi, value[j+1]): beta = dT / d(1/n) >= 0.
    const double beta = (value[j] - value[j + 1]) / (1.0 / n_lo - 1.0 / n_hi);
    const double alpha = value[j + 1] - beta / n_hi;
    c.pieces_.push_back({n_lo, n_hi, alpha, beta});
  }
  return c;
}

namespace {

// Work n T(n) at a piece's lower count above its upper count's by more
// than this share is superlinear. Profiles hold 6 significant digits: two
// rounded times of one linear curve differ in work by up to about 1e-6
// (ofasys-7's lm_loss on cpu-1x4, 201131.7 against 201131.6 device-us).
constexpr double kSuperlinearTolerance = 1e-5;

}  // namespace

ScalingCurve ScalingCurve::without_superlinear() const {
  ScalingCurve c = *this;
  // Knot values from the largest count down: T(n_lo) at most T(n_hi) n_hi /
  // n_lo. Pieces share their knots, so piece j's upper value is piece
  // j + 1's lower one.
  double upper = 0;   // the (lowered) value at the current piece's upper knot
  for (size_t j = c.pieces_.size(); j-- > 0;) {
    Piece& p = c.pieces_[j];
    const double hi = j + 1 == c.pieces_.size() ? p.alpha_ms + p.beta_ms / p.n_hi : upper;
    const double lo = p.alpha_ms + p.beta_ms / p.n_lo;
    const double linear = hi * p.n_hi / p.n_lo;   // lo with the work of hi
    const double kept = lo > linear * (1 + kSuperlinearTolerance) ? linear : lo;
    if (p.n_hi > p.n_lo) {
      p.beta_ms = (kept - hi) / (1.0 / p.n_lo - 1.0 / p.n_hi);
      p.alpha_ms = hi - p.beta_ms / p.n_hi;
    }
    upper = kept;
  }
  return c;
}

bool ScalingCurve::superlinear() const {
  for (const Piece& p : pieces_)
    if ((p.alpha_ms + p.beta_ms / p.n_lo) * p.n_lo >
        (p.alpha_ms + p.beta_ms / p.n_hi) * p.n_hi * (1 + kSuperlinearTolerance))
      return true;
  return false;
}

double superlinear_factor(const std::vector<ProfilePoint>& points) {
  double worst = 1.0;
  double most_work = 0;   // the largest n T(n) at a smaller count so far
  for (const ProfilePoint& p : points) {
    const double work = p.devices * p.ms;
    if (most_work > 0 && work > 0) worst = std::max(worst, most_work / work);
    most_work = std::max(most_work, work);
  }
  return worst;
}

double ScalingCurve::time_ms(double n) const {
  if (pieces_.empty()) return std::numeric_limits<double>::infinity();
  const Piece& first = pieces_.front();
  if (n <= first.n_lo) {
    const double t_min = first.alpha_ms + first.beta_ms / first.n_lo;
    return t_min * first.n_lo / n;
  }
  const Piece& last = pieces_.back();
  if (n >= last.n_hi) return last.alpha_ms + last.beta_ms / last.n_hi;
  // First piece whose upper end reaches n.
  auto it = std::lower_bound(pieces_.begin(), pieces_.end(), n,
                             [](const Piece& p, double v) { return p.n_hi < v; });
  return it->alpha_ms + it->beta_ms / n;
}

double ScalingCurve::devices_for(double t_ms) const {
  if (pieces_.empty() || !(t_ms > 0)) return std::numeric_limits<double>::infinity();
  const Piece& first = pieces_.front();
  const double t_min_n = first.alpha_ms + first.beta_ms / first.n_lo;   // T(min_devices)
  if (t_ms >= t_min_n) return t_min_n * first.n_lo / t_ms;              // time-sharing
  const Piece& last = pieces_.back();
  if (t_ms < last.alpha_ms + last.beta_ms / last.n_hi) {
    return std::numeric_limits<double>::infinity();
  }
  // First piece whose end time T(n_hi) is <= t_ms; T(n_lo) > t_ms there.
  auto it = std::partition_point(pieces_.begin(), pieces_.end(), [t_ms](const Piece& p) {
    return p.alpha_ms + p.beta_ms / p.n_hi > t_ms;
  });
  if (it->beta_ms <= 0) return it->n_lo;
  const double n = it->beta_ms / (t_ms - it->alpha_ms);
  return std::clamp(n, it->n_lo, it->n_hi);
}

}  // namespace spindle::plan
