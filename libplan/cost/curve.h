// Piecewise alpha-beta scaling curve of one operator workload (docs/planner.md,
// step 4): on each range between neighbouring profiled device counts,
// T(n) = alpha + beta / n, fitted by least squares (Eigen) where a range holds
// more than two points, forced positive and non-increasing in n.
#pragma once

#include <vector>

#include "libplan/io/profile.h"
#include "libplan/util/status.h"

namespace spindle::plan {

class ScalingCurve {
 public:
  ScalingCurve() = default;

  // Fits the curve through profiled points (devices strictly increasing, at
  // least one point, every ms > 0). Error otherwise.
  static Result<ScalingCurve> fit(const std::vector<ProfilePoint>& points);

  // Time of one operator on n devices, ms, for any real n > 0:
  //  - n in [min_devices, max_devices]: the piece that contains n;
  //  - n < min_devices: T(min) * min / n (time-sharing a device, used by the
  //    relaxed allocation, which may give a MetaOp less than one device);
  //  - n > max_devices: T(max) (no gain beyond the profiled range).
  // Positive and non-increasing in n.
  double time_ms(double n) const;

  // Inverse: the smallest real n > 0 with time_ms(n) <= t_ms; +infinity when
  // t_ms < T(max_devices) (no allocation is fast enough).
  double devices_for(double t_ms) const;

  // The largest curve at or below this one whose work n T(n) never
  // shrinks as n grows (alpha >= 0 on every piece): knot values lowered,
  // from the largest count down, to at most the next knot's value times
  // n_next / n. A knot within 1e-5 of that is kept (a profile's 6
  // significant digits round a linear curve's work by about 1e-6).
  // Equal to this curve when its work never shrinks. The
  // relaxed allocation's optimum is a lower bound only on such curves: on
  // 10 ms at 1 device and 1 ms at 2 (T = -8 + 18/n between) it priced
  // the MetaOp at n = 1.5 above what running it on both devices and then
  // another MetaOp there takes (test_alloc); without_superlinear gives
  // T = 2/n.
  ScalingCurve without_superlinear() const;
  // Whether without_superlinear changes this curve: some piece's work at
  // its lower count exceeds its work at the upper one by more than 1e-5.
  bool superlinear() const;

  int min_devices() const { return min_n_; }
  int max_devices() const { return max_n_; }

  struct Piece {
    double n_lo, n_hi;   // closed range of device counts
    double alpha_ms, beta_ms;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  std::vector<Piece> pieces_;
  int min_n_ = 1;
  int max_n_ = 1;
};

// How far `points` (devices strictly increasing) break the rule that
// without_superlinear enforces: the largest work ratio n_i T_i / (n_j T_j) over
// i < j, 1 when the work never shrinks (and for fewer than two points).
// 10 ms on 1 device and 1 ms on 2: 5. spindle-profile --measure names the
// worst entry: a timing taken while the machine was busy, or a cache
// effect (docs/profiling.md, "Fit check").
double superlinear_factor(const std::vector<ProfilePoint>& points);

}  // namespace spindle::plan
