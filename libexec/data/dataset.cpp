#include "libexec/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>

#include "libexec/rng.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/ops.h"
#include "libplan/model/yaml_util.h"
#include "libplan/util/files.h"
#include "libplan/util/text.h"

namespace spindle::exec {

using plan::Error;
using plan::Result;
using plan::Status;

namespace {

namespace yamlu = plan::yamlu;

Result<DataSpec> parse_spec_yaml(const yamlu::Reader& r, const YAML::Node& root, const plan::Model& model,
                                 bool eval) {
  if (!root.IsMap()) return r.error("", root, "expected a map with key tasks, found " + yamlu::describe(root));
  yamlu::MapView top;
  SPINDLE_TRY(r.view_map("", root, top));
  SPINDLE_TRY(r.reject_unknown("", top, {"tasks"}, "a data description"));
  const yamlu::Entry* tasks = top.find("tasks");
  if (!tasks) return r.error("tasks", root, "missing key tasks (one entry per task of model " + model.name + ")");
  if (!tasks->value.IsMap())
    return r.error("tasks", tasks->value, "expected a map of task names, found " + yamlu::describe(tasks->value));
  yamlu::MapView by_task;
  SPINDLE_TRY(r.view_map("tasks", tasks->value, by_task));

  const std::filesystem::path base = std::filesystem::path(r.file).parent_path();
  DataSpec spec;
  spec.tasks.resize(model.tasks.size());
  std::vector<bool> seen(model.tasks.size(), false);
  for (const std::string& name : by_task.order) {
    const std::string key = yamlu::child("tasks", name);
    const yamlu::Entry& e = *by_task.find(name);
    size_t t = 0;
    while (t < model.tasks.size() && model.tasks[t].name != name) ++t;
    if (t == model.tasks.size()) {
      std::string list;
      for (const plan::Task& mt : model.tasks) list += (list.empty() ? "" : ", ") + mt.name;
      return r.error(key, e.key, "model " + model.name + " has no task '" + name + "' (its tasks: " + list + ")");
    }
    seen[t] = true;
    if (!e.value.IsMap()) return r.error(key, e.value, "expected a map, found " + yamlu::describe(e.value));
    yamlu::MapView v;
    SPINDLE_TRY(r.view_map(key, e.value, v));
    SPINDLE_TRY(r.reject_unknown(key, v, {"path", "shuffle", "synthetic"}, "a task's data"));
    TaskDataSpec& ts = spec.tasks[t];
    ts.shuffle = !eval;
    if (const yamlu::Entry* s = v.find("synthetic")) SPINDLE_TRY(r.get_bool(yamlu::child(key, "synthetic"), s->value, ts.synthetic));
    const yamlu::Entry* p = v.find("path");
    if (ts.synthetic == (p != nullptr))
      return r.error(key, e.value, ts.synthetic ? "give either path or synthetic: true, not both"
                                                : "expected path: DIR (a dataset directory) or synthetic: true");
    if (p) {
      std::string dir;
      SPINDLE_TRY(r.get_string(yamlu::child(key, "path"), p->value, dir));
      if (dir.empty()) return r.error(yamlu::child(key, "path"), p->value, "expected a directory, found ''");
      ts.dir = std::filesystem::path(dir).is_absolute() ? dir : (base / dir).lexically_normal().string();
      // The folder is recorded in every checkpoint's manifest, whose JSON
      // strings take no control characters: DATA.yaml's own folder may
      // bring one (a tab in a folder name), and the checkpoints written
      // with it would not resume.
      if (const size_t at = plan::control_char_at(ts.dir); at != std::string::npos)
        return r.error(yamlu::child(key, "path"), p->value,
                       "the dataset folder " + ts.dir + " has a control character (byte " +
                           std::to_string(static_cast<unsigned char>(ts.dir[at])) +
                           ") in its path, which checkpoints record and cannot read back: rename the folder");
      // A file named where its folder belongs (path: d/img.npy): said here,
      // at the key, not as "d/img.npy/img.npy: cannot open" later. A path
      // that does not exist is left to the file checks, which name the
      // first file missing. One that cannot be inspected (a loop of
      // symbolic links, a folder without search permission) is said here
      // too, with the reason.
      std::error_code ec;
      const auto kind = std::filesystem::status(ts.dir, ec).type();
      if (kind == std::filesystem::file_type::none)
        return r.error(yamlu::child(key, "path"), p->value, ts.dir + ": cannot be read: " + ec.message());
      if (kind != std::filesystem::file_type::not_found && kind != std::filesystem::file_type::directory)
        return r.error(yamlu::child(key, "path"), p->value,
                       ts.dir + " is not a directory (a dataset directory holds one .npy file per node)");
    }
    if (const yamlu::Entry* s = v.find("shuffle")) SPINDLE_TRY(r.get_bool(yamlu::child(key, "shuffle"), s->value, ts.shuffle));
  }
  for (size_t t = 0; t < model.tasks.size(); ++t)
    if (!seen[t])
      return r.error("tasks", tasks->value, "no entry for task '" + model.tasks[t].name + "' of model " + model.name +
                                                " (give its path, or synthetic: true)");
  return spec;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

bool dtype_allowed(DataKind kind, ElementType t) {
  switch (kind) {
    case DataKind::features: return t == ElementType::f32 || t == ElementType::f16 || t == ElementType::u8;
    case DataKind::tokens:
      return t == ElementType::i32 || t == ElementType::i64 || t == ElementType::u16 || t == ElementType::u8;
    case DataKind::targets:
    case DataKind::labels: return t == ElementType::i32 || t == ElementType::i64;
  }
  return false;
}

const char* allowed_text(DataKind kind) {
  switch (kind) {
    case DataKind::features: return "float32, float16 or uint8";
    case DataKind::tokens: return "int32, int64, uint16 or uint8";
    case DataKind::targets:
    case DataKind::labels: return "int32 or int64";
  }
  return "";
}

// The file stem a read names (the file: sample_file_path).
std::string stem_of(const DataRead& r) {
  switch (r.kind) {
    case DataKind::features:
    case DataKind::tokens: return r.node;
    case DataKind::targets: return r.node + ".targets";
    case DataKind::labels: return "labels";
  }
  return "";
}

std::string what_of(const DataRead& r) {
  switch (r.kind) {
    case DataKind::features:
      return "patch_embed node " + r.node + " (seq " + std::to_string(r.seq) + ", in_dim " + std::to_string(r.width) + ")";
    case DataKind::tokens: return "token_embed node " + r.node + " (seq " + std::to_string(r.seq) + ")";
    case DataKind::targets: return "lm_loss node " + r.node + " (seq " + std::to_string(r.seq) + ")";
    case DataKind::labels: return "labels";
  }
  return "";
}

// The expected shape with the file's own S first.
std::vector<int64_t> expected_shape(const DataRead& r, int64_t samples) {
  switch (r.kind) {
    case DataKind::features: return {samples, r.seq, r.width};
    case DataKind::tokens:
    case DataKind::targets: return {samples, r.seq};
    case DataKind::labels: return {samples};
  }
  return {};
}

// "(S, 17, 48)": the expected shape, any S.
std::string expected_text(const DataRead& r) {
  const std::vector<int64_t> s = expected_shape(r, 0);
  std::string out = "(S";
  for (size_t i = 1; i < s.size(); ++i) out += ", " + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// The high 64 bits of the 128-bit product a * b.
uint64_t mul_high(uint64_t a, uint64_t b) {
  const uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32, b_lo = b & 0xffffffffu, b_hi = b >> 32;
  const uint64_t p0 = a_lo * b_lo, p1 = a_lo * b_hi, p2 = a_hi * b_lo, p3 = a_hi * b_hi;
  const uint64_t mid = (p0 >> 32) + (p1 & 0xffffffffu) + (p2 & 0xffffffffu);
  return p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
}

}  // namespace

Result<DataSpec> parse_data_spec(const std::string& text, const std::string& path, const plan::Model& model,
                                 bool eval) {
  return yamlu::parse_yaml_document<DataSpec>(
      text, path, "data description",
      [&](const yamlu::Reader& r, const YAML::Node& root) { return parse_spec_yaml(r, root, model, eval); });
}

Result<DataSpec> load_data_spec(const std::string& path, const plan::Model& model, bool eval) {
  SPINDLE_ASSIGN(text, plan::read_file(path));
  return parse_data_spec(text, path, model, eval);
}

std::vector<int64_t> epoch_order(uint64_t seed, const std::string& task, int64_t epoch, int64_t samples) {
  std::vector<int64_t> p(static_cast<size_t>(samples));
  std::iota(p.begin(), p.end(), int64_t{0});
  const uint64_t key =
      splitmix64(seed ^ splitmix64(hash_name("data/shuffle/" + task) ^ splitmix64(static_cast<uint64_t>(epoch))));
  for (int64_t i = samples - 1; i >= 1; --i) {
    const uint64_t u = splitmix64(key + static_cast<uint64_t>(i));
    const auto j = static_cast<int64_t>(mul_high(u, static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

BatchPosition batch_position(int64_t batch, int64_t per_epoch) {
  return {batch / per_epoch, batch % per_epoch};
}

std::vector<std::string> FileSource::paths() const {
  std::vector<std::string> out;
  for (const auto& [_, file] : files_) out.push_back(file->path());
  return out;
}

Result<std::unique_ptr<FileSource>> FileSource::open(const DataSpec& spec, const plan::Model& model, uint64_t seed,
                                                   uint64_t synthetic_stream) {
  std::unique_ptr<FileSource> src(new FileSource(seed, synthetic_stream));
  src->model_ = &model;
  src->tasks_.resize(model.tasks.size());
  // What every task reads (one entry per node and kind), from the operator graph.
  std::vector<std::vector<DataRead>> reads(model.tasks.size());
  const plan::OpGraph graph = plan::expand(model);
  for (const plan::Operator& op : graph.ops) {
    DataRead r;
    if ((op.block == 0 && op.rep == 0) || plan::find_op(op.workload.op)->reads_targets)
      if (op_data_read(model, op, &r)) reads[static_cast<size_t>(op.task)].push_back(std::move(r));
  }
  for (size_t t = 0; t < model.tasks.size(); ++t) {
    const TaskDataSpec& ts = spec.tasks.at(t);
    TaskFiles& tf = src->tasks_[t];
    tf.synthetic = ts.synthetic;
    tf.dir = ts.dir;
    tf.shuffle = ts.shuffle;
    tf.batch = model.tasks[t].batch;
    if (ts.synthetic) continue;
    // labels.npy is optional: absent, no labels; there but not to be
    // inspected (a loop of symbolic links), an error naming it.
    std::error_code ec;
    const std::string labels_path = sample_file_path(ts.dir, "labels");
    const auto labels_kind = std::filesystem::status(labels_path, ec).type();
    if (labels_kind == std::filesystem::file_type::none)
      return Error{labels_path + ": cannot be read: " + ec.message()};
    if (labels_kind != std::filesystem::file_type::not_found) {
      DataRead lr;
      lr.task = static_cast<int>(t);
      lr.kind = DataKind::labels;
      reads[t].push_back(lr);
      tf.has_labels = true;
    }
    std::string first_path;  // the file that set S
    for (const DataRead& r : reads[t]) {
      const std::string stem = stem_of(r);
      SPINDLE_ASSIGN(file, open_sample_file(ts.dir, stem));
      const std::string& path = file->path();
      if (!dtype_allowed(r.kind, file->dtype()))
        return Error{path + ": dtype " + element_type_name(file->dtype()) + " is not allowed for " + what_of(r) +
                     " of task " + model.tasks[t].name + " (expected " + allowed_text(r.kind) + ")"};
      const int64_t samples = file->samples();
      if (file->shape().empty() || file->shape() != expected_shape(r, samples))
        return Error{path + ": shape " + shape_text(file->shape()) + " does not match " + what_of(r) + " of task " +
                     model.tasks[t].name + " in model " + model.name + ": expected " +
                     expected_text(r)};
      if (first_path.empty()) {
        tf.samples = samples;
        first_path = path;
      } else if (samples != tf.samples) {
        return Error{path + ": " + std::to_string(samples) + " samples, but " + first_path + " has " +
                     std::to_string(tf.samples) + " (every file of task " + model.tasks[t].name +
                     " needs the same first dimension)"};
      }
      if (r.kind == DataKind::targets) tf.has_targets = true;
      src->files_[{static_cast<int>(t), stem}] = std::move(file);
    }
    if (first_path.empty())
      return Error{ts.dir + ": task " + model.tasks[t].name + " reads no data (no patch_embed, token_embed or lm_loss node)"};
    if (tf.samples < tf.batch)
      return Error{first_path + ": " + std::to_string(tf.samples) + " samples, fewer than task " +
                   model.tasks[t].name + "'s batch " + std::to_string(tf.batch) + " (drop last would read nothing)"};
    tf.per_epoch = tf.samples / tf.batch;
  }
  return src;
}

bool FileSource::may_ignore_targets(int task) const {
  const TaskFiles& tf = tasks_.at(static_cast<size_t>(task));
  return !tf.synthetic && tf.has_targets;
}

const SampleFile& FileSource::file(int task, const std::string& stem) const {
  const auto it = files_.find({task, stem});
  if (it == files_.end())
    throw DataError(sample_file_path(tasks_.at(static_cast<size_t>(task)).dir, stem) +
                    ": not opened (no such node in the model)");
  return *it->second;
}

int64_t FileSource::sample_of(int t, int64_t batch, int64_t row) {
  const TaskFiles& tf = tasks_.at(static_cast<size_t>(t));
  const BatchPosition pos = batch_position(batch, tf.per_epoch);
  const int64_t at = pos.index * tf.batch + row;
  if (!tf.shuffle) return at;
  auto& [epoch, order] = order_cache_[t];
  if (order.empty() || epoch != pos.epoch) {
    order = epoch_order(seed_, model_->tasks[static_cast<size_t>(t)].name, pos.epoch, tf.samples);
    epoch = pos.epoch;
  }
  return order[static_cast<size_t>(at)];
}

Tensor FileSource::load(const DataRead& r, int64_t batch) {
  const TaskFiles& tf = tasks_.at(static_cast<size_t>(r.task));
  if (tf.synthetic) return synthetic_.read(r, batch);
  if (r.kind == DataKind::labels && !tf.has_labels) return Tensor();
  const SampleFile& arr = file(r.task, stem_of(r));
  const int64_t per_row = arr.row_elems();
  Tensor out = Tensor::zeros(expected_shape(r, r.rows()));
  std::vector<double> row;
  row.reserve(static_cast<size_t>(per_row));
  const bool u8 = arr.dtype() == ElementType::u8;
  for (int64_t i = 0; i < r.rows(); ++i) {
    const int64_t sample = sample_of(r.task, batch, r.row_begin + i);
    row.clear();
    arr.read_row(sample, row);
    float* dst = out.data() + i * per_row;
    for (int64_t e = 0; e < per_row; ++e) {
      const double v = row[static_cast<size_t>(e)];
      auto fail = [&](const std::string& why) {
        throw DataError(arr.path() + ": sample " + std::to_string(sample) + ", element " + std::to_string(e) +
                        ": " + why);
      };
      switch (r.kind) {
        case DataKind::features:
          if (!std::isfinite(v)) fail("value " + std::string(std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") +
                                      " (features must be finite)");
          dst[e] = u8 ? static_cast<float>(v / 255.0) : static_cast<float>(v);
          break;
        case DataKind::tokens:
          if (v < 0 || v >= static_cast<double>(r.width))
            fail("token id " + std::to_string(static_cast<int64_t>(v)) + " outside [0, " + std::to_string(r.width) + ")");
          dst[e] = static_cast<float>(v);
          break;
        case DataKind::targets:
          if (v != -1 && (v < 0 || v >= static_cast<double>(r.width)))
            fail("target " + std::to_string(static_cast<int64_t>(v)) + " outside [0, " + std::to_string(r.width) +
                 ") (or -1: ignored)");
          dst[e] = static_cast<float>(v);
          break;
        case DataKind::labels: dst[e] = static_cast<float>(v); break;
      }
    }
  }
  return out;
}

std::vector<int> tasks_evaluated_on_training_data(const FileSource& train, const FileSource& eval) {
  std::vector<int> out;
  for (int t = 0; t < std::min(train.tasks(), eval.tasks()); ++t) {
    const TaskFiles& a = train.task(t);
    const TaskFiles& b = eval.task(t);
    if (a.synthetic || b.synthetic) continue;
    std::error_code ec;
    if (std::filesystem::equivalent(a.dir, b.dir, ec) && !ec) out.push_back(t);
  }
  return out;
}

std::vector<int> tasks_evaluated_past_one_pass(const FileSource& eval, int64_t batches) {
  std::vector<int> out;
  for (int t = 0; t < eval.tasks(); ++t)
    if (!eval.task(t).synthetic && batches > eval.task(t).per_epoch) out.push_back(t);
  return out;
}

}  // namespace spindle::exec
