// Fuzz target of the DATA.yaml reader (parse_data_spec, libexec/data/dataset.h)
// against the shipped digits-mm model, as training and as --eval-data. A
// description it accepts has one entry per model task, each either synthetic
// or a dataset directory, never both; an error must name the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "libexec/data/dataset.h"
#include "libplan/model/model.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

namespace {

const plan::Model& digits_model() {
  static const plan::Model model = [] {
    plan::Result<plan::Model> m = plan::load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/digits-mm.yaml");
    fuzz::require(m.ok(), "the shipped digits-mm model loads", m.ok() ? "" : m.error().message);
    return *m;
  }();
  return model;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const plan::Model& model = digits_model();
  for (const bool eval : {false, true}) {
    const plan::Result<exec::DataSpec> spec = exec::parse_data_spec(text, fuzz::kPath, model, eval);
    if (!spec.ok()) {
      fuzz::require_error_names_file(spec.error().message);
      continue;
    }
    fuzz::require(spec->tasks.size() == model.tasks.size(), "one entry per model task");
    for (const exec::TaskDataSpec& t : spec->tasks)
      fuzz::require(t.synthetic == t.dir.empty(), "a task is synthetic or has a dataset directory, not both");
  }
  return 0;
}
