#include "libplan/report/utilisation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "libplan/report/trace.h"

namespace spindle::plan {

namespace {

// Sorts spans and joins those that overlap or touch.
std::vector<Interval> merge(std::vector<Interval> spans) {
  std::sort(spans.begin(), spans.end(), [](const Interval& a, const Interval& b) {
    return a.start_ms != b.start_ms ? a.start_ms < b.start_ms : a.end_ms < b.end_ms;
  });
  std::vector<Interval> out;
  for (const Interval& s : spans) {
    if (!out.empty() && s.start_ms <= out.back().end_ms + 1e-9)
      out.back().end_ms = std::max(out.back().end_ms, s.end_ms);
    else
      out.push_back(s);
  }
  return out;
}

// Fixed-point number for SVG coordinates and labels.
std::string num(double v, int decimals = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s == "-0.00" || s == "-0") s.erase(0, 1);
  return s;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A 1-2-5 tick step giving at most about `target` ticks over [0, max].
double tick_step(double max, int target) {
  const double raw = max / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2"};
constexpr const char* kTransferFill = "#f2b134";
constexpr const char* kSyncFill = "#7f7f7f";

// Fills u.bucket_ms and u.busy (buckets already sized, u.timeline_ms and
// u.devices > 0): per bucket the overlap of every compute event with it,
// over devices x bucket_ms.
void add_busy(Utilisation& u, const std::vector<TraceEvent>& events) {
  const int buckets = static_cast<int>(u.busy.size());
  u.bucket_ms = u.timeline_ms / buckets;
  for (const TraceEvent& e : events) {
    if (e.cat != "compute" || e.dur_us <= 0) continue;
    const double a = e.start_us / 1000, b = (e.start_us + e.dur_us) / 1000;
    for (int k = std::clamp(static_cast<int>(a / u.bucket_ms), 0, buckets - 1); k < buckets; ++k) {
      const double lo = k * u.bucket_ms, hi = (k + 1) * u.bucket_ms;
      if (lo >= b) break;
      u.busy[k] += std::max(0.0, std::min(b, hi) - std::max(a, lo));
    }
  }
  for (double& v : u.busy) v /= u.devices * u.bucket_ms;
}

}  // namespace

double average_utilisation(const Plan& plan) {
  if (plan.devices <= 0 || plan.predicted.iteration_ms <= 0) return 0;
  double busy_device_ms = 0;
  for (const Wave& w : plan.waves)
    for (const Slice& s : w.slices) busy_device_ms += s.ms * static_cast<double>(s.devices.size());
  return busy_device_ms / (plan.devices * plan.predicted.iteration_ms);
}

Utilisation utilisation(const Plan& plan, int buckets) {
  buckets = std::max(buckets, 1);
  Utilisation u;
  u.label = plan.strategy;
  u.model_name = plan.model_name;
  u.cluster_name = plan.cluster_name;
  u.devices = plan.devices;
  u.iteration_ms = plan.predicted.iteration_ms;
  u.average = average_utilisation(plan);
  u.busy.assign(static_cast<size_t>(buckets), 0.0);

  const std::vector<TraceEvent> events = planned_trace(plan);
  std::vector<Interval> transfers, syncs;
  for (const TraceEvent& e : events) {
    const Interval span{e.start_us / 1000, (e.start_us + e.dur_us) / 1000};
    u.timeline_ms = std::max(u.timeline_ms, span.end_ms);
    if (e.cat == "transfer") transfers.push_back(span);
    if (e.cat == "sync") syncs.push_back(span);
  }
  u.transfers = merge(std::move(transfers));
  u.syncs = merge(std::move(syncs));
  if (u.timeline_ms <= 0 || plan.devices <= 0) return u;

  add_busy(u, events);
  return u;
}

double average_utilisation(const Simulation& sim) {
  if (sim.devices.empty() || sim.iteration_ms <= 0) return 0;
  return sim.compute_device_ms() / (static_cast<double>(sim.devices.size()) * sim.iteration_ms);
}

Utilisation utilisation(const Simulation& sim, const Plan& plan, int buckets) {
  buckets = std::max(buckets, 1);
  Utilisation u;
  u.label = plan.strategy;
  u.model_name = plan.model_name;
  u.cluster_name = plan.cluster_name;
  u.devices = static_cast<int>(sim.devices.size());
  u.iteration_ms = sim.iteration_ms;
  u.timeline_ms = sim.iteration_ms;
  u.average = average_utilisation(sim);
  u.busy.assign(static_cast<size_t>(buckets), 0.0);
  std::vector<Interval> transfers, syncs;
  for (const SimMessage& m : sim.messages)
    if (m.end_ms > m.start_ms) transfers.push_back({m.start_ms, m.end_ms});
  for (const SimBox& b : sim.boxes)
    if ((b.cat == "allreduce" || b.cat == "allgather") && b.dur_ms > 0) syncs.push_back({b.start_ms, b.start_ms + b.dur_ms});
  u.transfers = merge(std::move(transfers));
  u.syncs = merge(std::move(syncs));
  if (u.timeline_ms <= 0 || u.devices <= 0) return u;
  add_busy(u, simulated_trace(sim));
  return u;
}

std::string utilisation_svg(const std::vector<Utilisation>& series, const std::string& title) {
  // Layout in px: title and key on top, then one panel per series, then the x axis label.
  const double width = 960, left = 64, right = 24, plot_w = width - left - right;
  const double header = 64, panel_h = 150, plot_h = 100, plot_top = 28, footer = 24;
  const double height = header + panel_h * static_cast<double>(std::max<size_t>(series.size(), 1)) + footer;

  double max_ms = 0;
  for (const Utilisation& u : series) max_ms = std::max(max_ms, u.timeline_ms);
  if (max_ms <= 0) max_ms = 1;
  const double step = tick_step(max_ms, 10);
  const int tick_decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  auto x_of = [&](double ms) { return left + plot_w * ms / max_ms; };

  std::string t = title;
  if (t.empty() && !series.empty())
    t = "Cluster utilisation over one iteration: " + series[0].model_name + " on " + series[0].cluster_name + " (" +
        std::to_string(series[0].devices) + " devices)";

  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + num(width, 0) + "\" height=\"" +
       num(height, 0) + "\" viewBox=\"0 0 " + num(width, 0) + " " + num(height, 0) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(width, 0) + "\" height=\"" + num(height, 0) + "\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(left) + "\" y=\"20\" font-size=\"15\" font-weight=\"bold\">" + xml_escape(t) + "</text>\n";
  // Key for the shaded phases.
  s += "<g class=\"key\">\n";
  s += "<rect x=\"" + num(left) + "\" y=\"32\" width=\"14\" height=\"10\" fill=\"" + kTransferFill +
       "\" fill-opacity=\"0.45\"/>\n";
  s += "<text x=\"" + num(left + 20) + "\" y=\"41\">inter-wave transfer</text>\n";
  s += "<rect x=\"" + num(left + 160) + "\" y=\"32\" width=\"14\" height=\"10\" fill=\"" + kSyncFill +
       "\" fill-opacity=\"0.45\"/>\n";
  s += "<text x=\"" + num(left + 180) + "\" y=\"41\">gradient sync</text>\n";
  s += "<text x=\"" + num(left + 300) + "\" y=\"41\">line: share of devices computing</text>\n";
  s += "</g>\n";

  for (size_t i = 0; i < series.size(); ++i) {
    const Utilisation& u = series[i];
    const char* colour = kColours[i % (sizeof kColours / sizeof kColours[0])];
    const double top = header + panel_h * static_cast<double>(i) + plot_top;
    const double bottom = top + plot_h;
    auto y_of = [&](double share) { return bottom - plot_h * share; };
    s += "<g class=\"panel\">\n";
    // Legend: the series with its predicted iteration time and average utilisation.
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(top - 18) + "\" width=\"14\" height=\"10\" fill=\"" + colour +
         "\"/>\n";
    s += "<text class=\"legend\" x=\"" + num(left + 20) + "\" y=\"" + num(top - 9) + "\"><tspan font-weight=\"bold\">" +
         xml_escape(u.label) + "</tspan>: iteration " + num(u.iteration_ms, 3) + " ms, average utilisation " +
         num(100 * u.average, 1) + "%, " + std::to_string(u.devices) + " devices</text>\n";
    // Frame, y grid and y ticks.
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(plot_w) + "\" height=\"" +
         num(plot_h) + "\" fill=\"none\" stroke=\"#333333\"/>\n";
    for (int p = 0; p <= 100; p += 25) {
      const double y = y_of(p / 100.0);
      if (p > 0 && p < 100)
        s += "<line x1=\"" + num(left) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left + plot_w) + "\" y2=\"" + num(y) +
             "\" stroke=\"#dddddd\"/>\n";
      s += "<text x=\"" + num(left - 6) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" + std::to_string(p) +
           "%</text>\n";
    }
    // Shaded transfer and sync spans.
    for (const auto& [spans, fill, cls] : {std::tuple{&u.transfers, kTransferFill, "transfer"},
                                           std::tuple{&u.syncs, kSyncFill, "sync"}})
      for (const Interval& span : *spans)
        s += "<rect class=\"" + std::string(cls) + "\" x=\"" + num(x_of(span.start_ms)) + "\" y=\"" + num(top) +
             "\" width=\"" + num(x_of(span.end_ms) - x_of(span.start_ms)) + "\" height=\"" + num(plot_h) +
             "\" fill=\"" + fill + "\" fill-opacity=\"0.45\"/>\n";
    // The utilisation step line, filled down to 0%: a vertex only where the
    // (rounded) level changes.
    std::string d = "M" + num(x_of(0)) + " " + num(bottom);
    std::string level = num(bottom);
    for (size_t k = 0; k < u.busy.size() && u.bucket_ms > 0; ++k) {
      const std::string y = num(y_of(std::clamp(u.busy[k], 0.0, 1.0)));
      if (y == level) continue;
      d += " H" + num(x_of(static_cast<double>(k) * u.bucket_ms)) + " V" + y;
      level = y;
    }
    d += " H" + num(x_of(u.timeline_ms)) + " V" + num(bottom) + " Z";
    s += "<path class=\"util\" d=\"" + d + "\" fill=\"" + colour + "\" fill-opacity=\"0.25\" stroke=\"" + colour +
         "\" stroke-width=\"1.2\"/>\n";
    // End of the iteration.
    s += "<line x1=\"" + num(x_of(u.timeline_ms)) + "\" y1=\"" + num(top) + "\" x2=\"" + num(x_of(u.timeline_ms)) +
         "\" y2=\"" + num(bottom) + "\" stroke=\"#333333\" stroke-dasharray=\"4 3\"/>\n";
    // x ticks on every panel, labels under each.
    for (int k = 0; k * step <= max_ms * (1 + 1e-9); ++k) {
      const double x = x_of(k * step);
      s += "<line x1=\"" + num(x) + "\" y1=\"" + num(bottom) + "\" x2=\"" + num(x) + "\" y2=\"" + num(bottom + 4) +
           "\" stroke=\"#333333\"/>\n";
      s += "<text x=\"" + num(x) + "\" y=\"" + num(bottom + 16) + "\" text-anchor=\"middle\">" +
           num(k * step, tick_decimals) + "</text>\n";
    }
    s += "</g>\n";
  }
  s += "<text x=\"" + num(left + plot_w / 2) + "\" y=\"" + num(height - 6) +
       "\" text-anchor=\"middle\">time in the iteration (ms)</text>\n";
  s += "<text transform=\"translate(14 " + num(header + panel_h / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">devices computing</text>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace spindle::plan
