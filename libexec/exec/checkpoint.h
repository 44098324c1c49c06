// Checkpoints of training state, saved by parameter, not by rank
// (docs/runtime.md, "Checkpoints and resume").
//
// A checkpoint is a directory DIR/step-NNNNNN (6+ digits, the steps done)
// holding
//   manifest.json  {"format": "spindle-checkpoint", "version": 1, "step": S,
//                   "model": {"name", "sha256"}, "plan": {"sha256",
//                   "strategy", "devices"}, "seed": K, "data": {"next_step":
//                   S + 1, "samples": {TASK: n}}, "optimizer":
//                   {"name": "adamw", "lr", "beta1", "beta2", "eps",
//                   "weight_decay", "steps": {TENSOR: n}}, "files": {FILE:
//                   {"sha256", "bytes"}}}
//   params.bin     every parameter tensor, full (TP shards reassembled)
//   adam_m.bin     AdamW first moments, same names and shapes
//   adam_v.bin     AdamW second moments
// A tensor file (all integers and floats little-endian):
//   header  8 bytes magic "SPNDLTF\0", u32 version (1), u32 0, u64 count
//   count records, names in ascending byte order:
//           u32 name bytes, name (UTF-8), u32 rank, rank x i64 dims,
//           product(dims) x f32 values (row-major)
//   nothing after the last record.
// The data position is the step alone (step s reads batch s - 1 of every
// task, whether synthetic or from files: libexec/data/dataset.h), so the
// seed and step restore it; "data" records it for readers, and, from runs
// with --data, "data": {"tasks": {TASK: {"source": "npy", "dir",
// "samples" (S), "batches_per_epoch", "shuffle", "next_batch", "epoch",
// "batch_in_epoch"}}} ({"source": "synthetic", "next_batch"} for synthetic
// tasks), by which a resumed run sees whether a dataset changed. The key is
// optional: manifests without it (older builds, synthetic runs) read as
// before, and builds that do not know it ignore it. So is
// "optimizer": {"lr_schedule": {"decay", "warmup_steps", "decay_steps",
// "min_lr"}} (optim/lr_schedule.h; "lr" is its peak): without it, constant;
// and "optimizer": {"clip_grad"} (spindle-run --clip-grad): without it, 0;
// and "optimizer": {"weight_decay_1d"} (false: --no-weight-decay-1d):
// without it, true.
//
// Writing: into DIR/step-NNNNNN.tmp.PID.K (the folder and its files get
// the permissions the umask gives), every file fsynced, then renamed to
// DIR/step-NNNNNN; a crash mid-write leaves only a *.tmp.* directory,
// which readers ignore. A tensor at a time (CheckpointWriter), each file
// by its own rank (checkpoint_file_rank): no rank holds the model's whole
// state, nor one parameter's (on 3 ranks or more). Reading verifies every file's size and
// SHA-256 against the manifest, a chunk at a time as it decodes, and
// returns nothing of a file whose hash differs; a reader may keep only
// the tensors it asks for (load_checkpoint's `wanted`). A resuming run
// splits the hashing over its ranks (verify_checkpoint_files), each file
// read whole by one rank.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libexec/optim/lr_schedule.h"
#include "libexec/tensor.h"
#include "libplan/util/status.h"

namespace spindle::exec {

// One parameter tensor's full training state.
struct TensorState {
  Tensor value, m, v;      // full shape (no TP split), fp32
  int64_t adam_steps = 0;  // AdamW steps taken (bias correction)
  // Part `p`: 0 value, 1 m, 2 v, the order of the tensor files
  // (checkpoint_file(p)) and of Executor::gather_state's parts.
  Tensor& part(int p) { return p == 0 ? value : p == 1 ? m : v; }
  const Tensor& part(int p) const { return p == 0 ? value : p == 1 ? m : v; }
};

// How far the tensor-parallel copies of replicated tensors (LayerNorm
// gains and biases, row-parallel biases: every rank of a TP group holds the
// whole tensor) are from TP rank 0's, which a checkpoint keeps. Each copy
// is stepped by its own holders, with a gradient summed over the devices
// that hold that copy; where a plan places TP rank 0's copies on other
// devices than rank 1's, the same contributions are summed in other
// groupings and would drift apart by rounding, but every step ends with
// the programs' copy exchange, which sets them to TP rank 0's values
// (where they do not step alike anyway: docs/runtime.md,
// "Tensor-parallel copies"). So any difference here is a defect.
struct ReplicaDrift {
  int tensors = 0;         // replicated tensors with a copy that differs from TP rank 0's
  int64_t values = 0;      // values that differ, over those copies
  double max_relative = 0; // the largest |copy - rank 0's| / max(|rank 0's|, 1e-30)
  std::string worst;       // the tensor that holds it, "M/k.r/<tensor>"
};

// Everything a run needs to continue: full tensors by name "M/k.r/<tensor>".
struct TrainingState {
  int64_t step = 0;  // steps done
  std::map<std::string, TensorState> tensors;
  ReplicaDrift drift;  // Executor::gather_state only; not saved
};

// What the manifest says besides the tensors.
struct CheckpointMeta {
  int64_t step = 0;
  std::string model_name, model_sha256;
  std::string plan_sha256, plan_strategy;
  int plan_devices = 1;   // "plan"."devices": 1..10^6
  uint64_t seed = 0;
  // "data"."samples": the samples each task has read in steps 1..step,
  // counted from a base: task_samples[task] read by step samples_step
  // (from the checkpoint a run resumed from; empty and 0 for a fresh run),
  // plus task_batch[task] (this run's batch) for each step since. A run
  // that resumes with another batch so counts what was really read.
  // Reading a manifest sets task_samples and samples_step to its own.
  std::map<std::string, int64_t> task_batch;    // task -> this run's batch
  std::map<std::string, int64_t> task_samples;  // task -> samples read by samples_step
  int64_t samples_step = 0;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  // The learning-rate schedule (its max_lr is `lr`): "optimizer"."lr_schedule"
  // in the manifest; a manifest without it (older builds) reads as
  // constant.
  LrSchedule lr_schedule;
  // Gradient clipping's bound (ExecOptions::clip_grad; 0: none):
  // "optimizer"."clip_grad", 0 when absent (older builds).
  double clip_grad = 0;
  // Weight decay on 1-D tensors too (ExecOptions::decay_1d):
  // "optimizer"."weight_decay_1d", true when absent.
  bool decay_1d = true;
  nlohmann::json data_tasks = nlohmann::json::object();  // "data"."tasks" (empty: not written)
};

// The most samples a checkpoint counts: "data"."samples" summed over its
// tasks (2^62; docs/hardening.md). A manifest past it is refused, and so
// is a run whose checkpoints would pass it (check_samples_fit), so the
// counts, their sum and one run's additions (batch <= 10^9 times fewer
// than 2^31 steps per task) all stay inside int64_t.
inline constexpr int64_t kMaxCheckpointSamples = int64_t{1} << 62;

// The samples each task of `meta` has read in steps 1..`step` (step >=
// meta.samples_step): "data"."samples" of a checkpoint at that step, and
// summed, the step line's "consumed samples". A count past INT64_MAX
// stays at INT64_MAX (never within check_samples_fit's bound).
std::map<std::string, int64_t> samples_read(const CheckpointMeta& meta, int64_t step);

// Whether samples_read(meta, last_step), summed over the tasks, stays
// within kMaxCheckpointSamples: "" or the error, naming `manifest` (the
// checkpoint resumed from; "" for a fresh run) and its "data"."samples", or
// --steps.
std::string check_samples_fit(const CheckpointMeta& meta, int64_t last_step, const std::string& manifest);

// One tensor a checkpoint holds: its full shape, AdamW step count, and
// where its values are in params.bin, adam_m.bin and adam_v.bin.
struct CheckpointTensor {
  Shape shape;
  int64_t adam_steps = 0;
  uint64_t offset[3] = {0, 0, 0};
};

struct Checkpoint {
  std::string path;  // the step directory
  CheckpointMeta meta;
  // Every tensor the checkpoint holds, whether or not `state` holds its
  // values (load_checkpoint's `wanted`, read_checkpoint_tensors).
  std::map<std::string, CheckpointTensor> index;
  uint64_t file_bytes[3] = {0, 0, 0};   // params.bin, adam_m.bin, adam_v.bin, as verified
  std::string file_sha256[3];           // ... and their SHA-256, the manifest's
  // The values read: every tensor, or those asked for.
  TrainingState state;
};

// Tensor file encoding (header comment); decode errors name `path`.
std::string encode_tensors(const std::map<std::string, Tensor>& tensors);
plan::Result<std::map<std::string, Tensor>> decode_tensors(const std::string& bytes,
                                                           const std::string& path);

// "step-000006" for step 6.
std::string checkpoint_name(int64_t step);

// The lock file a run keeps in its checkpoint folder (CheckpointLock).
inline constexpr const char* kCheckpointLockFile = ".spindle-run.lock";

// Whether `name`, an entry directly in a checkpoint folder, is one the
// runtime may write, replace or remove there, so that no output of any
// program may take it: any name starting "step-" (checkpoints, their
// *.tmp.* leftovers, and names the steps to come take) and the lock file.
inline bool is_checkpoint_entry(const std::string& name) {
  return name.rfind("step-", 0) == 0 || name == kCheckpointLockFile;
}

// The step of `name` when it is exactly checkpoint_name(step) (a complete
// checkpoint's folder name: "step-000006"), or of the checkpoint a
// leftover of a save names ("step-000006.tmp.PID.K" or ".tmp.oldPID"),
// with `leftover` set; -1 for any other name (a user's "step-1",
// "step-2020" or "step-000006.tmp.my-backup" is none).
int64_t checkpoint_step_of(const std::string& name, bool* leftover = nullptr);

// `path` with "." and ".." resolved and no trailing separator, lexically
// (no link followed): filename() is the folder's own name ("ck/step-000002/"
// gives step-000002), parent_path() the folder holding it.
std::filesystem::path lexical_folder(const std::string& path);

// Ok when every value, m and v of `state` is finite; else an error naming
// the first tensor, part and element that is not (inf or nan: training
// diverged, e.g. a gradient too large for fp32, whose square made v inf).
plan::Status check_state_finite(const TrainingState& state);

// Writes the checkpoint of `state` (step = meta.step) into `dir` (created
// if missing) atomically as above, then removes all but the newest `keep`
// complete checkpoints and any *.tmp.* leftovers of steps up to this one.
// A checkpoint of the same step already there is replaced. Returns the step
// directory's path; on error nothing complete is changed. A state that is
// not finite (check_state_finite) is refused before anything is written: no
// checkpoint holds a diverged run, so resuming from the newest one starts
// before the divergence.
// `warning` (optional): set when an older checkpoint could not be pruned
// (the save itself succeeded; the folder keeps more than `keep`).
plan::Result<std::string> save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                                          const TrainingState& state, int keep, std::string* warning = nullptr);

// The tensor files of a checkpoint, in their order: params.bin, adam_m.bin,
// adam_v.bin (checkpoint_file(f), f < kCheckpointFiles).
inline constexpr int kCheckpointFiles = 3;
const char* checkpoint_file(int f);

// The rank of `ranks` that writes tensor file `f` at a save
// (CheckpointWriter::begin on rank 0 for its own, join on the others) and
// checks its SHA-256 when a run resumes (verify_checkpoint_files):
// f * ranks / 3, so that on three ranks or more each file is written, and
// read whole, by one rank, those ranks spread over the run (on different
// nodes, placed by blocks), rather than one rank writing, or every rank
// reading, the three files. Rank 0 always has params.bin.
int checkpoint_file_rank(int f, int ranks);
// Which of the three files rank `rank` of `ranks` writes and verifies.
std::array<bool, kCheckpointFiles> checkpoint_files_of(int rank, int ranks);

// A checkpoint written a tensor at a time, into the files and folder
// save_checkpoint writes: spindle-run's saves, where no rank holds the
// model's state (Executor::gather_state's sink). The tensor files are laid
// out first (every record's head in place), each tensor's values written
// at their offsets as they come, in any order, and the files hashed by
// reading them back when all are in. The three files may be written by
// writers on different ranks: one begin()s the save (its folder, the
// layout, the files it writes) and finish()es it; the others join() it
// for their files and close_files() before it finishes, their hashes
// handed to finish().
class CheckpointWriter {
 public:
  // Starts the checkpoint of `meta.step` in `dir` (created if missing): its
  // temporary folder (DIR/step-N.tmp.PID.K) and the three tensor files laid
  // out for `shapes` (every tensor it will hold, by name, full shapes);
  // this writer writes the values of the files `files` marks. Error names
  // what could not be made; its temporary folder is removed then (`dir`,
  // when made, stays, as save_checkpoint leaves it).
  static plan::Result<CheckpointWriter> begin(const std::string& dir, const CheckpointMeta& meta,
                                              const std::map<std::string, Shape>& shapes,
                                              const std::array<bool, kCheckpointFiles>& files = {true, true, true});
  // Joins the save whose begin()'s writer made `temp_dir` (its temp_dir(),
  // from another rank) to write the values of the files `files` marks
  // there, laid out as begin laid them out for the same `shapes`. A joined
  // writer never removes the folder; its errors name `temp_dir`.
  static plan::Result<CheckpointWriter> join(const std::string& temp_dir, const CheckpointMeta& meta,
                                             const std::map<std::string, Shape>& shapes,
                                             const std::array<bool, kCheckpointFiles>& files);
  CheckpointWriter(CheckpointWriter&& o) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&& o) noexcept;
  // Closes its files; begin()'s writer also removes the temporary folder
  // unless finish put it in place.
  ~CheckpointWriter();

  // Writes one tensor's parts into the files this writer writes (value
  // into params.bin, m into adam_m.bin, v into adam_v.bin). An error (a
  // name not in the layout or added before, another shape, a part that is
  // not finite: check_state_finite's message, after meta.step, or a write
  // that failed) ends the save: later adds return it, and so does finish.
  plan::Status add(const std::string& name, const TensorState& state);
  // The same for one part: `values` of tensor `name` into file `file`
  // (0 params.bin, 1 adam_m.bin, 2 adam_v.bin), which this writer writes;
  // `adam_steps` its AdamW step count (for the manifest).
  plan::Status add_part(const std::string& name, int file, const Tensor& values, int64_t adam_steps);
  // The temporary folder while the save is in progress ("" after finish).
  const std::string& temp_dir() const { return tmp_; }
  // Once every tensor of the layout was added to each file this writer
  // writes: those files fsynced, closed and hashed ({FILE: {"sha256",
  // "bytes"}}, the manifest's "files" entries). A joined writer's last
  // call; finish calls it for begin()'s writer.
  plan::Result<nlohmann::json> close_files();
  // begin()'s writer, once every tensor of the layout was added to its
  // files and the joined writers closed theirs (`joined`: their
  // close_files() merged): its files fsynced and hashed, the manifest
  // written, the folder renamed into place and the checkpoints pruned as
  // save_checkpoint says (`keep`, `warning`). Returns the step folder's
  // path.
  plan::Result<std::string> finish(int keep, std::string* warning = nullptr,
                                   const nlohmann::json& joined = nlohmann::json::object());

 private:
  CheckpointWriter() = default;
  void abandon();   // closes the files, removes the temporary folder when it is this writer's
  void lay_out(const std::map<std::string, Shape>& shapes);   // slots_, file_bytes_
  struct Slot {
    Shape shape;
    uint64_t offset = 0;   // of its values, in each of the three files
  };
  std::string dir_, final_dir_, tmp_;
  bool owns_tmp_ = false;                  // begin()'s writer: removes the folder, finishes
  CheckpointMeta meta_;
  std::map<std::string, Slot> slots_;
  std::array<bool, kCheckpointFiles> mine_{};   // the files this writer writes
  std::set<std::string> written_[kCheckpointFiles];
  std::map<std::string, int64_t> steps_;   // the tensors added: AdamW steps
  uint64_t file_bytes_ = 0;                // each file's size (the three have one layout)
  int fd_[kCheckpointFiles] = {-1, -1, -1};
  std::string error_;
};

// Step numbers of the complete checkpoints in `dir` (names step-N, no
// ".tmp."), ascending; empty when none or `dir` is missing.
std::vector<int64_t> list_checkpoints(const std::string& dir);

// Removes every checkpoint in `dir` (the directories checkpoint_step_of
// names: complete checkpoints and leftovers of saves), nothing else, but
// the folder `except` names (a save in progress: CheckpointWriter::temp_dir);
// for a fresh run told to overwrite another run's checkpoints. Error names
// what could not be removed.
plan::Status remove_checkpoints(const std::string& dir, const std::string& except = "");

// An advisory lock on a checkpoint folder (flock on DIR/.spindle-run.lock,
// which holds "pid P on host H since TIME" of its holder), taken by one
// run's rank 0 before it reads or writes the folder and held until the
// object is destroyed or the process ends (a killed process releases it).
// Two runs writing one folder (a job resumed while the old one still runs,
// a second launch of the same command) each pruned the other's checkpoints
// (--keep) and left two runs' steps interleaved in it.
class CheckpointLock {
 public:
  CheckpointLock() = default;
  CheckpointLock(CheckpointLock&& o) noexcept;
  CheckpointLock& operator=(CheckpointLock&& o) noexcept;
  ~CheckpointLock();
  // Empty when the lock is held; else why the filesystem could not lock
  // (flock unsupported, e.g. Lustre mounted without -o flock): the run goes
  // on unlocked and says so.
  const std::string& unlocked_reason() const { return unlocked_; }

 private:
  friend plan::Result<CheckpointLock> lock_checkpoint_dir(const std::string& dir);
  void release();   // tidies the folder as the destructor says, then unlocks
  int fd_ = -1;
  std::string dir_;
  bool made_dir_ = false;     // this lock made the folder: removed again if left empty
  std::string made_from_;     // the outermost folder it made for it (dir_ or a parent), removed too if empty
  std::string unlocked_;
};

// Creates `dir` if missing and locks it (CheckpointLock). Error when
// another process holds the lock (naming it, from the lock file) or the
// lock file cannot be made.
plan::Result<CheckpointLock> lock_checkpoint_dir(const std::string& dir);

// Reads DIR/step-N's manifest (refused as load_checkpoint refuses it) and
// checks the size and SHA-256 of each tensor file `files` marks, reading
// it whole, a chunk at a time. Errors name the file.
plan::Status verify_checkpoint_files(const std::string& step_dir, const std::array<bool, kCheckpointFiles>& files);

// Reads and verifies DIR/step-N: manifest format and version, every file's
// size and SHA-256, tensor files, and that params/m/v name the same tensors
// with the same shapes. Errors name the offending file. Every tensor goes
// into Checkpoint::index; the values of those `wanted` names (every one
// when null) into Checkpoint::state. The files are read once, a chunk at a
// time: what a rank holds of them is what it asked for (a rank resuming
// a large model keeps its own parameters, not the model's three times
// over). Without `hash` the files are checked by size alone and read only
// where the parser reads (the records' heads and the values wanted): for
// files whose SHA-256 was checked by verify_checkpoint_files (spindle-run:
// each by one rank, checkpoint_file_rank).
plan::Result<Checkpoint> load_checkpoint(const std::string& step_dir,
                                         const std::set<std::string>* wanted = nullptr, bool hash = true);

// The values of the tensors `names` gives that `ck` (loaded by
// load_checkpoint) holds and `ck.state` does not yet, read from its files
// at the offsets its index has (each file first checked to have the size
// it was verified with), into ck.state. Names the checkpoint lacks are
// left out (a re-planned model's new tensors). `values_only`: each
// tensor's value alone, m and v left empty (a reader of the parameters:
// spindle-export; a later call does not read their m and v either, since
// ck.state then holds them). The files are checked by size only here:
// the folder is the run's own (its lock, CheckpointLock) from their
// verification on. Errors name the file.
plan::Status read_checkpoint_tensors(Checkpoint& ck, const std::set<std::string>& names, bool values_only = false);

// Every tensor's value in params.bin of `ck` (loaded by load_checkpoint,
// hashed or not), given to `each` in the file's order (ascending names,
// the index's) as it is read, the file read once, a chunk at a time, and
// its SHA-256 checked against the manifest's as it is read: the values
// given are the very bytes checked (spindle-export writes them as they
// come). An error from `each` ends the read and is returned; a file whose
// hash differs (or whose records are not those indexed) is an Error
// naming it, returned after the values were given, which the caller then
// discards.
plan::Status stream_checkpoint_values(
    const Checkpoint& ck, const std::function<plan::Status(const std::string& name, const Tensor& values)>& each);

}  // namespace spindle::exec
