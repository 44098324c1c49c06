// Checkpoints (libexec/exec/checkpoint.h): the tensor file format by hand,
// truncation and corruption refused with the file named, the directory
// protocol (tmp + rename, keep N, leftovers ignored), and resume on one
// device equal to training straight. Resume on other device counts and
// re-planning run under mpirun (test/exec/mpi/run_checks.sh ckpt-*).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/exec/checkpoint.h"
#include "helpers.h"
#include "libexec/exec/executor.h"
#include "fixtures.h"
#include "libplan/graph/op_graph.h"
#include "libplan/util/files.h"

using namespace spindle::exec;
using spindle::exec::test::one_device_plan;
using spindle::exec::test::OneDevice;
using spindle::exec::test::TempDir;
namespace sp = spindle::plan;
namespace fs = std::filesystem;

namespace {

TrainingState small_state() {
  TrainingState s;
  s.step = 4;
  TensorState a;
  a.value = Tensor::from({2, 3}, {1, 2, 3, 4, 5, 6});
  a.m = Tensor::from({2, 3}, {0.5f, 0, 0, 0, 0, -0.5f});
  a.v = Tensor::from({2, 3}, {1e-3f, 0, 0, 0, 0, 2e-3f});
  a.adam_steps = 4;
  TensorState b;
  b.value = Tensor::from({1}, {-7});
  b.m = Tensor::from({1}, {0.25f});
  b.v = Tensor::from({1}, {0.125f});
  b.adam_steps = 2;
  s.tensors["x/0.0/w"] = a;
  s.tensors["x/0.0/b"] = b;
  return s;
}

CheckpointMeta small_meta(int64_t step) {
  CheckpointMeta m;
  m.step = step;
  m.model_name = "x";
  m.model_sha256 = "abc";
  m.plan_sha256 = "def";
  m.plan_strategy = "spindle";
  m.plan_devices = 2;
  m.seed = 5;
  m.task_batch = {{"t", 8}};
  m.lr = 3e-3f;
  return m;
}

struct stat stat_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST_CASE("checkpoint: tensor file layout by hand, decode inverts encode") {
  std::map<std::string, Tensor> t;
  t["a"] = Tensor::from({2}, {1.5f, -2});
  t["bc"] = Tensor::from({1, 1}, {3});
  const std::string bytes = encode_tensors(t);
  // header 24; "a": 4 + 1 + 4 + 8 + 2*4 = 25; "bc": 4 + 2 + 4 + 16 + 4 = 30.
  REQUIRE(bytes.size() == 24 + 25 + 30);
  CHECK(std::memcmp(bytes.data(), "SPNDLTF\0", 8) == 0);
  CHECK(bytes[8] == 1);    // version 1, little-endian
  CHECK(bytes[16] == 2);   // two records
  CHECK(bytes[24] == 1);   // name length of "a"
  CHECK(bytes[28] == 'a');
  CHECK(bytes[29] == 1);   // rank 1
  CHECK(bytes[33] == 2);   // dim 0 = 2
  float first = 0;
  std::memcpy(&first, bytes.data() + 41, 4);
  CHECK(first == 1.5f);
  const auto back = decode_tensors(bytes, "f.bin");
  REQUIRE(back.ok());
  CHECK(encode_tensors(*back) == bytes);
  CHECK(back->at("bc").shape() == Shape{1, 1});
}

TEST_CASE("checkpoint: every truncation and trailing bytes are refused, naming the file") {
  std::map<std::string, Tensor> t;
  t["w"] = Tensor::from({2, 2}, {1, 2, 3, 4});
  const std::string bytes = encode_tensors(t);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const auto r = decode_tensors(bytes.substr(0, n), "cut.bin");
    REQUIRE_FALSE(r.ok());
    REQUIRE(r.error().message.rfind("cut.bin: ", 0) == 0);
  }
  const auto extra = decode_tensors(bytes + "x", "extra.bin");
  REQUIRE_FALSE(extra.ok());
  CHECK(extra.error().message.find("after the last record") != std::string::npos);
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  CHECK_FALSE(decode_tensors(bad_magic, "m.bin").ok());
}

// A record header by hand: name "a", the given dims, no values.
std::string record_header(const std::vector<int64_t>& dims) {
  std::string out;
  const auto put = [&](const auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint32_t{1});
  out += "a";
  put(static_cast<uint32_t>(dims.size()));
  for (int64_t d : dims) put(d);
  return out;
}

TEST_CASE("checkpoint: dimensions whose product passes 2^40 and a reserved field other than 0 are refused") {
  const std::string empty = encode_tensors({});   // the header, count 0
  std::string one = empty;
  one[16] = 1;   // count 1 (u64 at byte 16)
  // Each dimension within 2^40, their product 2^80: refused before it is
  // multiplied (found by fuzz_tensors: a signed overflow, undefined).
  const auto big = decode_tensors(one + record_header({int64_t{1} << 40, int64_t{1} << 40}), "big.bin");
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().message.find("big.bin: record 'a': too many elements") == 0);
  // 2^20 x 2^20 = 2^40 elements is within the bound: refused as truncated.
  const auto at_bound = decode_tensors(one + record_header({int64_t{1} << 20, int64_t{1} << 20}), "edge.bin");
  REQUIRE_FALSE(at_bound.ok());
  CHECK(at_bound.error().message.find("truncated values") != std::string::npos);
  // A zero dimension first: no elements, whatever follows.
  const auto zero = decode_tensors(one + record_header({0, int64_t{1} << 40, int64_t{1} << 40}), "zero.bin");
  REQUIRE(zero.ok());
  CHECK(zero->at("a").numel() == 0);
  std::string reserved = empty;
  reserved[12] = 7;   // the u32 after the version
  const auto r = decode_tensors(reserved, "reserved.bin");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("reserved.bin: header: the reserved field is 7, not 0") == 0);
}

TEST_CASE("checkpoint: save and load round trip, keep N, leftovers ignored and cleaned") {
  TempDir dir("ckpt-roundtrip");
  const TrainingState state = small_state();
  // A crashed write of step 3 and of a later step 9.
  fs::create_directories(dir.path / "step-000003.tmp.4242.0");
  fs::create_directories(dir.path / "step-000009.tmp.4242.1");
  for (int64_t step : {2, 4, 6}) {
    const auto path = save_checkpoint(dir.str(), small_meta(step), state, 2);
    REQUIRE(path.ok());
    CHECK(*path == (dir.path / checkpoint_name(step)).string());
  }
  CHECK(list_checkpoints(dir.str()) == std::vector<int64_t>{4, 6});
  CHECK_FALSE(fs::exists(dir.path / "step-000003.tmp.4242.0"));  // step <= 6: cleaned
  CHECK(fs::exists(dir.path / "step-000009.tmp.4242.1"));           // not ours to judge
  const auto ck = load_checkpoint((dir.path / "step-000006").string());
  REQUIRE(ck.ok());
  CHECK(ck->meta.step == 6);
  CHECK(ck->meta.seed == 5);
  CHECK(ck->meta.plan_devices == 2);
  CHECK(ck->meta.task_samples == std::map<std::string, int64_t>{{"t", 6 * 8}});
  CHECK(ck->meta.samples_step == 6);
  REQUIRE(ck->state.tensors.size() == 2);
  const TensorState& a = ck->state.tensors.at("x/0.0/w");
  CHECK(a.adam_steps == 4);
  CHECK(ck->state.tensors.at("x/0.0/b").adam_steps == 2);
  for (int64_t i = 0; i < 6; ++i) {
    CHECK(a.value[i] == state.tensors.at("x/0.0/w").value[i]);
    CHECK(a.m[i] == state.tensors.at("x/0.0/w").m[i]);
    CHECK(a.v[i] == state.tensors.at("x/0.0/w").v[i]);
  }
  // Saving the same step again replaces it.
  REQUIRE(save_checkpoint(dir.str(), small_meta(6), state, 2).ok());
  CHECK(list_checkpoints(dir.str()) == std::vector<int64_t>{4, 6});
  CHECK(list_checkpoints((dir.path / "missing").string()).empty());
}

// --overwrite and --keep remove checkpoints, and nothing of the user's
// that only looks like one: a file "step-1" and a folder "step-2020" (not
// checkpoint_name of any step) were deleted by --overwrite, exit 0.
TEST_CASE("checkpoint: removal and pruning take only checkpoints and their leftovers, not look-alikes") {
  TempDir dir("ckpt-lookalikes");
  const TrainingState state = small_state();
  REQUIRE(save_checkpoint(dir.str(), small_meta(1), state, 5).ok());
  const std::vector<fs::path> users{dir.path / "step-1", dir.path / "step-2020" / "photo.jpg",
                                    dir.path / "step-000002.txt", dir.path / "step-000001.tmp.notes",
                                    dir.path / "step-000001.tmp.my-backup" / "notes.txt"};
  fs::create_directories(dir.path / "step-2020");
  fs::create_directories(dir.path / "step-000001.tmp.my-backup");
  for (const fs::path& p : users) REQUIRE(sp::write_file_atomic(p.string(), "the user's").ok());
  fs::create_directories(dir.path / "step-000000.tmp.123.0");   // a crashed save: a folder
  CHECK(checkpoint_step_of("step-000001") == 1);
  CHECK(checkpoint_step_of("step-1234567") == 1234567);
  bool leftover = false;
  CHECK(checkpoint_step_of("step-000003.tmp.9.0", &leftover) == 3);
  CHECK(leftover);
  CHECK(checkpoint_step_of("step-000003.tmp.old1234", &leftover) == 3);
  for (const std::string name : {"step-1", "step-2020", "step-000002.txt", "step-", "step-0000001", "xstep-000001",
                                 "step-1.tmp.2", "step-999999999999999999999", "step-000002.tmp.my-backup",
                                 "step-000002.tmp.12", "step-000002.tmp.12.", "step-000002.tmp.old",
                                 "step-000002.tmp.1.2.3"}) {
    CAPTURE(name);
    CHECK(checkpoint_step_of(name) == -1);
  }
  // Pruning at step 2 removes the leftover folder, not the look-alike file.
  REQUIRE(save_checkpoint(dir.str(), small_meta(2), state, 1).ok());
  CHECK(list_checkpoints(dir.str()) == std::vector<int64_t>{2});
  CHECK_FALSE(fs::exists(dir.path / "step-000000.tmp.123.0"));
  for (const fs::path& p : users) CHECK(*sp::read_file(p.string()) == "the user's");
  // A checkpoint renamed for another step is refused, naming both; under a
  // name that is no checkpoint's it is the user's copy, and loads.
  fs::rename(dir.path / "step-000002", dir.path / "step-000009");
  auto renamed = load_checkpoint((dir.path / "step-000009").string());
  REQUIRE_FALSE(renamed.ok());
  CHECK_THAT(renamed.error().message, Catch::Contains("manifest.json: step 2, but its folder is named step-000009"));
  fs::rename(dir.path / "step-000009", dir.path / "best");
  REQUIRE(load_checkpoint((dir.path / "best").string()).ok());
  fs::rename(dir.path / "best", dir.path / "step-000002");
  REQUIRE(remove_checkpoints(dir.str()).ok());
  CHECK(list_checkpoints(dir.str()).empty());
  for (const fs::path& p : users) CHECK(*sp::read_file(p.string()) == "the user's");
  // The lock file and every step-* name stay reserved for outputs.
  CHECK(is_checkpoint_entry(".spindle-run.lock"));
  CHECK(is_checkpoint_entry("step-1"));
  CHECK_FALSE(is_checkpoint_entry("model.safetensors"));
}

// The checkpoint's folder and files get what the umask gives, as every
// other output: with mkdtemp the folder was 0700 whatever the umask.
TEST_CASE("checkpoint: folder and files get the permissions the umask gives") {
  TempDir dir("ckpt-umask");
  const TrainingState state = small_state();
  struct Case {
    mode_t umask, dir_mode, file_mode;
  };
  for (const Case c : {Case{022, 0755, 0644}, Case{077, 0700, 0600}, Case{002, 0775, 0664}}) {
    const mode_t before = ::umask(c.umask);
    const auto path = save_checkpoint(dir.str(), small_meta(2), state, 1);
    ::umask(before);
    REQUIRE(path.ok());
    INFO("umask " << std::oct << c.umask);
    const struct stat folder = stat_of(*path);
    CHECK((folder.st_mode & 07777) == c.dir_mode);
    for (const auto& entry : fs::directory_iterator(*path)) {
      INFO(entry.path().filename().string());
      CHECK((stat_of(entry.path().string()).st_mode & 07777) == c.file_mode);
    }
    // The lock file too (it was 0644 whatever the umask: a group sharing
    // the folder under umask 002 could not lock it in turn).
    const fs::path lock_dir = dir.path / ("locked-" + std::to_string(c.umask));
    ::umask(c.umask);
    {
      auto lock = lock_checkpoint_dir(lock_dir.string());
      ::umask(before);
      REQUIRE(lock.ok());
      CHECK((stat_of((lock_dir / ".spindle-run.lock").string()).st_mode & 07777) == c.file_mode);
    }
  }
  // No temporary folder left beside it.
  for (const auto& entry : fs::directory_iterator(dir.path))
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("checkpoint: one run locks its folder, a second is refused naming the first, released on destruction") {
  TempDir dir("ckpt-lock");
  const std::string folder = (dir.path / "ck").string();
  {
    auto first = lock_checkpoint_dir(folder);   // makes the folder
    REQUIRE(first.ok());
    CHECK(first->unlocked_reason().empty());
    CHECK(fs::is_directory(folder));
    // flock belongs to the open file: a second open conflicts, in one process as in two.
    auto second = lock_checkpoint_dir(folder);
    REQUIRE_FALSE(second.ok());
    CHECK_THAT(second.error().message,
               Catch::StartsWith("--checkpoint " + folder + ": in use by another spindle-run (pid " +
                                 std::to_string(::getpid()) + " on host "));
    CHECK_THAT(second.error().message, Catch::Contains("two runs must not write one folder"));
    CHECK(fs::exists(fs::path(folder) / ".spindle-run.lock"));   // the refused one leaves the holder's file
    // Moved, it is still held.
    CheckpointLock moved = std::move(*first);
    CHECK_FALSE(lock_checkpoint_dir(folder).ok());
  }
  // Released, and the folder it made, left empty, removed again.
  CHECK_FALSE(fs::exists(folder));
  {
    auto lock = lock_checkpoint_dir(folder);
    REQUIRE(lock.ok());
    fs::create_directories(fs::path(folder) / "step-000001");   // as a checkpoint would be
  }
  CHECK(fs::is_directory(fs::path(folder) / "step-000001"));     // kept: not empty
  auto again = lock_checkpoint_dir(folder);                       // an existing folder: free again
  REQUIRE(again.ok());
  // A folder that was there, empty: left as it was found, without the lock file.
  const fs::path empty = dir.path / "empty";
  fs::create_directories(empty);
  { REQUIRE(lock_checkpoint_dir(empty.string()).ok()); }
  CHECK(fs::is_directory(empty));
  CHECK(fs::is_empty(empty));
  // The parents it made for a new folder go too (they were left behind by
  // a run that failed before its first checkpoint); those that were there
  // stay, and so does a parent that is no longer empty.
  fs::create_directories(dir.path / "was");
  { REQUIRE(lock_checkpoint_dir((dir.path / "was" / "new" / "sub" / "ck").string()).ok()); }
  CHECK(fs::is_directory(dir.path / "was"));
  CHECK(fs::is_empty(dir.path / "was"));
  {
    auto held = lock_checkpoint_dir((dir.path / "was" / "new" / "ck" / "").string());
    REQUIRE(held.ok());
    REQUIRE(sp::write_file_atomic((dir.path / "was" / "new" / "notes").string(), "mine").ok());
  }
  CHECK_FALSE(fs::exists(dir.path / "was" / "new" / "ck"));
  CHECK(fs::exists(dir.path / "was" / "new" / "notes"));
}

TEST_CASE("checkpoint: a state that is not finite is refused, named, and nothing is written") {
  TempDir dir("ckpt-finite");
  REQUIRE(check_state_finite(small_state()).ok());
  REQUIRE(save_checkpoint(dir.str(), small_meta(1), small_state(), 3).ok());
  struct Case {
    const char* tensor;
    int part;   // 0 value, 1 m, 2 v
    int64_t element;
    float x;
    const char* expected;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (const Case& c : {Case{"x/0.0/w", 0, 4, std::nanf(""), "x/0.0/w, value, element 4 is nan"},
                        Case{"x/0.0/b", 1, 0, -inf, "x/0.0/b, AdamW m, element 0 is -inf"},
                        Case{"x/0.0/w", 2, 5, inf, "x/0.0/w, AdamW v, element 5 is inf"}}) {
    CAPTURE(c.expected);
    TrainingState state = small_state();
    TensorState& ts = state.tensors.at(c.tensor);
    (c.part == 0 ? ts.value : c.part == 1 ? ts.m : ts.v).data()[c.element] = c.x;
    const sp::Status st = check_state_finite(state);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().message == std::string("the training state after step 4 is not finite: ") + c.expected +
                                    " (training diverged; no checkpoint of this step is saved)");
    const auto saved = save_checkpoint(dir.str(), small_meta(2), state, 3);
    REQUIRE_FALSE(saved.ok());
    CHECK(saved.error().message == st.error().message);
    // Nothing of step 2, not even a leftover; step 1 as it was.
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
    CHECK(names == std::vector<std::string>{"step-000001"});
    CHECK(load_checkpoint((dir.path / "step-000001").string()).ok());
  }
}

TEST_CASE("checkpoint: a checkpoint --keep cannot prune is said, and none is left half removed") {
  TempDir dir("ckpt-prune");
  REQUIRE(save_checkpoint(dir.str(), small_meta(2), small_state(), 1).ok());
  // Pruning renames step-000002 aside to a leftover's name first; a folder
  // already there under that name (not empty) makes the rename fail, as a
  // read-only folder makes it for a user who is not root.
  const fs::path aside = dir.path / ("step-000002.tmp.old" + std::to_string(::getpid()));
  fs::create_directories(aside / "x");
  std::string warning;
  const auto saved = save_checkpoint(dir.str(), small_meta(4), small_state(), 1, &warning);
  REQUIRE(saved.ok());
  CHECK_THAT(warning, Catch::StartsWith("--keep 1: cannot remove the older checkpoint " +
                                        (dir.path / "step-000002").string() + ": ") &&
                          Catch::EndsWith("the folder keeps more checkpoints than --keep asks"));
  CHECK(list_checkpoints(dir.str()) == std::vector<int64_t>{2, 4});
  REQUIRE(load_checkpoint((dir.path / "step-000002").string()).ok());   // whole, not half removed
  // Pruned when it can be: no warning, the older one gone.
  fs::remove_all(aside);
  warning.clear();
  REQUIRE(save_checkpoint(dir.str(), small_meta(6), small_state(), 1, &warning).ok());
  CHECK(warning.empty());
  CHECK(list_checkpoints(dir.str()) == std::vector<int64_t>{6});
}

TEST_CASE("checkpoint: the samples read count on from the resumed checkpoint's, with this run's batches") {
  TempDir dir("ckpt-samples");
  // Steps 1..6 with batch 8 (48 samples); resumed with batch 3, and task u
  // new to the model, task gone no longer in it.
  auto first = load_checkpoint(*save_checkpoint(dir.str(), small_meta(6), small_state(), 2));
  REQUIRE(first.ok());
  CheckpointMeta meta = small_meta(9);
  meta.task_batch = {{"t", 3}, {"u", 5}};
  meta.task_samples = first->meta.task_samples;
  meta.task_samples["gone"] = 7;
  meta.samples_step = first->meta.samples_step;
  const std::map<std::string, int64_t> at9{{"gone", 7}, {"t", 48 + 3 * 3}, {"u", 5 * 3}};
  CHECK(samples_read(meta, 9) == at9);
  CHECK(samples_read(meta, 6) == std::map<std::string, int64_t>{{"gone", 7}, {"t", 48}, {"u", 0}});
  auto back = load_checkpoint(*save_checkpoint(dir.str(), meta, small_state(), 2));
  REQUIRE(back.ok());
  CHECK(back->meta.task_samples == at9);
  CHECK(back->meta.samples_step == 9);
  CHECK(samples_read(back->meta, 9) == at9);   // no batches known: as read
}

TEST_CASE("checkpoint: the learning-rate schedule round-trips, is constant when absent, a bad one refused") {
  TempDir dir("ckpt-lr");
  CheckpointMeta meta = small_meta(1);
  meta.lr_schedule = {3e-3, 2.5e-4, 7, 90, LrDecay::cosine};
  REQUIRE(save_checkpoint(dir.str(), meta, small_state(), 3).ok());
  const std::string step = (dir.path / "step-000001").string();
  auto back = load_checkpoint(step);
  REQUIRE(back.ok());
  const LrSchedule& ls = back->meta.lr_schedule;
  CHECK(ls.decay == LrDecay::cosine);
  CHECK(ls.warmup_steps == 7);
  CHECK(ls.decay_steps == 90);
  CHECK(ls.min_lr == 2.5e-4);
  CHECK(ls.max_lr == static_cast<double>(meta.lr));   // the peak is "lr"
  CHECK(same_lr_schedule(ls, meta.lr_schedule));
  // As an older build wrote it: no lr_schedule, read as constant at "lr".
  const auto text = sp::read_file(step + "/manifest.json");
  REQUIRE(text.ok());
  auto manifest = nlohmann::json::parse(*text);
  REQUIRE(manifest["optimizer"].contains("lr_schedule"));
  manifest["optimizer"].erase("lr_schedule");
  write_bytes(step + "/manifest.json", manifest.dump(1));
  back = load_checkpoint(step);
  REQUIRE(back.ok());
  CHECK(same_lr_schedule(back->meta.lr_schedule, LrSchedule{meta.lr, 0, 0, 0, LrDecay::constant}));
  // A decay no build writes.
  manifest["optimizer"]["lr_schedule"] = {{"decay", "exponential"}, {"warmup_steps", 0}, {"decay_steps", 5},
                                          {"min_lr", 0}};
  write_bytes(step + "/manifest.json", manifest.dump(1));
  back = load_checkpoint(step);
  REQUIRE_FALSE(back.ok());
  CHECK(back.error().message ==
        step + "/manifest.json: optimizer.lr_schedule.decay: expected constant, linear or cosine");
}

TEST_CASE("checkpoint: the gradient clip round-trips, is 0 when absent, a bad one refused") {
  TempDir dir("ckpt-clip");
  CheckpointMeta meta = small_meta(1);
  meta.clip_grad = 0.75;
  REQUIRE(save_checkpoint(dir.str(), meta, small_state(), 3).ok());
  const std::string step = (dir.path / "step-000001").string();
  auto back = load_checkpoint(step);
  REQUIRE(back.ok());
  CHECK(back->meta.clip_grad == 0.75);
  const auto text = sp::read_file(step + "/manifest.json");
  REQUIRE(text.ok());
  auto manifest = nlohmann::json::parse(*text);
  CHECK(manifest["optimizer"]["clip_grad"] == 0.75);
  manifest["optimizer"].erase("clip_grad");   // as an older build wrote it
  write_bytes(step + "/manifest.json", manifest.dump(1));
  back = load_checkpoint(step);
  REQUIRE(back.ok());
  CHECK(back->meta.clip_grad == 0);
  // Weight decay on 1-D tensors: recorded, true when absent.
  CHECK(back->meta.decay_1d);
  manifest["optimizer"]["weight_decay_1d"] = false;
  write_bytes(step + "/manifest.json", manifest.dump(1));
  back = load_checkpoint(step);
  REQUIRE(back.ok());
  CHECK_FALSE(back->meta.decay_1d);
  manifest["optimizer"].erase("weight_decay_1d");
  for (const nlohmann::json& bad : {nlohmann::json(-1.0), nlohmann::json("1")}) {
    manifest["optimizer"]["clip_grad"] = bad;
    write_bytes(step + "/manifest.json", manifest.dump(1));
    back = load_checkpoint(step);
    REQUIRE_FALSE(back.ok());
    CHECK_THAT(back.error().message, Catch::Contains("manifest.json") &&
                                         (Catch::Contains("optimizer.clip_grad") || Catch::Contains("not a valid")));
  }
}

TEST_CASE("checkpoint: manifest values of the wrong type or range are refused, naming the key") {
  TempDir dir("ckpt-manifest");
  REQUIRE(save_checkpoint(dir.str(), small_meta(1), small_state(), 3).ok());
  const std::string step = (dir.path / "step-000001").string();
  const auto text = sp::read_file(step + "/manifest.json");
  REQUIRE(text.ok());
  const nlohmann::json good = nlohmann::json::parse(*text);
  // Each edit, and the message that must follow the manifest's path. Before
  // 2026-12-06 the first and the fourth converted 1e300 to int64_t and
  // uint64_t (undefined behaviour) and the rest read as valid. The last
  // three then failed in spindle-run's resume with --data: two threw a JSON
  // type error (exit 1 through MPI_Abort, the manifest not named), the
  // third converted 1e300 unchecked.
  using J = nlohmann::json;
  // A tensor's name in a JSON pointer ("/" inside it escaped as "~1").
  std::string tensor = good["optimizer"]["steps"].begin().key();
  for (size_t at = tensor.find('/'); at != std::string::npos; at = tensor.find('/', at + 2)) tensor.replace(at, 1, "~1");
  const std::vector<std::tuple<J::json_pointer, J, std::string>> edits = {
      {J::json_pointer("/step"), J(1e300), "step: expected an integer, found 1e+300"},
      {J::json_pointer("/step"), J(0), "step: expected an integer from 1 to 9223372036854775807, found 0"},
      {J::json_pointer("/optimizer/lr"), J(1e300), "optimizer.lr: expected a number a float holds"},
      {J::json_pointer("/files/adam_m.bin/bytes"), J(1e300), "files.adam_m.bin.bytes: expected an integer >= 0, found 1e+300"},
      {J::json_pointer("/optimizer/steps/" + tensor), J(2.5),
       "optimizer.steps." + good["optimizer"]["steps"].begin().key() + ": expected an integer, found 2.5"},
      {J::json_pointer("/data/samples"), J::array(), "data.samples: expected an object, found array"},
      {J::json_pointer("/seed"), J(-3), "seed: expected an integer >= 0, found -3"},
      {J::json_pointer("/plan/devices"), J(4294967298.0), "plan.devices: expected an integer, found 4294967298.0"},
      {J::json_pointer("/optimizer/weight_decay_1d"), J("no"), "optimizer.weight_decay_1d: expected true or false"},
      // What a resume with --data reads of the data position (spindle-run
      // threw a JSON type error there on these: the job aborted).
      {J::json_pointer("/data/tasks"), J({{"pairs", 5}}), "data.tasks.pairs: expected an object, found number"},
      {J::json_pointer("/data/tasks"), J({{"pairs", {{"source", 1}}}}), "data.tasks.pairs.source: expected a string"},
      {J::json_pointer("/data/tasks"), J({{"pairs", {{"source", "npy"}, {"samples", 1e300}}}}),
       "data.tasks.pairs.samples: expected an integer, found 1e+300"},
      // Before 2026-12-07 read as valid: a count of 2^63 - 1 then
      // overflowed when the resumed run counted on (undefined behaviour),
      // counts past 2^62 together likewise; a plan of 0 devices; another
      // optimizer's name over AdamW's state.
      {J::json_pointer("/data/samples/t"), J(INT64_MAX),
       "data.samples.t: expected an integer from 0 to 4611686018427387904, found 9223372036854775807"},
      {J::json_pointer("/data/samples"), J({{"t", int64_t{1} << 62}, {"u", 1}}),
       "data.samples: the counts sum to more than 4611686018427387904 (2^62)"},
      {J::json_pointer("/plan/devices"), J(0), "plan.devices: expected an integer from 1 to 1000000, found 0"},
      {J::json_pointer("/optimizer/name"), J("sgd"), "optimizer.name: \"sgd\": expected \"adamw\""},
  };
  for (const auto& [where, value, message] : edits) {
    nlohmann::json edited = good;
    edited[where] = value;
    write_bytes(step + "/manifest.json", edited.dump(1));
    const auto back = load_checkpoint(step);
    REQUIRE_FALSE(back.ok());
    CHECK_THAT(back.error().message, Catch::StartsWith(step + "/manifest.json: " + message));
  }
  write_bytes(step + "/manifest.json", good.dump(1));
  CHECK(load_checkpoint(step).ok());
}

TEST_CASE("checkpoint: the sample counts stay within 2^62 and never overflow") {
  CheckpointMeta meta;
  meta.task_batch = {{"t", 1000000000}, {"u", 1000000000}};
  meta.task_samples = {{"t", kMaxCheckpointSamples}};
  meta.samples_step = 5;
  // Within the bounds, exact: 2^62 + 10^9 (2^31) fits.
  CHECK(samples_read(meta, 5 + (int64_t{1} << 31)).at("t") == kMaxCheckpointSamples + 1000000000 * (int64_t{1} << 31));
  CHECK(samples_read(meta, 5 + (int64_t{1} << 31)).at("u") == 1000000000 * (int64_t{1} << 31));
  // Past INT64_MAX a count stays there (signed overflow before 2026-12-07).
  CheckpointMeta near = meta;
  near.task_samples = {{"t", INT64_MAX - 1}};
  CHECK(samples_read(near, 6).at("t") == INT64_MAX);
  // The run's last step is checked against the bound before step 1.
  CHECK(check_samples_fit(meta, 5, "ck/step-000005/manifest.json").empty());
  CHECK_THAT(check_samples_fit(meta, 6, "ck/step-000005/manifest.json"),
             Catch::StartsWith("ck/step-000005/manifest.json: data.samples: 4611686018427387904 samples read by step "
                               "5, and with this run's batches to step 6 4611686020427387904 samples, past the "
                               "4611686018427387904 (2^62)"));
  CHECK_THAT(check_samples_fit(meta, INT64_MAX, "m.json"), Catch::Contains("more than 2^63"));
  CheckpointMeta fresh;
  fresh.task_batch = meta.task_batch;
  CHECK(check_samples_fit(fresh, INT32_MAX, "").empty());   // 2 tasks of 10^9 for 2^31 - 1 steps: 4.3e18
  fresh.task_batch["v"] = 1000000000;
  CHECK_THAT(check_samples_fit(fresh, INT32_MAX, ""), Catch::StartsWith("--steps 2147483647: the model's tasks "
                                                                         "would read 6442450941000000000 samples"));
}

TEST_CASE("checkpoint: a flipped byte or a truncated file is refused, naming the file") {
  TempDir dir("ckpt-corrupt");
  REQUIRE(save_checkpoint(dir.str(), small_meta(1), small_state(), 3).ok());
  const std::string step = (dir.path / "step-000001").string();
  REQUIRE(load_checkpoint(step).ok());

  const auto params = sp::read_file(step + "/params.bin");
  REQUIRE(params.ok());
  std::string flipped = *params;
  flipped[flipped.size() - 2] ^= 0x10;
  write_bytes(step + "/params.bin", flipped);
  auto r = load_checkpoint(step);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("params.bin") != std::string::npos);
  CHECK(r.error().message.find("SHA-256") != std::string::npos);
  write_bytes(step + "/params.bin", *params);
  REQUIRE(load_checkpoint(step).ok());

  const auto v = sp::read_file(step + "/adam_v.bin");
  REQUIRE(v.ok());
  write_bytes(step + "/adam_v.bin", v->substr(0, v->size() / 2));
  r = load_checkpoint(step);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("adam_v.bin") != std::string::npos);
  CHECK(r.error().message.find("truncated") != std::string::npos);

  write_bytes(step + "/manifest.json", "{\"format\": \"spindle-checkpoint\"");
  r = load_checkpoint(step);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("manifest.json") != std::string::npos);
}

TEST_CASE("checkpoint: a reader keeps the values it asks for and indexes every tensor with its offsets") {
  TempDir dir("ckpt-wanted");
  const TrainingState saved = small_state();
  REQUIRE(save_checkpoint(dir.str(), small_meta(4), saved, 3).ok());
  const std::string step = (dir.path / "step-000004").string();
  const auto whole = load_checkpoint(step);
  REQUIRE(whole.ok());
  REQUIRE(whole->state.tensors.size() == 2);

  auto same = [](const TensorState& a, const TensorState& b) {
    for (const auto& [x, y] : {std::pair{&a.value, &b.value}, {&a.m, &b.m}, {&a.v, &b.v}}) {
      if (x->shape() != y->shape()) return false;
      if (std::memcmp(x->data(), y->data(), static_cast<size_t>(x->numel()) * sizeof(float)) != 0) return false;
    }
    return a.adam_steps == b.adam_steps;
  };
  // Records in name order: x/0.0/b, then x/0.0/w. The header is 24 bytes;
  // b's head 4 + 7 + 4 + 1 x 8 = 23, so its values start at 47; its one
  // value ends at 51; w's head 4 + 7 + 4 + 2 x 8 = 31, values at 82. The
  // three files have the same layout.
  REQUIRE(whole->index.size() == 2);
  const CheckpointTensor& b = whole->index.at("x/0.0/b");
  const CheckpointTensor& w = whole->index.at("x/0.0/w");
  CHECK(b.shape == Shape{1});
  CHECK(w.shape == Shape{2, 3});
  CHECK(b.adam_steps == 2);
  CHECK(w.adam_steps == 4);
  for (int f = 0; f < 3; ++f) {
    CHECK(b.offset[f] == 47);
    CHECK(w.offset[f] == 82);
    CHECK(whole->file_bytes[f] == 82 + 6 * 4);
  }
  const std::set<std::string> only_b{"x/0.0/b"};
  auto part = load_checkpoint(step, &only_b);
  REQUIRE(part.ok());
  CHECK(part->index.size() == 2);
  REQUIRE(part->state.tensors.size() == 1);
  CHECK(same(part->state.tensors.at("x/0.0/b"), whole->state.tensors.at("x/0.0/b")));

  // Nothing read at first, then what is asked for at the index's offsets;
  // a name the checkpoint lacks (a re-planned model's new tensor) is left out.
  const std::set<std::string> none;
  auto later = load_checkpoint(step, &none);
  REQUIRE(later.ok());
  CHECK(later->state.tensors.empty());
  CHECK(later->index.size() == 2);
  REQUIRE(read_checkpoint_tensors(*later, {"x/0.0/w", "x/9.0/new"}).ok());
  REQUIRE(later->state.tensors.size() == 1);
  CHECK(same(later->state.tensors.at("x/0.0/w"), saved.tensors.at("x/0.0/w")));
  REQUIRE(read_checkpoint_tensors(*later, {"x/0.0/b", "x/0.0/w"}).ok());
  REQUIRE(later->state.tensors.size() == 2);
  CHECK(same(later->state.tensors.at("x/0.0/b"), saved.tensors.at("x/0.0/b")));
  // The values alone (spindle-export's read): m and v left empty.
  auto values = load_checkpoint(step, &none);
  REQUIRE(values.ok());
  REQUIRE(read_checkpoint_tensors(*values, {"x/0.0/w"}, true).ok());
  const TensorState& w_value = values->state.tensors.at("x/0.0/w");
  REQUIRE(w_value.value.shape() == Shape{2, 3});
  CHECK(std::memcmp(w_value.value.data(), saved.tensors.at("x/0.0/w").value.data(), 6 * sizeof(float)) == 0);
  CHECK(w_value.m.numel() == 0);
  CHECK(w_value.v.numel() == 0);

  // A file that changed size since it was verified is refused, named.
  auto again = load_checkpoint(step, &none);
  REQUIRE(again.ok());
  const auto m = sp::read_file(step + "/adam_m.bin");
  REQUIRE(m.ok());
  write_bytes(step + "/adam_m.bin", m->substr(0, m->size() - 4));
  const sp::Status st = read_checkpoint_tensors(*again, {"x/0.0/w"});
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.error().message, Catch::Contains("adam_m.bin: truncated or corrupt checkpoint file: 102 bytes, "
                                                 "the manifest says 106"));
}

TEST_CASE("checkpoint: a resume's hashing is split over the ranks, each file by one, spread out") {
  // f * ranks / 3, worked by hand.
  const std::vector<std::pair<int, std::vector<int>>> expected{
      {1, {0, 0, 0}}, {2, {0, 0, 1}}, {3, {0, 1, 2}}, {4, {0, 1, 2}}, {8, {0, 2, 5}}, {64, {0, 21, 42}}};
  for (const auto& [ranks, verifiers] : expected) {
    INFO(ranks << " ranks");
    for (int f = 0; f < kCheckpointFiles; ++f) CHECK(checkpoint_file_rank(f, ranks) == verifiers[f]);
  }
  // Every file by a rank of the run, and by distinct ranks once there are three.
  for (int ranks = 1; ranks <= 1000; ++ranks) {
    std::set<int> seen;
    for (int f = 0; f < kCheckpointFiles; ++f) {
      const int r = checkpoint_file_rank(f, ranks);
      REQUIRE(r >= 0);
      REQUIRE(r < ranks);
      seen.insert(r);
    }
    REQUIRE(static_cast<int>(seen.size()) == std::min(ranks, kCheckpointFiles));
  }
  CHECK(std::string(checkpoint_file(0)) == "params.bin");
  CHECK(std::string(checkpoint_file(2)) == "adam_v.bin");
}

TEST_CASE("checkpoint: verifying chosen files finds a flipped byte only in those, naming the file") {
  TempDir dir("ckpt-verify");
  REQUIRE(save_checkpoint(dir.str(), small_meta(1), small_state(), 3).ok());
  const std::string step = (dir.path / "step-000001").string();
  const std::array<bool, kCheckpointFiles> all{true, true, true}, v_only{false, false, true},
      not_v{true, true, false};
  REQUIRE(verify_checkpoint_files(step, all).ok());
  const auto v = sp::read_file(step + "/adam_v.bin");
  REQUIRE(v.ok());
  std::string flipped = *v;
  flipped[flipped.size() - 1] ^= 0x01;   // the last value's low byte
  write_bytes(step + "/adam_v.bin", flipped);
  const sp::Status st = verify_checkpoint_files(step, v_only);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.error().message, Catch::Contains("adam_v.bin: corrupt checkpoint file: SHA-256 differs"));
  CHECK(verify_checkpoint_files(step, not_v).ok());
  // Another size is found by any rank (checked before anything is read).
  write_bytes(step + "/adam_v.bin", v->substr(0, 30));
  const sp::Status cut = verify_checkpoint_files(step, not_v);
  CHECK(cut.ok());
  const auto indexed = load_checkpoint(step, nullptr, false);
  REQUIRE_FALSE(indexed.ok());
  CHECK_THAT(indexed.error().message, Catch::Contains("adam_v.bin: truncated or corrupt checkpoint file: 30 bytes"));
  // The manifest is checked as load_checkpoint checks it.
  write_bytes(step + "/manifest.json", "[]");
  const sp::Status bad = verify_checkpoint_files(step, {false, false, false});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message, Catch::Contains("manifest.json"));
}

TEST_CASE("checkpoint: indexing without the hash reads the records' heads alone and finds what hashing finds") {
  // A tensor of 2^20 values (4 MiB in each file) beside small_state's.
  TrainingState big = small_state();
  TensorState t;
  t.value = Tensor::zeros({1024, 1024});
  for (int64_t i = 0; i < t.value.numel(); ++i) t.value.data()[i] = static_cast<float>(i % 97) * 0.5f;
  t.m = t.value.clone();
  t.v = t.value.clone();
  t.adam_steps = 3;
  big.tensors["x/0.1/big"] = t;
  TempDir dir("ckpt-heads");
  REQUIRE(save_checkpoint(dir.str(), small_meta(2), big, 3).ok());
  const std::string step = (dir.path / "step-000002").string();
  // Bytes this process has read (read, pread), from /proc/self/io.
  auto rchar = [] {
    std::ifstream io("/proc/self/io");
    std::string key;
    int64_t value = -1;
    while (io >> key >> value)
      if (key == "rchar:") return value;
    return int64_t{-1};
  };
  const std::set<std::string> none;
  const int64_t before = rchar();
  REQUIRE(before >= 0);
  const auto heads = load_checkpoint(step, &none, false);
  const int64_t read = rchar() - before;
  REQUIRE(heads.ok());
  // Three files of 12 MiB in all: a window of 64 KiB at each head, and the manifest.
  CHECK(read < 3 * (64 << 10) * 3 + (64 << 10));
  const auto hashed = load_checkpoint(step, &none);
  REQUIRE(hashed.ok());
  CHECK(rchar() - before - read >= 3 * 4 * (1 << 20));
  REQUIRE(heads->index.size() == 3);
  for (const auto& [name, entry] : hashed->index) {
    INFO(name);
    const CheckpointTensor& other = heads->index.at(name);
    CHECK(other.shape == entry.shape);
    CHECK(other.adam_steps == entry.adam_steps);
    for (int f = 0; f < kCheckpointFiles; ++f) CHECK(other.offset[f] == entry.offset[f]);
  }
  for (int f = 0; f < kCheckpointFiles; ++f) CHECK(heads->file_bytes[f] == hashed->file_bytes[f]);
  // The values wanted are read, bit for bit: the large one past the window.
  const std::set<std::string> wanted{"x/0.0/w", "x/0.1/big"};
  const auto some = load_checkpoint(step, &wanted, false);
  REQUIRE(some.ok());
  REQUIRE(some->state.tensors.size() == 2);
  for (const std::string& name : wanted) {
    const TensorState& a = some->state.tensors.at(name);
    const TensorState& b = big.tensors.at(name);
    CHECK(std::memcmp(a.value.data(), b.value.data(), static_cast<size_t>(b.value.numel()) * 4) == 0);
    CHECK(std::memcmp(a.v.data(), b.v.data(), static_cast<size_t>(b.v.numel()) * 4) == 0);
  }
  // A broken head is found without the hash, as a bad record of the file.
  const auto m = sp::read_file(step + "/adam_m.bin");
  REQUIRE(m.ok());
  std::string flipped = *m;
  flipped[24 + 3] ^= 0x40;   // the first record's name length
  write_bytes(step + "/adam_m.bin", flipped);
  const auto broken = load_checkpoint(step, &none, false);
  REQUIRE_FALSE(broken.ok());
  CHECK_THAT(broken.error().message, Catch::Contains("adam_m.bin: record 0: bad or truncated name"));
}

TEST_CASE("checkpoint: streaming params.bin gives each value in order and checks the hash as it reads") {
  TempDir dir("ckpt-stream");
  const TrainingState state = small_state();
  REQUIRE(save_checkpoint(dir.str(), small_meta(4), state, 3).ok());
  const std::string step = (dir.path / "step-000004").string();
  const std::set<std::string> none;
  const auto ck = load_checkpoint(step, &none, false);
  REQUIRE(ck.ok());
  std::vector<std::string> order;
  auto collect = [&](const std::string& name, const Tensor& values) -> sp::Status {
    order.push_back(name);
    const Tensor& saved = state.tensors.at(name).value;
    REQUIRE(values.shape() == saved.shape());
    CHECK(std::memcmp(values.data(), saved.data(), static_cast<size_t>(saved.numel()) * 4) == 0);
    return sp::Status::Ok();
  };
  REQUIRE(stream_checkpoint_values(*ck, collect).ok());
  CHECK(order == std::vector<std::string>{"x/0.0/b", "x/0.0/w"});   // ascending, the file's order
  // An index that is not the file's (it was indexed from another file, or
  // before a repair): refused after the values, as a bad hash is.
  Checkpoint other = *ck;
  other.index.at("x/0.0/w").shape = {3, 2};
  const sp::Status moved = stream_checkpoint_values(other, [](const std::string&, const Tensor&) {
    return sp::Status::Ok();
  });
  REQUIRE_FALSE(moved.ok());
  CHECK_THAT(moved.error().message, Catch::Contains("params.bin: its records differ from those indexed before"));
  // The sink's error ends the read, as it is.
  order.clear();
  const sp::Status stopped = stream_checkpoint_values(*ck, [&](const std::string& name, const Tensor&) -> sp::Status {
    order.push_back(name);
    return sp::Error{"out: disk full"};
  });
  REQUIRE_FALSE(stopped.ok());
  CHECK(stopped.error().message == "out: disk full");
  CHECK(order.size() == 1);
  // A value flipped after the index was made: every value given, then the
  // file refused (the caller drops what it wrote).
  const auto params = sp::read_file(step + "/params.bin");
  REQUIRE(params.ok());
  std::string flipped = *params;
  flipped[flipped.size() - 1] ^= 0x01;
  write_bytes(step + "/params.bin", flipped);
  order.clear();
  const sp::Status corrupt = stream_checkpoint_values(*ck, [&](const std::string& name, const Tensor&) {
    order.push_back(name);
    return sp::Status::Ok();
  });
  REQUIRE_FALSE(corrupt.ok());
  CHECK_THAT(corrupt.error().message, Catch::Contains("params.bin: corrupt checkpoint file: SHA-256 differs"));
  CHECK(order.size() == 2);
  // A record's head broken: reported as corruption too, not as a bad record.
  flipped = *params;
  flipped[24 + 3] ^= 0x40;
  write_bytes(step + "/params.bin", flipped);
  const sp::Status head = stream_checkpoint_values(*ck, collect);
  REQUIRE_FALSE(head.ok());
  CHECK_THAT(head.error().message, Catch::Contains("params.bin: corrupt checkpoint file: SHA-256 differs"));
}

TEST_CASE("checkpoint: a writer given the tensors in any order writes save_checkpoint's bytes") {
  TempDir a("ckpt-writer-a"), b("ckpt-writer-b");
  const TrainingState state = small_state();
  REQUIRE(save_checkpoint(a.str(), small_meta(4), state, 3).ok());
  std::map<std::string, Shape> shapes;
  for (const auto& [name, ts] : state.tensors) shapes[name] = ts.value.shape();
  auto writer = CheckpointWriter::begin(b.str(), small_meta(4), shapes);
  REQUIRE(writer.ok());
  CHECK(fs::is_directory(writer->temp_dir()));
  for (auto it = state.tensors.rbegin(); it != state.tensors.rend(); ++it)   // w before b: not the files' order
    REQUIRE(writer->add(it->first, it->second).ok());
  const auto path = writer->finish(3);
  REQUIRE(path.ok());
  CHECK(*path == (b.path / "step-000004").string());
  CHECK(writer->temp_dir().empty());
  for (const char* file : {"params.bin", "adam_m.bin", "adam_v.bin", "manifest.json"}) {
    const auto x = sp::read_file((a.path / "step-000004" / file).string());
    const auto y = sp::read_file((b.path / "step-000004" / file).string());
    REQUIRE(x.ok());
    REQUIRE(y.ok());
    CHECK(*x == *y);
  }
  // And the bytes are the format's: the files encode_tensors makes.
  std::map<std::string, Tensor> values;
  for (const auto& [name, ts] : state.tensors) values.emplace(name, ts.value);
  CHECK(*sp::read_file((b.path / "step-000004/params.bin").string()) == encode_tensors(values));
}

TEST_CASE("checkpoint: three writers, one a file, write save_checkpoint's bytes (spindle-run's split save)") {
  TempDir a("ckpt-split-a"), b("ckpt-split-b");
  const TrainingState state = small_state();
  REQUIRE(save_checkpoint(a.str(), small_meta(4), state, 3).ok());
  std::map<std::string, Shape> shapes;
  for (const auto& [name, ts] : state.tensors) shapes[name] = ts.value.shape();
  // As on ranks 0, 1 and 2: params.bin by the writer that begins the save.
  auto first = CheckpointWriter::begin(b.str(), small_meta(4), shapes, {true, false, false});
  REQUIRE(first.ok());
  auto m = CheckpointWriter::join(first->temp_dir(), small_meta(4), shapes, {false, true, false});
  auto v = CheckpointWriter::join(first->temp_dir(), small_meta(4), shapes, {false, false, true});
  REQUIRE(m.ok());
  REQUIRE(v.ok());
  for (const auto& [name, ts] : state.tensors) {
    REQUIRE(first->add_part(name, 0, ts.value, ts.adam_steps).ok());
    REQUIRE(v->add_part(name, 2, ts.v, ts.adam_steps).ok());
  }
  for (auto it = state.tensors.rbegin(); it != state.tensors.rend(); ++it)   // another order
    REQUIRE(m->add(it->first, it->second).ok());   // its own part (m) alone
  // A part for a file another writer writes is refused.
  CHECK_THAT(first->add_part("x/0.0/b", 1, state.tensors.at("x/0.0/b").m, 2).error().message,
             Catch::Contains("x/0.0/b's AdamW m given to a writer of other files"));
  // ... which ended that writer's save: begin anew.
  first = CheckpointWriter::begin(b.str(), small_meta(4), shapes, {true, false, false});
  REQUIRE(first.ok());
  m = CheckpointWriter::join(first->temp_dir(), small_meta(4), shapes, {false, true, false});
  v = CheckpointWriter::join(first->temp_dir(), small_meta(4), shapes, {false, false, true});
  REQUIRE(m.ok());
  REQUIRE(v.ok());
  for (const auto& [name, ts] : state.tensors) {
    REQUIRE(first->add_part(name, 0, ts.value, ts.adam_steps).ok());
    REQUIRE(m->add_part(name, 1, ts.m, ts.adam_steps).ok());
    REQUIRE(v->add_part(name, 2, ts.v, ts.adam_steps).ok());
  }
  auto m_files = m->close_files();
  REQUIRE(m_files.ok());
  CHECK(m_files->size() == 1);
  CHECK(m_files->contains("adam_m.bin"));
  // Without adam_v.bin's hash the save cannot finish.
  const std::string tmp = first->temp_dir();
  CHECK_THAT(first->finish(3, nullptr, *m_files).error().message, Catch::Contains("adam_v.bin was written by no writer"));
  // Again, every file closed: the bytes of save_checkpoint.
  first = CheckpointWriter::begin(b.str(), small_meta(4), shapes, {true, false, false});
  REQUIRE(first.ok());
  CHECK_FALSE(fs::exists(tmp));   // the writer that failed removed its folder as it went
  m = CheckpointWriter::join(first->temp_dir(), small_meta(4), shapes, {false, true, false});
  v = CheckpointWriter::join(first->temp_dir(), small_meta(4), shapes, {false, false, true});
  for (const auto& [name, ts] : state.tensors) {
    REQUIRE(first->add_part(name, 0, ts.value, ts.adam_steps).ok());
    REQUIRE(m->add_part(name, 1, ts.m, ts.adam_steps).ok());
    REQUIRE(v->add_part(name, 2, ts.v, ts.adam_steps).ok());
  }
  nlohmann::json joined = *m->close_files();
  joined.update(*v->close_files());
  const std::string folder = first->temp_dir();
  m = sp::Error{"gone"};   // the joined writers destroyed: the folder stays, theirs to leave
  v = sp::Error{"gone"};
  CHECK(fs::is_directory(folder));
  const auto path = first->finish(3, nullptr, joined);
  REQUIRE(path.ok());
  for (const char* file : {"params.bin", "adam_m.bin", "adam_v.bin", "manifest.json"}) {
    INFO(file);
    CHECK(*sp::read_file((a.path / "step-000004" / file).string()) ==
          *sp::read_file((b.path / "step-000004" / file).string()));
  }
}

TEST_CASE("checkpoint: a joined writer's file never fully written, or not laid out, is refused") {
  TempDir dir("ckpt-split-bad");
  const TrainingState state = small_state();
  std::map<std::string, Shape> shapes;
  for (const auto& [name, ts] : state.tensors) shapes[name] = ts.value.shape();
  auto first = CheckpointWriter::begin(dir.str(), small_meta(4), shapes, {true, false, false});
  REQUIRE(first.ok());
  auto v = CheckpointWriter::join(first->temp_dir(), small_meta(4), shapes, {false, false, true});
  REQUIRE(v.ok());
  REQUIRE(v->add_part("x/0.0/w", 2, state.tensors.at("x/0.0/w").v, 4).ok());
  const auto closed = v->close_files();
  REQUIRE_FALSE(closed.ok());
  CHECK_THAT(closed.error().message, Catch::Contains("tensor x/0.0/b was never written to adam_v.bin"));
  // Other shapes than begin's: another layout, another size.
  std::map<std::string, Shape> other = shapes;
  other["x/0.0/w"] = {3, 3};
  const auto wrong = CheckpointWriter::join(first->temp_dir(), small_meta(4), other, {false, true, false});
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(wrong.error().message, Catch::Contains("adam_m.bin: not the file laid out for this save"));
  // A folder that is not there.
  const auto nowhere = CheckpointWriter::join((dir.path / "nowhere").string(), small_meta(4), shapes, {false, true, false});
  REQUIRE_FALSE(nowhere.ok());
  CHECK_THAT(nowhere.error().message, Catch::Contains("nowhere/adam_m.bin: cannot write"));
}

TEST_CASE("checkpoint: a writer refuses a tensor it was not laid out for and leaves nothing behind") {
  const TrainingState state = small_state();
  std::map<std::string, Shape> shapes;
  for (const auto& [name, ts] : state.tensors) shapes[name] = ts.value.shape();
  TensorState inf = state.tensors.at("x/0.0/w");
  inf.v = Tensor::from({2, 3}, {0, 0, std::numeric_limits<float>::infinity(), 0, 0, 0});
  const TensorState& b = state.tensors.at("x/0.0/b");
  struct Case {
    const char* what;
    std::string name;
    const TensorState* ts;
    std::string expected;
  } cases[] = {
      {"unknown", "x/0.0/z", &b, "tensor x/0.0/z is not in its layout"},
      {"shape", "x/0.0/w", &b, "tensor x/0.0/w has shape [1], its layout [2, 3]"},
      {"not finite", "x/0.0/w", &inf,
       "the training state after step 4 is not finite: x/0.0/w, AdamW v, element 2 is inf (training diverged; no "
       "checkpoint of this step is saved)"},
      {"twice", "x/0.0/b", &b, "tensor x/0.0/b added twice"},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      TempDir dir("ckpt-writer-bad");
      {
        auto writer = CheckpointWriter::begin(dir.str(), small_meta(4), shapes);
        REQUIRE(writer.ok());
        REQUIRE(writer->add("x/0.0/b", b).ok());
        const sp::Status st = writer->add(c.name, *c.ts);
        REQUIRE_FALSE(st.ok());
        CHECK_THAT(st.error().message, Catch::Contains(c.expected));
        // The save is over: a good tensor now gets the same error, and so does finish.
        CHECK_FALSE(writer->add("x/0.0/w", state.tensors.at("x/0.0/w")).ok());
        const auto done = writer->finish(3);
        REQUIRE_FALSE(done.ok());
        CHECK(done.error().message == st.error().message);
      }
      CHECK(fs::is_empty(dir.path));   // neither the step nor its temporary folder
    }
  }
  SECTION("one never written") {
    TempDir dir("ckpt-writer-short");
    {
      auto writer = CheckpointWriter::begin(dir.str(), small_meta(4), shapes);
      REQUIRE(writer.ok());
      REQUIRE(writer->add("x/0.0/w", state.tensors.at("x/0.0/w")).ok());
      const auto done = writer->finish(3);
      REQUIRE_FALSE(done.ok());
      CHECK_THAT(done.error().message, Catch::Contains("tensor x/0.0/b was never written"));
    }
    CHECK(fs::is_empty(dir.path));
  }
}

TEST_CASE("checkpoint: removing another run's checkpoints keeps the save in progress") {
  TempDir dir("ckpt-remove-except");
  REQUIRE(save_checkpoint(dir.str(), small_meta(2), small_state(), 3).ok());
  std::map<std::string, Shape> shapes;
  for (const auto& [name, ts] : small_state().tensors) shapes[name] = ts.value.shape();
  auto writer = CheckpointWriter::begin(dir.str(), small_meta(3), shapes);
  REQUIRE(writer.ok());
  REQUIRE(remove_checkpoints(dir.str(), writer->temp_dir()).ok());
  CHECK_FALSE(fs::exists(dir.path / "step-000002"));
  CHECK(fs::is_directory(writer->temp_dir()));
  for (const auto& [name, ts] : small_state().tensors) REQUIRE(writer->add(name, ts).ok());
  REQUIRE(writer->finish(3).ok());
  CHECK(list_checkpoints(dir.str()) == std::vector<int64_t>{3});
}

TEST_CASE("checkpoint: a flipped byte in a record's head is reported as corruption, not as a bad record") {
  TempDir dir("ckpt-flip-head");
  REQUIRE(save_checkpoint(dir.str(), small_meta(1), small_state(), 3).ok());
  const std::string step = (dir.path / "step-000001").string();
  const auto params = sp::read_file(step + "/params.bin");
  REQUIRE(params.ok());
  std::string flipped = *params;
  flipped[24 + 3] ^= 0x40;   // the high byte of the first record's name length
  write_bytes(step + "/params.bin", flipped);
  // Parsed alone, the bytes say what broke; the checkpoint's reader says
  // the file is not the one the manifest describes.
  const auto decoded = decode_tensors(flipped, "params.bin");
  REQUIRE_FALSE(decoded.ok());
  CHECK_THAT(decoded.error().message, Catch::Contains("bad or truncated name"));
  const auto r = load_checkpoint(step);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("params.bin: corrupt checkpoint file: SHA-256 differs"));
}

TEST_CASE("checkpoint: a FIFO or a folder in place of one of its files is refused at once, naming it") {
  TempDir dir("ckpt-special");
  REQUIRE(save_checkpoint(dir.str(), small_meta(1), small_state(), 3).ok());
  const std::string step = (dir.path / "step-000001").string();
  REQUIRE(load_checkpoint(step).ok());
  // A FIFO with no writer: a blocking read would wait forever (and the test
  // with it, until ctest's timeout).
  for (const char* name : {"params.bin", "manifest.json"}) {
    INFO(name);
    const std::string path = step + "/" + name;
    const auto bytes = sp::read_file(path);
    REQUIRE(bytes.ok());
    std::filesystem::remove(path);
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    auto r = load_checkpoint(step);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains(std::string(name) + ": not a regular file"));
    std::filesystem::remove(path);
    std::filesystem::create_directory(path);
    r = load_checkpoint(step);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains(std::string(name) + ": not a regular file"));
    std::filesystem::remove(path);
    write_bytes(path, *bytes);
    REQUIRE(load_checkpoint(step).ok());
  }
}

TEST_CASE("checkpoint: training 2 steps, saving, loading into a new executor, 2 more equals 4 straight") {
  auto m = sp::load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/tiny-clip.yaml");
  REQUIRE(m.ok());
  const sp::Plan plan = one_device_plan(*m);
  OneDevice straight(*m, plan);
  std::vector<std::vector<double>> losses;
  for (int s = 0; s < 4; ++s) losses.push_back(straight.ex->step().task_loss);

  TempDir dir("ckpt-resume");
  OneDevice first(*m, plan);
  first.ex->step();
  first.ex->step();
  CheckpointMeta meta;
  meta.step = 2;
  REQUIRE(save_checkpoint(dir.str(), meta, first.ex->gather_state(), 3).ok());
  const auto ck = load_checkpoint((dir.path / "step-000002").string());
  REQUIRE(ck.ok());

  OneDevice second(*m, plan);
  const LoadCounts counts = second.ex->load_state(ck->state);
  CHECK(counts.fresh == 0);
  CHECK(counts.carried == static_cast<int64_t>(second.ex->param_shapes().size()));
  CHECK(second.ex->steps_done() == 2);
  // Same arithmetic on one device: bitwise equal losses and parameters.
  for (int s = 2; s < 4; ++s) {
    const StepStats st = second.ex->step();
    CHECK(st.step == s + 1);
    CHECK(st.task_loss == losses[static_cast<size_t>(s)]);
  }
  const auto want = straight.ex->gather_params(), got = second.ex->gather_params();
  REQUIRE(want.size() == got.size());
  for (const auto& [name, t] : want)
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(got.at(name)[i] == t[i]);
}

TEST_CASE("checkpoint: load_state keeps missing tensors fresh and refuses another shape") {
  auto m = sp::load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/tiny-clip.yaml");
  REQUIRE(m.ok());
  const sp::Plan plan = one_device_plan(*m);
  OneDevice a(*m, plan);
  a.ex->step();
  TrainingState state = a.ex->gather_state();
  const auto initial = OneDevice(*m, plan).ex->gather_params();
  // Drop the audio encoder (as when the tasks using it are removed).
  int64_t audio = 0;
  for (auto it = state.tensors.begin(); it != state.tensors.end();)
    if (it->first.rfind("audio/", 0) == 0) {
      it = state.tensors.erase(it);
      ++audio;
    } else {
      ++it;
    }
  REQUIRE(audio > 0);
  OneDevice b(*m, plan);
  const LoadCounts counts = b.ex->load_state(state);
  CHECK(counts.fresh == audio);
  CHECK(counts.carried + counts.fresh == static_cast<int64_t>(b.ex->param_shapes().size()));
  const auto got = b.ex->gather_params();
  const auto trained = a.ex->gather_params();
  const Tensor& fresh = got.at("audio/0.0/w");   // patch_embed weight: seeded initial value
  for (int64_t i = 0; i < fresh.numel(); ++i) REQUIRE(fresh[i] == initial.at("audio/0.0/w")[i]);
  const Tensor& carried = got.at("vision/0.0/w");
  for (int64_t i = 0; i < carried.numel(); ++i) REQUIRE(carried[i] == trained.at("vision/0.0/w")[i]);

  // From a source (spindle-run's resume, reading each tensor as it is
  // asked for): the same parameters, every tensor of the model asked for
  // once (one shard each on one device), a parameter's tensors one after
  // another.
  OneDevice d(*m, plan);
  std::vector<std::string> asked;
  const LoadCounts from_source = d.ex->load_state(
      [&](const std::string& name) -> const TensorState* {
        asked.push_back(name);
        const auto it = state.tensors.find(name);
        return it == state.tensors.end() ? nullptr : &it->second;
      },
      state.step);
  CHECK(from_source.fresh == counts.fresh);
  CHECK(from_source.carried == counts.carried);
  CHECK(d.ex->steps_done() == state.step);
  CHECK(asked.size() == b.ex->param_shapes().size());
  CHECK(std::set<std::string>(asked.begin(), asked.end()).size() == asked.size());
  std::set<std::string> params_done;
  for (size_t i = 0; i < asked.size(); ++i) {
    const std::string param = asked[i].substr(0, asked[i].rfind('/'));
    if (i > 0 && param == asked[i - 1].substr(0, asked[i - 1].rfind('/'))) continue;
    INFO(asked[i]);
    CHECK(params_done.insert(param).second);   // never a parameter's tensors again after another's
  }
  const auto sourced = d.ex->gather_params();
  for (const auto& [name, value] : got) {
    INFO(name);
    REQUIRE(std::memcmp(sourced.at(name).data(), value.data(), static_cast<size_t>(value.numel()) * 4) == 0);
  }

  state.tensors.at("vision/0.0/w").value = Tensor::zeros({3, 3});
  OneDevice c(*m, plan);
  CHECK_THROWS_AS(c.ex->load_state(state), std::invalid_argument);
}
