// Weights out (libexec/exec/export.h, spindle-export): the safetensors file
// read back here by hand (header length, JSON header, dtype, shapes,
// contiguous offsets, the raw values) against the checkpoint it came from;
// bad checkpoints refused naming the file, nothing written. The names of a
// trained tiny-clip are the documented ones (docs/spec/ops.md). The
// command line and an independent NumPy reader: test/exec/mpi/run_checks.sh
// export.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/exec/checkpoint.h"
#include "libexec/exec/executor.h"
#include "libexec/exec/export.h"
#include "libplan/model/model.h"
#include "libplan/util/files.h"
#include "fixtures.h"

using namespace spindle::exec;
namespace sp = spindle::plan;
namespace fs = std::filesystem;
using spindle::exec::test::TempDir;

namespace {


// A safetensors file parsed by hand (the format, not export.cpp's code).
struct Read {
  nlohmann::json header;
  std::map<std::string, Tensor> tensors;
};

Read read_safetensors(const std::string& path) {
  const auto bytes = sp::read_file(path);
  REQUIRE(bytes.ok());
  const std::string& b = *bytes;
  REQUIRE(b.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  REQUIRE(n % 8 == 0);
  REQUIRE(8 + n <= b.size());
  Read r;
  r.header = nlohmann::json::parse(b.substr(8, n));
  const size_t data = 8 + n;
  uint64_t expect_begin = 0;
  std::map<uint64_t, std::string> by_offset;
  for (const auto& [name, t] : r.header.items()) {
    if (name == "__metadata__") continue;
    INFO(name);
    REQUIRE(t.at("dtype") == "F32");
    const Shape shape = t.at("shape").get<Shape>();
    const uint64_t begin = t.at("data_offsets")[0], end = t.at("data_offsets")[1];
    REQUIRE(end - begin == static_cast<uint64_t>(shape_numel(shape)) * 4);
    REQUIRE(data + end <= b.size());
    Tensor v = Tensor::zeros(shape);
    std::memcpy(v.data(), b.data() + data + begin, end - begin);  // little-endian host
    r.tensors.emplace(name, v);
    by_offset[begin] = name;
  }
  // Contiguous, in ascending name order, and nothing after the last tensor.
  std::string previous;
  for (const auto& [begin, name] : by_offset) {
    CHECK(begin == expect_begin);
    CHECK(name > previous);
    previous = name;
    expect_begin = r.header.at(name).at("data_offsets")[1];
  }
  CHECK(data + expect_begin == b.size());
  return r;
}

TrainingState export_state() {
  TrainingState s;
  s.step = 3;
  for (const auto& [name, shape] : std::map<std::string, Shape>{{"x/0.0/w", {2, 3}}, {"x/0.0/bias", {3}},
                                                                 {"a/1.2/table", {4, 1, 2}}}) {
    TensorState t;
    t.value = test::random_tensor(shape, std::hash<std::string>{}(name));
    t.m = Tensor::zeros(shape);
    t.v = Tensor::zeros(shape);
    t.adam_steps = 3;
    s.tensors[name] = t;
  }
  return s;
}

CheckpointMeta export_meta() {
  CheckpointMeta m;
  m.step = 3;
  m.model_name = "x";
  m.model_sha256 = "abc";
  m.plan_sha256 = "def";
  m.plan_strategy = "spindle";
  m.plan_devices = 2;
  m.seed = 5;
  m.task_batch = {{"t", 8}};
  return m;
}

}  // namespace

TEST_CASE("export: safetensors read back by hand equals the checkpoint, bit for bit", "[export]") {
  TempDir dir("export-roundtrip");
  const TrainingState state = export_state();
  REQUIRE(save_checkpoint((dir.path / "ck").string(), export_meta(), state, 3).ok());
  const std::string out = (dir.path / "model.safetensors").string();
  bool write_failed = true;
  // The checkpoint directory (newest step) and the step directory give the same file.
  const auto s = export_checkpoint((dir.path / "ck").string(), out, &write_failed);
  REQUIRE(s.ok());
  CHECK_FALSE(write_failed);
  CHECK(s->step == 3);
  CHECK(s->tensors == 3);
  CHECK(s->elements == 6 + 3 + 8);
  CHECK(s->step_dir == (dir.path / "ck" / "step-000003").string());
  const Read r = read_safetensors(out);
  CHECK(static_cast<int64_t>(fs::file_size(out)) == s->bytes);
  REQUIRE(r.tensors.size() == state.tensors.size());
  for (const auto& [name, ts] : state.tensors) {
    INFO(name);
    REQUIRE(r.tensors.count(name) == 1);
    const Tensor& got = r.tensors.at(name);
    CHECK(got.shape() == ts.value.shape());
    CHECK(std::memcmp(got.data(), ts.value.data(), static_cast<size_t>(ts.value.numel()) * 4) == 0);
  }
  const auto& meta = r.header.at("__metadata__");
  CHECK(meta.at("format") == "spindle-export");
  CHECK(meta.at("model") == "x");
  CHECK(meta.at("step") == "3");
  CHECK(meta.at("seed") == "5");
  for (const auto& [k, v] : meta.items()) CHECK(v.is_string());  // safetensors: string to string

  const std::string again = (dir.path / "again.safetensors").string();
  REQUIRE(export_checkpoint((dir.path / "ck" / "step-000003").string(), again, &write_failed).ok());
  CHECK(*sp::read_file(again) == *sp::read_file(out));
}

TEST_CASE("export: the safetensors header by hand", "[export]") {
  // {"a":{...},"b":{...}} for a [2] and a [1, 3]: offsets 0-8 and 8-20.
  const std::string h = safetensors_header({{"a", {2}}, {"b", {1, 3}}}, {});
  const std::string json =
      R"({"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},"b":{"data_offsets":[8,20],"dtype":"F32","shape":[1,3]}})";
  const size_t padded = (json.size() + 7) / 8 * 8;
  REQUIRE(h.size() == 8 + padded);
  uint64_t n = 0;
  std::memcpy(&n, h.data(), 8);
  CHECK(n == padded);
  CHECK(h.substr(8, json.size()) == json);
  CHECK(h.substr(8 + json.size()) == std::string(padded - json.size(), ' '));
  // A scalar (shape []) holds one value.
  const std::string scalar = safetensors_header({{"s", {}}}, {{"k", "v"}});
  CHECK(scalar.find(R"("s":{"data_offsets":[0,4],"dtype":"F32","shape":[]})") != std::string::npos);
  CHECK(scalar.find(R"("__metadata__":{"k":"v"})") != std::string::npos);
}

TEST_CASE("export: a missing, empty or corrupt checkpoint is refused naming the file, nothing written",
          "[export]") {
  TempDir dir("export-bad");
  const std::string out = (dir.path / "out.safetensors").string();
  bool write_failed = true;
  auto r = export_checkpoint((dir.path / "nowhere").string(), out, &write_failed);
  REQUIRE_FALSE(r.ok());
  CHECK_FALSE(write_failed);
  CHECK(r.error().message.find("nowhere") != std::string::npos);

  fs::create_directories(dir.path / "empty");
  r = export_checkpoint((dir.path / "empty").string(), out, &write_failed);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("empty") != std::string::npos);

  REQUIRE(save_checkpoint((dir.path / "ck").string(), export_meta(), export_state(), 3).ok());
  const std::string params = (dir.path / "ck" / "step-000003" / "params.bin").string();
  std::string bytes = *sp::read_file(params);
  bytes[bytes.size() - 1] ^= 0x01;
  std::ofstream(params, std::ios::binary | std::ios::trunc) << bytes;
  r = export_checkpoint((dir.path / "ck").string(), out, &write_failed);
  REQUIRE_FALSE(r.ok());
  CHECK_FALSE(write_failed);
  CHECK(r.error().message.find("params.bin") != std::string::npos);
  CHECK_FALSE(fs::exists(out));

  // AdamW's moments are verified too (as --resume verifies them), though
  // not exported.
  bytes[bytes.size() - 1] ^= 0x01;
  std::ofstream(params, std::ios::binary | std::ios::trunc) << bytes;
  const std::string v = (dir.path / "ck" / "step-000003" / "adam_v.bin").string();
  std::string v_bytes = *sp::read_file(v);
  v_bytes[v_bytes.size() - 1] ^= 0x01;
  std::ofstream(v, std::ios::binary | std::ios::trunc) << v_bytes;
  r = export_checkpoint((dir.path / "ck").string(), out, &write_failed);
  REQUIRE_FALSE(r.ok());
  CHECK_FALSE(write_failed);
  CHECK_THAT(r.error().message, Catch::Contains("adam_v.bin: corrupt checkpoint file: SHA-256 differs"));
  CHECK_FALSE(fs::exists(out));
  v_bytes[v_bytes.size() - 1] ^= 0x01;
  std::ofstream(v, std::ios::binary | std::ios::trunc) << v_bytes;

  // An output folder that does not exist: a write failure, nothing left behind.
  r = export_checkpoint((dir.path / "ck").string(), (dir.path / "no-dir" / "m.safetensors").string(),
                        &write_failed);
  REQUIRE_FALSE(r.ok());
  CHECK(write_failed);
  CHECK_FALSE(fs::exists(dir.path / "no-dir"));
}

TEST_CASE("export: an output inside a checkpoint's step folder is refused, the checkpoint unchanged", "[export]") {
  TempDir dir("export-inside");
  REQUIRE(save_checkpoint((dir.path / "ck").string(), export_meta(), export_state(), 2).ok());
  REQUIRE(save_checkpoint((dir.path / "ck").string(), export_meta(), export_state(), 3).ok());
  const fs::path step = dir.path / "ck" / "step-000003";
  const std::string manifest = *sp::read_file((step / "manifest.json").string());
  bool write_failed = true;
  // Its own manifest (the bug: the export replaced it), a new file in the
  // step read, and a file in an older step folder of the checkpoint folder.
  for (const auto& [checkpoint, out] : std::vector<std::pair<fs::path, fs::path>>{
           {dir.path / "ck", step / "manifest.json"},
           {step, step / "manifest.json"},
           {step, step / "w.safetensors"},
           {dir.path / "ck", dir.path / "ck" / "step-000002" / "w.safetensors"},
           // From the step, into an older step beside it, which --keep
           // deletes later; or over the run's lock (a resume truncates it).
           {step, dir.path / "ck" / "step-000002" / "w.safetensors"},
           {step, dir.path / "ck" / ".spindle-run.lock"},
           {dir.path / "ck", dir.path / "ck" / ".spindle-run.lock"}}) {
    INFO(checkpoint.string() << " -> " << out.string());
    auto r = export_checkpoint(checkpoint.string(), out.string(), &write_failed);
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(write_failed);
    CHECK_THAT(r.error().message, Catch::Contains("is in the folder of checkpoint"));
  }
  CHECK(*sp::read_file((step / "manifest.json").string()) == manifest);
  CHECK_FALSE(fs::exists(step / "w.safetensors"));
  CHECK_FALSE(fs::exists(dir.path / "ck" / "step-000002" / "w.safetensors"));
  // Beside the steps, in the checkpoint folder itself: allowed, and a
  // later export still finds the newest step.
  REQUIRE(export_checkpoint((dir.path / "ck").string(), (dir.path / "ck" / "model.safetensors").string(),
                            &write_failed).ok());
  auto again = export_checkpoint((dir.path / "ck").string(), (dir.path / "m2.safetensors").string(), &write_failed);
  REQUIRE(again.ok());
  CHECK(again->step == 3);
  // A step folder copied out under another name is the user's own: its
  // neighbours are not checkpoints, so writing beside it is fine.
  fs::create_directories(dir.path / "kept");
  fs::copy(step, dir.path / "kept" / "best", fs::copy_options::recursive);
  fs::create_directories(dir.path / "kept" / "step-000002");
  REQUIRE(export_checkpoint((dir.path / "kept" / "best").string(),
                            (dir.path / "kept" / "step-000002" / "w.safetensors").string(), &write_failed)
              .ok());
}

TEST_CASE("export: a trained tiny-clip exports every parameter under its documented name", "[export]") {
  const auto model = sp::load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/tiny-clip.yaml");
  REQUIRE(model.ok());
  const sp::Plan plan = test::one_device_plan(*model);
  SelfComm world;
  std::unique_ptr<Backend> backend = make_backend("cpu");
  GroupComms groups;
  groups[{0}] = std::make_unique<SelfComm>();
  Executor ex(*model, plan, world, std::move(groups), *backend, ExecOptions{});
  ex.step();
  TempDir dir("export-tiny");
  CheckpointMeta meta = export_meta();
  meta.step = 1;
  REQUIRE(save_checkpoint((dir.path / "ck").string(), meta, ex.gather_state(), 3).ok());
  const std::string out = (dir.path / "tiny.safetensors").string();
  bool write_failed = false;
  REQUIRE(export_checkpoint((dir.path / "ck").string(), out, &write_failed).ok());
  const Read r = read_safetensors(out);
  const auto params = ex.gather_params();
  const auto shapes = ex.param_shapes();
  REQUIRE(r.tensors.size() == shapes.size());
  const std::string doc = *sp::read_file(std::string(SPINDLE_SOURCE_DIR) + "/docs/spec/ops.md");
  std::set<std::string> suffixes;
  for (const auto& [name, shape] : shapes) {
    INFO(name);
    REQUIRE(r.tensors.count(name) == 1);
    CHECK(r.tensors.at(name).shape() == shape);
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * 4;
    CHECK(std::memcmp(r.tensors.at(name).data(), params.at(name).data(), bytes) == 0);
    suffixes.insert(name.substr(name.rfind('/') + 1));
  }
  // Every tensor name of the model is in the spec's table of tensors.
  for (const std::string& s : suffixes) {
    INFO("tensor name " << s << " in docs/spec/ops.md");
    CHECK(doc.find("| `" + s + "` |") != std::string::npos);
  }
  CHECK(suffixes.size() >= 10);
}
