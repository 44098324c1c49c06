// compare_runs: checks that a spindle-run run equals a reference run.
//
//   compare_runs REF.metrics.jsonl REF.params.json GOT.metrics.jsonl GOT.params.json
//
// Every step's task losses (--metrics) must agree element by element:
//   |got - ref| <= kRtol * max(|ref|, kFloor)   (1e-5 relative, floor 0.1).
// Every final parameter tensor (--dump-params) must agree in RMS:
//   rms(got - ref) <= kRtol * max(rms(ref), kFloor),
// the same 1e-5 relative with an absolute floor of 1e-6 per element. Why RMS
// and not every element: fp32 rounding differs between device counts (and
// between TP and non-TP arithmetic), and AdamW divides by sqrt(v), so the
// rare element whose gradients nearly cancel over the steps moves by up to
// ~1e-5 absolute (seen: 2 of 33440 elements of tiny-lm at seed 3) while the
// other elements agree to a few 1e-7. A wrong shard, scale or row range
// shifts whole tensors far beyond 1e-5. The worst single element is printed
// for information.
// Prints the worst mismatch; exits 0 when everything agrees, 1 otherwise,
// 2 on unreadable input.
//
//   compare_runs --losses REF.metrics.jsonl GOT.metrics.jsonl
//
// Lines with "eval" (spindle-run --eval-data) are compared apart from the
// training steps: the same evaluations, every task's loss and accuracies
// within the same tolerance.
//
// Only losses, matched by "step": every task loss of every step in GOT must
// equal REF's loss of that task at that step (same tolerance). GOT may hold
// fewer steps and fewer tasks (a resumed run; a model with a task removed);
// at least one loss must be compared.
//
//   compare_runs --bytes PROGRAM_DIR GOT.metrics.jsonl
//
// Predicted against measured traffic: every step's "ranks" entry of GOT
// (bytes sent, received, all-reduced and, with sharded optimizer state,
// all-gathered by that rank) must equal, exactly,
// the "bytes" of PROGRAM_DIR/device-R.json (spindle-plan --lower). Every
// rank of every step is compared; a run with no step, or a rank without its
// program, fails.
//
//   compare_runs --grad-norms REF.metrics.jsonl GOT.metrics.jsonl GOT.grads.json
//
// Gradient clipping (spindle-run --clip-grad): every step of GOT has a
// "grad_norm" equal to REF's of that step (same tolerance), and GOT's step
// 1 norm equals the L2 norm of the full gradients in GOT.grads.json
// (--dump-grads: after the sync, before clipping), summed here in double.
//
//   compare_runs --flip-bucket-starts PLAN.json OUT.json
//   compare_runs --late-transfers PLAN.json OUT.json
//   compare_runs --optimizer-state sharded|replicated PLAN.json OUT.json
//
//   compare_runs --move-slices PLAN.json OUT.json PREFIX DEVICES
//
// Not a comparison: write PLAN with every slice of the MetaOps whose
// operator ids start with PREFIX (e.g. "text/llm/") on DEVICES (comma-
// separated ids, ascending), for a placement the planner would not make.
// Fails when no slice matched.
//
// Not comparisons: write PLAN with its buckets started the other way
// (x-lowering.bucket_starts "when-ready" removed when present, else added),
// or with its transfers kept in their exchanges (x-lowering.early_transfers
// false), or with ZeRO-1's all-gathers at the next step's start
// (--gather-next-step: x-lowering.param_gather "next-step"), or with its optimizer state held the given way (sharded: the values gathered after the step) (ZeRO-1 or
// whole: x-memory.optimizer_state; its memory figures as they were), for
// the runs that check each gives bitwise the same result.
//
//   compare_runs --mutate SEED PLAN.json OUT.json
//
// Not a comparison: write PLAN with one edit drawn from SEED (a device of a
// slice replaced, added or dropped, a count or first moved, two waves
// swapped, a slice dropped, doubled or moved to another wave, a parameter
// group changed or dropped, a MetaOp field changed), and print which.
//
//   compare_runs --params REF.params.json GOT.params.json
//
// Only tensors (--dump-params or --dump-grads files), in RMS as above: the
// same names and shapes, at least one tensor.
//
// `--rtol X` before the mode sets the relative tolerance (default 1e-5; the
// GPU checks use 1e-4 in fp32 and 2e-2 in bf16). Any mode fails when it
// compared nothing.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

double kRtol = 1e-5;  // --rtol
constexpr double kFloor = 0.1;

// The lines of a --metrics file: training steps (evals == nullptr) or,
// with `evals`, the training steps and the evaluations apart.
std::vector<nlohmann::json> read_lines(const std::string& path, std::vector<nlohmann::json>* evals = nullptr) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("eval")) out.push_back(std::move(j));
    else if (evals) evals->push_back(std::move(j));
  }
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(in);
}

struct Worst {
  double excess = 0;  // |diff| / allowed
  std::string what;
  void see(double got, double ref, const std::string& where) {
    const double e = std::abs(got - ref) / (kRtol * std::max(std::abs(ref), kFloor));
    if (!(e <= excess)) {  // also catches NaN
      excess = std::isnan(e) ? 1e30 : e;
      std::ostringstream s;
      s.precision(9);
      s << where << ": got " << got << ", reference " << ref;
      what = s.str();
    }
  }
};

}  // namespace

// The tensors of two --dump-params / --dump-grads files, in RMS (header).
// Prints what it compared; returns false on any difference or when no
// tensor was compared.
bool compare_params(const nlohmann::json& ref_p, const nlohmann::json& got_p) {
  bool ok = true;
  Worst param, element;
  size_t elements = 0;
  const auto& rp = ref_p.at("params");
  const auto& gp = got_p.at("params");
  if (rp.size() != gp.size()) {
    std::fprintf(stderr, "parameter tensors differ: reference %zu, got %zu\n", rp.size(), gp.size());
    ok = false;
  }
  for (const auto& [name, t] : rp.items()) {
    if (!gp.contains(name) || gp[name]["shape"] != t["shape"]) {
      std::fprintf(stderr, "parameter %s missing or of another shape\n", name.c_str());
      ok = false;
      continue;
    }
    const auto& rv = t["values"];
    const auto& gv = gp[name]["values"];
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < rv.size(); ++i) {
      const double g = gv[i].get<double>(), r = rv[i].get<double>();
      element.see(g, r, name + "[" + std::to_string(i) + "]");
      d2 += (g - r) * (g - r);
      r2 += r * r;
    }
    const double n = static_cast<double>(std::max<size_t>(rv.size(), 1));
    // RMS comparison expressed through see(): got = rms(ref) + rms(diff).
    param.see(std::sqrt(r2 / n) + std::sqrt(d2 / n), std::sqrt(r2 / n), name + " (rms)");
    elements += rv.size();
  }
  std::printf("compared %zu tensors in RMS (worst %.3g of tolerance%s%s)\n", rp.size(), param.excess,
              param.what.empty() ? "" : ": ", param.what.c_str());
  std::printf("  (information: %zu elements, worst single element %.3g of tolerance%s%s)\n", elements,
              element.excess, element.what.empty() ? "" : ": ", element.what.c_str());
  if (rp.empty() || elements == 0 || param.excess > 1) ok = false;
  return ok;
}

// The --losses mode (header).
int compare_losses(const std::string& ref_path, const std::string& got_path) {
  std::map<int64_t, nlohmann::json> ref;
  for (const auto& j : read_lines(ref_path)) ref[j.at("step").get<int64_t>()] = j;
  Worst loss;
  size_t losses = 0;
  bool ok = true;
  for (const auto& g : read_lines(got_path)) {
    const int64_t step = g.at("step").get<int64_t>();
    const auto it = ref.find(step);
    if (it == ref.end()) {
      std::fprintf(stderr, "step %lld: not in %s\n", static_cast<long long>(step), ref_path.c_str());
      ok = false;
      continue;
    }
    for (const auto& [task, v] : g.at("loss").items()) {
      if (!it->second.at("loss").contains(task)) {
        std::fprintf(stderr, "step %lld: no loss for task %s in %s\n", static_cast<long long>(step),
                     task.c_str(), ref_path.c_str());
        ok = false;
        continue;
      }
      loss.see(v.get<double>(), it->second["loss"][task].get<double>(),
               "step " + std::to_string(step) + " loss " + task);
      ++losses;
    }
  }
  std::printf("compared %zu losses (worst %.3g of tolerance%s%s)\n", losses, loss.excess,
              loss.what.empty() ? "" : ": ", loss.what.c_str());
  if (losses == 0 || loss.excess > 1) ok = false;
  std::printf("%s\n", ok ? "AGREE" : "DIFFER");
  return ok ? 0 : 1;
}

// The --grad-norms mode (header).
int compare_grad_norms(const std::string& ref_path, const std::string& got_path, const std::string& grads_path) {
  std::map<int64_t, double> ref;
  for (const auto& j : read_lines(ref_path)) ref[j.at("step").get<int64_t>()] = j.at("grad_norm").get<double>();
  Worst norm;
  size_t compared = 0;
  double first = -1;
  for (const auto& g : read_lines(got_path)) {
    const int64_t step = g.at("step").get<int64_t>();
    const double got = g.at("grad_norm").get<double>();
    if (step == 1) first = got;
    if (!ref.count(step)) throw std::runtime_error("step " + std::to_string(step) + ": not in " + ref_path);
    norm.see(got, ref[step], "step " + std::to_string(step) + " grad_norm");
    ++compared;
  }
  double squares = 0;
  size_t values = 0;
  const nlohmann::json grads = read_json(grads_path);
  for (const auto& [name, t] : grads.at("params").items())
    for (const auto& v : t.at("values")) {
      squares += v.get<double>() * v.get<double>();
      ++values;
    }
  if (first >= 0) norm.see(first, std::sqrt(squares), "step 1 grad_norm against the gradients' own norm");
  std::printf("compared %zu gradient norms with %s and step 1's with the L2 norm of %zu gradient values (worst %.3g "
              "of tolerance%s%s)\n",
              compared, ref_path.c_str(), values, norm.excess, norm.what.empty() ? "" : ": ", norm.what.c_str());
  const bool ok = compared > 0 && first >= 0 && values > 0 && norm.excess <= 1;
  std::printf("%s\n", ok ? "AGREE" : "DIFFER");
  return ok ? 0 : 1;
}

// The --bytes mode (header).
int compare_bytes(const std::string& dir, const std::string& got_path) {
  std::map<int, nlohmann::json> predicted;  // rank -> {"sent", "received", "reduced"[, "gathered"]}
  size_t compared = 0, nonzero = 0;
  bool ok = true;
  const auto lines = read_lines(got_path);
  // Every device of the programs in `dir` must report in every step: a
  // rank missing from "ranks" is an error, not one comparison fewer.
  int devices = 0;
  while (std::filesystem::exists(dir + "/device-" + std::to_string(devices) + ".json")) ++devices;
  for (const auto& g : lines) {
    const int64_t step = g.at("step").get<int64_t>();
    std::set<int> reported;
    for (const auto& r : g.at("ranks")) reported.insert(r.at("rank").get<int>());
    if (devices == 0 || reported.size() != static_cast<size_t>(devices) || *reported.begin() != 0 ||
        *reported.rbegin() != devices - 1) {
      std::fprintf(stderr, "step %lld: %zu ranks reported, the programs are for %d devices\n",
                   static_cast<long long>(step), reported.size(), devices);
      ok = false;
    }
    for (const auto& r : g.at("ranks")) {
      const int rank = r.at("rank").get<int>();
      if (!predicted.count(rank))
        predicted[rank] = read_json(dir + "/device-" + std::to_string(rank) + ".json").at("bytes");
      const nlohmann::json& p = predicted[rank];
      for (const auto& [field, key] : {std::pair{"sent", "sent_bytes"}, {"received", "received_bytes"},
                                       {"reduced", "reduced_bytes"}, {"gathered", "gathered_bytes"}}) {
        // A program without sharded optimizer state states no "gathered": 0.
        const int64_t want = p.value(field, int64_t{0}), got = r.at(key).get<int64_t>();
        if (want != got) {
          std::fprintf(stderr, "step %lld rank %d: %s %lld measured, %lld predicted\n", static_cast<long long>(step),
                       rank, key, static_cast<long long>(got), static_cast<long long>(want));
          ok = false;
        }
        nonzero += got != 0;
        ++compared;
      }
    }
  }
  std::printf("compared %zu byte counts of %zu steps (%zu non-zero) with %s\n", compared, lines.size(), nonzero,
              dir.c_str());
  if (compared == 0) ok = false;
  std::printf("%s\n", ok ? "AGREE" : "DIFFER");
  return ok ? 0 : 1;
}

// The --mutate mode (header): one edit of a plan, drawn from `seed`, that
// leaves it valid JSON of the same shape; returns what it did.
std::string mutate_plan(nlohmann::json& plan, uint32_t seed) {
  std::mt19937 gen(seed);
  const auto draw = [&](size_t n) { return static_cast<size_t>(gen() % static_cast<uint32_t>(n)); };
  nlohmann::json& waves = plan.at("waves");
  nlohmann::json& groups = plan.at("param_groups");
  const int devices = plan.at("cluster").at("devices").get<int>();
  std::vector<std::pair<size_t, size_t>> slices;   // (wave, slice)
  for (size_t w = 0; w < waves.size(); ++w)
    for (size_t k = 0; k < waves[w].at("slices").size(); ++k) slices.emplace_back(w, k);
  const auto [w, k] = slices.at(draw(slices.size()));
  nlohmann::json& slice = waves[w]["slices"][k];
  nlohmann::json& on = slice["devices"];
  const std::string at = " (wave " + std::to_string(w) + ", slice " + std::to_string(k) + ")";
  const auto other_device = [&] { return static_cast<int>(draw(static_cast<size_t>(devices))); };
  switch (draw(12)) {
    case 0: on[draw(on.size())] = other_device(); return "a slice's device replaced" + at;
    case 1: on.push_back(other_device()); return "a device added to a slice" + at;
    case 2:
      if (on.size() < 2) return "nothing (a one-device slice keeps its device)";
      on.erase(draw(on.size()));
      return "a device dropped from a slice" + at;
    case 3: slice["count"] = slice["count"].get<int>() + (gen() % 2 ? 1 : -1); return "a slice's count moved" + at;
    case 4: slice["first"] = slice["first"].get<int>() + 1; return "a slice's first operator moved" + at;
    case 5:
      if (w + 1 >= waves.size()) return "nothing (the last wave has no next one)";
      std::swap(waves[w]["slices"], waves[w + 1]["slices"]);
      return "waves " + std::to_string(w) + " and " + std::to_string(w + 1) + " swapped";
    case 6: waves[w]["slices"].erase(k); return "a slice dropped" + at;
    case 7: {
      nlohmann::json& g = groups[draw(groups.size())]["devices"];
      const int d = other_device();
      if (std::find(g.begin(), g.end(), d) == g.end()) g.push_back(d);
      std::sort(g.begin(), g.end());
      return "a device added to a parameter group";
    }
    case 8: groups.erase(draw(groups.size())); return "a parameter group dropped";
    case 9: {
      nlohmann::json& m = plan.at("metaops")[draw(plan.at("metaops").size())];
      const char* field = std::array{"batch", "seq", "level", "tensor_parallel"}[draw(4)];
      m[field] = m[field].get<int>() + 1;
      return std::string("a MetaOp's ") + field + " changed";
    }
    case 10: {
      nlohmann::json copy = slice;
      waves[w]["slices"].erase(k);
      waves[draw(waves.size())]["slices"].push_back(copy);
      return "a slice moved to a wave" + at;
    }
    default: waves[w]["slices"].push_back(slice); return "a slice doubled" + at;
  }
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() >= 2 && args[0] == "--rtol") {
    kRtol = std::atof(args[1].c_str());
    args.erase(args.begin(), args.begin() + 2);
    if (!(kRtol > 0)) {
      std::fprintf(stderr, "compare_runs: --rtol must be positive\n");
      return 2;
    }
  }
  try {
    if (args.size() == 3 && args[0] == "--losses") return compare_losses(args[1], args[2]);
    if (args.size() == 3 && args[0] == "--bytes") return compare_bytes(args[1], args[2]);
    if (args.size() == 4 && args[0] == "--grad-norms") return compare_grad_norms(args[1], args[2], args[3]);
    if (args.size() == 4 && args[0] == "--optimizer-state" && (args[1] == "sharded" || args[1] == "replicated")) {
      nlohmann::json plan = read_json(args[2]);
      plan["x-memory"]["optimizer_state"] = args[1];
      if (plan.contains("x-lowering")) {   // sharded: the values gathered after the step
        plan["x-lowering"].erase("param_gather");
        if (plan["x-lowering"].empty()) plan.erase("x-lowering");
      }
      std::ofstream out(args[3]);
      out << plan.dump(1) << "\n";
      return out.good() ? 0 : 2;
    }
    if (args.size() == 3 &&
        (args[0] == "--flip-bucket-starts" || args[0] == "--late-transfers" || args[0] == "--gather-next-step")) {
      nlohmann::json plan = read_json(args[1]);
      nlohmann::json& lowering = plan["x-lowering"];
      if (args[0] == "--late-transfers") lowering["early_transfers"] = false;
      else if (args[0] == "--gather-next-step") lowering["param_gather"] = "next-step";
      else if (lowering.contains("bucket_starts")) lowering.erase("bucket_starts");
      else lowering["bucket_starts"] = "when-ready";
      if (lowering.empty()) plan.erase("x-lowering");
      std::ofstream out(args[2]);
      out << plan.dump(1) << "\n";
      return out.good() ? 0 : 2;
    }
    if (args.size() == 5 && args[0] == "--move-slices") {
      nlohmann::json plan = read_json(args[1]);
      std::vector<int> devices;
      std::stringstream list(args[4]);
      for (std::string id; std::getline(list, id, ',');) devices.push_back(std::stoi(id));
      std::vector<char> moved_metaop;
      for (const nlohmann::json& m : plan.at("metaops")) {
        const std::string first = m.at("operators").at(0).get<std::string>();
        moved_metaop.push_back(first.rfind(args[3], 0) == 0);
      }
      int moved = 0;
      for (nlohmann::json& wave : plan.at("waves"))
        for (nlohmann::json& slice : wave.at("slices"))
          if (moved_metaop.at(slice.at("metaop").get<size_t>())) {
            slice["devices"] = devices;
            ++moved;
          }
      if (moved == 0) {
        std::fprintf(stderr, "compare_runs --move-slices: no MetaOp's operators start with %s\n", args[3].c_str());
        return 1;
      }
      std::ofstream out(args[2]);
      out << plan.dump(1) << "\n";
      return out.good() ? 0 : 2;
    }
    if (args.size() == 4 && args[0] == "--mutate") {
      nlohmann::json plan = read_json(args[2]);
      const std::string what = mutate_plan(plan, static_cast<uint32_t>(std::stoul(args[1])));
      std::printf("%s\n", what.c_str());
      std::ofstream out(args[3]);
      out << plan.dump(1) << "\n";
      return out.good() ? 0 : 2;
    }
    if (args.size() == 3 && args[0] == "--params") {
      const bool ok = compare_params(read_json(args[1]), read_json(args[2]));
      std::printf("%s (tolerance: RMS of the difference <= %g * max(RMS of the reference, %g))\n",
                  ok ? "AGREE" : "DIFFER", kRtol, kFloor);
      return ok ? 0 : 1;
    }
    if (args.size() != 4) {
      std::fprintf(stderr, "usage: compare_runs [--rtol X] REF.metrics REF.params GOT.metrics GOT.params\n"
                           "       compare_runs [--rtol X] --losses REF.metrics GOT.metrics\n"
                           "       compare_runs [--rtol X] --params REF.params GOT.params\n"
                           "       compare_runs --bytes PROGRAM_DIR GOT.metrics\n"
                           "       compare_runs [--rtol X] --grad-norms REF.metrics GOT.metrics GOT.grads\n"
                           "       compare_runs --flip-bucket-starts PLAN OUT\n"
                           "       compare_runs --late-transfers PLAN OUT\n"
                           "       compare_runs --optimizer-state sharded|replicated PLAN OUT\n"
                           "       compare_runs --move-slices PLAN OUT PREFIX DEVICES\n"
                           "       compare_runs --mutate SEED PLAN OUT\n");
      return 2;
    }
    std::vector<nlohmann::json> ref_e, got_e;
    const auto ref_m = read_lines(args[0], &ref_e), got_m = read_lines(args[2], &got_e);
    const auto ref_p = read_json(args[1]), got_p = read_json(args[3]);
    bool ok = true;
    if (ref_m.size() != got_m.size() || ref_m.empty()) {
      std::fprintf(stderr, "steps differ: reference %zu, got %zu\n", ref_m.size(), got_m.size());
      ok = false;
    }
    Worst loss;
    size_t losses = 0;
    for (size_t s = 0; s < std::min(ref_m.size(), got_m.size()); ++s)
      for (const auto& [task, v] : ref_m[s]["loss"].items()) {
        if (!got_m[s]["loss"].contains(task)) {
          std::fprintf(stderr, "step %zu: no loss for task %s\n", s + 1, task.c_str());
          ok = false;
          continue;
        }
        loss.see(got_m[s]["loss"][task].get<double>(), v.get<double>(),
                 "step " + std::to_string(s + 1) + " loss " + task);
        ++losses;
      }
    if (ref_e.size() != got_e.size()) {
      std::fprintf(stderr, "evaluations differ: reference %zu, got %zu\n", ref_e.size(), got_e.size());
      ok = false;
    }
    size_t evals = 0;
    for (size_t e = 0; e < std::min(ref_e.size(), got_e.size()); ++e)
      for (const auto& [task, fields] : ref_e[e]["eval"].items())
        for (const auto& [key, v] : fields.items()) {
          const std::string where = "eval " + std::to_string(e) + " " + task + " " + key;
          if (!got_e[e]["eval"].contains(task) || !got_e[e]["eval"][task].contains(key)) {
            std::fprintf(stderr, "%s: missing\n", where.c_str());
            ok = false;
            continue;
          }
          loss.see(got_e[e]["eval"][task][key].get<double>(), v.get<double>(), where);
          ++evals;
        }
    if (evals > 0) std::printf("compared %zu evaluation figures\n", evals);
    if (!compare_params(ref_p, got_p)) ok = false;
    std::printf("compared %zu losses (worst %.3g of tolerance%s%s)\n", losses, loss.excess,
                loss.what.empty() ? "" : ": ", loss.what.c_str());
    if (losses == 0 || loss.excess > 1) ok = false;
    std::printf("%s (tolerance: losses |got - ref| <= %g * max(|ref|, %g); parameters the same in RMS)\n",
                ok ? "AGREE" : "DIFFER", kRtol, kFloor);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_runs: %s\n", e.what());
    return 2;
  }
}
