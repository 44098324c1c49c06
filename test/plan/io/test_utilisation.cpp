// Cluster utilisation over one planned iteration and its SVG (io/utilisation.h).
#include <catch2/catch.hpp>

#include <numeric>
#include <string>
#include <vector>

#include "test/plan/shipped_fixture.h"
#include "libplan/report/utilisation.h"

namespace sp = spindle::plan;

using spindle::plan::testing::Fixture;

namespace {

// 4 devices, two waves, by hand:
//   wave 0 (no transfer): A on {0,1} for 10 ms, B on {2} for 6 ms -> wave 10 ms
//   wave 1: transfer 2 ms, then C on {0,1,2,3} for 5 ms            -> wave 5 ms
//   gradient sync 3 ms.
// Timeline: [0,10) wave 0, [10,12) transfer, [12,17) C, [17,20) sync.
sp::Plan two_wave_plan() {
  sp::Plan p;
  p.strategy = "hand";
  p.model_name = "m";
  p.cluster_name = "c";
  p.devices = 4;
  for (int id = 0; id < 3; ++id) {
    sp::PlanMetaOp m;
    m.id = id;
    m.task = "t" + std::to_string(id);
    m.workload.op = "linear";
    p.metaops.push_back(m);
  }
  sp::Wave w0;
  w0.index = 0;
  w0.ms = 10;
  w0.slices = {{0, 0, 1, {0, 1}, 10.0}, {1, 0, 1, {2}, 6.0}};
  sp::Wave w1;
  w1.index = 1;
  w1.ms = 5;
  w1.transfer_ms = 2;
  w1.slices = {{2, 0, 1, {0, 1, 2, 3}, 5.0}};
  p.waves = {w0, w1};
  p.predicted.compute_ms = 15;
  p.predicted.transfer_ms = 2;
  p.predicted.sync_ms = 3;
  p.predicted.iteration_ms = 20;
  return p;
}

// Checks that every tag is closed in order (comments and the XML declaration
// aside) and returns the number of elements; -1 when the nesting is broken.
int balanced_elements(const std::string& xml, std::string& root) {
  std::vector<std::string> open;
  int elements = 0;
  for (size_t i = xml.find('<'); i != std::string::npos; i = xml.find('<', i + 1)) {
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return -1;
    const std::string tag = xml.substr(i + 1, end - i - 1);
    if (tag.rfind("?", 0) == 0 || tag.rfind("!--", 0) == 0) continue;
    if (tag.find('<') != std::string::npos) return -1;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return -1;
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (open.empty() && elements > 0) return -1;  // a second root
    if (open.empty()) root = name;
    ++elements;
    if (tag.back() != '/') open.push_back(name);
  }
  return open.empty() ? elements : -1;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t i = text.find(what); i != std::string::npos; i = text.find(what, i + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("utilisation: a hand-made two-wave plan", "[utilisation]") {
  const sp::Plan p = two_wave_plan();
  // Busy device-ms: A 2 x 10 + B 1 x 6 + C 4 x 5 = 46, over 4 devices x 20 ms.
  CHECK(sp::average_utilisation(p) == Approx(46.0 / 80.0));

  const sp::Utilisation u = sp::utilisation(p, 4);
  CHECK(u.label == "hand");
  CHECK(u.devices == 4);
  CHECK(u.timeline_ms == Approx(20));
  CHECK(u.iteration_ms == Approx(20));
  CHECK(u.bucket_ms == Approx(5));
  REQUIRE(u.busy.size() == 4);
  CHECK(u.busy[0] == Approx(15.0 / 20.0));   // [0,5): A 2x5 + B 1x5
  CHECK(u.busy[1] == Approx(11.0 / 20.0));   // [5,10): A 2x5 + B 1x1
  CHECK(u.busy[2] == Approx(12.0 / 20.0));   // [10,15): transfer to 12, then C 4x3
  CHECK(u.busy[3] == Approx(8.0 / 20.0));    // [15,20): C 4x2, then sync
  REQUIRE(u.transfers.size() == 1);
  CHECK(u.transfers[0].start_ms == Approx(10));
  CHECK(u.transfers[0].end_ms == Approx(12));
  REQUIRE(u.syncs.size() == 1);
  CHECK(u.syncs[0].start_ms == Approx(17));
  CHECK(u.syncs[0].end_ms == Approx(20));

  // Finer buckets: 1 ms each.
  const sp::Utilisation fine = sp::utilisation(p, 20);
  REQUIRE(fine.busy.size() == 20);
  CHECK(fine.busy[5] == Approx(0.75));       // A and B
  CHECK(fine.busy[6] == Approx(0.5));        // A only
  CHECK(fine.busy[10] == Approx(0.0));       // transfer
  CHECK(fine.busy[12] == Approx(1.0));       // C on all four
  CHECK(fine.busy[17] == Approx(0.0));       // sync
  // The mean over buckets is the average utilisation.
  CHECK(std::accumulate(fine.busy.begin(), fine.busy.end(), 0.0) / 20 == Approx(46.0 / 80.0));

  // Buckets that do not divide the waves: 3 of 20/3 ms.
  const sp::Utilisation odd = sp::utilisation(p, 3);
  REQUIRE(odd.busy.size() == 3);
  // [0, 6.667): A 2 x 6.667 + B 1 x 6 = 19.333 device-ms over 4 x 6.667.
  CHECK(odd.busy[0] == Approx((2 * 20.0 / 3 + 6) / (4 * 20.0 / 3)));
}

TEST_CASE("utilisation: a plan without time or devices gives zeros", "[utilisation]") {
  sp::Plan p;
  p.strategy = "empty";
  CHECK(sp::average_utilisation(p) == 0);
  const sp::Utilisation u = sp::utilisation(p, 0);
  CHECK(u.busy == std::vector<double>{0.0});
  CHECK(u.timeline_ms == 0);
  std::string root;
  CHECK(balanced_elements(sp::utilisation_svg({u}), root) > 0);
}

TEST_CASE("utilisation: shipped plans agree with their predictions", "[utilisation]") {
  Fixture f("multitask-clip-10", "a800-2x8");
  for (sp::Strategy s : {sp::Strategy::sequential, sp::Strategy::task_level, sp::Strategy::intra_task,
                         sp::Strategy::spindle}) {
    INFO(sp::strategy_name(s));
    const sp::Plan p = f.plan(s);
    const sp::Utilisation u = sp::utilisation(p, 200);
    // The planned timeline ends at the predicted iteration time.
    CHECK(u.timeline_ms == Approx(p.predicted.iteration_ms).epsilon(1e-9));
    CHECK(u.average > 0);
    CHECK(u.average <= 1.0 + 1e-12);
    for (double b : u.busy) {
      CHECK(b >= 0);
      CHECK(b <= 1.0 + 1e-9);
    }
    CHECK(std::accumulate(u.busy.begin(), u.busy.end(), 0.0) / 200 == Approx(u.average).epsilon(1e-9));
    // Shaded spans add up to the predicted transfer and sync times.
    double transfer = 0, sync = 0;
    for (const sp::Interval& i : u.transfers) transfer += i.end_ms - i.start_ms;
    for (const sp::Interval& i : u.syncs) sync += i.end_ms - i.start_ms;
    CHECK(transfer == Approx(p.predicted.transfer_ms).margin(1e-9));
    CHECK(sync == Approx(p.predicted.sync_ms).margin(1e-9));
  }
}

TEST_CASE("utilisation SVG: well-formed, one series per plan, deterministic", "[utilisation]") {
  Fixture f("multitask-clip-4", "a800-1x8");
  std::vector<sp::Utilisation> series;
  for (sp::Strategy s : {sp::Strategy::sequential, sp::Strategy::spindle}) series.push_back(sp::utilisation(f.plan(s)));
  sp::Utilisation hand = sp::utilisation(two_wave_plan());
  hand.label = "a<b & \"c\"";
  series.push_back(hand);

  const std::string svg = sp::utilisation_svg(series);
  std::string root;
  CHECK(balanced_elements(svg, root) > 10);
  CHECK(root == "svg");
  CHECK(count(svg, "<path class=\"util\"") == 3);
  CHECK(count(svg, "<g class=\"panel\">") == 3);
  CHECK_THAT(svg, Catch::Contains(">sequential</tspan>") && Catch::Contains(">spindle</tspan>") &&
                      Catch::Contains("a&lt;b &amp; &quot;c&quot;") && Catch::Contains("time in the iteration (ms)") &&
                      Catch::Contains("multitask-clip-4 on a800-1x8 (8 devices)"));
  // The legend carries the predicted iteration time (3 decimals) and the average.
  char legend[128];
  std::snprintf(legend, sizeof legend, "iteration %.3f ms, average utilisation %.1f%%", series[1].iteration_ms,
                100 * series[1].average);
  CHECK_THAT(svg, Catch::Contains(legend));
  // The hand-made plan has one transfer and one sync span.
  CHECK(count(svg, "<rect class=\"sync\"") >= 1);
  CHECK(count(svg, "<rect class=\"transfer\"") >= 1);
  CHECK(sp::utilisation_svg(series) == svg);
  CHECK_THAT(sp::utilisation_svg(series, "my title"), Catch::Contains(">my title</text>"));
}
