// The executor with the fake communicator (one device, SelfComm): training
// on the synthetic data lowers the loss; plus the synthetic data's
// independence from how rows are split (row arithmetic: test/plan/rules).
// The multi-rank equivalence runs under mpirun (test/exec/mpi/run_checks.sh).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/exec/data.h"
#include "helpers.h"
#include "libexec/exec/executor.h"
#include "fixtures.h"
#include "libplan/graph/op_graph.h"

using namespace spindle::exec;
using spindle::exec::test::one_device_plan;
namespace sp = spindle::plan;

namespace {



double total(const StepStats& s) {
  double t = 0;
  for (double l : s.task_loss) t += l;
  return t;
}

}  // namespace

TEST_CASE("data: a sample depends on (seed, task, index), not on how rows are split") {
  const SampleRange all{7, "image-text", 0, 8}, part{7, "image-text", 2, 3};
  const Tensor f_all = synth_features(all, "img", "vision", 5, 6), f_part = synth_features(part, "img", "vision", 5, 6);
  const Tensor t_all = synth_tokens(all, "text", 4, 64), t_part = synth_tokens(part, "text", 4, 64);
  for (int64_t i = 0; i < f_part.numel(); ++i) REQUIRE(f_part[i] == f_all[2 * 30 + i]);
  for (int64_t i = 0; i < t_part.numel(); ++i) REQUIRE(t_part[i] == t_all[2 * 4 + i]);
  for (int64_t i = 0; i < t_all.numel(); ++i) REQUIRE((t_all[i] >= 0 && t_all[i] < 64));
  // Another seed, other data.
  const Tensor other = synth_features({8, "image-text", 0, 8}, "img", "vision", 5, 6);
  CHECK(other[0] != f_all[0]);
}

TEST_CASE("executor: one device with SelfComm trains tiny-clip, loss falls over 20 steps") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  const sp::Plan plan = one_device_plan(model);
  REQUIRE(Executor::device_groups(model, plan) == std::vector<std::vector<int>>{{0}});
  SelfComm world;
  GroupComms groups;
  groups[{0}] = std::make_unique<SelfComm>();
  auto backend = make_backend("cpu");
  ExecOptions opts;
  opts.record_trace = true;
  Executor ex(model, plan, world, std::move(groups), *backend, opts);
  std::vector<double> losses;
  for (int s = 0; s < 20; ++s) {
    const StepStats st = ex.step();
    REQUIRE(st.task_loss.size() == model.tasks.size());
    losses.push_back(total(st));
  }
  INFO("first " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < 0.7 * losses.front());
  CHECK((losses[17] + losses[18] + losses[19]) / 3 < (losses[0] + losses[1] + losses[2]) / 3);
  // Trace: compute boxes for every slice forward and backward, every step.
  size_t compute = 0;
  for (const auto& e : ex.trace()) compute += e.cat == "compute" ? 1 : 0;
  CHECK(compute == 20 * (2 * plan.waves.size() + 1));  // + the optimizer box
  // Parameters: every tensor of the model, full shapes.
  const auto params = ex.gather_params();
  int64_t count = 0;
  for (const auto& [name, t] : params) count += t.numel();
  CHECK(count == model.parameter_count());
}

TEST_CASE("executor: the same seed gives the same losses, another seed others") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  const sp::Plan plan = one_device_plan(model);
  auto run = [&](uint64_t seed) {
    SelfComm world;
    GroupComms groups;
    groups[{0}] = std::make_unique<SelfComm>();
    auto backend = make_backend("cpu");
    ExecOptions opts;
    opts.seed = seed;
    Executor ex(model, plan, world, std::move(groups), *backend, opts);
    std::vector<double> l;
    for (int s = 0; s < 3; ++s) l.push_back(total(ex.step()));
    return l;
  };
  CHECK(run(1) == run(1));
  CHECK(run(1) != run(2));
}

TEST_CASE("executor: a plan for another world size is rejected") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  sp::Plan plan = one_device_plan(model);
  plan.devices = 2;
  SelfComm world;
  auto backend = make_backend("cpu");
  CHECK_THROWS_AS(Executor(model, plan, world, GroupComms{}, *backend, ExecOptions{}), std::invalid_argument);
}
