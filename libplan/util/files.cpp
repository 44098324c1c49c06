#include "libplan/util/files.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spindle::plan {

Result<std::string> read_file(const std::string& path, int64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Error{path + ": is a directory, not a file"};
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{path + ": cannot open: " + std::strerror(errno)};
  std::string out;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      return Error{path + ": larger than " + std::to_string(max_bytes) + " bytes, more than any input may have"};
    }
  }
  if (in.bad()) return Error{path + ": read failed: " + std::strerror(errno)};
  return out;
}

Result<std::string> read_regular_file(const std::string& path, int64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return Error{path + ": not a regular file"};
  return read_file(path, max_bytes);
}

std::error_code list_folder(const std::string& dir, std::vector<std::filesystem::directory_entry>& out) {
  out.clear();
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(*it);
  return ec;
}

std::string shared_input_refusal(const std::string& path, int ranks) {
  struct stat st {};
  if (ranks <= 1 || ::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return "";
  const char* what = S_ISFIFO(st.st_mode) ? "a pipe (FIFO)" : S_ISSOCK(st.st_mode) ? "a socket" : "a device";
  return path + ": is " + what + ", and each of the " + std::to_string(ranks) +
         " ranks reads this file itself, where a pipe or device can be read only once (one rank would take its "
         "bytes and the others wait forever): give a regular file";
}

namespace {

// What is at `path` without following a final symbolic link; "" when it may
// be written (a regular file, or nothing). Else the reason to refuse it.
std::string output_refusal(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return "";
    return std::string("cannot inspect: ") + std::strerror(errno);
  }
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISLNK(st.st_mode)) return "is a symbolic link (refused: name the file it points to)";
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device node";
  if (S_ISFIFO(st.st_mode)) return "is a FIFO";
  if (S_ISSOCK(st.st_mode)) return "is a socket";
  return "is not a regular file";
}

std::string parent_of(const std::string& path) {
  const std::string p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

// The folder `dir` exists, is a folder and is writable; else the reason.
std::string folder_refusal(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return "folder " + dir + (errno == ENOENT ? std::string(" does not exist") : ": " + std::string(std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return dir + " is not a folder";
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return "folder " + dir + " is not writable: " + std::strerror(errno);
  return "";
}

// `path` absolute, with its existing part's links, "." and ".." resolved
// and no trailing separator: two spellings of one path compare equal
// ("new/" and "new" too, while new does not exist yet).
std::filesystem::path normal_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path norm = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  if (ec) norm = std::filesystem::path(path);
  norm = norm.lexically_normal();
  return norm.has_filename() || !norm.has_relative_path() ? norm : norm.parent_path();
}

void fsync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);  // best effort: some file systems refuse fsync on folders
  ::close(fd);
}

}  // namespace

Status check_output_paths(const std::vector<OutputPath>& outputs, const std::vector<std::string>& inputs) {
  std::vector<std::string> seen;  // normalised output paths
  for (const OutputPath& o : outputs) {
    if (o.path.empty()) continue;
    const std::string who = o.flag + " " + o.path;
    if (std::string why = output_refusal(o.path); !why.empty()) return Error{who + ": " + why};
    if (std::string why = folder_refusal(parent_of(o.path)); !why.empty()) return Error{who + ": " + why};
    struct stat out {};
    if (::stat(o.path.c_str(), &out) == 0) {
      for (const std::string& in : inputs) {
        struct stat ist {};
        if (!in.empty() && ::stat(in.c_str(), &ist) == 0 && ist.st_dev == out.st_dev && ist.st_ino == out.st_ino) {
          return Error{who + ": is the input " + in + " (refused: it would be overwritten)"};
        }
      }
    }
    const std::string norm = normal_path(o.path).string();
    for (const std::string& other : seen) {
      if (other == norm) return Error{who + ": the same file as another output of this command"};
    }
    seen.push_back(norm);
  }
  return Status::Ok();
}

Status check_output_dir(const std::string& flag, const std::string& dir) {
  const std::string who = flag + " " + dir;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {  // follows links: a linked folder is fine
    if (!S_ISDIR(st.st_mode)) return Error{who + ": exists and is not a folder"};
    if (::access(dir.c_str(), W_OK | X_OK) != 0) return Error{who + ": not writable: " + std::strerror(errno)};
    return Status::Ok();
  }
  if (errno == ENOTDIR) return Error{who + ": a parent of it is not a folder"};
  if (errno != ENOENT) return Error{who + ": " + std::strerror(errno)};
  // Missing: it will be created; its nearest existing ancestor must be a writable folder.
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);   // fails only without a working folder
  if (ec) return Error{who + ": " + ec.message()};
  while (p.has_parent_path() && p != p.parent_path()) {
    p = p.parent_path();
    if (::stat(p.c_str(), &st) == 0) {
      if (std::string why = folder_refusal(p.string()); !why.empty()) return Error{who + ": " + why};
      return Status::Ok();
    }
  }
  return Error{who + ": no existing folder above it"};
}

Status check_apart_from_dir(const OutputDir& dir, const std::vector<OutputPath>& outputs,
                            const std::vector<std::string>& inputs) {
  if (dir.path.empty()) return Status::Ok();
  const std::filesystem::path folder = normal_path(dir.path);
  const std::string where = dir.flag + " " + dir.path;
  // "" when `path` stays clear of the folder's own entries, else why not.
  const auto clash = [&](const std::string& path) -> std::string {
    const std::filesystem::path p = normal_path(path);
    if (p == folder) return "is the folder of " + where;
    const std::filesystem::path rel = p.lexically_relative(folder);
    if (rel.empty() || *rel.begin() == "..") return "";
    const std::string first = rel.begin()->string();
    if (!dir.owns(first)) return "";
    return "is in the folder of " + where + ", where " + first + " is " + dir.taken;
  };
  for (const OutputPath& o : outputs) {
    if (o.path.empty()) continue;
    if (std::string why = clash(o.path); !why.empty()) return Error{o.flag + " " + o.path + ": " + why + "; name another file"};
  }
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    if (std::string why = clash(in); !why.empty())
      return Error{"the input " + in + " " + why + ": " + dir.flag + " would replace it; name another folder"};
  }
  return Status::Ok();
}

namespace {

// Every temporary beside `path` starts with this: PATH.tmp.PID, with
// `reserve` bytes more to come (make_temp_dir's ".K"). A file name that
// leaves no room for that within NAME_MAX (255 bytes: a 246-byte name
// failed with "File name too long" after the whole plan was made) gives
// its first kTemporaryNameBytes bytes and 8 hex digits of its SHA-256
// instead, so two long names that begin alike stay apart.
constexpr size_t kTemporaryNameBytes = 200;
std::string temporary_prefix(const std::string& path, size_t reserve = 0) {
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  const size_t slash = path.find_last_of('/');
  const size_t name_begin = slash == std::string::npos ? 0 : slash + 1;
  const size_t name_bytes = path.size() - name_begin;
  if (name_bytes + suffix.size() + reserve <= 255) return path + suffix;
  return path.substr(0, name_begin + std::min(name_bytes, kTemporaryNameBytes)) + "." +
         sha256_hex(path.substr(name_begin)).substr(0, 8) + suffix;
}

// write_file_atomic up to the rename: the bytes `fill` appends, in a
// temporary beside `path`, created exclusively (never through a link),
// written, fsynced and closed. Its name, or an Error naming `path` (the
// temporary removed).
Result<std::string> write_temporary(const std::string& path, const FileFiller& fill) {
  if (std::string why = output_refusal(path); !why.empty()) return Error{path + ": " + why};
  const std::string tmp = temporary_prefix(path);
  // O_EXCL | O_NOFOLLOW: never write through a link or into another file.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) return Error{path + ": cannot write: " + std::strerror(errno)};
  int saved = 0;
  const AppendBytes append = [&](const void* data, size_t size) -> Status {
    const char* bytes = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size && saved == 0) {
      const ssize_t n = ::write(fd, bytes + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        saved = n < 0 ? errno : EIO;
      } else {
        done += static_cast<size_t>(n);
      }
    }
    if (saved != 0) return Error{path + ": write failed: " + std::strerror(saved)};
    return Status::Ok();
  };
  const Status filled = fill(append);
  if (filled.ok() && saved == 0 && ::fsync(fd) != 0) saved = errno;
  if (::close(fd) != 0 && saved == 0) saved = errno;
  if (!filled.ok() || saved != 0) {
    ::unlink(tmp.c_str());
    if (!filled.ok()) return filled.error();
    return Error{path + ": write failed: " + std::strerror(saved)};
  }
  return tmp;
}
Result<std::string> write_temporary(const std::string& path, const std::string& bytes) {
  return write_temporary(path, [&](const AppendBytes& append) { return append(bytes.data(), bytes.size()); });
}

// The temporary renamed over `path`; on error it is removed.
Status rename_into_place(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    return Error{path + ": cannot rename into place: " + std::strerror(saved)};
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> make_temp_dir(const std::string& path) {
  const std::string prefix = temporary_prefix(path, 8) + ".";
  for (int k = 0; k < 1000; ++k) {
    std::string tmp = prefix + std::to_string(k);
    if (::mkdir(tmp.c_str(), 0777) == 0) return tmp;
    if (errno != EEXIST) return Error{path + ".tmp.*: cannot create: " + std::strerror(errno)};
  }
  return Error{path + ".tmp.*: cannot create: 1000 folders " + prefix + "K are there already"};
}

Status write_file_atomic(const std::string& path, const std::string& bytes) {
  return write_file_atomic(path, [&](const AppendBytes& append) { return append(bytes.data(), bytes.size()); });
}

Status write_file_atomic(const std::string& path, const FileFiller& fill) {
  Result<std::string> tmp = write_temporary(path, fill);
  if (!tmp) return tmp.error();
  SPINDLE_TRY(rename_into_place(*tmp, path));
  fsync_folder(parent_of(path));
  return Status::Ok();
}

OutputSet::~OutputSet() {
  if (committed_) return;
  for (const Staged& s : staged_) ::unlink(s.tmp.c_str());
  for (auto d = made_.rbegin(); d != made_.rend(); ++d) ::rmdir(d->c_str());  // empty by now; innermost first
}

Status OutputSet::make_folder(const std::string& flag, const std::string& dir) {
  // The folders that do not exist yet, from `dir` up to the first that does.
  std::vector<std::string> missing;
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(dir, ec);   // fails only without a working folder
  if (ec) return Error{flag + " " + dir + ": " + ec.message()};
  for (std::filesystem::path p = abs.lexically_normal(); !p.empty() && p != p.parent_path(); p = p.parent_path()) {
    if (p.filename().empty()) continue;  // "a/b/": the trailing separator
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) break;
    missing.push_back(p.string());
  }
  std::filesystem::create_directories(dir, ec);
  // Remembered even on error: what was made before it is removed with the set.
  for (auto m = missing.rbegin(); m != missing.rend(); ++m) {
    std::error_code made;
    if (std::filesystem::is_directory(*m, made)) made_.push_back(*m);
  }
  if (ec) return Error{flag + " " + dir + ": cannot create the folder: " + ec.message()};
  return Status::Ok();
}

Status OutputSet::stage(const std::string& path, const std::string& bytes) {
  Result<std::string> tmp = write_temporary(path, bytes);
  if (!tmp) return tmp.error();
  staged_.push_back({*tmp, path});
  return Status::Ok();
}

Status OutputSet::commit() {
  committed_ = true;  // from here on nothing is removed: what was renamed stays
  std::vector<std::string> folders;
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (Status st = rename_into_place(staged_[i].tmp, staged_[i].path); !st) {
      for (size_t j = i + 1; j < staged_.size(); ++j) ::unlink(staged_[j].tmp.c_str());
      return st;
    }
    const std::string folder = parent_of(staged_[i].path);
    if (std::find(folders.begin(), folders.end(), folder) == folders.end()) folders.push_back(folder);
  }
  for (const std::string& f : folders) fsync_folder(f);
  return Status::Ok();
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    throw std::runtime_error("OpenSSL: cannot start a SHA-256");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const void* data, size_t n) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n); }

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len);
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(const std::string& bytes) {
  Sha256 sha;
  sha.update(bytes.data(), bytes.size());
  return sha.hex_digest();
}

}  // namespace spindle::plan
