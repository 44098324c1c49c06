// Fuzz target of the checkpoint manifest reader (load_checkpoint,
// libexec/exec/checkpoint.h): the input is a checkpoint's manifest.json,
// beside params.bin, adam_m.bin and adam_v.bin that this target writes once
// (kTensors below; the corpus's manifests name their sizes and SHA-256). A
// checkpoint it accepts holds those tensors, its step at least 1 and a
// finite, non-negative gradient clip; an error must name a file of the
// checkpoint's folder. Nothing else reads files here.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "libexec/exec/checkpoint.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

namespace {

// The tensor files' contents: one 2 x 2 tensor "w" (params 1..4, moments
// 0.5 and 0.25 everywhere).
const std::map<std::string, exec::Tensor>& tensors(int file) {
  static const std::map<std::string, exec::Tensor> t[3] = {
      {{"w", exec::Tensor::from({2, 2}, {1, 2, 3, 4})}},
      {{"w", exec::Tensor::from({2, 2}, {0.5, 0.5, 0.5, 0.5})}},
      {{"w", exec::Tensor::from({2, 2}, {0.25, 0.25, 0.25, 0.25})}}};
  return t[file];
}

// A folder holding the three tensor files, made once per process:
// TMPDIR/spindle-fuzz-manifest-PID. libFuzzer may end a run without exit
// handlers, so each process first removes the folders of processes that
// are gone, and its own at a normal exit.
const std::string& checkpoint_dir() {
  namespace fs = std::filesystem;
  static const std::string prefix = "spindle-fuzz-manifest-";
  // Never destroyed: the exit handler registered while it is made would
  // run after its destructor.
  static const std::string& dir = *new std::string([] {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string digits = name.substr(prefix.size());
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
      if (::kill(static_cast<pid_t>(std::stol(digits)), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
    }
    const std::string t = (fs::temp_directory_path() / (prefix + std::to_string(::getpid()))).string();
    fs::remove_all(t, ec);
    fuzz::require(fs::create_directory(t, ec), "a scratch folder", t);
    const char* names[3] = {"params.bin", "adam_m.bin", "adam_v.bin"};
    for (int f = 0; f < 3; ++f) std::ofstream(t + "/" + names[f], std::ios::binary) << exec::encode_tensors(tensors(f));
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(checkpoint_dir(), ignored);
    });
    return t;
  }());
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  std::ofstream(dir + "/manifest.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  const plan::Result<exec::Checkpoint> ck = exec::load_checkpoint(dir);
  if (!ck.ok()) {
    fuzz::require(ck.error().message.rfind(dir + "/", 0) == 0, "an error names a file of the checkpoint",
                  ck.error().message);
    return 0;
  }
  fuzz::require(ck->meta.step >= 1 && ck->state.step == ck->meta.step, "a step of at least 1");
  fuzz::require(ck->meta.clip_grad >= 0 && ck->meta.clip_grad < 1e308, "a finite clip");
  fuzz::require(ck->state.tensors.size() == 1 && ck->state.tensors.count("w") == 1, "the tensors of the files");
  return 0;
}
