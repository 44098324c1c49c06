#include "libplan/alloc/alloc.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace spindle::plan {

std::vector<int> valid_device_counts(int devices, int tensor_parallel, int64_t batch) {
  std::vector<int> out;
  if (tensor_parallel < 1 || batch < 1) return out;
  for (int n = tensor_parallel; n <= devices; n += tensor_parallel) {
    if (batch % n == 0) out.push_back(n);
  }
  return out;
}

namespace {

constexpr int kMaxBisectionSteps = 100;
constexpr double kBisectionRelTol = 1e-9;
constexpr double kValidRelTol = 1e-6;

int cap_of(const AllocItem& it, int devices) {
  return it.max_devices > 0 ? std::min(it.max_devices, devices) : devices;
}

// Total real devices the items need to finish within c_ms each; +infinity
// when one would need more than its cap.
double devices_needed(const std::vector<AllocItem>& items, double c_ms, int devices) {
  double sum = 0;
  for (const AllocItem& it : items) {
    const double n = it.curve->devices_for(c_ms / it.length);
    const double cap = cap_of(it, devices);
    if (n > cap * (1 + 1e-12)) return std::numeric_limits<double>::infinity();
    sum += n;
  }
  return sum;
}

}  // namespace

RelaxedAllocation relax_level(const std::vector<AllocItem>& items, int devices) {
  assert(!items.empty() && devices >= 1);
  RelaxedAllocation out;
  const double n = static_cast<double>(devices);
  double lo = 0, hi = 0;
  for (const AllocItem& it : items) {
    lo = std::max(lo, it.length * it.curve->time_ms(cap_of(it, devices)));
    hi += it.length * it.curve->time_ms(1.0);
  }
  hi = std::max(hi, lo);
  if (devices_needed(items, lo, devices) <= n) {
    // Even the slowest MetaOp cannot use more devices: the level takes lo.
    hi = lo;
  } else {
    // Invariant: needed(lo) > N >= needed(hi).
    for (int step = 0; step < kMaxBisectionSteps; ++step) {
      if (hi - lo <= kBisectionRelTol * hi) break;
      const double mid = 0.5 * (lo + hi);
      if (devices_needed(items, mid, devices) > n) {
        lo = mid;
      } else {
        hi = mid;
      }
      out.iterations = step + 1;
    }
  }
  out.c_star_ms = hi;
  out.n_star.reserve(items.size());
  for (const AllocItem& it : items) out.n_star.push_back(it.curve->devices_for(hi / it.length));
  return out;
}

std::vector<AllocTuple> discretise(int length, const std::function<double(int)>& time_ms,
                                   double n_star, double c_star_ms, const std::vector<int>& valid) {
  assert(length >= 1 && !valid.empty());
  // n_star is itself valid (up to the bisection's tolerance).
  for (int v : valid) {
    if (std::abs(n_star - v) <= kValidRelTol * v) return {{v, length}};
  }
  if (n_star > valid.back()) return {{valid.back(), length}};
  const auto hi_it = std::upper_bound(valid.begin(), valid.end(), n_star,
                                      [](double x, int v) { return x < v; });
  const int n_hi = *hi_it;
  const int n_lo = hi_it == valid.begin() ? 0 : *(hi_it - 1);
  if (n_lo == 0) return {{n_hi, length}};   // dummy lower point: infinite time
  const double t_hi = time_ms(n_hi);
  const double t_lo = time_ms(n_lo);
  int l_hi = length;
  if (t_lo - t_hi > 0) {
    // l_hi t_hi + (L - l_hi) t_lo = C*  =>  l_hi = (L t_lo - C*) / (t_lo - t_hi).
    const double real = (length * t_lo - c_star_ms) / (t_lo - t_hi);
    l_hi = static_cast<int>(std::lround(std::clamp(real, 0.0, static_cast<double>(length))));
  } else {
    l_hi = 0;   // no gain from the larger count: keep every operator on n_lo
  }
  std::vector<AllocTuple> out;
  if (l_hi > 0) out.push_back({n_hi, l_hi});
  if (length - l_hi > 0) out.push_back({n_lo, length - l_hi});
  return out;
}

std::vector<AllocTuple> discretise(int length, const ScalingCurve& curve, double n_star,
                                   double c_star_ms, const std::vector<int>& valid) {
  return discretise(
      length, [&curve](int n) { return curve.time_ms(static_cast<double>(n)); }, n_star,
      c_star_ms, valid);
}

}  // namespace spindle::plan
