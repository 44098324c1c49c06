// Training and evaluation data from files (docs/spec/data.md): the
// DATA.yaml reader, the sampling of a task's batches, and FileSource, the
// DataSource over one file per data-reading node (SampleFile, sample_file.h:
// .npy today).
//
// Sampling. Task T with batch B over S samples has k = floor(S / B)
// batches per epoch (drop last: the S - k B samples left over in an epoch
// are not read). Batch b (0-based; training step s reads batch s - 1)
// belongs to epoch e = floor(b / k) and takes positions (b mod k) B ..
// (b mod k) B + B - 1 of epoch e's order; row r of the batch is sample
// order_e[(b mod k) B + r]. The order is the identity with shuffle: false,
// else epoch_order(seed, T, e, S) below. Nothing depends on the plan, the
// device count or what earlier batches read, so a run resumed at step s on
// any plan reads batch s next: the checkpoint's step is the data position
// (checkpoint.h records the per-task epoch and batch for readers).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "libexec/data/sample_file.h"
#include "libexec/data/source.h"
#include "libplan/model/model.h"
#include "libplan/util/status.h"

namespace spindle::exec {

// One task's entry of DATA.yaml.
struct TaskDataSpec {
  bool synthetic = false;
  std::string dir;     // dataset directory (DATA.yaml's folder joined with `path`)
  bool shuffle = true; // default true for training, false for --eval-data
};

// A DATA.yaml: every model task, by model task index.
struct DataSpec {
  std::string path, sha256;          // the file and its bytes' SHA-256
  std::vector<TaskDataSpec> tasks;   // model task order
};

// Parses DATA.yaml text. `eval` picks the shuffle default (false). Errors
// name the file, the key, line and column: not a map, unknown keys, a task
// the model lacks, a model task missing, path and synthetic both or
// neither. Relative paths are relative to `path`'s folder.
plan::Result<DataSpec> parse_data_spec(const std::string& text, const std::string& path, const plan::Model& model,
                                       bool eval);
plan::Result<DataSpec> load_data_spec(const std::string& path, const plan::Model& model, bool eval);

// Epoch `epoch`'s order of `samples` samples of task `task` (shuffle:
// true): the Fisher-Yates shuffle, for i = S-1 down to 1, of swap(p[i],
// p[j]) with j = floor(u_i (i + 1) / 2^64) (the high 64 bits of the
// 128-bit product), starting from p = 0, 1, ..., S-1, where
//   key = splitmix64(seed ^ splitmix64(fnv1a64("data/shuffle/" + task) ^ splitmix64(epoch)))
//   u_i = splitmix64(key + i)             (all arithmetic mod 2^64)
// and splitmix64, fnv1a64 are rng.h's splitmix64 and hash_name. Depends on
// (seed, task, epoch, S) alone.
std::vector<int64_t> epoch_order(uint64_t seed, const std::string& task, int64_t epoch, int64_t samples);

// Where batch `batch` of a task with `per_epoch` batches per epoch is.
struct BatchPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // batch within the epoch, 0 .. per_epoch-1
};
BatchPosition batch_position(int64_t batch, int64_t per_epoch);

// One task's files as FileSource reads them.
struct TaskFiles {
  bool synthetic = false;
  std::string dir;
  bool shuffle = true;
  int64_t samples = 0;            // S (0 when synthetic)
  int64_t batch = 0;              // B
  int64_t per_epoch = 0;          // k = floor(S / B)
  bool has_targets = false;       // some lm_loss node reads targets
  bool has_labels = false;        // labels.npy present
};

class FileSource final : public DataSource {
 public:
  // Opens and checks, for every task that is not synthetic, every file its
  // nodes read (ID.npy per patch_embed / token_embed node, ID.targets.npy
  // per lm_loss node, labels.npy when present): the header, the dtype
  // against the node's kind, the shape against the model (both printed),
  // the same S in every file of the task, S >= B. Errors name the file.
  // Values are checked when read (DataSource::prepare). `seed` drives the
  // shuffle and the synthetic tasks; `synthetic_stream` as SyntheticSource.
  static plan::Result<std::unique_ptr<FileSource>> open(const DataSpec& spec, const plan::Model& model,
                                                       uint64_t seed, uint64_t synthetic_stream = 0);

  bool may_ignore_targets(int task) const override;
  const TaskFiles& task(int t) const { return tasks_[static_cast<size_t>(t)]; }
  // The path of every file it opened (inputs no output may overwrite).
  std::vector<std::string> paths() const;
  int tasks() const { return static_cast<int>(tasks_.size()); }
  // Sample index of row `row` of batch `batch` of task `t` (not synthetic).
  int64_t sample_of(int t, int64_t batch, int64_t row);

 protected:
  Tensor load(const DataRead& r, int64_t batch) override;

 private:
  FileSource(uint64_t seed, uint64_t stream) : seed_(seed), synthetic_(seed, stream) {}
  const SampleFile& file(int task, const std::string& stem) const;

  const plan::Model* model_ = nullptr;
  uint64_t seed_;
  SyntheticSource synthetic_;
  std::vector<TaskFiles> tasks_;
  // (task, file stem) -> file; several tasks may open one file.
  std::map<std::pair<int, std::string>, std::unique_ptr<SampleFile>> files_;
  std::map<int, std::pair<int64_t, std::vector<int64_t>>> order_cache_;  // task -> (epoch, order)
};

// The tasks (model task indices, ascending) whose evaluation data is their
// training data: the same dataset folder (device and inode, so another
// spelling or a link to it counts) in `train` and `eval`. Evaluating there
// measures the samples trained on, not unseen ones: the train split named
// twice is a common slip. Synthetic tasks never count.
std::vector<int> tasks_evaluated_on_training_data(const FileSource& train, const FileSource& eval);

// The tasks (model task indices, ascending) for which `batches` evaluation
// batches (--eval-batches) are more than one pass over their samples
// (TaskFiles::per_epoch batches a pass): the batches after a pass repeat
// samples already evaluated, which then count twice in the figures.
// Synthetic tasks never count.
std::vector<int> tasks_evaluated_past_one_pass(const FileSource& eval, int64_t batches);

}  // namespace spindle::exec
