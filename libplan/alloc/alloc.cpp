#include "libplan/alloc/alloc.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace spindle::plan {

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

double relaxed_bound_ms(const std::vector<AllocItem>& items, int devices, const RelaxedAllocation& relaxed) {
  std::vector<ScalingCurve> linear;
  linear.reserve(items.size());   // no reallocation: the items point into it
  std::vector<AllocItem> bounded = items;
  for (AllocItem& it : bounded) {
    if (!it.curve->superlinear()) continue;   // the others as they are
    linear.push_back(it.curve->without_superlinear());
    it.curve = &linear.back();
  }
  return linear.empty() ? relaxed.c_star_ms : relax_level(bounded, devices).c_star_ms;
}

namespace {

enum class Rounding { nearest, down, up };

// The bi-point split of docs/planner.md step 6 with l_hi rounded as asked.
std::vector<AllocTuple> split(int length, const std::function<double(int)>& time_ms, double n_star,
                              double c_star_ms, const std::vector<int>& valid, Rounding rounding) {
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
    const double real = std::clamp((length * t_lo - c_star_ms) / (t_lo - t_hi), 0.0,
                                   static_cast<double>(length));
    // Within the bisection's tolerance of an integer, every rounding agrees.
    const double near = std::round(real);
    const bool integral = std::abs(real - near) <= 1e-6;
    switch (rounding) {
      case Rounding::nearest: l_hi = static_cast<int>(std::lround(real)); break;
      case Rounding::down: l_hi = static_cast<int>(integral ? near : std::floor(real)); break;
      case Rounding::up: l_hi = static_cast<int>(integral ? near : std::ceil(real)); break;
    }
  } else {
    l_hi = 0;   // no gain from the larger count: keep every operator on n_lo
  }
  std::vector<AllocTuple> out;
  if (l_hi > 0) out.push_back({n_hi, l_hi});
  if (length - l_hi > 0) out.push_back({n_lo, length - l_hi});
  return out;
}

}  // namespace

std::vector<AllocTuple> discretise(int length, const std::function<double(int)>& time_ms,
                                   double n_star, double c_star_ms, const std::vector<int>& valid) {
  return split(length, time_ms, n_star, c_star_ms, valid, Rounding::nearest);
}

std::vector<std::vector<AllocTuple>> discretise_level(const std::vector<AllocItem>& items,
                                                      const RelaxedAllocation& relaxed,
                                                      const std::vector<std::vector<int>>& valid,
                                                      int devices) {
  assert(items.size() == relaxed.n_star.size() && items.size() == valid.size() && devices >= 1);
  struct Option {
    std::vector<AllocTuple> tuples;
    double ms = 0, area = 0;   // duration (ms) and busy device-ms
  };
  const size_t k = items.size();
  std::vector<Option> down(k), up(k);
  for (size_t m = 0; m < k; ++m) {
    const ScalingCurve& curve = *items[m].curve;
    const auto time = [&curve](int n) { return curve.time_ms(static_cast<double>(n)); };
    for (auto [rounding, option] : {std::pair{Rounding::down, &down[m]}, std::pair{Rounding::up, &up[m]}}) {
      option->tuples = split(items[m].length, time, relaxed.n_star[m], relaxed.c_star_ms, valid[m], rounding);
      for (const AllocTuple& t : option->tuples) {
        option->ms += t.count * time(t.devices);
        option->area += t.count * time(t.devices) * t.devices;
      }
    }
  }
  // Start from every MetaOp rounded up (durations at most C*, most
  // device-ms); round MetaOps down in order of their rounded-down duration,
  // shortest first, and keep the prefix with the least bound (ties: the
  // longer prefix, less device-ms). With sublinear scaling (n T(n) not
  // decreasing) rounding down never adds device-ms, so for any longest
  // rounded-down duration the best choice rounds down every MetaOp not
  // longer than it: the prefixes are all the candidates for the optimum.
  std::vector<size_t> order(k);
  for (size_t m = 0; m < k; ++m) order[m] = m;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return down[a].ms < down[b].ms; });
  double area = 0;
  for (size_t m = 0; m < k; ++m) area += up[m].area;
  // Largest rounded-up duration among MetaOps not yet rounded down: suffix maxima.
  std::vector<double> suffix_up_ms(k + 1, 0.0);
  for (size_t i = k; i-- > 0;) suffix_up_ms[i] = std::max(suffix_up_ms[i + 1], up[order[i]].ms);
  size_t best_prefix = 0;
  double down_ms = 0;
  double best = std::max(suffix_up_ms[0], area / devices);
  for (size_t i = 0; i < k; ++i) {
    const size_t m = order[i];
    area += down[m].area - up[m].area;
    down_ms = std::max(down_ms, down[m].ms);
    const double bound = std::max({down_ms, suffix_up_ms[i + 1], area / devices});
    if (bound <= best * (1 + 1e-12)) {   // ties: less area
      best = bound;
      best_prefix = i + 1;
    }
  }
  std::vector<std::vector<AllocTuple>> out(k);
  for (size_t i = 0; i < k; ++i) {
    const size_t m = order[i];
    out[m] = i < best_prefix ? std::move(down[m].tuples) : std::move(up[m].tuples);
  }
  return out;
}

std::vector<AllocTuple> discretise(int length, const ScalingCurve& curve, double n_star,
                                   double c_star_ms, const std::vector<int>& valid) {
  return discretise(
      length, [&curve](int n) { return curve.time_ms(static_cast<double>(n)); }, n_star,
      c_star_ms, valid);
}

}  // namespace spindle::plan
