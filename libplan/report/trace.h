// Chrome trace event files (docs/building.md, "Conventions users already parse"): one process per
// device, thread 0 for compute and thread 1 for communication; opens in
// Perfetto and chrome://tracing.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libplan/plan/plan.h"
#include "libplan/sim/sim.h"

namespace spindle::plan {

struct TraceEvent {
  std::string name;
  std::string cat;        // "compute", "transfer", "sync", ...
  int device = 0;         // pid
  int track = 0;          // tid: 0 compute, 1 communication
  double start_us = 0;
  double dur_us = 0;
  nlohmann::json args = nlohmann::json::object();
};

// `{"traceEvents": [...], "displayTimeUnit": "ms"}` with process and thread
// name metadata for devices 0..devices-1. Deterministic.
std::string trace_to_json(const std::vector<TraceEvent>& events, int devices);

// The planned timeline of one iteration: per wave its transfers, then its
// slices (forward + backward as one box), then gradient sync.
std::vector<TraceEvent> planned_trace(const Plan& plan);

// The simulated timeline (libplan/sim/sim.h): every box of `sim`, forward,
// backward and optimizer on the compute track (cat "compute"), exchanges
// (cat "transfer"), all-reduces (cat "sync") and waits for an all-reduce's
// group (cat "wait") on the communication track; args name the kind, wave,
// slice or bucket, and bytes. Deterministic.
std::vector<TraceEvent> simulated_trace(const Simulation& sim);

}  // namespace spindle::plan
