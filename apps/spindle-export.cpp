// spindle-export: a checkpoint's parameters as a safetensors file
// (spec/cli.md, docs/spec/ops.md "Exported weights").
//
//   spindle-export CHECKPOINT -o MODEL.safetensors
//
// CHECKPOINT is a step directory (DIR/step-N) or a --checkpoint DIR (its
// newest complete step). Exit 0 on success, 2 on bad usage or a missing,
// incomplete or corrupt checkpoint (the message names the file), 1 when the
// output cannot be written (nothing is left at its path).
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/cli_paths.h"
#include "libexec/exec/export.h"
#include "libplan/util/files.h"

namespace {
constexpr int kExitInvalid = 2;
constexpr int kExitFailure = 1;
}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint, out_path;
  CLI::App app{"spindle-export: write a checkpoint's parameters as safetensors"};
  spindle::apps::init_app(app, "spindle-export");
  app.add_option("checkpoint", checkpoint, "checkpoint step directory DIR/step-N, or DIR for its newest")
      ->required();
  app.add_option("-o,--output", out_path, "safetensors file to write")->required()->check(spindle::apps::non_empty_path());
  spindle::apps::refuse_empty_values(app);   // once every option is added
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return e.get_exit_code() == 0 ? 0 : kExitInvalid;
  }
  // The output policy of every app (docs/hardening.md, "Outputs"): checked
  // before anything is read.
  if (const auto st = spindle::plan::check_output_paths({{"-o", out_path}}, {checkpoint}); !st.ok()) {
    std::fprintf(stderr, "spindle-export: error: %s\n", st.error().message.c_str());
    return kExitInvalid;
  }
  bool write_failed = false;
  const auto summary = spindle::exec::export_checkpoint(checkpoint, out_path, &write_failed);
  if (!summary.ok()) {
    std::fprintf(stderr, "spindle-export: error: %s\n", summary.error().message.c_str());
    return write_failed ? kExitFailure : kExitInvalid;
  }
  const auto& s = summary.value();
  std::printf("spindle-export: %s (step %lld): %lld tensors, %lld parameters -> %s (%lld bytes)\n",
              s.step_dir.c_str(), static_cast<long long>(s.step), static_cast<long long>(s.tensors),
              static_cast<long long>(s.elements), out_path.c_str(), static_cast<long long>(s.bytes));
  return 0;
}
