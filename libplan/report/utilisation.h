// Cluster utilisation over one planned iteration (the paper's Figure 9): the
// share of devices computing over time, and an SVG that draws it for one or
// more plans. Built from planned_trace (trace.h), so the plot and the Chrome
// trace show the same timeline: per wave its transfers, then its slices
// (forward + backward as one box), then gradient sync at the end.
#pragma once

#include <string>
#include <vector>

#include "libplan/plan/plan.h"
#include "libplan/sim/sim.h"

namespace spindle::plan {

// A span of the planned timeline, in ms from the start of the iteration.
struct Interval {
  double start_ms = 0;
  double end_ms = 0;
};

struct Utilisation {
  std::string label;               // legend text; the plan's strategy by default
  std::string model_name;          // from the plan, for the plot title
  std::string cluster_name;
  int devices = 0;
  double iteration_ms = 0;         // plan.predicted.iteration_ms
  double timeline_ms = 0;          // end of the planned timeline (equals iteration_ms
                                   // when the plan's predictions are consistent)
  double average = 0;              // average_utilisation(plan), in [0, 1]
  double bucket_ms = 0;            // timeline_ms / busy.size()
  std::vector<double> busy;        // per bucket: busy device-ms / (devices * bucket_ms)
  std::vector<Interval> transfers; // inter-wave transfers, merged, ascending
  std::vector<Interval> syncs;     // gradient all-reduce, merged, ascending
};

// Sum over slices of slice.ms * |slice.devices|, divided by
// devices * predicted.iteration_ms: the share of device time spent computing
// over one iteration, in [0, 1] for a valid plan. 0 when the plan has no
// devices or no time.
double average_utilisation(const Plan& plan);

// The utilisation of `plan` in `buckets` equal buckets (>= 1; fewer is taken
// as 1) covering [0, timeline_ms). A plan without time gives all-zero buckets
// of width 0. Deterministic.
Utilisation utilisation(const Plan& plan, int buckets = 400);

// The same from a simulation of `plan` (libplan/sim/sim.h): busy from its
// compute boxes, transfer spans where any message moves, sync spans where any
// all-reduce runs; iteration_ms and timeline_ms are sim.iteration_ms, and
// average is average_utilisation(sim). Labels from `plan`.
Utilisation utilisation(const Simulation& sim, const Plan& plan, int buckets = 400);

// Compute device-ms of `sim` over devices x sim.iteration_ms, in [0, 1]; 0
// without devices or time.
double average_utilisation(const Simulation& sim);

// SVG 1.1 text (no scripts, no external resources): one panel per series,
// stacked in the given order, sharing the x axis (time in ms, 0 to the
// longest timeline) with ticks and labels; y is the share of devices busy
// computing, 0-100%, as a filled step line (one <path class="util"> per
// series); transfer and sync spans are shaded; each panel's legend names the
// series with its predicted iteration time and average utilisation. `title`
// empty: "Cluster utilisation over one iteration: MODEL on CLUSTER (N
// devices)" from the first series. Same input, same bytes.
std::string utilisation_svg(const std::vector<Utilisation>& series, const std::string& title = "");

}  // namespace spindle::plan
