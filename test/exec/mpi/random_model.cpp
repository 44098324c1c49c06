// random_model: writes a small random multi-task model for the random
// equivalence check (run_checks.sh equiv-random).
//
//   random_model SEED MODEL.yaml REFERENCE.yaml [DATA_DIR]
//
// MODEL.yaml is a valid model of docs/spec/model.md drawn from SEED alone
// (the same seed gives the same bytes on every machine: the draws are taken
// from std::mt19937's raw output, whose sequence the C++ standard fixes).
// REFERENCE.yaml is the same model with every tensor_parallel removed: the
// 1-device reference a plan with tensor-parallel modules is compared with
// (same parameter names, so the same initial values and data). DATA_DIR,
// when given, receives training and evaluation data for the model
// (write_data below), drawn from the seed too.
//
// What it draws, all at toy sizes so that a step takes milliseconds:
//   - 2-4 encoders, each a patch_embed or token_embed, 0-2 transformer
//     layers (causal or not, of their own width 8-16), then a linear
//     adapter to the common sequence width W (8-16) when theirs differs;
//     an encoder is used by nodes of several tasks at several sequence
//     lengths (one position table of the longest);
//   - 1-2 pooling modules ([transformer_layer,] pool_project W -> D) and one
//     contrastive_loss of width D (8 or 16);
//   - 0-1 LLM-style trunks (transformer layers of width W, an optional
//     linear, lm_loss), tensor_parallel 1 or 2;
//   - 1-4 tasks, each contrastive (two pooled encoder nodes, possibly of the
//     same encoder), language modelling (one or two encoder nodes
//     concatenated into the trunk) or both at once (one encoder node read by
//     both losses); batches among 6, 8, 12 and 24 (6 and 8 do not divide by
//     every device count: the planner must choose others); weights 0.5-2.
//
// Exit 0 on success, 2 on bad usage or an unwritable file.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

class Draw {
 public:
  explicit Draw(uint32_t seed) : gen_(seed) {}
  // Uniform in [lo, hi] (hi - lo small: the modulo bias is negligible and,
  // above all, the same everywhere).
  int in(int lo, int hi) { return lo + static_cast<int>(gen_() % static_cast<uint32_t>(hi - lo + 1)); }
  bool coin() { return in(0, 1) == 1; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(in(0, static_cast<int>(v.size()) - 1))]; }

 private:
  std::mt19937 gen_;
};

struct Encoder {
  std::string name;
  std::vector<std::string> blocks;   // YAML flow maps, in order
  bool patches = false;              // patch_embed (features) or token_embed (ids)
  int size = 0;                      // in_dim, or vocab
};

// What the data files of a model must hold (write_data).
struct DataNode {
  std::string id;
  const Encoder* encoder = nullptr;
  int seq = 0;
};
struct TaskData {
  int batch = 0;
  std::vector<DataNode> nodes;   // the nodes that read data
  int lm_seq = 0;                // the lm_loss node "lm": its input's seq (0: none)
};
struct Drawn {
  std::vector<Encoder> encoders;
  std::vector<TaskData> tasks;
  int lm_vocab = 0;
};

// A transformer layer of width h with a head count that divides it (and is
// even where the module may be split over 2 tensor-parallel ranks); its MLP
// `ffn` wide, or h, 2h or 3h drawn when ffn is 0. (Draws happen in the
// order written: a chain of << is sequenced left to right since C++17.)
std::string transformer(Draw& d, int h, int repeat, bool even_heads, int ffn = 0) {
  std::vector<int> heads;
  for (int k = 1; k <= h; ++k)
    if (h % k == 0 && h / k >= 2 && (!even_heads || k % 2 == 0)) heads.push_back(k);
  std::ostringstream s;
  s << "{op: transformer_layer";
  if (repeat > 1) s << ", repeat: " << repeat;
  s << ", hidden: " << h << ", heads: " << d.pick(heads) << ", ffn: " << (ffn > 0 ? ffn : h * d.in(1, 3));
  if (d.coin()) s << ", causal: true";
  s << "}";
  return s.str();
}

std::string write_model(uint32_t seed, bool with_tp, Drawn& drawn) {
  Draw d(seed);
  const int width = d.pick(std::vector<int>{8, 12, 16});   // W: every encoder's output width
  // D: the contrastive width. Not 4: at the default temperature (0.07)
  // 4-wide embeddings gave losses so sharp that a 5th step's loss moved by
  // 1.3 times the tolerance from one summation order to another (seed 13
  // on data files; parameters within tolerance).
  const int embed = d.pick(std::vector<int>{8, 16});
  std::ostringstream y;
  y << "# random_model seed " << seed << (with_tp ? "" : " (reference: no tensor_parallel)") << "\n";
  y << "name: random-" << seed << "\ndtype: fp32\nmodules:\n";

  std::vector<Encoder>& encoders = drawn.encoders;
  encoders.assign(static_cast<size_t>(d.in(2, 4)), Encoder{});
  for (size_t i = 0; i < encoders.size(); ++i) {
    Encoder& e = encoders[i];
    e.name = "enc" + std::to_string(i);
    // Widths from 8: a LayerNorm over 4 elements of size 0.02 (the
    // embeddings' initial scale) amplified rounding so much that a
    // parameter drifted by 1e-5 from one summation order to another within
    // 5 steps (seed 6 of the first generator: one embedding row, every
    // plan alike, step 1's gradients bitwise the same).
    const int h = d.pick(std::vector<int>{8, 12, 16});
    e.patches = d.coin();
    e.size = e.patches ? d.in(2, 10) : d.in(5, 30);
    e.blocks.push_back(std::string(e.patches ? "{op: patch_embed, in_dim: " : "{op: token_embed, vocab: ") +
                       std::to_string(e.size) + ", hidden: " + std::to_string(h) + "}");
    // 0-2 transformer layers: one block of repeat 2 (one MetaOp of 2), or
    // blocks of their own (their own head counts and widths of the MLP).
    const int layers = d.in(0, 2);
    if (layers == 2 && d.coin())
      e.blocks.push_back(transformer(d, h, 2, false));
    else
      for (int l = 0; l < layers; ++l) e.blocks.push_back(transformer(d, h, 1, false));
    if (h != width)
      e.blocks.push_back("{op: linear, in: " + std::to_string(h) + ", out: " + std::to_string(width) + "}");
    y << "  " << e.name << ":\n";
    for (const std::string& b : e.blocks) y << "    - " << b << "\n";
  }
  const int pools = d.in(1, 2);
  for (int p = 0; p < pools; ++p) {
    y << "  pool" << p << ":\n";
    if (d.coin()) y << "    - " << transformer(d, width, 1, false) << "\n";
    y << "    - {op: pool_project, in: " << width << ", out: " << embed << "}\n";
  }
  y << "  clip:\n    - {op: contrastive_loss, dim: " << embed;
  if (d.coin()) y << ", temperature: " << d.pick(std::vector<std::string>{"0.1", "0.5", "1"});
  y << "}\n";
  const bool trunk = d.in(0, 2) > 0;
  const int tp = d.coin() ? 2 : 1;
  if (trunk) {
    // Width W split over tp ranks: an even head count, ffn and vocab. No
    // block of another module has the trunk's workload (its ffn 4 W, the
    // others' at most 3 W; linear W -> W nowhere else): a profile keys one
    // curve per workload, whatever the tensor_parallel (check_profile_keys).
    y << "  trunk:\n    blocks:\n";
    y << "      - " << transformer(d, width, d.in(1, 2), tp == 2, 4 * width) << "\n";
    if (d.in(0, 2) == 0) y << "      - {op: linear, in: " << width << ", out: " << width << "}\n";
    drawn.lm_vocab = 2 * d.in(4, 12);
    y << "      - {op: lm_loss, hidden: " << width << ", vocab: " << drawn.lm_vocab << "}\n";
    if (with_tp) y << "    tensor_parallel: " << tp << "\n";
  }

  y << "tasks:\n";
  const int tasks = d.in(1, 4);
  for (int t = 0; t < tasks; ++t) {
    // 0: contrastive, 1: language modelling, 2: both.
    const int kind = trunk ? d.in(0, 2) : 0;
    TaskData& data = drawn.tasks.emplace_back();
    data.batch = d.pick(std::vector<int>{6, 8, 12, 24, 24});
    y << "  - name: task" << t << "\n    batch: " << data.batch << "\n";
    if (d.in(0, 2) == 0) y << "    weight: " << d.pick(std::vector<std::string>{"0.5", "2", "1.5"}) << "\n";
    y << "    nodes:\n";
    int node = 0;
    auto encoder_node = [&]() {
      DataNode& n = data.nodes.emplace_back();
      n.id = "e" + std::to_string(node++);
      n.encoder = &d.pick(encoders);
      n.seq = d.in(1, 7);
      y << "      - {id: " << n.id << ", module: " << n.encoder->name << ", seq: " << n.seq << "}\n";
      return n.id;
    };
    auto pooled = [&](const std::string& input) {
      const std::string id = "p" + std::to_string(node++);
      y << "      - {id: " << id << ", module: pool" << d.in(0, pools - 1) << ", inputs: [" << input << "]}\n";
      return id;
    };
    std::string shared;   // kind 2: the encoder node both losses read
    if (kind != 0) {
      std::string inputs = encoder_node();
      shared = inputs;
      if (d.coin()) inputs += ", " + encoder_node();
      for (const DataNode& n : data.nodes) data.lm_seq += n.seq;
      y << "      - {id: lm, module: trunk, inputs: [" << inputs << "]}\n";
    }
    if (kind != 1) {
      const std::string a = pooled(kind == 2 ? shared : encoder_node());
      const std::string b = pooled(encoder_node());
      y << "      - {id: loss, module: clip, inputs: [" << a << ", " << b << "]}\n";
    }
  }
  return y.str();
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) std::cerr << "random_model: cannot write " << path << "\n";
  return static_cast<bool>(out);
}

// A little-endian scalar's bytes.
template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// The bits of an IEEE half of x = k / 1024 with |k| <= 1024 (exact there).
uint16_t half_bits(float x) {
  if (x == 0) return 0;
  int e = 0;
  const float m = std::frexp(std::fabs(x), &e);   // |x| = m 2^e, m in [0.5, 1)
  const auto mantissa = static_cast<uint16_t>(std::lround((2 * m - 1) * 1024));
  return static_cast<uint16_t>((x < 0 ? 0x8000 : 0) | ((e + 14) << 10) | mantissa);
}

// An .npy file (format 1.0, C order): descr e.g. "<f4", the shape, the data.
bool write_npy(const std::string& path, const std::string& descr, const std::vector<int>& shape,
               const std::string& data) {
  std::string dims;
  for (int n : shape) dims += std::to_string(n) + ",";
  if (shape.size() > 1) dims.pop_back();
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string file = "\x93NUMPY";
  file += '\x01';
  file += '\x00';
  put(file, static_cast<uint16_t>(header.size()));
  return write_file(path, file + header + data);
}

// DIR/train.yaml and DIR/eval.yaml (docs/spec/data.md) over one dataset
// directory per task and split, DIR/taskT/{train,eval}, each with S samples
// (B to 3B: epochs that wrap, samples left over): every data node's
// features (float32, float16 or uint8) or token ids (int32, int64, uint16
// or uint8), the lm_loss targets (int32 or int64, about 1 in 5 ignored:
// -1) and labels.npy (4 classes, for evaluation). About 1 task in 4 stays
// synthetic ({synthetic: true}); training shuffles or not at random.
bool write_data(uint32_t seed, const Drawn& drawn, const std::string& dir) {
  Draw d(seed ^ 0x9e3779b9u);   // not the model's draws: the model stays as it is without data
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);   // also when every task stays synthetic
  std::string train = "# random_model seed " + std::to_string(seed) + "\ntasks:\n";
  std::string eval = train;
  for (size_t t = 0; t < drawn.tasks.size(); ++t) {
    const TaskData& task = drawn.tasks[t];
    const std::string name = "task" + std::to_string(t);
    if (d.in(0, 3) == 0) {
      train += "  " + name + ": {synthetic: true}\n";
      eval += "  " + name + ": {synthetic: true}\n";
      continue;
    }
    train += "  " + name + ": {path: " + name + "/train" + (d.coin() ? "" : ", shuffle: false") + "}\n";
    eval += "  " + name + ": {path: " + name + "/eval}\n";
    for (const char* split : {"train", "eval"}) {
      const std::string folder = dir + "/" + name + "/" + split;
      std::filesystem::create_directories(folder, ec);
      const int samples = d.in(task.batch, 3 * task.batch);
      for (const DataNode& n : task.nodes) {
        std::string bytes;
        const int count = samples * n.seq * (n.encoder->patches ? n.encoder->size : 1);
        std::string descr;
        if (n.encoder->patches) {
          descr = d.pick(std::vector<std::string>{"<f4", "<f2", "|u1"});
          for (int i = 0; i < count; ++i) {
            const int k = d.in(-1024, 1024);
            if (descr == "<f4") put(bytes, static_cast<float>(k) / 1024);
            else if (descr == "<f2") put(bytes, half_bits(static_cast<float>(k) / 1024));
            else put(bytes, static_cast<uint8_t>((k + 1024) / 9));
          }
        } else {
          descr = d.pick(std::vector<std::string>{"<i4", "<i8", "<u2", "|u1"});
          for (int i = 0; i < count; ++i) {
            const int id = d.in(0, n.encoder->size - 1);
            if (descr == "<i4") put(bytes, static_cast<int32_t>(id));
            else if (descr == "<i8") put(bytes, static_cast<int64_t>(id));
            else if (descr == "<u2") put(bytes, static_cast<uint16_t>(id));
            else put(bytes, static_cast<uint8_t>(id));
          }
        }
        std::vector<int> shape{samples, n.seq};
        if (n.encoder->patches) shape.push_back(n.encoder->size);
        if (!write_npy(folder + "/" + n.id + ".npy", descr, shape, bytes)) return false;
      }
      if (task.lm_seq > 0) {
        const bool wide = d.coin();
        std::string bytes;
        for (int i = 0; i < samples * task.lm_seq; ++i) {
          const int target = d.in(0, 4) == 0 ? -1 : d.in(0, drawn.lm_vocab - 1);
          if (wide) put(bytes, static_cast<int64_t>(target));
          else put(bytes, static_cast<int32_t>(target));
        }
        if (!write_npy(folder + "/lm.targets.npy", wide ? "<i8" : "<i4", {samples, task.lm_seq}, bytes))
          return false;
      }
      std::string labels;
      for (int i = 0; i < samples; ++i) put(labels, static_cast<int64_t>(d.in(0, 3)));
      if (!write_npy(folder + "/labels.npy", "<i8", {samples}, labels)) return false;
    }
  }
  return write_file(dir + "/train.yaml", train) && write_file(dir + "/eval.yaml", eval);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: random_model SEED MODEL.yaml REFERENCE.yaml [DATA_DIR]\n";
    return 2;
  }
  char* end = nullptr;
  const unsigned long seed = std::strtoul(argv[1], &end, 10);
  if (*argv[1] == '\0' || *end != '\0' || seed > UINT32_MAX) {
    std::cerr << "random_model: SEED must be an integer in [0, 2^32)\n";
    return 2;
  }
  const auto s = static_cast<uint32_t>(seed);
  Drawn drawn, again;
  const bool ok = write_file(argv[2], write_model(s, true, drawn)) && write_file(argv[3], write_model(s, false, again)) &&
                  (argc == 4 || write_data(s, drawn, argv[4]));
  return ok ? 0 : 2;
}
