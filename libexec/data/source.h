// Where a step's input rows come from (docs/spec/data.md).
//
// The executor asks a DataSource for the rows of one node's input that this
// device holds, for one batch: batch b (0-based; training step s reads
// batch s - 1) of task T is T's B samples chosen by the source's sampling,
// row r the r-th of them; a device holds rows [rows.begin, rows.end) as the
// runtime defines (data-parallel group g of G holds [g B/G, (g+1) B/G)). A
// value depends only on (source, task, node, batch, row), never on the plan
// or the device count.
//
// Two implementations: SyntheticSource (below; the default without --data)
// and FileSource (dataset.h, .npy files). A second file format joins by
// implementing load() for its files.
//
// Errors: bad values (a token id out of range, a NaN feature) are found
// when rows are read: prepare() returns them as a message naming the file,
// the sample and the value, so that every rank can agree to stop before
// the step (spindle-run); read() of rows not prepared throws DataError.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "libexec/tensor.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"

namespace spindle::exec {

// What a node reads.
enum class DataKind {
  features,  // patch_embed input: [rows, seq, width] fp32, width = in_dim
  tokens,    // token_embed input: [rows, seq] ids as fp32, width = vocab
  targets,   // lm_loss targets: [rows, seq] ids as fp32, or -1 (ignored); width = vocab
  labels,    // class per sample: [rows] as fp32 (evaluation; absent: empty tensor)
};

// One node's rows of one batch.
struct DataRead {
  int task = 0;              // model task index
  std::string task_name;
  std::string node;          // node id (the file name stem)
  std::string module;        // the node's module (synthetic data depends on it)
  DataKind kind = DataKind::features;
  int64_t seq = 0;           // tokens per sample (0 for labels)
  int64_t width = 0;         // in_dim, or vocab for ids (0 for labels)
  int64_t batch = 0;         // task batch B
  int64_t row_begin = 0, row_end = 0;  // rows of the batch, [begin, end)

  int64_t rows() const { return row_end - row_begin; }
  auto key() const { return std::tie(task, node, kind, row_begin, row_end); }
};

// The read operator `op` of `model` makes, rows [0, B): features for a
// patch_embed, tokens for a token_embed (the module's first block, so the
// node's first operator), targets for an lm_loss. False when it reads none.
bool op_data_read(const plan::Model& model, const plan::Operator& op, DataRead* out);

// A bad value or a file problem met while reading (message names the file).
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class DataSource {
 public:
  virtual ~DataSource() = default;

  // Reads every entry of `reads` for batch `batch` now, checking values, and
  // keeps the tensors for read(). Returns "" or the first error's message.
  // Drops what an earlier prepare() kept. Local (no communication).
  std::string prepare(const std::vector<DataRead>& reads, int64_t batch);

  // The rows `r` of batch `batch`, in host memory: the prepared tensor when
  // prepare() read it, else read now (throws DataError on a bad value).
  Tensor read(const DataRead& r, int64_t batch);

  // Drops what prepare() kept, once the step or evaluation that read it is
  // done: a batch is not held into the steps after it.
  void release();

  // Whether lm_loss targets of task `task` may hold -1 (ignored positions):
  // the loss's denominator then needs the whole batch's count.
  virtual bool may_ignore_targets(int task) const = 0;

 protected:
  // Reads the rows; throws DataError naming the file, sample and value.
  virtual Tensor load(const DataRead& r, int64_t batch) = 0;

 private:
  int64_t prepared_batch_ = -1;
  std::map<std::tuple<int, std::string, DataKind, int64_t, int64_t>, Tensor> prepared_;
};

// The synthetic data of data.h (exec/data.h): sample j of batch b is global
// sample b * B + j of the task's stream. `stream` separates evaluation
// samples from training samples (0: training). `threads` (>= 1) host
// threads draw each read; the values do not depend on it.
class SyntheticSource final : public DataSource {
 public:
  explicit SyntheticSource(uint64_t seed, uint64_t stream = 0, int threads = 1)
      : seed_(seed), stream_(stream), threads_(threads) {}
  bool may_ignore_targets(int) const override { return false; }

 protected:
  Tensor load(const DataRead& r, int64_t batch) override;

 private:
  uint64_t seed_, stream_;
  int threads_;
};

}  // namespace spindle::exec
