// Chrome trace event files (build-notes.md, "Conventions"): one process per
// device, thread 0 for compute and thread 1 for communication; opens in
// Perfetto and chrome://tracing.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libplan/plan/plan.h"

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

}  // namespace spindle::plan
