// Wavefront scheduling and simple placement, checked by hand.
#include <catch2/catch.hpp>

#include <algorithm>

#include "libplan/waves/portfolio.h"
#include "libplan/waves/schedule.h"

using namespace spindle::plan;

namespace {

// A MetaOp with T(n) = a / n on the valid counts.
ScheduleItem item(int level, std::vector<int> inputs, int length, double a,
                  std::vector<AllocTuple> tuples, std::vector<int> valid = {1, 2, 4}) {
  ScheduleItem it;
  it.level = level;
  it.inputs = std::move(inputs);
  it.length = length;
  it.valid = std::move(valid);
  it.time_ms.assign(static_cast<size_t>(it.valid.back()) + 1, 0.0);
  for (int n : it.valid) it.time_ms[static_cast<size_t>(n)] = a / n;
  it.tuples = std::move(tuples);
  return it;
}

struct S {
  int metaop, first, count, devices;
};

void check_wave(const AbstractWave& w, const std::vector<S>& want) {
  REQUIRE(w.slots.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(w.slots[i].metaop == want[i].metaop);
    CHECK(w.slots[i].first == want[i].first);
    CHECK(w.slots[i].count == want[i].count);
    CHECK(w.slots[i].devices == want[i].devices);
  }
}

// A chain A allocated 2 operators on 2 devices and 6 on 4, beside single
// long operators B (4 devices) and C (2) that fill the other devices and
// set the first wave's length; D after all three.
std::vector<ScheduleItem> chain_beside_long_ops() {
  const std::vector<int> v8{1, 2, 4, 8};
  return {item(0, {}, 8, 8, {{2, 2}, {4, 6}}, v8), item(0, {}, 1, 400, {{4, 1}}, v8),
          item(0, {}, 1, 200, {{2, 1}}, v8), item(1, {0, 1, 2}, 2, 16, {{8, 2}}, v8)};
}

}  // namespace

TEST_CASE("schedule: the Figure 5a level, by hand", "[schedule]") {
  // Tuples from the discretisation test: A 2x8, B 2x8 + 1x4, C 1x6; T = a/n with
  // a = 28.5, 15, 12 (T(2) = 14.25, 7.5, 6; T(1) = 28.5, 15, 12); C* = 120.
  const std::vector<ScheduleItem> items{item(0, {}, 8, 28.5, {{2, 8}}),
                                        item(0, {}, 12, 15, {{2, 8}, {1, 4}}),
                                        item(0, {}, 6, 12, {{1, 6}})};
  ScheduleOptions paper;
  paper.paper_rules = true;
  const std::vector<AbstractWave> w = schedule_waves(items, 4, paper);
  REQUIRE(w.size() == 4);
  // Wave 0: A(2) and B(2) fill the 4 devices; aligned to B's 8 x 7.5 = 60 ms,
  // A runs floor(60 / 14.25) = 4 operators.
  check_wave(w[0], {{0, 0, 4, 2}, {1, 0, 8, 2}});
  CHECK(w[0].ms == Approx(60));
  // Wave 1: A(2) 57 ms, C(1) 72 ms, B(1) 60 ms; aligned to A's 57 ms:
  // C floor(57 / 12) = 4, B floor(57 / 15) = 3.
  check_wave(w[1], {{0, 4, 4, 2}, {1, 8, 3, 1}, {2, 0, 4, 1}});
  CHECK(w[1].ms == Approx(57));
  // Wave 2: B 1 left (15 ms), C 2 left (24 ms) on 1 device each, 2 idle: C (most
  // work) grows to 2, then B to 2; aligned to B's 7.5 ms, C runs one (6 ms).
  check_wave(w[2], {{1, 11, 1, 2}, {2, 4, 1, 2}});
  CHECK(w[2].ms == Approx(7.5));
  // Wave 3: C's last operator grows to all 4 devices.
  check_wave(w[3], {{2, 5, 1, 4}});
  CHECK(w[3].ms == Approx(3));
  double total = 0;
  for (const AbstractWave& x : w) total += x.ms;
  CHECK(total == Approx(127.5));   // gap 127.5 / 120 = 1.0625 on this tiny level
}

TEST_CASE("schedule: levels run in order, cross-level starts MetaOps early", "[schedule]") {
  // Level 0: X 1x4 (T(1) = 10) and Y 1x1 (T(1) = 10) on 2 devices.
  // Level 1: Z after Y only, 2 operators on 1 device each 10 ms.
  // W after X, one operator.
  const std::vector<ScheduleItem> items{item(0, {}, 4, 10, {{1, 4}}, {1}),
                                        item(0, {}, 1, 10, {{1, 1}}, {1}),
                                        item(1, {1}, 2, 10, {{1, 2}}, {1}),
                                        item(1, {0}, 1, 10, {{1, 1}}, {1})};
  ScheduleOptions paper;
  paper.paper_rules = true;
  const std::vector<AbstractWave> by_level = schedule_waves(items, 2, paper);
  // Level 0: wave {X, Y} 10 ms, then X alone for 3 more (aligned to its own 30 ms);
  // level 1: {Z, W}, then Z.
  REQUIRE(by_level.size() == 4);
  check_wave(by_level[0], {{0, 0, 1, 1}, {1, 0, 1, 1}});
  check_wave(by_level[1], {{0, 1, 3, 1}});
  check_wave(by_level[2], {{2, 0, 1, 1}, {3, 0, 1, 1}});
  check_wave(by_level[3], {{2, 1, 1, 1}});
  paper.cross_level = true;
  const std::vector<AbstractWave> cross = schedule_waves(items, 2, paper);
  // Z starts next to X as soon as Y is done: X and Z align to Z's 20 ms.
  REQUIRE(cross.size() == 4);
  check_wave(cross[0], {{0, 0, 1, 1}, {1, 0, 1, 1}});
  check_wave(cross[1], {{0, 1, 2, 1}, {2, 0, 2, 1}});
  check_wave(cross[2], {{0, 3, 1, 1}});
  check_wave(cross[3], {{3, 0, 1, 1}});   // W waits for X's last slice
  double level_ms = 0, cross_ms = 0;
  for (const AbstractWave& x : by_level) level_ms += x.ms;
  for (const AbstractWave& x : cross) cross_ms += x.ms;
  CHECK(level_ms == Approx(60));
  CHECK(cross_ms == Approx(50));
}

namespace {

// The structural rules of spec/plan.md on abstract waves: each MetaOp's slots
// cover its operators once, in order, in strictly later waves; inputs end in
// an earlier wave; device counts valid and summing to at most N per wave.
void check_structure(const std::vector<ScheduleItem>& items, const std::vector<AbstractWave>& waves,
                     int n) {
  std::vector<int> next(items.size(), 0), last_wave(items.size(), -1);
  for (size_t w = 0; w < waves.size(); ++w) {
    int used = 0;
    for (const AbstractSlot& s : waves[w].slots) {
      const auto m = static_cast<size_t>(s.metaop);
      CHECK(s.first == next[m]);
      CHECK(s.count >= 1);
      CHECK(last_wave[m] < static_cast<int>(w));
      CHECK(std::count(items[m].valid.begin(), items[m].valid.end(), s.devices) == 1);
      for (int in : items[m].inputs) {
        CHECK(next[static_cast<size_t>(in)] == items[static_cast<size_t>(in)].length);
        CHECK(last_wave[static_cast<size_t>(in)] < static_cast<int>(w));
      }
      next[m] += s.count;
      last_wave[m] = static_cast<int>(w);
      used += s.devices;
    }
    CHECK(used <= n);
  }
  for (size_t m = 0; m < items.size(); ++m) CHECK(next[m] == items[m].length);
}

}  // namespace

TEST_CASE("schedule: every option set keeps the plan rules", "[schedule]") {
  // Two levels on 8 devices with uneven curves and a join.
  const std::vector<int> v8{1, 2, 4, 8};
  const std::vector<ScheduleItem> join{
      item(0, {}, 12, 40, {{4, 7}, {2, 5}}, v8), item(0, {}, 7, 9, {{2, 7}}, v8),
      item(0, {}, 20, 3, {{1, 20}}, v8),        item(0, {}, 3, 30, {{2, 3}}, v8),
      item(1, {0, 1}, 5, 16, {{4, 5}}, v8),     item(1, {2}, 9, 8, {{2, 6}, {1, 3}}, v8),
      item(2, {3, 4, 5}, 2, 4, {{8, 2}}, v8)};
  const std::vector<ScheduleItem> chain = chain_beside_long_ops();
  int narrowed = 0;   // schedules with narrow_tails that ran a wider tuple's operators narrower
  for (const std::vector<ScheduleItem>& items : {join, chain}) {
    for (bool paper : {false, true})
      for (bool cross : {false, true})
        for (int look : {0, 4})
          for (double defer : {0.0, 0.3})
            for (bool narrow : {true, false}) {
              ScheduleOptions o;
              o.paper_rules = paper;
              o.cross_level = cross;
              o.lookahead = look;
              o.defer_fraction = defer;
              o.narrow_tails = narrow;
              INFO("paper " << paper << " cross " << cross << " lookahead " << look << " defer " << defer
                            << " narrow_tails " << narrow);
              const std::vector<AbstractWave> w = schedule_waves(items, 8, o);
              check_structure(items, w, 8);
              if (narrow && !paper) narrowed += narrows_tails(items, w);
              if (!narrow && !paper) CHECK_FALSE(narrows_tails(items, w));
              // Deterministic.
              const std::vector<AbstractWave> again = schedule_waves(items, 8, o);
              REQUIRE(again.size() == w.size());
              for (size_t i = 0; i < w.size(); ++i) CHECK(again[i].ms == w[i].ms);
            }
  }
  // The items do make the default rule narrow tails, so the check above has
  // something to refuse.
  CHECK(narrowed > 0);
}

TEST_CASE("schedule: without narrow_tails a wider tuple's operators wait for their width", "[schedule]") {
  // On 8 devices: A = 8 operators, 2 allocated on 2 devices and 6 on 4
  // (T(n) = 8/n: 4 ms on 2, 2 on 4, 1 on 8); B one operator on 4 devices
  // (100 ms), C one on 2 (100 ms); D after all three. Wave 0 gives A 2, B 4
  // and C 2 devices (no device left to widen) and lasts 100 ms.
  const std::vector<ScheduleItem> items = chain_beside_long_ops();
  // Default: A's slot keeps going on its 2 devices and runs all 8 (32 ms),
  // 6 of them allocated to 4 devices.
  const std::vector<AbstractWave> narrowed = schedule_waves(items, 8, {});
  REQUIRE(narrowed.size() == 2);
  check_wave(narrowed[0], {{0, 0, 8, 2}, {1, 0, 1, 4}, {2, 0, 1, 2}});
  check_wave(narrowed[1], {{3, 0, 2, 8}});
  CHECK(narrows_tails(items, narrowed));
  // narrow_tails false: A runs its 2 on 2 devices; the other 6 wait for the
  // next wave, where A has the devices to itself (widened to 8: 6 ms).
  ScheduleOptions wide;
  wide.narrow_tails = false;
  const std::vector<AbstractWave> w = schedule_waves(items, 8, wide);
  REQUIRE(w.size() == 3);
  check_wave(w[0], {{0, 0, 2, 2}, {1, 0, 1, 4}, {2, 0, 1, 2}});
  CHECK(w[0].ms == Approx(100));
  check_wave(w[1], {{0, 2, 6, 8}});
  CHECK(w[1].ms == Approx(6));
  check_wave(w[2], {{3, 0, 2, 8}});
  CHECK_FALSE(narrows_tails(items, w));
}

TEST_CASE("schedule: the portfolio says whether a variant narrowed a tail", "[schedule]") {
  const std::vector<ScheduleItem> items = chain_beside_long_ops(), none;
  PortfolioInput in;
  in.items = &items;
  in.level_rounded = &none;
  in.levels = 2;
  in.devices = 8;
  in.island = 8;
  const PortfolioSchedules narrowed = schedule_portfolio(in);
  CHECK(narrowed.narrowed_tails);
  in.narrow_tails = false;
  const PortfolioSchedules wide = schedule_portfolio(in);
  CHECK_FALSE(wide.narrowed_tails);
  REQUIRE_FALSE(wide.schedules.empty());
  for (const std::vector<AbstractWave>& w : wide.schedules) {
    check_structure(items, w, 8);
    CHECK_FALSE(narrows_tails(items, w));
  }
}

TEST_CASE("schedule: narrows_tails by hand", "[schedule]") {
  // One MetaOp of 4 operators: 2 on 2 devices, 2 on 1 device.
  const std::vector<ScheduleItem> items{item(0, {}, 4, 8, {{2, 2}, {1, 2}})};
  const auto waves = [](std::vector<AbstractSlot> slots) {
    std::vector<AbstractWave> w;
    for (const AbstractSlot& s : slots) w.push_back({{s}, s.ms});
    return w;
  };
  // As allocated: 2 on 2 devices, then 2 on 1.
  CHECK_FALSE(narrows_tails(items, waves({{0, 0, 2, 2, 8}, {0, 2, 2, 1, 16}})));
  // 3 on 2 devices takes one of the 1-device operators: wider, not narrower.
  CHECK_FALSE(narrows_tails(items, waves({{0, 0, 3, 2, 12}, {0, 3, 1, 1, 8}})));
  // 3 on 1 device: one of the 2-device operators ran on 1.
  CHECK(narrows_tails(items, waves({{0, 0, 3, 1, 24}, {0, 3, 1, 2, 4}})));
  // After the 1-device tuple is used up, an operator on 1 device is narrower
  // than allocated, but one alone runs under either rule.
  CHECK_FALSE(narrows_tails(items, waves({{0, 0, 2, 1, 16}, {0, 2, 1, 1, 8}, {0, 3, 1, 2, 4}})));
  // Two of them on 1 device are a narrowed tail.
  CHECK(narrows_tails(items, waves({{0, 0, 2, 1, 16}, {0, 2, 2, 1, 16}})));
}

TEST_CASE("schedule: our rules on the Figure 5a level", "[schedule]") {
  const std::vector<ScheduleItem> items{item(0, {}, 8, 28.5, {{2, 8}}),
                                        item(0, {}, 12, 15, {{2, 8}, {1, 4}}),
                                        item(0, {}, 6, 12, {{1, 6}})};
  const std::vector<AbstractWave> w = schedule_waves(items, 4);
  check_structure(items, w, 4);
  double total = 0;
  for (const AbstractWave& x : w) total += x.ms;
  CHECK(total >= 120 - 1e-9);   // never below the relaxed optimum here (T = a/n)
  CHECK(total <= 127.5);        // no worse than the paper's rules (hand trace above)
}

TEST_CASE("schedule: single operators on the level-rounded counts finish sooner", "[schedule]") {
  // The level of test_alloc's "single operators take the larger count": three
  // MetaOps of one operator, T = a/n with a = 6, 6, 8, on 4 devices; C* = 5.
  // Paper's rounding: 1, 1 and 2 devices. Every rule runs them side by side
  // in one wave of 6 ms (each slot runs at least one operator).
  const std::vector<ScheduleItem> nearest{item(0, {}, 1, 6, {{1, 1}}), item(0, {}, 1, 6, {{1, 1}}),
                                          item(0, {}, 1, 8, {{2, 1}})};
  // Level rounding: 2 devices each. Wave 0: the two with most work (8, then
  // the first 6) on 2 + 2 devices, 4 ms; wave 1: the other 6 alone, widened
  // to 4 devices, 1.5 ms: 5.5 ms.
  const std::vector<ScheduleItem> rounded{item(0, {}, 1, 6, {{2, 1}}), item(0, {}, 1, 6, {{2, 1}}),
                                          item(0, {}, 1, 8, {{2, 1}})};
  ScheduleOptions paper;
  paper.paper_rules = true;
  ScheduleOptions look;
  look.lookahead = 8;
  for (const ScheduleOptions& o : {ScheduleOptions{}, paper, look}) {
    const std::vector<AbstractWave> a = schedule_waves(nearest, 4, o);
    REQUIRE(a.size() == 1);
    CHECK(a[0].ms == Approx(6));
    const std::vector<AbstractWave> b = schedule_waves(rounded, 4, o);
    check_structure(rounded, b, 4);
    REQUIRE(b.size() == 2);
    check_wave(b[0], {{0, 0, 1, 2}, {2, 0, 1, 2}});
    check_wave(b[1], {{1, 0, 1, 4}});
    CHECK(b[0].ms + b[1].ms == Approx(5.5));
  }
}

TEST_CASE("schedule: a level starts in the idle devices of the previous level's last waves", "[schedule]") {
  // The level-by-level case above under our rules: level 0 is {X, Y} 10 ms,
  // then X's last 3 operators alone for 30 ms, one device idle; level 1 is
  // {Z, W} 10 ms, then Z's second operator 10 ms: 60 ms in all.
  const std::vector<ScheduleItem> items{item(0, {}, 4, 10, {{1, 4}}, {1}),
                                        item(0, {}, 1, 10, {{1, 1}}, {1}),
                                        item(1, {1}, 2, 10, {{1, 2}}, {1}),
                                        item(1, {0}, 1, 10, {{1, 1}}, {1})};
  const ScheduleOptions ours;
  const std::vector<AbstractWave> by_level = schedule_waves(items, 2, ours);
  REQUIRE(by_level.size() == 4);
  check_wave(by_level[1], {{0, 1, 3, 1}});
  CHECK(by_level[1].ms == Approx(30));
  std::vector<AbstractWave> before(by_level.begin(), by_level.begin() + 2);
  CHECK(schedule_level(items, 2, ours, before, 1).size() == 2);   // unchanged without a fill

  // Z's input Y finished in wave 0, so Z's two operators fit in wave 1's
  // idle device (20 of its 30 ms, the wave keeps its length); W needs X,
  // which ends in wave 1, so it waits. Level 1 is then W alone: 50 ms.
  CHECK(fill_idle(items, 2, before, 1, 1) == 1);
  check_wave(before[0], {{0, 0, 1, 1}, {1, 0, 1, 1}});
  check_wave(before[1], {{0, 1, 3, 1}, {2, 0, 2, 1}});
  CHECK(before[1].ms == Approx(30));
  const std::vector<AbstractWave> rest = schedule_level(items, 2, ours, before, 1);
  REQUIRE(rest.size() == 1);
  check_wave(rest[0], {{3, 0, 1, 1}});
  std::vector<AbstractWave> all = before;
  all.insert(all.end(), rest.begin(), rest.end());
  check_structure(items, all, 2);
  double ms = 0;
  for (const AbstractWave& w : all) ms += w.ms;
  CHECK(ms == Approx(50));

  // A MetaOp whose single operator is longer than the wave stays out: the
  // fill never lengthens a wave.
  std::vector<ScheduleItem> slow = items;
  slow[2] = item(1, {1}, 2, 40, {{1, 2}}, {1});
  std::vector<AbstractWave> unfilled(by_level.begin(), by_level.begin() + 2);
  CHECK(fill_idle(slow, 2, unfilled, 0, 1) == 0);
  check_wave(unfilled[1], {{0, 1, 3, 1}});
}
