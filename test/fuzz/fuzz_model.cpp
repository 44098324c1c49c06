// Fuzz target of the model reader (parse_model_string). A model it accepts
// must satisfy what later stages rely on: parameter_count() and expand()
// without overflow (UBSan checks that) and an operator graph whose edges go
// from lower to higher indices.
#include <cstddef>
#include <cstdint>
#include <string>

#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  plan::Result<plan::Model> model = plan::parse_model_string(text, fuzz::kPath);
  if (!model.ok()) {
    fuzz::require_error_names_file(model.error().message);
    return 0;
  }
  fuzz::require(!model->modules.empty() && !model->tasks.empty(), "a model has modules and tasks");
  fuzz::require(model->parameter_count() > 0, "a model has parameters");

  // Expanding a huge model (repeat counts up to 10^6) is slow, not wrong:
  // only expand models of fuzzing size.
  int64_t operators = 0;
  for (const plan::Task& task : model->tasks) {
    for (const plan::Node& node : task.nodes) {
      const plan::Module* m = model->find_module(node.module);
      fuzz::require(m != nullptr, "every node names a known module", node.module);
      for (const plan::Block& b : m->blocks) operators += b.repeat;
    }
  }
  if (operators > 10000) return 0;
  const plan::OpGraph graph = plan::expand(*model);
  fuzz::require(static_cast<int64_t>(graph.ops.size()) == operators, "one operator per block repetition");
  for (std::size_t i = 0; i < graph.ops.size(); ++i) {
    for (int in : graph.ops[i].inputs) {
      fuzz::require(in >= 0 && static_cast<std::size_t>(in) < i, "edges go from lower to higher index",
                    graph.ops[i].id);
    }
  }
  return 0;
}
