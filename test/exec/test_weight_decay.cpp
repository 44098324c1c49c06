// AdamW without weight decay on 1-D tensors (ExecOptions::decay_1d false,
// spindle-run --no-weight-decay-1d, Megatron-LM's default): the 1-D tensors
// step as with no weight decay at all, the others as with it, bit for bit.
#include <catch2/catch.hpp>

#include <string>

#include "fixtures.h"
#include "helpers.h"

using namespace spindle::exec;
using spindle::exec::test::one_device_plan;
using spindle::exec::test::OneDevice;
using spindle::exec::test::shipped_model;

TEST_CASE("executor: without weight decay on 1-D tensors, those step as with none, the others as with it",
          "[adamw]") {
  const auto m = shipped_model("tiny-clip");
  const auto plan = one_device_plan(m);
  ExecOptions skip_1d, none;
  skip_1d.decay_1d = false;
  none.adamw.weight_decay = 0;
  none.adamw.lr = skip_1d.adamw.lr;
  OneDevice every(m, plan), skip(m, plan, skip_1d), no_decay(m, plan, none);
  // One step: all three from the same values, so with the same gradients
  // (a second step's would differ with the parameters).
  every.ex->step();
  skip.ex->step();
  no_decay.ex->step();
  const auto a = every.ex->gather_params(), b = skip.ex->gather_params(), c = no_decay.ex->gather_params();
  const auto shapes = every.ex->param_shapes();
  int one_d = 0, other = 0;
  bool decay_showed = false;   // some 1-D tensor moved otherwise with decay
  for (const auto& [name, shape] : shapes) {
    INFO(name);
    const bool flat = shape.size() == 1;
    (flat ? one_d : other) += 1;
    const auto& want = flat ? c.at(name) : a.at(name);
    for (int64_t i = 0; i < want.numel(); ++i) REQUIRE(b.at(name)[i] == want[i]);
    if (flat)
      for (int64_t i = 0; i < want.numel(); ++i) decay_showed |= a.at(name)[i] != b.at(name)[i];
  }
  CHECK(one_d > 0);   // biases, LayerNorm gains and biases
  CHECK(other > 0);
  CHECK(decay_showed);
}
