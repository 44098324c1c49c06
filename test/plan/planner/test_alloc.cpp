// Relaxed allocation and bi-point discretisation (docs/planner.md, step 5-6).
#include <catch2/catch.hpp>

#include <cmath>

#include "helpers.h"
#include "libplan/alloc/alloc.h"

using namespace spindle::plan;
using namespace spindle::plan::test;

namespace {

std::function<double(int)> inverse(double a) {
  return [a](int n) { return a / n; };
}

bool same(const std::vector<AllocTuple>& got, const std::vector<AllocTuple>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].devices != want[i].devices || got[i].count != want[i].count) return false;
  return true;
}

}  // namespace

TEST_CASE("valid device counts: tensor parallel and batch divisibility", "[alloc]") {
  CHECK(valid_device_counts(8, 1, 12) == std::vector<int>{1, 2, 3, 4, 6});
  CHECK(valid_device_counts(8, 2, 8) == std::vector<int>{2, 4, 8});
  CHECK(valid_device_counts(8, 2, 6) == std::vector<int>{2, 4, 6});   // 4: 2 groups of 3 rows
  CHECK(valid_device_counts(4, 1, 7) == std::vector<int>{1});
  CHECK(valid_device_counts(4, 8, 64).empty());   // K larger than the cluster
  CHECK(valid_device_counts(8, 4, 2) == std::vector<int>{4, 8});   // 1 or 2 groups of K = 4
  CHECK(valid_device_counts(12, 4, 2) == std::vector<int>{4, 8});  // 12: 3 groups do not split 2 rows
}

TEST_CASE("relaxed allocation: T = a/n gives C* = sum L a / N", "[alloc]") {
  const std::vector<int> counts{1, 2, 4, 8};
  const ScalingCurve c1 = alpha_beta_curve(0, 10, counts);
  const ScalingCurve c2 = alpha_beta_curve(0, 3, counts);
  const ScalingCurve c3 = alpha_beta_curve(0, 7, counts);
  const RelaxedAllocation r = relax_level({{4, &c1}, {6, &c2}, {2, &c3}}, 8);
  const double c_star = (4 * 10.0 + 6 * 3.0 + 2 * 7.0) / 8;   // 9
  CHECK(r.c_star_ms == Approx(c_star).epsilon(1e-8));
  REQUIRE(r.n_star.size() == 3);
  CHECK(r.n_star[0] == Approx(40 / c_star).epsilon(1e-8));
  CHECK(r.n_star[1] == Approx(18 / c_star).epsilon(1e-8));
  CHECK(r.n_star[2] == Approx(14 / c_star).epsilon(1e-8));
  CHECK(r.n_star[0] + r.n_star[1] + r.n_star[2] == Approx(8).epsilon(1e-8));
  CHECK(r.iterations <= 100);
}

TEST_CASE("relaxed allocation: alpha-beta curves match the closed form", "[alloc]") {
  // L = 1, T1 = 1 + 8/n, T2 = 2 + 4/n, N = 4:
  // 8/(C-1) + 4/(C-2) = 4  =>  C^2 - 6C + 7 = 0  =>  C* = 3 + sqrt(2).
  const std::vector<int> counts{1, 2, 3, 4};
  const ScalingCurve c1 = alpha_beta_curve(1, 8, counts);
  const ScalingCurve c2 = alpha_beta_curve(2, 4, counts);
  const RelaxedAllocation r = relax_level({{1, &c1}, {1, &c2}}, 4);
  const double c_star = 3 + std::sqrt(2.0);
  CHECK(r.c_star_ms == Approx(c_star).epsilon(1e-8));
  CHECK(r.n_star[0] == Approx(8 / (c_star - 1)).epsilon(1e-6));
  CHECK(r.n_star[1] == Approx(4 / (c_star - 2)).epsilon(1e-6));
}

TEST_CASE("relaxed allocation: tensor-parallel curves starting at K", "[alloc]") {
  // Profiled from 2 devices only; below 2 the curve time-shares: T(n) = T(2)*2/n.
  const ScalingCurve tp = alpha_beta_curve(0, 16, {2, 4, 8});
  const ScalingCurve dp = alpha_beta_curve(0, 8, {1, 2, 4, 8});
  const RelaxedAllocation r = relax_level({{2, &tp}, {2, &dp}}, 8);
  CHECK(r.c_star_ms == Approx((2 * 16.0 + 2 * 8.0) / 8).epsilon(1e-8));   // 6
  CHECK(r.n_star[0] == Approx(32 / 6.0).epsilon(1e-6));
  // A single MetaOp on the whole cluster.
  const RelaxedAllocation one = relax_level({{3, &tp}}, 8);
  CHECK(one.c_star_ms == Approx(3 * 2.0).epsilon(1e-8));
  CHECK(one.n_star[0] == Approx(8).epsilon(1e-6));
}

TEST_CASE("relaxed allocation: a curve that stops scaling leaves devices idle", "[alloc]") {
  // Profiled up to 2 devices: beyond, no gain. Two of them cannot use 8 devices.
  const ScalingCurve c = alpha_beta_curve(0, 4, {1, 2});
  const RelaxedAllocation r = relax_level({{1, &c}, {1, &c}}, 8);
  CHECK(r.c_star_ms == Approx(2.0));
  CHECK(r.n_star[0] <= 2.0 + 1e-9);
}

TEST_CASE("relaxed allocation: a MetaOp capped by its largest valid count", "[alloc]") {
  // Both T = 8/n, L = 1, N = 8; the first can use at most 2 devices (say its
  // batch is 2): it cannot beat T(2) = 4, and the other needs only 2 devices
  // to keep up, so C* = 4 with 4 devices idle.
  const ScalingCurve c = alpha_beta_curve(0, 8, {1, 2, 4, 8});
  const RelaxedAllocation r = relax_level({{1, &c, 2}, {1, &c, 0}}, 8);
  CHECK(r.c_star_ms == Approx(4));
  CHECK(r.n_star[0] == Approx(2));
  CHECK(r.n_star[1] == Approx(2));
  // Uncapped, the two share the cluster: C* = 16 / 8 = 2.
  CHECK(relax_level({{1, &c, 0}, {1, &c, 0}}, 8).c_star_ms == Approx(2).epsilon(1e-8));
  // A cap that binds only partly: caps 3 and none, T = 12/n, L = 1, N = 8:
  // uncapped optimum n* = 4 each is infeasible for the first; C* = T(3) = 4.
  const ScalingCurve d = alpha_beta_curve(0, 12, {1, 2, 3, 4, 8});
  const RelaxedAllocation q = relax_level({{1, &d, 3}, {1, &d, 0}}, 8);
  CHECK(q.c_star_ms == Approx(4));
  CHECK(q.n_star[0] == Approx(3));
}

TEST_CASE("relaxed allocation: a superlinear profile keeps its bound a lower bound", "[alloc]") {
  // A profiled 10 ms on 1 device and 1 ms on 2 (a busy machine's first
  // point): T = -8 + 18/n on [1, 2]. With B (1 ms on 1 device, 0.5 on 2,
  // T = 1/n) on N = 2 the equal-finish relaxation solves 18/(C+8) + 1/C = 2,
  // 2C^2 - 3C - 8 = 0, C* = (3 + sqrt 73) / 4 = 2.886 ms, while A on both
  // devices and then B on both takes 1 + 0.5 = 1.5 ms. The allocation keeps
  // that (the profile as measured); the bound lowers T_A(1) to 2 T_A(2) = 2
  // (T = 2/n): 2/C + 1/C = 2, C = 1.5, that schedule's time, by hand.
  std::vector<ProfilePoint> a_points{{1, 10.0, 0.0}, {2, 1.0, 0.0}};
  std::vector<ProfilePoint> b_points{{1, 1.0, 0.0}, {2, 0.5, 0.0}};
  const Result<ScalingCurve> a = ScalingCurve::fit(a_points);
  const Result<ScalingCurve> b = ScalingCurve::fit(b_points);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->superlinear());
  CHECK_FALSE(b->superlinear());
  const std::vector<AllocItem> items{{1, &*a, 2}, {1, &*b, 2}};
  const RelaxedAllocation r = relax_level(items, 2);
  CHECK(r.c_star_ms == Approx((3 + std::sqrt(73.0)) / 4).epsilon(1e-8));
  const double bound = relaxed_bound_ms(items, 2, r);
  CHECK(bound == Approx(1.5).epsilon(1e-8));
  CHECK(bound <= a_points[1].ms + b_points[1].ms + 1e-9);
  // Without a superlinear curve the bound is relax_level's C*, as given.
  const std::vector<AllocItem> sub{{1, &*b, 2}, {1, &*b, 2}};
  const RelaxedAllocation q = relax_level(sub, 2);
  CHECK(relaxed_bound_ms(sub, 2, q) == q.c_star_ms);
  CHECK(q.c_star_ms == Approx(1.0).epsilon(1e-8));   // 1/C + 1/C = 2
}

TEST_CASE("discretise: the paper's Figure 5a", "[alloc]") {
  // N = 4, MetaOps of 8, 12, 6 operators, n* = 1.9, 1.5, 0.6, T(n) = a/n with
  // L a / n* = C* = 120 for each: a = 28.5, 15, 12.
  const std::vector<int> valid = valid_device_counts(4, 1, 4);
  REQUIRE(valid == std::vector<int>{1, 2, 4});
  CHECK(same(discretise(8, inverse(28.5), 1.9, 120, valid), {{2, 8}}));
  CHECK(same(discretise(12, inverse(15), 1.5, 120, valid), {{2, 8}, {1, 4}}));
  CHECK(same(discretise(6, inverse(12), 0.6, 120, valid), {{1, 6}}));

  // The same through fitted curves and the bisection.
  const std::vector<int> counts{1, 2, 4};
  const ScalingCurve c1 = alpha_beta_curve(0, 28.5, counts);
  const ScalingCurve c2 = alpha_beta_curve(0, 15, counts);
  const ScalingCurve c3 = alpha_beta_curve(0, 12, counts);
  const RelaxedAllocation r = relax_level({{8, &c1}, {12, &c2}, {6, &c3}}, 4);
  CHECK(r.c_star_ms == Approx(120).epsilon(1e-8));
  CHECK(r.n_star[0] == Approx(1.9).epsilon(1e-8));
  CHECK(r.n_star[1] == Approx(1.5).epsilon(1e-8));
  CHECK(r.n_star[2] == Approx(0.6).epsilon(1e-8));
  CHECK(same(discretise(8, c1, r.n_star[0], r.c_star_ms, valid), {{2, 8}}));
  CHECK(same(discretise(12, c2, r.n_star[1], r.c_star_ms, valid), {{2, 8}, {1, 4}}));
  CHECK(same(discretise(6, c3, r.n_star[2], r.c_star_ms, valid), {{1, 6}}));
}

TEST_CASE("discretise: edge cases", "[alloc]") {
  const std::vector<int> v124{1, 2, 4};
  SECTION("n* below the smallest valid count: everything on it") {
    CHECK(same(discretise(5, inverse(10), 0.2, 250, v124), {{1, 5}}));
  }
  SECTION("n* exactly valid, or within the bisection's tolerance") {
    CHECK(same(discretise(5, inverse(10), 2.0, 25, v124), {{2, 5}}));
    CHECK(same(discretise(5, inverse(10), 2.0 * (1 - 1e-9), 25, v124), {{2, 5}}));
    CHECK(same(discretise(5, inverse(10), 4.0 * (1 + 1e-9), 12.5, v124), {{4, 5}}));
  }
  SECTION("n* above every valid count: all on the largest") {
    CHECK(same(discretise(3, inverse(10), 5.5, 5.45, {1, 2, 3}), {{3, 3}}));
  }
  SECTION("tensor parallel 2: valid 2, 4, 8") {
    const std::vector<int> v = valid_device_counts(8, 2, 16);
    REQUIRE(v == std::vector<int>{2, 4, 8});
    // n* = 3 between 2 and 4; L = 6, T = 12/n: C* = 24 = l_hi*3 + (6-l_hi)*6 => l_hi = 4.
    CHECK(same(discretise(6, inverse(12), 3, 24, v), {{4, 4}, {2, 2}}));
    // n* = 1.5 < 2: the dummy 0 below, all on 2.
    CHECK(same(discretise(6, inverse(12), 1.5, 48, v), {{2, 6}}));
  }
  SECTION("batch divisibility: batch 6 on 8 devices skips 4 and 5") {
    const std::vector<int> v = valid_device_counts(8, 1, 6);
    REQUIRE(v == std::vector<int>{1, 2, 3, 6});
    // n* = 4.5 between 3 and 6; L = 9, T = 18/n: C* = 9*18/4.5 = 36;
    // l_hi*3 + (9-l_hi)*6 = 36 => l_hi = 6.
    CHECK(same(discretise(9, inverse(18), 4.5, 36, v), {{6, 6}, {3, 3}}));
  }
  SECTION("rounding to the nearest count; a zero count is dropped") {
    // L = 4, T = 10/n, n* = 1.1: C* = 36.36: l_hi*5 + (4-l_hi)*10 = 36.36 => l_hi = 0.73 -> 1.
    CHECK(same(discretise(4, inverse(10), 1.1, 40 / 1.1, v124), {{2, 1}, {1, 3}}));
    // n* = 1.02: l_hi = 0.16 -> 0.
    CHECK(same(discretise(4, inverse(10), 1.02, 40 / 1.02, v124), {{1, 4}}));
  }
  SECTION("a flat curve between the points keeps the smaller count") {
    CHECK(same(discretise(4, [](int) { return 3.0; }, 1.5, 12, v124), {{1, 4}}));
  }
}

TEST_CASE("discretise_level: single operators take the larger count when the level affords it", "[alloc]") {
  // N = 4, valid 1, 2, 4; three MetaOps of one operator each with T = a/n,
  // a = 6, 6, 8 (the same device-ms on any count). Relaxed: C* = 20 / 4 = 5,
  // n* = 1.2, 1.2, 1.6.
  const std::vector<int> counts{1, 2, 4};
  const ScalingCurve a6 = alpha_beta_curve(0, 6, counts);
  const ScalingCurve a8 = alpha_beta_curve(0, 8, counts);
  const std::vector<AllocItem> items{{1, &a6, 4}, {1, &a6, 4}, {1, &a8, 4}};
  const RelaxedAllocation r = relax_level(items, 4);
  REQUIRE(r.c_star_ms == Approx(5).epsilon(1e-8));
  REQUIRE(r.n_star[0] == Approx(1.2).epsilon(1e-8));
  REQUIRE(r.n_star[2] == Approx(1.6).epsilon(1e-8));
  // Nearest rounding: l_hi = (6 - 5) / (6 - 3) = 0.33 -> 0, so the a = 6
  // MetaOps run alone on 1 device for 6 ms, past C*; l_hi = (8 - 5) / (8 - 4)
  // = 0.75 -> 1 puts a = 8 on 2 devices (4 ms). Level bound
  // max(6, 20 / 4) = 6.
  CHECK(same(discretise(1, a6, r.n_star[0], r.c_star_ms, counts), {{1, 1}}));
  CHECK(same(discretise(1, a8, r.n_star[2], r.c_star_ms, counts), {{2, 1}}));
  // Level rounding: rounding every one up costs no device-ms here, so the
  // bound falls to max(3, 3, 4, 20 / 4) = 5 = C*: all on 2 devices.
  const std::vector<std::vector<AllocTuple>> t = discretise_level(items, r, {counts, counts, counts}, 4);
  REQUIRE(t.size() == 3);
  CHECK(same(t[0], {{2, 1}}));
  CHECK(same(t[1], {{2, 1}}));
  CHECK(same(t[2], {{2, 1}}));
}

TEST_CASE("discretise_level: a level short of devices rounds down", "[alloc]") {
  // N = 3, valid 1, 2, 3; two MetaOps of 4 operators with T = 6 + 4/n
  // (T(1) = 10, T(2) = 8: 2 devices cost 16 device-ms an operator, 1 device
  // 10). Relaxed: n* = 1.5 each, C* = 4 T(1.5) = 34.67; l_hi = (40 - 34.67) /
  // (10 - 8) = 2.67. Nearest: 3 on 2 devices + 1 on 1 (28 ms, 58 device-ms
  // each): bound max(28, 116 / 3) = 38.67. Rounded down: 2 + 2 (36 ms, 52
  // device-ms each): bound max(36, 104 / 3) = 36, the least of the four
  // choices (one down: max(36, 110 / 3) = 36.67).
  const std::vector<int> counts{1, 2, 3};
  const ScalingCurve c = alpha_beta_curve(6, 4, counts);
  const std::vector<AllocItem> items{{4, &c, 3}, {4, &c, 3}};
  const RelaxedAllocation r = relax_level(items, 3);
  REQUIRE(r.c_star_ms == Approx(4 * (6 + 4 / 1.5)).epsilon(1e-8));
  CHECK(same(discretise(4, c, r.n_star[0], r.c_star_ms, counts), {{2, 3}, {1, 1}}));
  const std::vector<std::vector<AllocTuple>> t = discretise_level(items, r, {counts, counts}, 3);
  REQUIRE(t.size() == 2);
  CHECK(same(t[0], {{2, 2}, {1, 2}}));
  CHECK(same(t[1], {{2, 2}, {1, 2}}));
}
