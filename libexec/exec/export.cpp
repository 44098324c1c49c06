#include "libexec/exec/export.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "libexec/exec/checkpoint.h"
#include "libplan/util/files.h"

namespace spindle::exec {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

std::string safetensors_header(const std::map<std::string, Shape>& shapes,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, shape] : shapes) {  // ascending name order, contiguous
    uint64_t bytes = sizeof(float);
    for (const int64_t d : shape) bytes *= static_cast<uint64_t>(d);
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

namespace {

// An error when `out_path` lies inside a checkpoint step folder of
// `checkpoint`: the step read, or any step folder of the checkpoint
// folder (the one given, or the one holding the step given), which a later
// --resume, --keep or --overwrite reads or deletes. Writing there could
// replace the manifest or a shard of the checkpoint being exported, or be
// deleted with an older step. A file directly in the checkpoint folder is
// fine unless named as its entries are (is_checkpoint_entry).
plan::Status check_outside_checkpoint(const std::string& checkpoint, bool is_step, const std::string& out_path) {
  const std::vector<plan::OutputPath> outputs{{"-o", out_path}};
  if (!is_step)
    return plan::check_apart_from_dir(
        {"checkpoint", checkpoint, is_checkpoint_entry, "a name checkpoints take (step-*, .spindle-run.lock)"}, outputs,
        {});
  SPINDLE_TRY(plan::check_apart_from_dir(
      {"checkpoint", checkpoint, [](const std::string&) { return true; }, "part of the checkpoint read"}, outputs, {}));
  const std::filesystem::path step = lexical_folder(checkpoint);
  if (checkpoint_step_of(step.filename().string()) < 0) return {};   // a step kept elsewhere: its folder is the user's
  const std::string folder = step.parent_path().empty() ? std::string(".") : step.parent_path().string();
  return plan::check_apart_from_dir({"checkpoint", folder, is_checkpoint_entry,
                                     "a name the checkpoints beside the step read take (step-*, .spindle-run.lock)"},
                                    outputs, {});
}

}  // namespace

plan::Result<ExportSummary> export_checkpoint(const std::string& checkpoint, const std::string& out_path,
                                              bool* write_failed) {
  *write_failed = false;
  std::string step_dir = checkpoint;
  std::error_code ec;
  const bool is_step = std::filesystem::exists(std::filesystem::path(checkpoint) / "manifest.json", ec);
  if (plan::Status st = check_outside_checkpoint(checkpoint, is_step, out_path); !st.ok()) return st.error();
  if (!is_step) {
    if (!std::filesystem::is_directory(checkpoint, ec))
      return plan::Error{checkpoint + ": not a checkpoint directory (missing or not a directory)"};
    const std::vector<int64_t> steps = list_checkpoints(checkpoint);
    if (steps.empty())
      return plan::Error{checkpoint + ": no manifest.json and no complete checkpoint (step-N) inside"};
    step_dir = (std::filesystem::path(checkpoint) / checkpoint_name(steps.back())).string();
  }
  // AdamW's m and v verified (as --resume verifies them), the records
  // indexed from their heads, then params.bin read once as it is written,
  // its hash checked on the way: the values written are the bytes checked.
  if (plan::Status st = verify_checkpoint_files(step_dir, {false, true, true}); !st.ok()) return st.error();
  const std::set<std::string> none;
  plan::Result<Checkpoint> ck = load_checkpoint(step_dir, &none, false);
  if (!ck.ok()) return ck.error();
  const CheckpointMeta& meta = ck.value().meta;
  std::map<std::string, Shape> shapes;
  ExportSummary summary;
  summary.step_dir = step_dir;
  summary.step = meta.step;
  for (const auto& [name, entry] : ck->index) {
    shapes.emplace(name, entry.shape);
    ++summary.tensors;
    summary.elements += shape_numel(entry.shape);
  }
  const std::map<std::string, std::string> metadata{
      {"format", "spindle-export"},
      {"version", "1"},
      {"model", meta.model_name},
      {"model_sha256", meta.model_sha256},
      {"step", std::to_string(meta.step)},
      {"seed", std::to_string(meta.seed)},
      {"plan_strategy", meta.plan_strategy},
      {"plan_devices", std::to_string(meta.plan_devices)},
      {"layout", "row-major; weights [in, out] (y = x W); names M/k.r/tensor (docs/spec/ops.md)"},
  };
  const std::string header = safetensors_header(shapes, metadata);
  summary.bytes = static_cast<int64_t>(header.size()) + summary.elements * static_cast<int64_t>(sizeof(float));
  // The values a tensor at a time, in the header's order (the file's).
  bool checkpoint_failed = false;   // else a failure is the output's (exit 1)
  const plan::Status written = plan::write_file_atomic(out_path, [&](const plan::AppendBytes& append) -> plan::Status {
    SPINDLE_TRY(append(header.data(), header.size()));
    bool append_failed = false;
    plan::Status st = stream_checkpoint_values(*ck, [&](const std::string&, const Tensor& values) -> plan::Status {
      plan::Status appended = append(values.data(), static_cast<size_t>(values.numel()) * sizeof(float));
      append_failed = !appended.ok();
      return appended;
    });
    checkpoint_failed = !st.ok() && !append_failed;
    return st;
  });
  if (!written.ok()) {
    *write_failed = !checkpoint_failed;
    return written.error();
  }
  return summary;
}

}  // namespace spindle::exec
