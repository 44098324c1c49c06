// File helpers shared by every reader and writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "libplan/util/limits.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// The largest file read_file reads by default: the largest input of any
// reader.
inline constexpr int64_t kMaxReadBytes = limits::kMaxJsonBytes;

// Reads a whole file of at most `max_bytes` (default: the largest input any
// reader takes, limits.h), so an endless input (/dev/zero) ends with an
// Error instead of exhausting memory. Error names the file and the reason.
// A pipe is read like a file (`spindle-plan <(sed ... model.yaml)`).
Result<std::string> read_file(const std::string& path, int64_t max_bytes = kMaxReadBytes);

// An input each rank of an MPI world of `ranks` reads itself (spindle-run's
// plan, model and DATA.yaml files; spindle-profile --measure's model and
// cluster): "" when it may be read so, else why not, naming `path`. With
// more than one rank it must be a regular file: a pipe (a FIFO, `<(...)`)
// or a device gives its bytes once, so one rank would read them and the
// others wait in open() forever. stat() only: never blocks, and a path
// that cannot be inspected is left to the reader's error.
std::string shared_input_refusal(const std::string& path, int ranks);

// read_file for what only the programs write (a checkpoint's files): a
// folder, device, FIFO or socket there is refused at once, where opening a
// FIFO with no writer would wait forever.
Result<std::string> read_regular_file(const std::string& path, int64_t max_bytes = kMaxReadBytes);

// The entries of folder `dir` as the system lists them, never throwing:
// the error of listing it (a folder that does not exist, or a read that
// fails part way, with the entries read before it in `out`), else none.
// A range-for over std::filesystem::directory_iterator throws from its
// increment.
std::error_code list_folder(const std::string& dir, std::vector<std::filesystem::directory_entry>& out);

// The output-file policy of every program (docs/hardening.md, "Outputs").
// An output path is refused, before anything is written, when
//   - it is a directory, a device node, a FIFO or a socket (an output is a
//     regular file or nothing yet);
//   - it is a symbolic link: refused on purpose, since replacing it would
//     replace the link and writing through it could reach any file (name the
//     link's target instead);
//   - it is the same file as one of `inputs` (device and inode), or names
//     the same path as another output in `outputs`;
//   - its folder is missing, not a folder, or not writable.
// Each output is {flag, path}; messages name the flag and the path.
struct OutputPath {
  std::string flag;  // "-o", "--trace", ...
  std::string path;
};
Status check_output_paths(const std::vector<OutputPath>& outputs, const std::vector<std::string>& inputs);

// A folder output (checkpoints): `dir` is a folder or does not exist yet
// (then its nearest existing parent is a writable folder); it is not a
// device node, FIFO, socket or regular file; if it exists it is writable.
// Symbolic links to folders are followed (a shared file system is often
// linked in). `flag` names the option in messages.
Status check_output_dir(const std::string& flag, const std::string& dir);

// A folder output that a program fills with entries of its own names
// (--lower DIR: device-D.json; --checkpoint DIR: step-N). `owns` says
// whether a name directly in the folder is one of them; `taken` says what
// such a name is, for messages ("a device's program").
struct OutputDir {
  std::string flag;  // "--lower", "--checkpoint"
  std::string path;
  std::function<bool(const std::string& name)> owns;
  std::string taken;
};
// Refuses, before anything is written, a file output or an input of the
// same command that is the folder itself, or lies in it under a name the
// folder's entries take (the file itself, or inside such an entry): filling
// the folder would replace it, or remove it with the checkpoints. Files in
// the folder under other names are fine (-o L/plan.json --lower L).
// Messages name the flag and both paths. An empty `dir.path` checks nothing.
Status check_apart_from_dir(const OutputDir& dir, const std::vector<OutputPath>& outputs,
                            const std::vector<std::string>& inputs);

// Writes `bytes` to `path` atomically: a temporary file in the same folder
// (created exclusively, never through a link), written, flushed, fsynced and
// closed, then renamed over `path`, and the folder fsynced. Every failure,
// of write, fsync and close included, is an Error naming `path`; on error
// nothing at `path` changes and the temporary is removed. Refuses a `path`
// that is a directory, device node, FIFO, socket or symbolic link. The
// temporary is PATH.tmp.PID, or, for a file name too long to take that
// suffix (NAME_MAX), its first 200 bytes and 8 hex digits of the name's
// SHA-256 with it.
Status write_file_atomic(const std::string& path, const std::string& bytes);

// write_file_atomic for a file made a piece at a time, too large to hold
// whole (spindle-export's safetensors): `fill` is called once and gives
// the file's bytes in order to `append`. An Error either returns (append's
// names `path`: "write failed") ends the write: nothing at `path` changes
// and the temporary is removed.
using AppendBytes = std::function<Status(const void* bytes, size_t n)>;
using FileFiller = std::function<Status(const AppendBytes& append)>;
Status write_file_atomic(const std::string& path, const FileFiller& fill);

// A new, empty folder beside `path` for a folder written whole and then
// renamed over `path` (a checkpoint): PATH.tmp.PID.K, the first K free (the
// temporaries of write_file_atomic are PATH.tmp.PID). Made with mode 0777,
// so the umask decides its permissions, as it does for the files written
// into it; mkdtemp's 0700 would hide the output from a group that shares
// it. Returns its path, or an Error naming `path`.
Result<std::string> make_temp_dir(const std::string& path);

// Outputs one command writes together: all of them, or none. stage()
// writes a file's bytes to a temporary beside it, as write_file_atomic does,
// and keeps it there; commit() renames every staged file over its path, in
// the order staged, and fsyncs their folders. Destroyed uncommitted (a stage
// failed, or the command failed after staging), the set removes its
// temporaries and the folders make_folder made for them: a command that
// fails leaves no output behind and replaces no file (a plan written, then
// `--lower DIR` failing, would be a failed run's partial output). Once
// commit() begins only a rename can fail (the folder changed under the
// command): the outputs renamed before it stay, and the Error names the
// first that did not.
class OutputSet {
 public:
  OutputSet() = default;
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  ~OutputSet();
  // `dir` and any missing folder above it created, remembered for removal
  // if the set is not committed. Error names `flag` and `dir`.
  Status make_folder(const std::string& flag, const std::string& dir);
  // The refusals and errors of write_file_atomic, naming `path`; on error
  // nothing at `path` changes and no temporary is left for it.
  Status stage(const std::string& path, const std::string& bytes);
  Status commit();

 private:
  struct Staged {
    std::string tmp, path;
  };
  std::vector<Staged> staged_;
  std::vector<std::string> made_;  // folders make_folder created, outermost first
  bool committed_ = false;
};

// Lower-case hex SHA-256 of `bytes` (OpenSSL).
std::string sha256_hex(const std::string& bytes);

// SHA-256 fed a piece at a time (OpenSSL), for what is too large to hold
// whole (a checkpoint's tensor files, read or written a chunk at a time).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  // Lower-case hex of everything fed so far; call once, then no update.
  std::string hex_digest();

 private:
  void* ctx_;   // OpenSSL's EVP_MD_CTX, kept out of this header
};

}  // namespace spindle::plan
