// Training data from files (docs/spec/data.md): the .npy reader, DATA.yaml,
// sampling, FileSource's checks, and retrieval accuracy.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "libexec/data/dataset.h"
#include "libexec/data/npy.h"
#include "libexec/exec/checkpoint.h"
#include "libexec/exec/eval.h"
#include "libplan/model/model.h"
#include "test/scratch.h"

using namespace spindle;
using namespace spindle::exec;
using spindle::testutil::TempDir;
namespace fs = std::filesystem;

namespace {

// A .npy file's bytes: format `major`.0, header dict `dict`, then `data`.
// The header is padded with spaces to a multiple of 64 bytes, as NumPy does.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string h = dict;
  while ((prefix + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const auto len = static_cast<uint32_t>(h.size());
  for (size_t b = 0; b < (major == 1 ? 2u : 4u); ++b) out += static_cast<char>((len >> (8 * b)) & 0xff);
  return out + h + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string dict(const std::string& descr, const std::string& shape, const char* order = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
}

// A fresh folder NAME in this process's scratch folder: one folder under
// the system temp folder made unique by mkdtemp (spindle-test-data-XXXXXX;
// before 2026-12-06 fixed names there, which another user's run left
// behind and this one could not remove), removed at exit.
fs::path temp_dir(const std::string& name) {
  static const TempDir scratch("test-data");
  const fs::path d = scratch.path / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

const std::string kModel = R"(name: m
dtype: fp32
modules:
  vision:
    - {op: patch_embed, in_dim: 3, hidden: 8}
    - {op: pool_project, in: 8, out: 4}
  text:
    - {op: token_embed, vocab: 10, hidden: 8}
    - {op: pool_project, in: 8, out: 4}
  clip: [{op: contrastive_loss, dim: 4}]
  words: [{op: token_embed, vocab: 10, hidden: 8}]
  head: [{op: lm_loss, hidden: 8, vocab: 10}]
tasks:
  - name: pairs
    batch: 2
    nodes:
      - {id: img, module: vision, seq: 2}
      - {id: txt, module: text, seq: 3}
      - {id: loss, module: clip, inputs: [img, txt]}
  - name: lm
    batch: 2
    nodes:
      - {id: txt, module: words, seq: 3}
      - {id: out, module: head, inputs: [txt]}
)";

plan::Model model() {
  auto m = plan::parse_model_string(kModel, "m.yaml");
  REQUIRE(m.ok());
  return *m;
}

// A valid dataset for the model: S samples; img[s] = s + 0.5 everywhere,
// txt[s] = (s, s+1, s+2) mod 10, out.targets[s] = (-1, s mod 10, -1).
fs::path good_dataset(const std::string& name, int64_t samples) {
  const fs::path d = temp_dir(name);
  std::vector<float> img;
  std::vector<int32_t> txt;
  std::vector<int64_t> tgt;
  for (int64_t s = 0; s < samples; ++s) {
    for (int e = 0; e < 6; ++e) img.push_back(static_cast<float>(s) + 0.5f);
    for (int p = 0; p < 3; ++p) txt.push_back(static_cast<int32_t>((s + p) % 10));
    tgt.insert(tgt.end(), {-1, s % 10, -1});
  }
  const std::string n = std::to_string(samples);
  write(d / "img.npy", npy_bytes(dict("<f4", "(" + n + ", 2, 3)"), raw(img)));
  write(d / "txt.npy", npy_bytes(dict("<i4", "(" + n + ", 3)"), raw(txt)));
  write(d / "out.targets.npy", npy_bytes(dict("<i8", "(" + n + ", 3)"), raw(tgt)));
  write(d / "data.yaml", "tasks:\n  pairs: {path: .}\n  lm: {path: ., shuffle: false}\n");
  return d;
}

std::string open_error(const fs::path& dir, const plan::Model& m) {
  auto spec = load_data_spec((dir / "data.yaml").string(), m, false);
  if (!spec.ok()) return spec.error().message;
  auto src = FileSource::open(*spec, m, 0);
  return src.ok() ? "" : src.error().message;
}

DataRead read_of(int task, const std::string& task_name, const std::string& node, DataKind kind, int64_t seq,
                 int64_t width, int64_t rows_begin, int64_t rows_end) {
  DataRead r;
  r.task = task;
  r.task_name = task_name;
  r.node = node;
  r.kind = kind;
  r.seq = seq;
  r.width = width;
  r.batch = 2;
  r.row_begin = rows_begin;
  r.row_end = rows_end;
  return r;
}

}  // namespace

TEST_CASE("npy header: versions 1.0, 2.0 and 3.0, every dtype of the contract", "[data]") {
  for (int major : {1, 2, 3}) {
    const auto h = parse_npy_header(npy_bytes(dict("<f4", "(5, 2, 3)"), ""), "a.npy");
    REQUIRE(h.ok());
    CHECK(h->shape == std::vector<int64_t>{5, 2, 3});
    CHECK(h->dtype == ElementType::f32);
    const auto v = parse_npy_header(npy_bytes(dict("<i8", "(7,)"), "", major), "a.npy");
    REQUIRE(v.ok());
    CHECK(v->major == major);
    CHECK(v->data_offset % 64 == 0);
    CHECK(v->shape == std::vector<int64_t>{7});
  }
  const std::pair<const char*, ElementType> types[] = {{"<f4", ElementType::f32}, {"<f2", ElementType::f16},
                                                    {"|u1", ElementType::u8},  {"<u2", ElementType::u16},
                                                    {"<i4", ElementType::i32}, {"<i8", ElementType::i64}};
  for (const auto& [descr, type] : types) {
    const auto h = parse_npy_header(npy_bytes(dict(descr, "(1,)"), ""), "a.npy");
    REQUIRE(h.ok());
    CHECK(h->dtype == type);
  }
  // Keys in another order, double quotes, no trailing comma.
  const auto h = parse_npy_header(npy_bytes("{\"shape\": (), \"fortran_order\": False, \"descr\": \"<u2\"}", ""), "a.npy");
  REQUIRE(h.ok());
  CHECK(h->shape.empty());
  CHECK(h->numel() == 1);
}

TEST_CASE("npy header: what the contract rejects, with the file named", "[data]") {
  const std::pair<std::string, std::string> bad[] = {
      {npy_bytes(dict("<f4", "(2, 2)", "True"), ""), "Fortran-order"},
      {npy_bytes(dict(">f4", "(2,)"), ""), "big-endian"},
      {npy_bytes(dict("|O", "(2,)"), ""), "object dtype"},
      {npy_bytes(dict("<f8", "(2,)"), ""), "dtype '<f8' is not supported"},
      {npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", ""), "structured"},
      {npy_bytes("{'descr': '<f4', 'shape': (2,), }", ""), "needs descr, fortran_order and shape"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", ""), "unknown key 'x'"},
      {npy_bytes(dict("<f4", "(2, -1)"), ""), "non-integer"},
      {npy_bytes(dict("<f4", "(1099511627776, 2)"), ""), "2^40"},
      {"PK\x03\x04 a zip file, not npy", "not a NumPy .npy file"},
      {npy_bytes(dict("<f4", "(2,)"), "").substr(0, 30), "truncated"},
  };
  for (const auto& [bytes, why] : bad) {
    const auto h = parse_npy_header(bytes, "dir/x.npy");
    REQUIRE_FALSE(h.ok());
    CHECK(h.error().message.rfind("dir/x.npy: ", 0) == 0);
    CHECK_THAT(h.error().message, Catch::Contains(why));
  }
  std::string v4 = npy_bytes(dict("<f4", "(2,)"), "");
  v4[6] = 4;
  CHECK_THAT(parse_npy_header(v4, "x.npy").error().message, Catch::Contains("version 4.0"));
}

TEST_CASE("npy: float16 to float by hand (normal, subnormal, signed zero, inf)", "[data]") {
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0xc000) == -2.0f);
  CHECK(half_to_float(0x3555) == Approx(0.333251953125f).epsilon(0));  // 1365/4096
  CHECK(half_to_float(0x7bff) == 65504.0f);                            // largest half
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));              // smallest subnormal
  CHECK(half_to_float(0x8000) == 0.0f);
  CHECK(std::signbit(half_to_float(0x8000)));
  CHECK(std::isinf(half_to_float(0x7c00)));
  CHECK(std::isnan(half_to_float(0x7e00)));
}

TEST_CASE("npy: a mapped file gives exactly the rows asked for, a short file is refused", "[data]") {
  const fs::path d = temp_dir("npy");
  write(d / "a.npy", npy_bytes(dict("<u2", "(3, 2)"), raw(std::vector<uint16_t>{1, 2, 3, 4, 65535, 6}), 2));
  auto a = NpyArray::open((d / "a.npy").string());
  REQUIRE(a.ok());
  CHECK(a->samples() == 3);
  CHECK(a->row_elems() == 2);
  std::vector<double> row;
  a->read_row(2, row);
  a->read_row(0, row);
  CHECK(row == std::vector<double>{65535, 6, 1, 2});
  write(d / "short.npy", npy_bytes(dict("<i4", "(3, 2)"), raw(std::vector<int32_t>{1, 2, 3})));
  const auto s = NpyArray::open((d / "short.npy").string());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message, Catch::Contains("short.npy: truncated") && Catch::Contains("needs 24 data bytes"));
  CHECK_THAT(NpyArray::open((d / "none.npy").string()).error().message,
             Catch::Contains("none.npy: cannot open: No such file"));
}

TEST_CASE("npy: a FIFO, a folder or a device where a data file belongs is refused at once", "[data]") {
  const fs::path d = temp_dir("npy-special");
  // A FIFO with no writer: a blocking open would wait forever (and the
  // test with it, until ctest's timeout).
  REQUIRE(::mkfifo((d / "fifo.npy").c_str(), 0600) == 0);
  fs::create_directory(d / "dir.npy");
  fs::create_symlink("/dev/zero", d / "zero.npy");
  for (const char* name : {"fifo.npy", "dir.npy", "zero.npy"}) {
    INFO(name);
    const auto a = NpyArray::open((d / name).string());
    REQUIRE_FALSE(a.ok());
    CHECK_THAT(a.error().message, Catch::Contains(std::string(name) + ": not a regular file"));
  }
}

TEST_CASE("npy: the shipped digits data reads as numpy wrote it", "[data]") {
  // Values printed by numpy from configs/data/digits/train (make-digits-dataset.py).
  const std::string dir = std::string(SPINDLE_SOURCE_DIR) + "/configs/data/digits/train/";
  auto img = NpyArray::open(dir + "img.npy");
  REQUIRE(img.ok());
  CHECK(img->dtype() == ElementType::u8);
  CHECK(img->shape() == std::vector<int64_t>{1500, 16, 4});
  std::vector<double> row;
  img->read_row(0, row);
  CHECK(std::vector<double>(row.begin() + 4, row.begin() + 8) == std::vector<double>{80, 207, 207, 239});
  auto tgt = NpyArray::open(dir + "llm.targets.npy");
  REQUIRE(tgt.ok());
  CHECK(tgt->dtype() == ElementType::i64);
  row.clear();
  tgt->read_row(1, row);  // "one": o n e end
  CHECK(std::vector<double>(row.begin() + 14, row.begin() + 20) == std::vector<double>{-1, 15, 14, 5, 27, -1});
  auto aud = NpyArray::open(dir + "aud.npy");
  REQUIRE(aud.ok());
  CHECK(aud->dtype() == ElementType::f16);
  CHECK(aud->shape() == std::vector<int64_t>{1500, 32, 16});
}

TEST_CASE("evaluation on the training data: the tasks whose --eval-data folder is their --data folder", "[data]") {
  const std::string root = std::string(SPINDLE_SOURCE_DIR) + "/configs/data/digits/";
  auto model = plan::load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/digits-mm.yaml");
  REQUIRE(model.ok());
  const auto open = [&](const std::string& yaml_path, bool eval) {
    auto spec = load_data_spec(yaml_path, *model, eval);
    REQUIRE(spec.ok());
    auto src = FileSource::open(*spec, *model, 0);
    REQUIRE(src.ok());
    return std::move(*src);
  };
  const auto train = open(root + "train.yaml", false);
  const auto val = open(root + "val.yaml", true);
  const int tasks = static_cast<int>(model->tasks.size());
  REQUIRE(train->tasks() == tasks);
  CHECK(tasks_evaluated_on_training_data(*train, *val).empty());   // the shipped split
  std::vector<int> all(static_cast<size_t>(tasks));
  std::iota(all.begin(), all.end(), 0);
  CHECK(tasks_evaluated_on_training_data(*train, *open(root + "train.yaml", true)) == all);
  // The training folder under another spelling and through a link, for
  // one task; another task synthetic in both.
  const fs::path d = temp_dir("eval-on-train");
  fs::create_directory_symlink(root + "train", d / "linked");
  const std::string names[] = {model->tasks[0].name, model->tasks[1].name, model->tasks[2].name};
  std::ofstream(d / "eval.yaml") << "tasks:\n  " << names[0] << ": {path: linked}\n  " << names[1] << ": {path: "
                                 << root << "val}\n  " << names[2] << ": {synthetic: true}\n";
  std::ofstream(d / "train.yaml") << "tasks:\n  " << names[0] << ": {path: " << root << "./train}\n  " << names[1]
                                  << ": {path: " << root << "train}\n  " << names[2] << ": {synthetic: true}\n";
  CHECK(tasks_evaluated_on_training_data(*open((d / "train.yaml").string(), false),
                                         *open((d / "eval.yaml").string(), true)) == std::vector<int>{0});
  fs::remove_all(d);
}

TEST_CASE("evaluation past one pass: the tasks whose --eval-batches exceed floor(S / B)", "[data]") {
  // digits-mm's validation set: 297 samples; image-text and audio-text
  // take batches of 48 (6 a pass, drop last), caption of 24 (12 a pass).
  auto model = plan::load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/digits-mm.yaml");
  REQUIRE(model.ok());
  auto spec = load_data_spec(std::string(SPINDLE_SOURCE_DIR) + "/configs/data/digits/val.yaml", *model, true);
  REQUIRE(spec.ok());
  auto val = FileSource::open(*spec, *model, 0);
  REQUIRE(val.ok());
  REQUIRE((*val)->task(0).per_epoch == 297 / 48);
  REQUIRE((*val)->task(2).per_epoch == 297 / 24);
  CHECK(tasks_evaluated_past_one_pass(**val, 6).empty());
  CHECK(tasks_evaluated_past_one_pass(**val, 7) == std::vector<int>{0, 1});
  CHECK(tasks_evaluated_past_one_pass(**val, 12) == std::vector<int>{0, 1});
  CHECK(tasks_evaluated_past_one_pass(**val, 13) == std::vector<int>{0, 1, 2});
  CHECK(tasks_evaluated_past_one_pass(**val, 1).empty());
}

TEST_CASE("sampling: the documented shuffle, by an independent Python implementation", "[data]") {
  // Reference (Python, the algorithm of dataset.h):
  //   M = 2**64 - 1
  //   def sm(x): x = (x + 0x9e3779b97f4a7c15) & M; x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M
  //              x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M; return x ^ (x >> 31)
  //   def fnv(s): h = 0xcbf29ce484222325; for c in s.encode(): h = ((h ^ c) * 0x100000001b3) & M; return h
  //   def order(seed, task, epoch, S):
  //     p = list(range(S)); key = sm(seed ^ sm(fnv("data/shuffle/" + task) ^ sm(epoch)))
  //     for i in range(S - 1, 0, -1): j = (sm((key + i) & M) * (i + 1)) >> 64; p[i], p[j] = p[j], p[i]
  //     return p
  CHECK(epoch_order(0, "image-text", 0, 10) == std::vector<int64_t>{6, 3, 0, 4, 8, 9, 1, 7, 2, 5});
  CHECK(epoch_order(0, "image-text", 1, 10) == std::vector<int64_t>{2, 7, 6, 8, 9, 0, 1, 5, 4, 3});
  CHECK(epoch_order(7, "caption", 3, 12) == std::vector<int64_t>{9, 11, 3, 5, 8, 1, 4, 6, 2, 0, 10, 7});
  // A permutation for a large S too.
  std::vector<int64_t> p = epoch_order(5, "t", 2, 1001);
  std::sort(p.begin(), p.end());
  std::vector<int64_t> id(1001);
  std::iota(id.begin(), id.end(), 0);
  CHECK(p == id);
}

TEST_CASE("sampling: epochs of floor(S/B) batches, drop last, rows split anyhow", "[data]") {
  const plan::Model m = model();
  const fs::path d = good_dataset("sampling", 5);  // S 5, B 2: k = 2, sample order[4] never read
  auto spec = load_data_spec((d / "data.yaml").string(), m, false);
  REQUIRE(spec.ok());
  auto src = FileSource::open(*spec, m, 0);
  REQUIRE(src.ok());
  FileSource& s = **src;
  CHECK(s.task(0).samples == 5);
  CHECK(s.task(0).per_epoch == 2);
  CHECK(batch_position(5, 2).epoch == 2);
  CHECK(batch_position(5, 2).index == 1);
  // Task lm: shuffle false: batch b holds samples (b mod 2) * 2 + r.
  CHECK(s.sample_of(1, 0, 0) == 0);
  CHECK(s.sample_of(1, 1, 1) == 3);
  CHECK(s.sample_of(1, 2, 0) == 0);  // epoch 1 starts again; sample 4 is dropped
  // Task pairs: shuffled, epoch e's order from (seed, task, e) alone.
  for (int64_t b = 0; b < 6; ++b) {
    const std::vector<int64_t> order = epoch_order(0, "pairs", b / 2, 5);
    for (int64_t r = 0; r < 2; ++r) CHECK(s.sample_of(0, b, r) == order[static_cast<size_t>((b % 2) * 2 + r)]);
  }
  // Each epoch reads 4 distinct samples.
  std::set<int64_t> epoch1{s.sample_of(0, 2, 0), s.sample_of(0, 2, 1), s.sample_of(0, 3, 0), s.sample_of(0, 3, 1)};
  CHECK(epoch1.size() == 4);
  // Rows read one by one equal rows read together (a device holds any split).
  const DataRead both = read_of(0, "pairs", "img", DataKind::features, 2, 3, 0, 2);
  const Tensor all = s.read(both, 3);
  const Tensor second = s.read(read_of(0, "pairs", "img", DataKind::features, 2, 3, 1, 2), 3);
  CHECK(all.shape() == Shape{2, 2, 3});
  for (int64_t e = 0; e < 6; ++e) CHECK(second[e] == all[6 + e]);
  CHECK(all[0] == static_cast<float>(s.sample_of(0, 3, 0)) + 0.5f);
  // Targets keep -1; tokens are ids.
  const Tensor tgt = s.read(read_of(1, "lm", "out", DataKind::targets, 3, 10, 0, 2), 1);
  CHECK(std::vector<float>(tgt.data(), tgt.data() + 6) == std::vector<float>{-1, 2, -1, -1, 3, -1});
  CHECK(s.may_ignore_targets(1));
  CHECK_FALSE(s.may_ignore_targets(0));
}

TEST_CASE("DATA.yaml: unknown keys, tasks missing or unknown, path and synthetic", "[data]") {
  const plan::Model m = model();
  const std::pair<std::string, std::string> bad[] = {
      {"tasks:\n  pairs: {path: a}\n", "tasks: no entry for task 'lm'"},
      {"tasks:\n  pairs: {path: a}\n  lm: {path: a}\n  other: {path: a}\n", "4:3: tasks.other: model m has no task 'other'"},
      {"tasks:\n  pairs: {path: a, shufle: true}\n  lm: {path: a}\n", "tasks.pairs.shufle: unknown key 'shufle'"},
      {"tasks:\n  pairs: {}\n  lm: {path: a}\n", "tasks.pairs: expected path: DIR"},
      {"tasks:\n  pairs: {path: a, synthetic: true}\n  lm: {path: a}\n", "not both"},
      {"tasks:\n  pairs: {path: a, shuffle: maybe}\n  lm: {path: a}\n", "tasks.pairs.shuffle: expected true or false"},
      {"task:\n  pairs: {path: a}\n", "unknown key 'task'"},
      {"tasks: [a, b]\n", "tasks: expected a map"},
  };
  for (const auto& [text, why] : bad) {
    const auto spec = parse_data_spec(text, "d/data.yaml", m, false);
    REQUIRE_FALSE(spec.ok());
    CHECK(spec.error().message.rfind("d/data.yaml:", 0) == 0);
    CHECK_THAT(spec.error().message, Catch::Contains(why));
  }
  const auto ok = parse_data_spec("tasks:\n  pairs: {path: sub/x}\n  lm: {synthetic: true}\n", "d/data.yaml", m, true);
  REQUIRE(ok.ok());
  CHECK(ok->tasks[0].dir == "d/sub/x");
  CHECK_FALSE(ok->tasks[0].shuffle);  // evaluation default
  CHECK(ok->tasks[1].synthetic);
  CHECK(parse_data_spec("tasks:\n  pairs: {path: x}\n  lm: {path: x}\n", "d.yaml", m, false)->tasks[0].shuffle);
  // path naming a file, not its folder: refused at the key; a folder, or a
  // path not there (left to the file checks, which name the file), is read.
  const fs::path dir = temp_dir("path-kind");
  std::ofstream(dir / "img.npy") << "x";
  const std::string yaml = (dir / "data.yaml").string();
  const auto file = parse_data_spec("tasks:\n  pairs: {path: img.npy}\n  lm: {synthetic: true}\n", yaml, m, false);
  REQUIRE_FALSE(file.ok());
  CHECK(file.error().message == yaml + ":2:17: tasks.pairs.path: " + (dir / "img.npy").string() +
                                    " is not a directory (a dataset directory holds one .npy file per node)");
  for (const char* path : {".", "missing"})
    CHECK(parse_data_spec("tasks:\n  pairs: {path: " + std::string(path) + "}\n  lm: {synthetic: true}\n", yaml, m,
                          false)
              .ok());
}

TEST_CASE("bad data: FileSource names the file and what is wrong", "[data]") {
  const plan::Model m = model();
  SECTION("a missing file") {
    const fs::path d = good_dataset("missing", 4);
    fs::remove(d / "txt.npy");
    CHECK_THAT(open_error(d, m), Catch::Contains("txt.npy: cannot open"));
  }
  SECTION("not an npy file") {
    const fs::path d = good_dataset("notnpy", 4);
    write(d / "img.npy", "img,0.5,0.5\n");
    CHECK_THAT(open_error(d, m), Catch::Contains("img.npy: not a NumPy .npy file"));
  }
  SECTION("a dtype the node does not take") {
    const fs::path d = good_dataset("dtype", 4);
    write(d / "txt.npy", npy_bytes(dict("<f4", "(4, 3)"), raw(std::vector<float>(12))));
    CHECK_THAT(open_error(d, m), Catch::Contains("txt.npy: dtype float32 is not allowed for token_embed node txt") &&
                                     Catch::Contains("int32, int64, uint16 or uint8"));
  }
  SECTION("a shape that disagrees with the model: expected and found") {
    const fs::path d = good_dataset("shape", 4);
    write(d / "img.npy", npy_bytes(dict("<f4", "(4, 3, 2)"), raw(std::vector<float>(24))));
    CHECK_THAT(open_error(d, m), Catch::Contains("img.npy: shape (4, 3, 2) does not match patch_embed node img") &&
                                     Catch::Contains("expected (S, 2, 3)"));
  }
  SECTION("files of one task with different S") {
    const fs::path d = good_dataset("samples", 4);
    write(d / "txt.npy", npy_bytes(dict("<i4", "(5, 3)"), raw(std::vector<int32_t>(15))));
    CHECK_THAT(open_error(d, m), Catch::Contains("txt.npy: 5 samples, but") && Catch::Contains("img.npy has 4"));
  }
  SECTION("S smaller than the batch") {
    const fs::path d = good_dataset("small", 1);
    CHECK_THAT(open_error(d, m), Catch::Contains("img.npy: 1 samples, fewer than task pairs's batch 2"));
  }
  SECTION("a Fortran-order file") {
    const fs::path d = good_dataset("fortran", 4);
    write(d / "out.targets.npy", npy_bytes(dict("<i8", "(4, 3)", "True"), raw(std::vector<int64_t>(12))));
    CHECK_THAT(open_error(d, m), Catch::Contains("out.targets.npy: Fortran-order"));
  }
}

TEST_CASE("bad data: values are checked when read, naming file, sample and value", "[data]") {
  const plan::Model m = model();
  const fs::path d = good_dataset("values", 4);
  std::vector<float> img(24, 0.5f);
  img[2 * 6 + 4] = std::nanf("");  // sample 2, element 4
  write(d / "img.npy", npy_bytes(dict("<f4", "(4, 2, 3)"), raw(img)));
  std::vector<int32_t> txt(12, 1);
  txt[3 * 3 + 1] = 10;  // sample 3: id 10 with vocab 10
  write(d / "txt.npy", npy_bytes(dict("<i4", "(4, 3)"), raw(txt)));
  auto spec = load_data_spec((d / "data.yaml").string(), m, false);
  REQUIRE(spec.ok());
  auto src = FileSource::open(*spec, m, 0);
  REQUIRE(src.ok());
  FileSource& s = **src;
  // Task lm reads in file order: batch 1 is samples 2 and 3.
  const std::vector<DataRead> lm_tokens{read_of(1, "lm", "txt", DataKind::tokens, 3, 10, 0, 2)};
  CHECK(s.prepare(lm_tokens, 0).empty());
  CHECK_THAT(s.prepare(lm_tokens, 1), Catch::Contains("txt.npy: sample 3, element 1: token id 10 outside [0, 10)"));
  CHECK_THROWS_AS(s.read(lm_tokens[0], 1), DataError);
  // The NaN is found in whichever batch holds sample 2.
  int64_t batch = 0;
  while (s.sample_of(0, batch, 0) != 2 && s.sample_of(0, batch, 1) != 2) ++batch;
  const std::vector<DataRead> feats{read_of(0, "pairs", "img", DataKind::features, 2, 3, 0, 2)};
  CHECK_THAT(s.prepare(feats, batch), Catch::Contains("img.npy: sample 2, element 4: value nan"));
  // Infinite features too, in float16 (0xfc00: -inf).
  std::vector<uint16_t> half(24, 0x3c00);
  half[1 * 6 + 2] = 0xfc00;  // sample 1, element 2
  write(d / "img.npy", npy_bytes(dict("<f2", "(4, 2, 3)"), raw(half)));
  auto src_inf = FileSource::open(*spec, m, 0);
  REQUIRE(src_inf.ok());
  batch = 0;
  while ((*src_inf)->sample_of(0, batch, 0) != 1 && (*src_inf)->sample_of(0, batch, 1) != 1) ++batch;
  CHECK_THAT((*src_inf)->prepare(feats, batch), Catch::Contains("img.npy: sample 1, element 2: value -inf"));
  int64_t clean = 0;  // a batch without sample 1 reads the halves as 1.0
  while ((*src_inf)->sample_of(0, clean, 0) == 1 || (*src_inf)->sample_of(0, clean, 1) == 1) ++clean;
  const Tensor ones = (*src_inf)->read(feats[0], clean);
  for (int64_t e = 0; e < ones.numel(); ++e) CHECK(ones[e] == 1.0f);
  // A target that is neither an id nor -1.
  std::vector<int64_t> tgt(12, -1);
  tgt[5] = -3;
  write(d / "out.targets.npy", npy_bytes(dict("<i8", "(4, 3)"), raw(tgt)));
  auto src2 = FileSource::open(*spec, m, 0);
  REQUIRE(src2.ok());
  CHECK_THAT((*src2)->prepare({read_of(1, "lm", "out", DataKind::targets, 3, 10, 0, 2)}, 0),
             Catch::Contains("out.targets.npy: sample 1, element 2: target -3 outside [0, 10) (or -1: ignored)"));
}

TEST_CASE("retrieval accuracy: top-1 both ways by cosine, labels, lowest row on ties", "[data]") {
  // a rows: e1, e2, e1+e2, -e1; b rows: e1, e1, e2, e2 (cosine, any length).
  const Tensor a = Tensor::from({4, 1, 2}, {1, 0, 0, 2, 1, 1, -3, 0});
  const Tensor b = Tensor::from({4, 1, 2}, {2, 0, 1, 0, 0, 1, 0, 5});
  // a -> b: a0 best b0 (b0 = b1, lowest) hit; a1 best b2 miss; a2 ties all
  // at 1/sqrt2 -> b0 miss; a3 best b2 (0 beats -1; b2 = b3 -> b2) miss.
  // b -> a: b0 -> a0 hit; b1 -> a0 miss; b2 -> a1 miss; b3 -> a1 miss.
  RetrievalHits h = retrieval_hits(a, b, Tensor());
  CHECK(h.a_to_b == 1);
  CHECK(h.b_to_a == 1);
  CHECK(h.queries == 4);
  // Labels 0 0 1 1: a2 -> b0 (label 0 vs 1) miss, a1 -> b2 (0 vs 1) miss,
  // a3 -> b2 (1 = 1) hit; b1 -> a0 hit, b2 -> a1 (1 vs 0) miss, b3 -> a1 miss.
  h = retrieval_hits(a, b, Tensor::from({4}, {0, 0, 1, 1}));
  CHECK(h.a_to_b == 2);
  CHECK(h.b_to_a == 2);
  CHECK_THROWS_AS(retrieval_hits(a, Tensor::from({2, 1, 2}, {1, 0, 0, 1}), Tensor()), std::invalid_argument);
}

TEST_CASE("retrieval accuracy: similarities within kSimilarityTie are ties, whichever copy rounding favours", "[data]") {
  // a = [e2, e1]; b's two rows both e1, one of them turned by d toward e3.
  // a0 (e2) sees 0 and 0: b0, its pair, a hit. a1 (e1) sees 1 and
  // cos(d) = 1 - d^2 / 2: within the tie (d = 1.5e-3: 1.1e-6) b0, not its
  // pair, whichever row was turned; beyond it (d = 1e-2: 5e-5) the exact
  // one, b1 when b0 was turned.
  const auto a_to_b = [](float d, bool turn_b0) {
    const Tensor a = Tensor::from({2, 1, 3}, {0, 1, 0, 1, 0, 0});
    const Tensor b = Tensor::from({2, 1, 3}, {1, 0, turn_b0 ? d : 0, 1, 0, turn_b0 ? 0 : d});
    return retrieval_hits(a, b, Tensor()).a_to_b;
  };
  CHECK(a_to_b(1.5e-3f, false) == 1);
  CHECK(a_to_b(1.5e-3f, true) == 1);   // compared exactly: b1, its pair, 2 hits
  CHECK(a_to_b(1e-2f, false) == 1);
  CHECK(a_to_b(1e-2f, true) == 2);
}

TEST_CASE("checkpoint: the data position per task round-trips, a manifest without it loads as before", "[data]") {
  TrainingState state;
  state.step = 3;
  TensorState ts;
  ts.value = Tensor::from({1}, {1});
  ts.m = Tensor::from({1}, {0});
  ts.v = Tensor::from({1}, {0});
  ts.adam_steps = 3;
  state.tensors["m/0.0/w"] = ts;
  CheckpointMeta meta;
  meta.step = 3;
  meta.model_name = std::string("pairs-model");
  meta.task_batch = {{"pairs", 2}};
  const fs::path dir = temp_dir("ckpt");
  // Without a data position (synthetic runs, older builds): no data.tasks.
  REQUIRE(save_checkpoint((dir / "old").string(), meta, state, 1).ok());
  auto old = load_checkpoint((dir / "old" / checkpoint_name(3)).string());
  REQUIRE(old.ok());
  CHECK(old->meta.data_tasks.empty());
  std::ifstream old_manifest(dir / "old" / checkpoint_name(3) / "manifest.json");
  const std::string old_text((std::istreambuf_iterator<char>(old_manifest)), std::istreambuf_iterator<char>());
  CHECK(old_text.find("\"tasks\"") == std::string::npos);
  // With one: written under data.tasks and read back as written.
  meta.data_tasks = {{"pairs", {{"source", "npy"}, {"samples", 5}, {"batches_per_epoch", 2}, {"next_batch", 3},
                                {"epoch", 1}, {"batch_in_epoch", 1}}}};
  REQUIRE(save_checkpoint((dir / "new").string(), meta, state, 1).ok());
  auto back = load_checkpoint((dir / "new" / checkpoint_name(3)).string());
  REQUIRE(back.ok());
  CHECK(back->meta.data_tasks == meta.data_tasks);
  CHECK(back->meta.task_samples == std::map<std::string, int64_t>{{"pairs", 3 * 2}});
}
