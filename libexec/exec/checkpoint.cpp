#include "libexec/exec/checkpoint.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "libplan/io/json_reader.h"
#include "libplan/util/files.h"
#include "libplan/util/limits.h"
#include "libplan/util/units.h"

namespace spindle::exec {

namespace fs = std::filesystem;
using plan::Error;
using plan::Result;

// The files are written with memcpy of native integers and floats.
static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian");

std::string checkpoint_name(int64_t step);

namespace {

constexpr char kMagic[8] = {'S', 'P', 'N', 'D', 'L', 'T', 'F', '\0'};
constexpr uint32_t kTensorFileVersion = 1;
constexpr int kManifestVersion = 1;
constexpr uint32_t kMaxRank = 8;
const char* const kFiles[] = {"params.bin", "adam_m.bin", "adam_v.bin"};
const char* const kLockFile = kCheckpointLockFile;

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// Where the parser of tensor files (parse_tensors) takes its bytes from,
// once each and in order: a string in memory (decode_tensors) or a file
// read a chunk at a time and hashed as it is read (load_checkpoint), so
// that a file as large as the model is never held whole.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // The next n bytes into dst, or past them when dst is null; false (and
  // nothing taken) when fewer than n are left.
  virtual bool take(void* dst, uint64_t n) = 0;
  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }

 protected:
  uint64_t pos_ = 0, size_ = 0;
};

class StringSource : public ByteSource {
 public:
  explicit StringSource(const std::string& bytes) : bytes_(bytes) { size_ = bytes.size(); }
  bool take(void* dst, uint64_t n) override {
    if (n > size_ - pos_) return false;
    if (dst) std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }

 private:
  const std::string& bytes_;
};

// An open file descriptor, closed with its scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// `n` bytes of `fd` at `offset` written from `bytes` (pwrite) or, with
// `read`, read into it (pread), whole, through partial transfers and
// EINTR: 0, errno, or -1 for a transfer of nothing (the end of the file).
int transfer_at(int fd, bool read, void* bytes, uint64_t n, uint64_t offset) {
  char* p = static_cast<char*>(bytes);
  while (n > 0) {
    const size_t chunk = std::min<uint64_t>(n, uint64_t{1} << 30);
    const ssize_t done =
        read ? ::pread(fd, p, chunk, static_cast<off_t>(offset)) : ::pwrite(fd, p, chunk, static_cast<off_t>(offset));
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return done < 0 ? errno : -1;
    p += done;
    n -= static_cast<uint64_t>(done);
    offset += static_cast<uint64_t>(done);
  }
  return 0;
}
// transfer_at's write (pwrite leaves `bytes` as they are): 0 or errno.
int pwrite_all(int fd, const void* bytes, uint64_t n, uint64_t offset) {
  const int err = transfer_at(fd, false, const_cast<void*>(bytes), n, offset);
  return err < 0 ? EIO : err;
}

// A file of `size` bytes (fstat's) on `fd`, read kChunk bytes at a time,
// every byte read fed to a SHA-256.
class ChunkedFileSource : public ByteSource {
 public:
  ChunkedFileSource(int fd, uint64_t size) : fd_(fd) { size_ = size; }
  bool take(void* dst, uint64_t n) override {
    if (n > size_ - pos_) return false;
    char* out = static_cast<char*>(dst);
    while (n > 0) {
      if (at_ == got_ && !refill()) return false;
      const uint64_t k = std::min<uint64_t>(n, got_ - at_);
      if (out) {
        std::memcpy(out, buf_.data() + at_, k);
        out += k;
      }
      at_ += k;
      pos_ += k;
      n -= k;
    }
    return true;
  }
  // The SHA-256 of the whole file, what the parser left unread included
  // (read now): "" when it could not be read to its end (read_error()).
  std::string hash_to_end() {
    while (refill()) {
    }
    return read_error_.empty() ? sha_.hex_digest() : "";
  }
  const std::string& read_error() const { return read_error_; }

 private:
  static constexpr size_t kChunk = size_t{4} << 20;
  bool refill() {
    buf_.resize(kChunk);
    ssize_t got = 0;
    do got = ::read(fd_, buf_.data(), buf_.size());
    while (got < 0 && errno == EINTR);
    if (got < 0) read_error_ = std::strerror(errno);
    if (got <= 0) return false;
    sha_.update(buf_.data(), static_cast<size_t>(got));
    got_ = static_cast<uint64_t>(got);
    at_ = 0;
    return true;
  }
  int fd_;
  std::vector<char> buf_;
  uint64_t at_ = 0, got_ = 0;   // the unread part of buf_: [at_, got_)
  plan::Sha256 sha_;
  std::string read_error_;
};

// A file of `size` bytes on `fd`, read only where the parser reads (pread,
// kWindow bytes at a time): what it skips is never read. A tensor file
// whose SHA-256 another rank checks (verify_checkpoint_files), indexed
// from its records' heads alone.
class PreadSource : public ByteSource {
 public:
  PreadSource(int fd, uint64_t size) : fd_(fd) { size_ = size; }
  bool take(void* dst, uint64_t n) override {
    if (n > size_ - pos_) return false;
    if (dst) {
      char* out = static_cast<char*>(dst);
      if (n > kWindow) {
        if (!read_at(out, n, pos_)) return false;
      } else {
        if (pos_ < window_at_ || pos_ + n > window_at_ + window_.size()) {
          window_.resize(std::min<uint64_t>(kWindow, size_ - pos_));
          window_at_ = pos_;
          if (!read_at(window_.data(), window_.size(), pos_)) {
            window_.clear();
            return false;
          }
        }
        std::memcpy(out, window_.data() + (pos_ - window_at_), n);
      }
    }
    pos_ += n;
    return true;
  }
  const std::string& read_error() const { return read_error_; }

 private:
  static constexpr uint64_t kWindow = uint64_t{64} << 10;
  bool read_at(char* out, uint64_t n, uint64_t offset) {
    const int err = transfer_at(fd_, true, out, n, offset);
    if (err != 0) read_error_ = err < 0 ? "end of file at byte " + std::to_string(offset) : std::strerror(err);
    return err == 0;
  }
  int fd_;
  std::vector<char> window_;
  uint64_t window_at_ = 0;   // the file offset of window_[0]
  std::string read_error_;
};

// The directories in `dir` that checkpoint_step_of names, by step:
// complete checkpoints or (`leftovers`) leftovers of saves.
std::vector<std::pair<int64_t, fs::path>> scan(const std::string& dir, bool leftovers) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  plan::list_folder(dir, entries);   // a folder that cannot be listed holds no checkpoint
  for (const fs::directory_entry& e : entries) {
    bool leftover = false;
    const int64_t step = checkpoint_step_of(e.path().filename().string(), &leftover);
    if (step >= 0 && leftover == leftovers && e.is_directory(ec)) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

int64_t checkpoint_step_of(const std::string& name, bool* leftover) {
  const size_t tmp = name.find(".tmp.");
  if (leftover) *leftover = tmp != std::string::npos;
  if (tmp != std::string::npos) {
    // What a save leaves: make_temp_dir's PID.K, or the copy it moved
    // aside, oldPID; not a user's step-000002.tmp.my-backup.
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    const std::string suffix = name.substr(tmp + 5);
    const size_t dot = suffix.find('.');
    const bool ours = suffix.rfind("old", 0) == 0
                          ? digits(suffix.substr(3))
                          : dot != std::string::npos && digits(suffix.substr(0, dot)) && digits(suffix.substr(dot + 1));
    if (!ours) return -1;
  }
  const std::string base = name.substr(0, tmp);
  // At most 15 digits: a step fits int64_t, and stoll cannot throw.
  if (base.size() < 6 || base.size() > 20 || base.rfind("step-", 0) != 0 ||
      base.find_first_not_of("0123456789", 5) != std::string::npos)
    return -1;
  const int64_t step = std::stoll(base.substr(5));
  return base == checkpoint_name(step) ? step : -1;
}

fs::path lexical_folder(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}

namespace {

// A tensor file's header (the layout above) for `count` records.
std::string file_header(uint64_t count) {
  std::string head(kMagic, sizeof kMagic);
  put<uint32_t>(head, kTensorFileVersion);
  put<uint32_t>(head, 0);
  put<uint64_t>(head, count);
  return head;
}

// One record's head: name length, name, rank, dims; its values follow.
std::string record_head(const std::string& name, const Shape& shape) {
  std::string head;
  put<uint32_t>(head, static_cast<uint32_t>(name.size()));
  head += name;
  put<uint32_t>(head, static_cast<uint32_t>(shape.size()));
  for (int64_t d : shape) put<int64_t>(head, d);
  return head;
}

// What the manifest says of each of kFiles.
struct FileEntry {
  std::string sha256;
  uint64_t bytes = 0;
};

}  // namespace

std::string encode_tensors(const std::map<std::string, Tensor>& tensors) {
  std::string out = file_header(tensors.size());
  for (const auto& [name, t] : tensors) {
    out += record_head(name, t.shape());
    out.append(reinterpret_cast<const char*>(t.data()), static_cast<size_t>(t.numel()) * sizeof(float));
  }
  return out;
}

namespace {

// Where one tensor is in a tensor file: its shape and the byte offset of
// its values from the file's start.
struct TensorRecord {
  Shape shape;
  uint64_t offset = 0;
};

// Where parse_tensors hands each tensor it reads, instead of keeping it.
using TensorSink = std::function<plan::Status(const std::string& name, const Tensor& values)>;

// One tensor file from `r` (its errors name `path` and the byte): every
// record's shape and the byte offset of its values into `index` (when
// given), and the values of the records `wanted` names (all when null)
// into the map returned, or, with `sink`, to it as each is read (its
// error ends the parse).
Result<std::map<std::string, Tensor>> parse_tensors(ByteSource& r, const std::string& path,
                                                    const std::set<std::string>* wanted,
                                                    std::map<std::string, TensorRecord>* index,
                                                    const TensorSink* sink = nullptr) {
  auto bad = [&](const std::string& what) {
    return Error{path + ": " + what + " (at byte " + std::to_string(r.pos()) + " of " + std::to_string(r.size()) +
                 ")"};
  };
  char magic[8];
  uint32_t version = 0, reserved = 0;
  uint64_t count = 0;
  if (!r.take(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return bad("not a spindle tensor file (magic)");
  if (!r.take(&version, 4) || !r.take(&reserved, 4) || !r.take(&count, 8)) return bad("truncated header");
  if (version != kTensorFileVersion)
    return bad("tensor file version " + std::to_string(version) + ", this build reads version " +
               std::to_string(kTensorFileVersion));
  if (reserved != 0) return bad("header: the reserved field is " + std::to_string(reserved) + ", not 0");
  std::map<std::string, Tensor> out;
  std::string previous;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t name_len = 0, rank = 0;
    if (!r.take(&name_len, 4) || name_len == 0 || name_len > r.size() - r.pos())
      return bad("record " + std::to_string(i) + ": bad or truncated name");
    std::string name(name_len, '\0');
    r.take(name.data(), name_len);
    if (i > 0 && !(previous < name)) return bad("record '" + name + "': names not in ascending order");
    if (!r.take(&rank, 4) || rank > kMaxRank) return bad("record '" + name + "': bad rank");
    Shape shape(rank);
    int64_t numel = 1;
    constexpr int64_t kMaxElements = int64_t{1} << 40;
    for (uint32_t d = 0; d < rank; ++d) {
      if (!r.take(&shape[d], 8) || shape[d] < 0 || shape[d] > kMaxElements)
        return bad("record '" + name + "': bad or truncated shape");
      // Checked before multiplying: two dimensions of 2^40 would overflow.
      if (shape[d] > 0 && numel > kMaxElements / shape[d]) return bad("record '" + name + "': too many elements");
      numel *= shape[d];
    }
    const uint64_t n_bytes = static_cast<uint64_t>(numel) * sizeof(float);
    if (n_bytes > r.size() - r.pos()) return bad("record '" + name + "': truncated values");
    if (index) (*index)[name] = {shape, r.pos()};
    if (!wanted || wanted->count(name)) {
      Tensor t = Tensor::zeros(shape);
      r.take(t.data(), n_bytes);
      if (sink)
        SPINDLE_TRY((*sink)(name, t));
      else
        out.emplace(name, std::move(t));
    } else {
      r.take(nullptr, n_bytes);
    }
    previous = std::move(name);
  }
  if (r.pos() != r.size()) return bad("bytes after the last record");
  return out;
}

}  // namespace

Result<std::map<std::string, Tensor>> decode_tensors(const std::string& bytes, const std::string& path) {
  StringSource r(bytes);
  return parse_tensors(r, path, nullptr, nullptr);
}

std::vector<int64_t> list_checkpoints(const std::string& dir) {
  std::vector<int64_t> out;
  for (const auto& [step, _] : scan(dir, false)) out.push_back(step);
  return out;
}

namespace {

const char* const kPartNames[] = {"value", "AdamW m", "AdamW v"};

// Ok when `t`, part `part` (0 value, 1 m, 2 v) of tensor `name` after
// `step`, is finite; else check_state_finite's error for the first element
// that is not.
plan::Status check_part_finite(int64_t step, const std::string& name, int part, const Tensor& t) {
  const float* x = t.data();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(x[i]))
      return Error{"the training state after step " + std::to_string(step) + " is not finite: " + name + ", " +
                   kPartNames[part] + ", element " + std::to_string(i) + " is " + plan::number_text(x[i]) +
                   " (training diverged; no checkpoint of this step is saved)"};
  return {};
}

}  // namespace

plan::Status check_state_finite(const TrainingState& state) {
  for (const auto& [name, ts] : state.tensors)
    for (int f = 0; f < kCheckpointFiles; ++f) SPINDLE_TRY(check_part_finite(state.step, name, f, ts.part(f)));
  return {};
}

std::map<std::string, int64_t> samples_read(const CheckpointMeta& meta, int64_t step) {
  // A task of the checkpoint no longer in the model keeps its count (it
  // read nothing since); a task new to it counts from the resumed step.
  std::map<std::string, int64_t> n = meta.task_samples;
  for (const auto& [task, batch] : meta.task_batch) {
    int64_t added = 0;
    if (__builtin_mul_overflow(batch, step - meta.samples_step, &added) ||
        __builtin_add_overflow(n[task], added, &n[task]))
      n[task] = std::numeric_limits<int64_t>::max();
  }
  return n;
}

std::string check_samples_fit(const CheckpointMeta& meta, int64_t last_step, const std::string& manifest) {
  // With overflow builtins: a sum past INT64_MAX is past the bound too.
  int64_t before = 0, after = 0;
  bool over = false;
  for (const auto& [task, n] : meta.task_samples) over |= __builtin_add_overflow(before, n, &before);
  after = before;
  const int64_t steps = std::max<int64_t>(0, last_step - meta.samples_step);
  for (const auto& [task, batch] : meta.task_batch) {
    int64_t added = 0;
    over |= __builtin_mul_overflow(batch, steps, &added) || __builtin_add_overflow(after, added, &after);
  }
  if (!over && after <= kMaxCheckpointSamples) return "";
  const std::string total = over ? "more than 2^63" : std::to_string(after);
  const std::string limit = " samples, past the " + std::to_string(kMaxCheckpointSamples) +
                            " (2^62) a checkpoint counts over its tasks";
  if (manifest.empty())
    return "--steps " + std::to_string(last_step) + ": the model's tasks would read " + total + limit;
  return manifest + ": data.samples: " + std::to_string(before) + " samples read by step " +
         std::to_string(meta.samples_step) + ", and with this run's batches to step " + std::to_string(last_step) +
         " " + total + limit;
}

namespace {

// The manifest of a checkpoint of `meta` whose tensors took `steps` AdamW
// steps each and whose files are `files`.
nlohmann::json manifest_json(const CheckpointMeta& meta, const nlohmann::json& steps, const nlohmann::json& files) {
  nlohmann::json samples = nlohmann::json::object();
  for (const auto& [task, n] : samples_read(meta, meta.step)) samples[task] = n;
  nlohmann::json manifest = {
      {"format", "spindle-checkpoint"},
      {"version", kManifestVersion},
      {"step", meta.step},
      {"model", {{"name", meta.model_name}, {"sha256", meta.model_sha256}}},
      {"plan", {{"sha256", meta.plan_sha256}, {"strategy", meta.plan_strategy}, {"devices", meta.plan_devices}}},
      {"seed", meta.seed},
      {"data", {{"next_step", meta.step + 1}, {"samples", samples}}},
      {"optimizer",
       {{"name", "adamw"}, {"lr", meta.lr}, {"beta1", meta.beta1}, {"beta2", meta.beta2}, {"eps", meta.eps},
        {"weight_decay", meta.weight_decay}, {"steps", steps}}},
      {"files", files}};
  if (!meta.data_tasks.empty()) manifest["data"]["tasks"] = meta.data_tasks;
  const LrSchedule& ls = meta.lr_schedule;
  manifest["optimizer"]["lr_schedule"] = {{"decay", lr_decay_name(ls.decay)},
                                          {"warmup_steps", ls.warmup_steps},
                                          {"decay_steps", ls.decay_steps},
                                          {"min_lr", ls.min_lr}};
  manifest["optimizer"]["clip_grad"] = meta.clip_grad;
  manifest["optimizer"]["weight_decay_1d"] = meta.decay_1d;
  return manifest;
}

}  // namespace

void CheckpointWriter::lay_out(const std::map<std::string, Shape>& shapes) {
  uint64_t at = file_header(shapes.size()).size();
  for (const auto& [name, shape] : shapes) {
    const uint64_t head = record_head(name, shape).size();
    slots_[name] = {shape, at + head};
    at += head + static_cast<uint64_t>(shape_numel(shape)) * sizeof(float);
  }
  file_bytes_ = at;
}

Result<CheckpointWriter> CheckpointWriter::begin(const std::string& dir, const CheckpointMeta& meta,
                                                 const std::map<std::string, Shape>& shapes,
                                                 const std::array<bool, kCheckpointFiles>& files) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Error{dir + ": cannot create checkpoint directory: " + ec.message()};
  CheckpointWriter w;
  w.dir_ = dir;
  w.meta_ = meta;
  w.final_dir_ = (fs::path(dir) / checkpoint_name(meta.step)).string();
  w.mine_ = files;
  // The folder and its files get the permissions the umask gives.
  SPINDLE_ASSIGN(tmp, plan::make_temp_dir(w.final_dir_));
  w.tmp_ = tmp;
  w.owns_tmp_ = true;
  // The layout: the header, then each record's head and values, by name;
  // every file laid out here, whoever writes its values.
  w.lay_out(shapes);
  const std::string header = file_header(shapes.size());
  for (int f = 0; f < kCheckpointFiles; ++f) {
    const std::string path = tmp + "/" + kFiles[f];
    Fd fd;
    fd.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd.fd < 0) return Error{path + ": cannot write: " + std::strerror(errno)};
    int err = ::ftruncate(fd.fd, static_cast<off_t>(w.file_bytes_)) != 0 ? errno : 0;
    if (err == 0) err = pwrite_all(fd.fd, header.data(), header.size(), 0);
    for (auto it = w.slots_.begin(); it != w.slots_.end() && err == 0; ++it) {
      const std::string head = record_head(it->first, it->second.shape);
      err = pwrite_all(fd.fd, head.data(), head.size(), it->second.offset - head.size());
    }
    // A file another rank writes is closed now, durable (its writer
    // fsyncs only what it writes).
    if (err == 0 && !files[static_cast<size_t>(f)] && ::fsync(fd.fd) != 0) err = errno;
    if (err != 0) return Error{path + ": write failed: " + std::strerror(err)};
    if (files[static_cast<size_t>(f)]) w.fd_[f] = std::exchange(fd.fd, -1);
  }
  return w;
}

Result<CheckpointWriter> CheckpointWriter::join(const std::string& temp_dir, const CheckpointMeta& meta,
                                                const std::map<std::string, Shape>& shapes,
                                                const std::array<bool, kCheckpointFiles>& files) {
  CheckpointWriter w;
  w.meta_ = meta;
  w.tmp_ = temp_dir;
  w.final_dir_ = temp_dir;   // named in messages: the step folder is begin's writer's
  w.mine_ = files;
  w.lay_out(shapes);
  for (int f = 0; f < kCheckpointFiles; ++f) {
    if (!files[static_cast<size_t>(f)]) continue;
    const std::string path = temp_dir + "/" + kFiles[f];
    w.fd_[f] = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (w.fd_[f] < 0) return Error{path + ": cannot write: " + std::strerror(errno)};
    struct stat st {};
    if (::fstat(w.fd_[f], &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != w.file_bytes_)
      return Error{path + ": not the file laid out for this save (" + std::to_string(w.file_bytes_) + " bytes)"};
  }
  return w;
}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& o) noexcept { *this = std::move(o); }

CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&& o) noexcept {
  if (this != &o) {
    abandon();
    dir_ = std::move(o.dir_);
    final_dir_ = std::move(o.final_dir_);
    tmp_ = std::exchange(o.tmp_, std::string());
    owns_tmp_ = o.owns_tmp_;
    meta_ = std::move(o.meta_);
    slots_ = std::move(o.slots_);
    mine_ = o.mine_;
    for (int f = 0; f < kCheckpointFiles; ++f) written_[f] = std::move(o.written_[f]);
    steps_ = std::move(o.steps_);
    file_bytes_ = o.file_bytes_;
    for (int f = 0; f < kCheckpointFiles; ++f) fd_[f] = std::exchange(o.fd_[f], -1);
    error_ = std::move(o.error_);
  }
  return *this;
}

CheckpointWriter::~CheckpointWriter() { abandon(); }

void CheckpointWriter::abandon() {
  for (int& fd : fd_)
    if (fd >= 0) ::close(std::exchange(fd, -1));
  if (!tmp_.empty() && owns_tmp_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  tmp_.clear();
}

plan::Status CheckpointWriter::add(const std::string& name, const TensorState& state) {
  for (int f = 0; f < kCheckpointFiles; ++f)
    if (mine_[static_cast<size_t>(f)]) SPINDLE_TRY(add_part(name, f, state.part(f), state.adam_steps));
  return {};
}

plan::Status CheckpointWriter::add_part(const std::string& name, int file, const Tensor& values, int64_t adam_steps) {
  if (!error_.empty()) return Error{error_};
  auto fail = [&](const std::string& why) {
    error_ = why;
    return Error{why};
  };
  if (tmp_.empty()) return fail("checkpoint " + final_dir_ + ": tensor " + name + " added after the save ended");
  if (file < 0 || file >= kCheckpointFiles || !mine_[static_cast<size_t>(file)])
    return fail("checkpoint " + final_dir_ + ": " + name + "'s " + kPartNames[std::clamp(file, 0, 2)] +
                " given to a writer of other files");
  const auto slot = slots_.find(name);
  if (slot == slots_.end()) return fail("checkpoint " + final_dir_ + ": tensor " + name + " is not in its layout");
  if (written_[file].contains(name)) return fail("checkpoint " + final_dir_ + ": tensor " + name + " added twice");
  if (values.shape() != slot->second.shape)
    return fail("checkpoint " + final_dir_ + ": tensor " + name + " has shape " + shape_str(values.shape()) +
                ", its layout " + shape_str(slot->second.shape));
  if (plan::Status finite = check_part_finite(meta_.step, name, file, values); !finite)
    return fail(finite.error().message);
  if (const int err = pwrite_all(fd_[file], values.data(), static_cast<uint64_t>(values.numel()) * sizeof(float),
                                 slot->second.offset);
      err != 0)
    return fail(tmp_ + "/" + kFiles[file] + ": write failed: " + std::strerror(err));
  written_[file].insert(name);
  steps_[name] = adam_steps;
  return {};
}

Result<nlohmann::json> CheckpointWriter::close_files() {
  if (!error_.empty()) return Error{error_};
  if (tmp_.empty()) return Error{"checkpoint " + final_dir_ + ": its files closed twice"};
  nlohmann::json files = nlohmann::json::object();
  // Each file made durable, then hashed as written (read back a chunk at a
  // time: the records came in whatever order their parameters did).
  for (int f = 0; f < kCheckpointFiles; ++f) {
    if (!mine_[static_cast<size_t>(f)]) continue;
    for (const auto& [name, slot] : slots_)
      if (!written_[f].contains(name))
        return Error{"checkpoint " + final_dir_ + ": tensor " + name + " was never written to " + kFiles[f]};
    const std::string path = tmp_ + "/" + kFiles[f];
    int err = ::fsync(fd_[f]) != 0 ? errno : 0;
    if (::close(std::exchange(fd_[f], -1)) != 0 && err == 0) err = errno;
    if (err != 0) return Error{path + ": write failed: " + std::strerror(err)};
    Fd fd;
    fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd.fd < 0) return Error{path + ": cannot read back: " + std::strerror(errno)};
    ChunkedFileSource back(fd.fd, file_bytes_);
    const std::string sha = back.hash_to_end();
    if (sha.empty()) return Error{path + ": read back failed: " + back.read_error()};
    files[kFiles[f]] = {{"sha256", sha}, {"bytes", file_bytes_}};
  }
  if (!owns_tmp_) tmp_.clear();   // a joined writer is done: the folder is begin's writer's
  return files;
}

Result<std::string> CheckpointWriter::finish(int keep, std::string* warning, const nlohmann::json& joined) {
  if (!error_.empty()) return Error{error_};
  if (tmp_.empty() || !owns_tmp_) return Error{"checkpoint " + final_dir_ + ": finished twice, or by a joined writer"};
  SPINDLE_ASSIGN(files, close_files());
  for (int f = 0; f < kCheckpointFiles; ++f) {
    if (mine_[static_cast<size_t>(f)]) continue;
    // Written and hashed by a joined writer (its close_files).
    const auto entry = joined.find(kFiles[f]);
    if (entry == joined.end())
      return Error{"checkpoint " + final_dir_ + ": " + kFiles[f] + " was written by no writer"};
    files[kFiles[f]] = *entry;
  }
  for (const auto& [name, slot] : slots_)
    if (!steps_.contains(name)) return Error{"checkpoint " + final_dir_ + ": tensor " + name + " was never written"};
  nlohmann::json steps = nlohmann::json::object();
  for (const auto& [name, n] : steps_) steps[name] = n;
  // A data folder's path (data.tasks.*.dir, for people) may hold bytes
  // that are not UTF-8, which JSON cannot: each is written as U+FFFD
  // rather than failing every save of the run.
  const plan::Status st = plan::write_file_atomic(
      tmp_ + "/manifest.json",
      manifest_json(meta_, steps, files).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (!st.ok()) return st.error();
  fsync_dir(tmp_);

  // Into place. A checkpoint of the same step (a rerun) is moved aside first.
  std::error_code ec;
  if (fs::exists(final_dir_, ec)) {
    const std::string old = final_dir_ + ".tmp.old" + std::to_string(::getpid());
    fs::rename(final_dir_, old, ec);
    if (ec) return Error{final_dir_ + ": cannot replace: " + ec.message()};
    fs::remove_all(old, ec);
  }
  fs::rename(tmp_, final_dir_, ec);
  if (ec) return Error{final_dir_ + ": cannot rename " + tmp_ + " into place: " + ec.message()};
  tmp_.clear();   // in place: no longer the writer's to remove
  fsync_dir(dir_);

  // Keep the newest `keep`; drop leftovers of crashed writes up to this step.
  // A checkpoint pruned is first renamed to a leftover's name, so one that a
  // kill or an error leaves half removed is never listed as complete.
  std::string not_pruned;
  const std::vector<int64_t> done = list_checkpoints(dir_);
  for (size_t i = 0; i + static_cast<size_t>(std::max(keep, 1)) < done.size(); ++i) {
    const std::string doomed = (fs::path(dir_) / checkpoint_name(done[i])).string();
    const std::string aside = doomed + ".tmp.old" + std::to_string(::getpid());
    fs::rename(doomed, aside, ec);
    if (!ec) fs::remove_all(aside, ec);
    if (ec && not_pruned.empty()) not_pruned = doomed + ": " + ec.message();
  }
  for (const auto& [step, path] : scan(dir_, true))
    if (step <= meta_.step) fs::remove_all(path, ec);
  if (warning && !not_pruned.empty())
    *warning = "--keep " + std::to_string(keep) + ": cannot remove the older checkpoint " + not_pruned +
               "; the folder keeps more checkpoints than --keep asks";
  return final_dir_;
}

Result<std::string> save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                                    const TrainingState& state, int keep, std::string* warning) {
  // Refused before anything is written.
  SPINDLE_TRY(check_state_finite(state));
  std::map<std::string, Shape> shapes;
  for (const auto& [name, ts] : state.tensors) shapes[name] = ts.value.shape();
  SPINDLE_ASSIGN(writer, CheckpointWriter::begin(dir, meta, shapes));
  for (const auto& [name, ts] : state.tensors) SPINDLE_TRY(writer.add(name, ts));
  return writer.finish(keep, warning);
}

plan::Status remove_checkpoints(const std::string& dir, const std::string& except) {
  std::error_code ec;
  if (const fs::directory_iterator listed(dir, ec); ec) return Error{dir + ": cannot list: " + ec.message()};
  std::vector<fs::path> doomed;
  for (bool leftovers : {false, true})
    for (const auto& [_, path] : scan(dir, leftovers))
      if (except.empty() || path.filename() != lexical_folder(except).filename()) doomed.push_back(path);
  for (const fs::path& p : doomed) {
    fs::remove_all(p, ec);
    if (ec) return Error{p.string() + ": cannot remove: " + ec.message()};
  }
  return plan::Status::Ok();
}

namespace {

// Manifest values through the checked reader (libplan/io/json_reader.h): a
// value of another type, an integer out of range or a number that is not
// finite is an Error naming the manifest and the key, never a conversion
// with undefined behaviour (a step of 1e300 read as int64_t was one).
Result<uint64_t> manifest_u64(const plan::JsonReader& r) {
  if (!r.value().is_number_unsigned() && !(r.value().is_number_integer() && r.value().get<int64_t>() >= 0))
    return r.error("expected an integer >= 0, found " + r.value().dump());
  return r.value().get<uint64_t>();
}
// A float setting (AdamW's): a finite number a float holds.
Result<float> manifest_float(const plan::JsonReader& r) {
  SPINDLE_ASSIGN(v, r.get_number());
  if (std::fabs(v) > std::numeric_limits<float>::max()) return r.error("expected a number a float holds");
  return static_cast<float>(v);
}
// Counts by name, each in 0..`hi`.
Result<std::map<std::string, int64_t>> manifest_counts(const plan::JsonReader& r,
                                                       int64_t hi = std::numeric_limits<int64_t>::max()) {
  SPINDLE_TRY(r.require_map());
  std::map<std::string, int64_t> out;
  for (const auto& [name, _] : r.value().items()) {
    SPINDLE_ASSIGN(n, r.at(name).get_int_in(0, hi));
    out[name] = n;
  }
  return out;
}

// The manifest's fields into `ck` and `files` (the header's layout; keys
// this build does not know are ignored, so older builds read newer
// manifests' core).
plan::Status read_manifest(const nlohmann::json& j, const std::string& manifest_path, Checkpoint& ck,
                           FileEntry (&files)[3], std::map<std::string, int64_t>& adam_steps) {
  const plan::JsonReader doc(j, manifest_path);
  SPINDLE_TRY(doc.require_map());
  SPINDLE_ASSIGN(format, doc.at("format").get_string());
  if (format != "spindle-checkpoint") return doc.at("format").error("expected \"spindle-checkpoint\"");
  SPINDLE_ASSIGN(version, doc.at("version").get_int());
  if (version != kManifestVersion)
    return doc.at("version").error("version " + std::to_string(version) + ", this build reads version " +
                                   std::to_string(kManifestVersion));
  CheckpointMeta& m = ck.meta;
  SPINDLE_ASSIGN(step, doc.at("step").get_int_in(1, std::numeric_limits<int64_t>::max()));
  m.step = step;
  SPINDLE_ASSIGN(model_name, doc.at("model").at("name").get_string());
  SPINDLE_ASSIGN(model_sha, doc.at("model").at("sha256").get_string());
  SPINDLE_ASSIGN(plan_sha, doc.at("plan").at("sha256").get_string());
  SPINDLE_ASSIGN(strategy, doc.at("plan").at("strategy").get_string());
  SPINDLE_ASSIGN(devices, doc.at("plan").at("devices").get_int_in(1, plan::limits::kMaxDevices));
  m.model_name = model_name;
  m.model_sha256 = model_sha;
  m.plan_sha256 = plan_sha;
  m.plan_strategy = strategy;
  m.plan_devices = static_cast<int>(devices);
  SPINDLE_ASSIGN(seed, manifest_u64(doc.at("seed")));
  m.seed = seed;
  const plan::JsonReader data = doc.at("data");
  // Each count, and their sum, within kMaxCheckpointSamples (checked one
  // by one, so the sum cannot overflow): what a run adds to them then
  // cannot overflow either. Which tasks it must hold depends on the model
  // resumed with (spindle-run's check_checkpoint).
  SPINDLE_ASSIGN(samples, manifest_counts(data.at("samples"), kMaxCheckpointSamples));
  int64_t samples_total = 0;
  for (const auto& [task, n] : samples) {
    if (n > kMaxCheckpointSamples - samples_total)
      return data.at("samples").error("the counts sum to more than " + std::to_string(kMaxCheckpointSamples) +
                                      " (2^62), the most a checkpoint counts");
    samples_total += n;
  }
  m.task_samples = samples;
  m.samples_step = m.step;
  if (data.has("tasks")) {
    // Kept as written; what a resume reads of it (spindle-run's
    // data_changes: "source", "samples") checked here.
    const plan::JsonReader tasks = data.at("tasks");
    SPINDLE_TRY(tasks.require_map());
    for (const auto& [task, _] : tasks.value().items()) {
      const plan::JsonReader entry = tasks.at(task);
      SPINDLE_TRY(entry.require_map());
      if (entry.has("source")) SPINDLE_TRY(entry.at("source").get_string());
      if (entry.has("samples")) SPINDLE_TRY(entry.at("samples").get_int_in(0, std::numeric_limits<int64_t>::max()));
    }
    m.data_tasks = tasks.value();
  }
  const plan::JsonReader opt = doc.at("optimizer");
  // The state is AdamW's (m, v and the step counts): what spindle-run writes.
  SPINDLE_ASSIGN(optimizer, opt.at("name").get_string());
  if (optimizer != "adamw")
    return opt.at("name").error("\"" + optimizer + "\": expected \"adamw\" (the optimizer spindle-run trains and "
                                "saves; its m and v are the state this checkpoint holds)");
  for (const auto& [key, field] : {std::pair{"lr", &m.lr}, std::pair{"beta1", &m.beta1}, std::pair{"beta2", &m.beta2},
                                   std::pair{"eps", &m.eps}, std::pair{"weight_decay", &m.weight_decay}}) {
    SPINDLE_ASSIGN(value, manifest_float(opt.at(key)));
    *field = value;
  }
  m.lr_schedule.max_lr = m.lr;
  if (opt.has("lr_schedule")) {
    const plan::JsonReader ls = opt.at("lr_schedule");
    SPINDLE_ASSIGN(decay_name, ls.at("decay").get_string());
    const auto decay = parse_lr_decay(decay_name);
    if (!decay) return ls.at("decay").error("expected constant, linear or cosine");
    m.lr_schedule.decay = *decay;
    SPINDLE_ASSIGN(warmup, ls.at("warmup_steps").get_int_in(0, std::numeric_limits<int64_t>::max()));
    SPINDLE_ASSIGN(decay_steps, ls.at("decay_steps").get_int_in(0, std::numeric_limits<int64_t>::max()));
    SPINDLE_ASSIGN(min_lr, ls.at("min_lr").get_number());
    m.lr_schedule.warmup_steps = warmup;
    m.lr_schedule.decay_steps = decay_steps;
    m.lr_schedule.min_lr = min_lr;
  }
  if (opt.has("clip_grad")) {
    SPINDLE_ASSIGN(clip, opt.at("clip_grad").get_number());
    if (!(clip >= 0)) return opt.at("clip_grad").error("expected a finite number >= 0");
    m.clip_grad = clip;
  }
  if (opt.has("weight_decay_1d")) {
    SPINDLE_ASSIGN(decay_1d, opt.at("weight_decay_1d").get_bool());
    m.decay_1d = decay_1d;
  }
  SPINDLE_ASSIGN(steps, manifest_counts(opt.at("steps")));
  adam_steps = std::move(steps);
  const plan::JsonReader listed = doc.at("files");
  SPINDLE_TRY(listed.require_map());
  for (int f = 0; f < 3; ++f) {
    if (!listed.has(kFiles[f])) return listed.error(std::string("no entry for ") + kFiles[f]);
    SPINDLE_ASSIGN(sha, listed.at(kFiles[f]).at("sha256").get_string());
    SPINDLE_ASSIGN(bytes, manifest_u64(listed.at(kFiles[f]).at("bytes")));
    files[f] = {sha, bytes};
  }
  return plan::Status::Ok();
}

}  // namespace

namespace {

// Opens checkpoint file `path` for reading, refusing what is not a regular
// file of `bytes` bytes (a FIFO is not waited on: opened non-blocking).
plan::Status open_checkpoint_file(const std::string& path, uint64_t bytes, Fd& out) {
  out.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (out.fd < 0) return Error{path + ": cannot open: " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(out.fd, &st) != 0) return Error{path + ": cannot inspect: " + std::strerror(errno)};
  if (!S_ISREG(st.st_mode)) return Error{path + ": not a regular file"};
  if (static_cast<uint64_t>(st.st_size) != bytes)
    return Error{path + ": truncated or corrupt checkpoint file: " + std::to_string(st.st_size) +
                 " bytes, the manifest says " + std::to_string(bytes)};
  return plan::Status::Ok();
}

// Reads the rest of `source` (a file whose manifest entry is `entry`) and
// checks the SHA-256 of all of it against the manifest's.
plan::Status check_file_hash(const std::string& path, ChunkedFileSource& source, const FileEntry& entry) {
  const std::string sha = source.hash_to_end();
  if (sha.empty()) return Error{path + ": read failed: " + source.read_error()};
  if (sha != entry.sha256) return Error{path + ": corrupt checkpoint file: SHA-256 differs from the manifest's"};
  return plan::Status::Ok();
}

// Tensor file `path`, which the manifest says is `entry`: its records into
// `records` and the values of those `wanted` names (all when null)
// returned. With `hash`, read once, a chunk at a time, its SHA-256 checked
// against the manifest's; a file whose hash differs is reported as corrupt
// whatever its parse found (a flipped byte may break a record before the
// hash is done). Without, checked by size and read where the records are
// (their heads, and the values wanted).
Result<std::map<std::string, Tensor>> read_tensor_file(const std::string& path, const FileEntry& entry,
                                                       const std::set<std::string>* wanted,
                                                       std::map<std::string, TensorRecord>& records, bool hash) {
  Fd fd;
  SPINDLE_TRY(open_checkpoint_file(path, entry.bytes, fd));
  if (!hash) {
    PreadSource source(fd.fd, entry.bytes);
    Result<std::map<std::string, Tensor>> parsed = parse_tensors(source, path, wanted, &records);
    if (!source.read_error().empty()) return Error{path + ": read failed: " + source.read_error()};
    return parsed;
  }
  ChunkedFileSource source(fd.fd, entry.bytes);
  Result<std::map<std::string, Tensor>> parsed = parse_tensors(source, path, wanted, &records);
  SPINDLE_TRY(check_file_hash(path, source, entry));
  return parsed;
}

// DIR/step-N's manifest into `ck` (path, meta, state.step), its file
// entries and AdamW step counts; refused when the folder is named for
// another step.
plan::Status load_manifest(const std::string& step_dir, Checkpoint& ck, FileEntry (&files)[3],
                           std::map<std::string, int64_t>& adam_steps) {
  const std::string manifest_path = step_dir + "/manifest.json";
  SPINDLE_ASSIGN(text, plan::read_regular_file(manifest_path));
  ck.path = step_dir;
  SPINDLE_TRY(plan::check_json_shape(text, manifest_path));   // bounded depth: the messages dump values
  SPINDLE_ASSIGN(j, plan::parse_json_text(text, manifest_path));
  SPINDLE_TRY(read_manifest(j, manifest_path, ck, files, adam_steps));
  ck.state.step = ck.meta.step;
  // A folder named for another step (renamed or copied by hand) would be
  // resumed as the newest when it is not, or pruned out of turn; a
  // leftover of a save is no checkpoint.
  const std::string name = lexical_folder(step_dir).filename().string();
  bool leftover = false;
  if (const int64_t named = checkpoint_step_of(name, &leftover); named >= 0 && (leftover || named != ck.meta.step))
    return Error{manifest_path + ": step " + std::to_string(ck.meta.step) + ", but its folder is named " + name +
                 " (a checkpoint renamed or copied by hand? name it " + checkpoint_name(ck.meta.step) +
                 ", or any name not step-*)"};
  return plan::Status::Ok();
}

}  // namespace

const char* checkpoint_file(int f) { return kFiles[f]; }

int checkpoint_file_rank(int f, int ranks) { return static_cast<int>(int64_t{f} * ranks / kCheckpointFiles); }

std::array<bool, kCheckpointFiles> checkpoint_files_of(int rank, int ranks) {
  std::array<bool, kCheckpointFiles> mine{};
  for (int f = 0; f < kCheckpointFiles; ++f) mine[static_cast<size_t>(f)] = checkpoint_file_rank(f, ranks) == rank;
  return mine;
}

plan::Status verify_checkpoint_files(const std::string& step_dir, const std::array<bool, kCheckpointFiles>& files) {
  Checkpoint ck;
  FileEntry entries[3];
  std::map<std::string, int64_t> adam_steps;
  SPINDLE_TRY(load_manifest(step_dir, ck, entries, adam_steps));
  for (int f = 0; f < kCheckpointFiles; ++f) {
    if (!files[static_cast<size_t>(f)]) continue;
    const std::string path = step_dir + "/" + kFiles[f];
    Fd fd;
    SPINDLE_TRY(open_checkpoint_file(path, entries[f].bytes, fd));
    ChunkedFileSource source(fd.fd, entries[f].bytes);
    SPINDLE_TRY(check_file_hash(path, source, entries[f]));
  }
  return plan::Status::Ok();
}

Result<Checkpoint> load_checkpoint(const std::string& step_dir, const std::set<std::string>* wanted, bool hash) {
  const std::string manifest_path = step_dir + "/manifest.json";
  Checkpoint ck;
  FileEntry files[3];
  std::map<std::string, int64_t> adam_steps;
  SPINDLE_TRY(load_manifest(step_dir, ck, files, adam_steps));

  std::map<std::string, Tensor> decoded[3];
  std::map<std::string, TensorRecord> records[3];
  for (int f = 0; f < 3; ++f) {
    SPINDLE_ASSIGN(values, read_tensor_file(step_dir + "/" + kFiles[f], files[f], wanted, records[f], hash));
    decoded[f] = std::move(values);
    ck.file_bytes[f] = files[f].bytes;
    ck.file_sha256[f] = files[f].sha256;
  }
  // params, m, v and the optimizer steps must name the same tensors.
  for (const auto& [tname, n] : adam_steps)
    if (!records[0].count(tname))
      return Error{manifest_path + ": optimizer.steps names " + tname + ", which params.bin lacks"};
  for (const auto& [tname, record] : records[0]) {
    CheckpointTensor& entry = ck.index[tname];
    entry.shape = record.shape;
    entry.offset[0] = record.offset;
    for (int f = 1; f < 3; ++f) {
      const auto it = records[f].find(tname);
      if (it == records[f].end() || it->second.shape != record.shape)
        return Error{step_dir + "/" + kFiles[f] + ": " + tname + " missing or shaped unlike params.bin"};
      entry.offset[f] = it->second.offset;
    }
    const auto steps = adam_steps.find(tname);
    if (steps == adam_steps.end()) return Error{manifest_path + ": optimizer.steps: no entry for " + tname};
    entry.adam_steps = steps->second;
    if (!decoded[0].count(tname)) continue;
    TensorState& ts = ck.state.tensors[tname];
    ts.value = std::move(decoded[0].at(tname));
    ts.m = std::move(decoded[1].at(tname));
    ts.v = std::move(decoded[2].at(tname));
    ts.adam_steps = entry.adam_steps;
  }
  if (records[1].size() != records[0].size() || records[2].size() != records[0].size())
    return Error{step_dir + ": adam_m.bin or adam_v.bin holds tensors params.bin lacks"};
  return ck;
}

plan::Status read_checkpoint_tensors(Checkpoint& ck, const std::set<std::string>& names, bool values_only) {
  std::vector<std::pair<const std::string*, const CheckpointTensor*>> todo;
  for (const std::string& tname : names)
    if (const auto it = ck.index.find(tname); it != ck.index.end() && !ck.state.tensors.count(tname))
      todo.emplace_back(&it->first, &it->second);
  if (todo.empty()) return plan::Status::Ok();
  std::map<std::string, TensorState> read;
  for (int f = 0; f < (values_only ? 1 : 3); ++f) {
    const std::string path = ck.path + "/" + kFiles[f];
    Fd fd;
    SPINDLE_TRY(open_checkpoint_file(path, ck.file_bytes[f], fd));
    for (const auto& [tname, entry] : todo) {
      TensorState& ts = read[*tname];
      Tensor& t = ts.part(f);
      t = Tensor::zeros(entry->shape);
      if (const int err = transfer_at(fd.fd, true, t.data(), static_cast<uint64_t>(t.numel()) * sizeof(float),
                                      entry->offset[f]);
          err != 0)
        return Error{path + ": read failed at byte " + std::to_string(entry->offset[f]) + " (" +
                     (err < 0 ? "end of file" : std::strerror(err)) + ")"};
      ts.adam_steps = entry->adam_steps;
    }
  }
  for (auto& [tname, ts] : read) ck.state.tensors[tname] = std::move(ts);
  return plan::Status::Ok();
}

plan::Status stream_checkpoint_values(const Checkpoint& ck, const TensorSink& each) {
  const std::string path = ck.path + "/" + kFiles[0];
  Fd fd;
  SPINDLE_TRY(open_checkpoint_file(path, ck.file_bytes[0], fd));
  ChunkedFileSource source(fd.fd, ck.file_bytes[0]);
  std::map<std::string, TensorRecord> records;
  bool each_failed = false;   // its own error, returned as it is, the rest unread
  const TensorSink counted = [&](const std::string& name, const Tensor& values) {
    plan::Status st = each(name, values);
    each_failed = !st.ok();
    return st;
  };
  const Result<std::map<std::string, Tensor>> parsed = parse_tensors(source, path, nullptr, &records, &counted);
  if (each_failed) return parsed.error();
  // A hash that differs says more than what the parse found (a flipped
  // byte may break a record first).
  const plan::Status hashed = check_file_hash(path, source, {ck.file_sha256[0], ck.file_bytes[0]});
  if (!parsed.ok() && hashed.ok()) return parsed.error();
  SPINDLE_TRY(hashed);
  // The same records as the index the caller worked from (spindle-export's
  // header): the file indexed from its heads, unhashed, may have been
  // another one then (replaced since, or corrupt and repaired).
  bool same = records.size() == ck.index.size();
  for (const auto& [name, record] : records) {
    const auto it = ck.index.find(name);
    same = same && it != ck.index.end() && it->second.shape == record.shape && it->second.offset[0] == record.offset;
  }
  if (!same) return Error{path + ": its records differ from those indexed before (the checkpoint changed)"};
  return plan::Status::Ok();
}

CheckpointLock::CheckpointLock(CheckpointLock&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), dir_(std::move(o.dir_)), made_dir_(o.made_dir_),
      made_from_(std::move(o.made_from_)), unlocked_(std::move(o.unlocked_)) {}

CheckpointLock& CheckpointLock::operator=(CheckpointLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    dir_ = std::move(o.dir_);
    made_dir_ = o.made_dir_;
    made_from_ = std::move(o.made_from_);
    unlocked_ = std::move(o.unlocked_);
  }
  return *this;
}

CheckpointLock::~CheckpointLock() { release(); }

void CheckpointLock::release() {
  // A folder holding nothing but the lock file (a run that stopped before
  // its first checkpoint) is left as the run found it: the lock file
  // removed, and the folder too when this lock made it. Removed while
  // still locked, so that no other run locks the file being removed.
  if (fd_ >= 0 && !dir_.empty()) {
    std::vector<fs::directory_entry> entries;
    std::error_code ec = plan::list_folder(dir_, entries);
    bool only_lock = true;
    for (const fs::directory_entry& entry : entries)
      if (entry.path().filename() != kLockFile) only_lock = false;
    if (!ec && only_lock) {
      std::filesystem::remove(std::filesystem::path(dir_) / kLockFile, ec);
      // The folder, then each parent made for it while empty (remove
      // refuses a folder that is not), up to the outermost one made.
      if (made_dir_) {
        const std::filesystem::path outermost = made_from_;   // empty: the folder alone
        for (fs::path p = lexical_folder(fs::absolute(dir_, ec).string());; p = p.parent_path()) {
          if (!fs::remove(p, ec) || ec || outermost.empty() || p == outermost || p == p.parent_path())
            break;
        }
      }
    }
  }
  if (fd_ >= 0) ::close(fd_);   // releases the flock
  fd_ = -1;
}

plan::Result<CheckpointLock> lock_checkpoint_dir(const std::string& dir) {
  CheckpointLock lock;
  std::error_code ec;
  // The outermost folder missing now: create_directories makes it and
  // those below, which release() removes again when nothing was saved.
  for (fs::path p = lexical_folder(fs::absolute(dir, ec).string()); !ec && !p.empty(); p = p.parent_path()) {
    std::error_code missing;
    if (fs::exists(p, missing) || missing || p == p.parent_path()) break;
    lock.made_from_ = p.string();
  }
  lock.made_dir_ = std::filesystem::create_directories(dir, ec);
  if (ec) return plan::Error{dir + ": cannot create the checkpoint folder: " + ec.message()};
  const std::string path = (std::filesystem::path(dir) / kLockFile).string();
  // 0666 less the umask, as the checkpoints get: members of a group that
  // shares the folder (umask 002) can lock it in turn. A lock file another
  // user made without write permission for us still locks read-only
  // (flock needs no write access; the holder's note is then not written).
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (lock.fd_ < 0 && errno == EACCES) lock.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (lock.fd_ < 0) return plan::Error{path + ": cannot open the lock file: " + std::strerror(errno)};
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK || err == EINTR) {
      char held[256] = {};
      const ssize_t n = ::pread(lock.fd_, held, sizeof held - 1, 0);
      std::string who = n > 0 ? std::string(held, static_cast<size_t>(n)) : std::string();
      while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) who.pop_back();
      return plan::Error{"--checkpoint " + dir + ": in use by another spindle-run (" +
                         (who.empty() ? std::string("its holder unknown") : who) + ", " + path +
                         "): two runs must not write one folder; wait for that run to end, or name another folder"};
    }
    lock.unlocked_ = std::string("flock: ") + std::strerror(err);   // e.g. ENOLCK, EOPNOTSUPP
    return lock;
  }
  lock.dir_ = dir;   // held: the destructor may tidy the folder (never another run's lock file)
  // Who holds it, for a second run's message.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string who = "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + "\n";
  if (::ftruncate(lock.fd_, 0) != 0 || ::pwrite(lock.fd_, who.data(), who.size(), 0) < 0) {
    // Only the message of a second run depends on it: the lock itself holds.
  }
  return lock;
}

}  // namespace spindle::exec
