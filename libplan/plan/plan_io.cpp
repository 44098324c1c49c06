#include "libplan/plan/plan_io.h"

#include <limits>
#include <optional>

#include "libplan/io/json_reader.h"
#include "libplan/model/ops.h"
#include "libplan/util/files.h"
#include "libplan/util/limits.h"

namespace spindle::plan {

namespace {

using nlohmann::json;

constexpr int kMsDecimals = 3;

json ints(const std::vector<int>& v) { return json(v); }

}  // namespace

std::string plan_to_json(const Plan& p) {
  json doc;
  doc["format"] = "spindle-plan";
  doc["version"] = kPlanVersion;
  doc["strategy"] = p.strategy;
  doc["model"] = {{"name", p.model_name}, {"sha256", p.model_sha256}};
  doc["cluster"] = {{"name", p.cluster_name},
                    {"devices", p.devices},
                    {"devices_per_island", p.devices_per_island},
                    {"memory_bytes", p.memory_bytes}};
  doc["profile"] = {{"sha256", p.profile_sha256}};

  json metaops = json::array();
  for (const PlanMetaOp& m : p.metaops) {
    metaops.push_back({{"id", m.id},
                       {"task", m.task},
                       {"op", m.workload.op},
                       {"dims", m.workload.dims},
                       {"seq", m.workload.seq},
                       {"batch", m.workload.batch},
                       {"tensor_parallel", m.tensor_parallel},
                       {"operators", m.operators},
                       {"level", m.level},
                       {"inputs", ints(m.inputs)}});
  }
  doc["metaops"] = std::move(metaops);

  json waves = json::array();
  for (const Wave& w : p.waves) {
    json slices = json::array();
    for (const Slice& s : w.slices) {
      slices.push_back({{"metaop", s.metaop},
                        {"first", s.first},
                        {"count", s.count},
                        {"devices", ints(s.devices)},
                        {"ms", round_to(s.ms, kMsDecimals)}});
    }
    waves.push_back({{"index", w.index},
                     {"ms", round_to(w.ms, kMsDecimals)},
                     {"transfer_ms", round_to(w.transfer_ms, kMsDecimals)},
                     {"slices", std::move(slices)}});
  }
  doc["waves"] = std::move(waves);

  json groups = json::array();
  for (const ParamGroup& g : p.param_groups) groups.push_back({{"param", g.param}, {"devices", ints(g.devices)}});
  doc["param_groups"] = std::move(groups);

  const Predicted& q = p.predicted;
  doc["predicted"] = {{"iteration_ms", round_to(q.iteration_ms, kMsDecimals)},
                      {"compute_ms", round_to(q.compute_ms, kMsDecimals)},
                      {"transfer_ms", round_to(q.transfer_ms, kMsDecimals)},
                      {"sync_ms", round_to(q.sync_ms, kMsDecimals)},
                      {"relaxed_optimum_ms", round_to(q.relaxed_optimum_ms, kMsDecimals)},
                      {"memory_bytes", q.memory_bytes}};
  if (q.simulated_ms > 0) doc["predicted"]["simulated_ms"] = round_to(q.simulated_ms, kMsDecimals);
  if (p.bucket_starts == BucketStarts::when_ready) doc["x-lowering"]["bucket_starts"] = "when-ready";
  if (!p.early_transfers) doc["x-lowering"]["early_transfers"] = false;
  if (p.param_gather == ParamGather::next_step) doc["x-lowering"]["param_gather"] = "next-step";
  if (!p.overlap) doc["x-lowering"]["overlap"] = false;
  if (p.bucket_bytes != kDefaultBucketBytes) doc["x-lowering"]["bucket_bytes"] = p.bucket_bytes;
  if (p.grad_norm) doc["x-lowering"]["grad_norm"] = true;
  if (p.optimizer_state != OptimizerState::sharded)
    doc["x-memory"]["optimizer_state"] = optimizer_state_name(p.optimizer_state);
  return doc.dump(1) + "\n";
}

namespace {

// An integer that the plan keeps as an int (ids, indices, counts, devices):
// one out of int range is an error, not silently truncated.
Result<int> get_int32(const JsonReader& r) {
  SPINDLE_ASSIGN(v, r.get_int());
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return r.error("integer " + std::to_string(v) + " is out of range");
  }
  return static_cast<int>(v);
}

// An int in lo..hi (both within int).
Result<int> get_int_in(const JsonReader& r, int64_t lo, int64_t hi) {
  SPINDLE_ASSIGN(v, r.get_int_in(lo, hi));
  return static_cast<int>(v);
}

// A time or figure of the plan: finite (get_number) and >= 0.
Result<double> get_ms(const JsonReader& r) {
  SPINDLE_ASSIGN(v, r.get_number());
  if (v < 0) return r.error("expected a number >= 0, found " + r.value().dump());
  return v;
}

Result<std::vector<int>> read_ints(const JsonReader& r) {
  SPINDLE_TRY(r.require_array());
  std::vector<int> out;
  for (size_t i = 0; i < r.value().size(); ++i) {
    SPINDLE_ASSIGN(v, get_int32(r.at(i)));
    out.push_back(v);
  }
  return out;
}

Result<PlanMetaOp> read_metaop(const JsonReader& r) {
  SPINDLE_TRY(r.require_object({"id", "task", "op", "dims", "seq", "batch", "operators", "level", "inputs"},
                               {"tensor_parallel"}));
  PlanMetaOp m;
  SPINDLE_ASSIGN(id, get_int32(r.at("id")));
  SPINDLE_ASSIGN(task, r.at("task").get_string());
  SPINDLE_ASSIGN(op, r.at("op").get_string());
  SPINDLE_ASSIGN(seq, get_int_in(r.at("seq"), 1, limits::kMaxSize));
  SPINDLE_ASSIGN(batch, get_int_in(r.at("batch"), 1, limits::kMaxSize));
  SPINDLE_ASSIGN(level, get_int32(r.at("level")));
  const OpSpec* spec = find_op(op);
  if (spec == nullptr) return r.at("op").error("unknown op '" + op + "'");
  // Exactly the op's dimensions, flat: workload keys never recurse.
  if (const std::string problem = op_dims_problem(*spec, r.at("dims").value()); !problem.empty()) {
    return r.at("dims").error(problem);
  }
  m.id = id;
  m.task = task;
  m.workload = Workload{op, r.at("dims").value(), seq, batch};
  m.level = level;
  if (r.has("tensor_parallel")) {
    SPINDLE_ASSIGN(tp, get_int_in(r.at("tensor_parallel"), 1, limits::kMaxDevices));
    m.tensor_parallel = tp;
  }
  JsonReader ops = r.at("operators");
  SPINDLE_TRY(ops.require_array());
  for (size_t i = 0; i < ops.value().size(); ++i) {
    SPINDLE_ASSIGN(s, ops.at(i).get_string());
    m.operators.push_back(s);
  }
  SPINDLE_ASSIGN(inputs, read_ints(r.at("inputs")));
  m.inputs = inputs;
  return m;
}

Result<Wave> read_wave(const JsonReader& r) {
  SPINDLE_TRY(r.require_object({"index", "ms", "transfer_ms", "slices"}, {}));
  Wave w;
  SPINDLE_ASSIGN(index, get_int32(r.at("index")));
  SPINDLE_ASSIGN(ms, get_ms(r.at("ms")));
  SPINDLE_ASSIGN(tms, get_ms(r.at("transfer_ms")));
  w.index = index;
  w.ms = ms;
  w.transfer_ms = tms;
  JsonReader slices = r.at("slices");
  SPINDLE_TRY(slices.require_array());
  for (size_t i = 0; i < slices.value().size(); ++i) {
    JsonReader s = slices.at(i);
    SPINDLE_TRY(s.require_object({"metaop", "first", "count", "devices", "ms"}, {}));
    Slice sl;
    SPINDLE_ASSIGN(metaop, get_int32(s.at("metaop")));
    // Operator positions: first + count stays in int.
    SPINDLE_ASSIGN(first, get_int_in(s.at("first"), 0, limits::kMaxOperators));
    SPINDLE_ASSIGN(count, get_int_in(s.at("count"), 0, limits::kMaxOperators));
    SPINDLE_ASSIGN(sms, get_ms(s.at("ms")));
    SPINDLE_ASSIGN(devices, read_ints(s.at("devices")));
    sl.metaop = metaop;
    sl.first = first;
    sl.count = count;
    sl.ms = sms;
    sl.devices = devices;
    w.slices.push_back(std::move(sl));
  }
  return w;
}

// The plan's extension keys (spec/plan.md): "x-lowering" (how spindle-run
// lowers the plan, as the planner simulated it) and "x-memory", each
// optional, with no other key under them.
Status read_extensions(const JsonReader& r, Plan& p) {
  if (r.has("x-lowering")) {
    JsonReader lowering = r.at("x-lowering");
    SPINDLE_TRY(
        lowering.require_object({}, {"bucket_starts", "early_transfers", "param_gather", "overlap", "bucket_bytes",
                                     "grad_norm"}));
    if (lowering.has("bucket_starts")) {
      SPINDLE_ASSIGN(starts, lowering.at("bucket_starts").get_string());
      if (starts == "when-ready") p.bucket_starts = BucketStarts::when_ready;
      else if (starts != "in-order")
        return lowering.at("bucket_starts").error("expected \"in-order\" or \"when-ready\", found \"" + starts + "\"");
    }
    if (lowering.has("param_gather")) {
      SPINDLE_ASSIGN(gather, lowering.at("param_gather").get_string());
      if (gather == "next-step") p.param_gather = ParamGather::next_step;
      else if (gather != "after-step")
        return lowering.at("param_gather").error("expected \"next-step\" or \"after-step\", found \"" + gather + "\"");
    }
    for (const auto& [key, field] : {std::pair{"early_transfers", &p.early_transfers}, std::pair{"overlap", &p.overlap},
                                     std::pair{"grad_norm", &p.grad_norm}})
      if (lowering.has(key)) {
        SPINDLE_ASSIGN(value, lowering.at(key).get_bool());
        *field = value;
      }
    if (lowering.has("bucket_bytes")) {
      // --bucket-mb's range, in bytes (plan.h).
      SPINDLE_ASSIGN(bytes, lowering.at("bucket_bytes").get_int());
      if (bytes < kMinBucketBytes || bytes > kMaxBucketBytes)
        return lowering.at("bucket_bytes").error("expected bytes from " + std::to_string(kMinBucketBytes) + " to " +
                                                 std::to_string(kMaxBucketBytes) + ", found " + std::to_string(bytes));
      p.bucket_bytes = bytes;
    }
  }
  if (r.has("x-memory")) {
    JsonReader memory = r.at("x-memory");
    SPINDLE_TRY(memory.require_object({}, {"optimizer_state"}));
    if (memory.has("optimizer_state")) {
      SPINDLE_ASSIGN(name, memory.at("optimizer_state").get_string());
      const std::optional<OptimizerState> state = optimizer_state_named(name);
      if (!state)
        return memory.at("optimizer_state").error("expected \"sharded\" or \"replicated\", found \"" + name + "\"");
      p.optimizer_state = *state;
    }
  }
  return {};
}

}  // namespace

Result<Plan> parse_plan_string(const std::string& text, const std::string& path) {
  SPINDLE_ASSIGN(doc, parse_json_text(text, path));
  JsonReader r(doc, path);
  SPINDLE_TRY(r.require_object(
      {"format", "version", "strategy", "model", "cluster", "profile", "metaops", "waves", "param_groups", "predicted"},
      {}));
  SPINDLE_TRY(check_format_version(r, "spindle-plan", kPlanVersion));
  Plan p;
  SPINDLE_ASSIGN(strategy, r.at("strategy").get_string());
  if (strategy.empty()) return Error{path + ": strategy: expected a name (spindle, a baseline's, or your own), found \"\""};
  p.strategy = strategy;

  JsonReader model = r.at("model");
  SPINDLE_TRY(model.require_object({"name", "sha256"}, {}));
  SPINDLE_ASSIGN(mname, model.at("name").get_string());
  SPINDLE_ASSIGN(msha, model.at("sha256").get_string());
  p.model_name = mname;
  p.model_sha256 = msha;

  JsonReader cluster = r.at("cluster");
  SPINDLE_TRY(cluster.require_object({"name", "devices", "devices_per_island", "memory_bytes"}, {}));
  SPINDLE_ASSIGN(cname, cluster.at("name").get_string());
  SPINDLE_ASSIGN(devices, get_int_in(cluster.at("devices"), 1, limits::kMaxDevices));
  SPINDLE_ASSIGN(dpi, get_int_in(cluster.at("devices_per_island"), 1, limits::kMaxDevices));
  SPINDLE_ASSIGN(mem, cluster.at("memory_bytes").get_int());
  if (devices % dpi != 0) {
    return cluster.at("devices_per_island")
        .error(std::to_string(dpi) + " does not divide the " + std::to_string(devices) +
               " devices (a cluster is whole islands)");
  }
  if (mem < 1) return cluster.at("memory_bytes").error("expected at least 1 byte, found " + std::to_string(mem));
  p.cluster_name = cname;
  p.devices = devices;
  p.devices_per_island = dpi;
  p.memory_bytes = mem;

  JsonReader profile = r.at("profile");
  SPINDLE_TRY(profile.require_object({"sha256"}, {}));
  SPINDLE_ASSIGN(psha, profile.at("sha256").get_string());
  p.profile_sha256 = psha;

  JsonReader metaops = r.at("metaops");
  SPINDLE_TRY(metaops.require_array());
  for (size_t i = 0; i < metaops.value().size(); ++i) {
    SPINDLE_ASSIGN(m, read_metaop(metaops.at(i)));
    p.metaops.push_back(std::move(m));
  }
  JsonReader waves = r.at("waves");
  SPINDLE_TRY(waves.require_array());
  for (size_t i = 0; i < waves.value().size(); ++i) {
    SPINDLE_ASSIGN(w, read_wave(waves.at(i)));
    p.waves.push_back(std::move(w));
  }
  JsonReader groups = r.at("param_groups");
  SPINDLE_TRY(groups.require_array());
  for (size_t i = 0; i < groups.value().size(); ++i) {
    JsonReader g = groups.at(i);
    SPINDLE_TRY(g.require_object({"param", "devices"}, {}));
    SPINDLE_ASSIGN(param, g.at("param").get_string());
    SPINDLE_ASSIGN(gdev, read_ints(g.at("devices")));
    p.param_groups.push_back({param, gdev});
  }

  JsonReader pred = r.at("predicted");
  SPINDLE_TRY(pred.require_object(
      {"iteration_ms", "compute_ms", "transfer_ms", "sync_ms", "relaxed_optimum_ms", "memory_bytes"},
      {"simulated_ms"}));
  SPINDLE_ASSIGN(it, get_ms(pred.at("iteration_ms")));
  SPINDLE_ASSIGN(cm, get_ms(pred.at("compute_ms")));
  SPINDLE_ASSIGN(tr, get_ms(pred.at("transfer_ms")));
  SPINDLE_ASSIGN(sy, get_ms(pred.at("sync_ms")));
  SPINDLE_ASSIGN(ro, get_ms(pred.at("relaxed_optimum_ms")));
  p.predicted = Predicted{it, cm, tr, sy, ro, {}, 0.0};
  if (pred.has("simulated_ms")) {
    SPINDLE_ASSIGN(sim, get_ms(pred.at("simulated_ms")));
    p.predicted.simulated_ms = sim;
  }
  JsonReader memb = pred.at("memory_bytes");
  SPINDLE_TRY(memb.require_array());
  for (size_t i = 0; i < memb.value().size(); ++i) {
    SPINDLE_ASSIGN(b, memb.at(i).get_int());
    if (b < 0) return memb.at(i).error("expected a byte count >= 0, found " + std::to_string(b));
    p.predicted.memory_bytes.push_back(b);
  }
  SPINDLE_TRY(read_extensions(r, p));
  return p;
}

Result<Plan> load_plan(const std::string& path) {
  SPINDLE_ASSIGN(text, read_file(path));
  return parse_plan_string(text, path);
}

}  // namespace spindle::plan
