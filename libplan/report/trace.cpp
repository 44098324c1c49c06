#include "libplan/report/trace.h"

#include "libplan/io/json_reader.h"

#include <algorithm>

namespace spindle::plan {

std::string trace_to_json(const std::vector<TraceEvent>& events, int devices) {
  using nlohmann::json;
  json out = json::array();
  for (int d = 0; d < devices; ++d) {
    out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", d}, {"tid", 0},
                   {"args", {{"name", "device " + std::to_string(d)}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", d}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", d}, {"tid", 1},
                   {"args", {{"name", "communication"}}}});
  }
  for (const TraceEvent& e : events) {
    // The end rounded as the start is: boxes that meet on a track still
    // meet (each rounded apart, one overlapped the next by 0.001 us, which
    // viewers take for a box nested in another).
    const double start = round_to(e.start_us, 3);
    const double dur = std::max(0.0, round_to(round_to(e.start_us + e.dur_us, 3) - start, 3));
    out.push_back({{"name", e.name}, {"cat", e.cat}, {"ph", "X"}, {"pid", e.device}, {"tid", e.track},
                   {"ts", start}, {"dur", dur}, {"args", e.args}});
  }
  return json{{"traceEvents", out}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

std::vector<TraceEvent> planned_trace(const Plan& plan) {
  std::vector<TraceEvent> ev;
  double t_us = 0;
  for (const Wave& w : plan.waves) {
    if (w.transfer_ms > 0) {
      for (const Slice& s : w.slices)
        for (int d : s.devices)
          ev.push_back({"transfer into wave " + std::to_string(w.index), "transfer", d, 1, t_us,
                        w.transfer_ms * 1000, {{"wave", w.index}}});
      t_us += w.transfer_ms * 1000;
    }
    for (const Slice& s : w.slices) {
      const PlanMetaOp& m = plan.metaops[s.metaop];
      std::string name = m.task + " " + m.workload.op + " x" + std::to_string(s.count);
      for (int d : s.devices)
        ev.push_back({name, "compute", d, 0, t_us, s.ms * 1000,
                      {{"wave", w.index}, {"metaop", s.metaop}, {"first", s.first}, {"count", s.count},
                       {"devices", s.devices.size()}}});
    }
    t_us += w.ms * 1000;
  }
  if (plan.predicted.sync_ms > 0)
    for (int d = 0; d < plan.devices; ++d)
      ev.push_back({"gradient all-reduce", "sync", d, 1, t_us, plan.predicted.sync_ms * 1000, {}});
  return ev;
}

std::vector<TraceEvent> simulated_trace(const Simulation& sim) {
  std::vector<TraceEvent> ev;
  ev.reserve(sim.boxes.size());
  for (const SimBox& b : sim.boxes) {
    const std::string cat = b.cat == "exchange" || b.cat == "send" || b.cat == "recv" ? "transfer"
                            : b.cat == "allreduce" || b.cat == "allgather" ? "sync"
                            : b.cat == "wait"      ? "wait"
                                                   : "compute";
    nlohmann::json args = {{"kind", b.cat}, {"instr", b.instr}};
    if (b.wave >= 0) args["wave"] = b.wave;
    if (b.slice >= 0) args["slice"] = b.slice;
    if (b.bucket >= 0) args["bucket"] = b.bucket;
    if (b.cat == "send") args["sent_bytes"] = b.sent_bytes;
    if (b.cat == "exchange") {
      args["sent_bytes"] = b.sent_bytes;
      args["received_bytes"] = b.received_bytes;
    }
    if (b.cat == "allreduce" || b.cat == "allgather") args["bytes"] = b.sent_bytes;
    if (b.critical) args["critical"] = true;
    ev.push_back({b.name, cat, b.device, static_cast<int>(b.track), b.start_ms * 1000, b.dur_ms * 1000, std::move(args)});
  }
  return ev;
}

}  // namespace spindle::plan
