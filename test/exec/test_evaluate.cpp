// Executor::evaluate and the data-source hook on one device (SelfComm): an
// evaluation is forward only (training goes on exactly as without it), the
// shipped real example's files feed the same step as the synthetic default
// would feed its own data, and evaluation counts retrieval queries per task.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "helpers.h"
#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/data/dataset.h"
#include "libexec/exec/executor.h"
#include "fixtures.h"

using namespace spindle::exec;
using spindle::exec::test::one_device_plan;
using spindle::exec::test::OneDevice;
namespace sp = spindle::plan;

namespace {


std::unique_ptr<FileSource> digits(const sp::Model& model, const std::string& split, bool eval) {
  auto spec = load_data_spec(std::string(SPINDLE_SOURCE_DIR) + "/configs/data/digits/" + split + ".yaml", model, eval);
  REQUIRE(spec.ok());
  auto src = FileSource::open(*spec, model, 0, eval ? 1 : 0);
  REQUIRE(src.ok());
  return std::move(*src);
}

}  // namespace

TEST_CASE("evaluate is forward only: training with evaluations between steps is bitwise unchanged") {
  const sp::Model model = spindle::exec::test::shipped_model("digits-mm");
  const sp::Plan plan = one_device_plan(model);
  auto train_a = digits(model, "train", false), train_b = digits(model, "train", false);
  auto val = digits(model, "val", true);
  OneDevice a(model, plan), b(model, plan);
  a.ex->set_data(train_a.get());
  b.ex->set_data(train_b.get());
  std::vector<StepStats> sa, sb;
  EvalStats first{}, again{};
  for (int s = 0; s < 3; ++s) {
    sa.push_back(a.ex->step());
    first = b.ex->evaluate(*val, 0);
    again = b.ex->evaluate(*val, 0);
    sb.push_back(b.ex->step());
    CHECK(b.ex->steps_done() == s + 1);
  }
  for (size_t s = 0; s < sa.size(); ++s) CHECK(sa[s].task_loss == sb[s].task_loss);
  const auto pa = a.ex->gather_params(), pb = b.ex->gather_params();
  REQUIRE(pa.size() == pb.size());
  for (const auto& [name, t] : pa) {
    INFO(name);
    const Tensor& u = pb.at(name);
    REQUIRE(u.numel() == t.numel());
    CHECK(std::equal(t.data(), t.data() + t.numel(), u.data()));
  }
  // The same batch evaluates the same; queries: the batch, per contrastive task.
  CHECK(first.task_loss == again.task_loss);
  CHECK(first.hits_ab == again.hits_ab);
  CHECK(first.queries == std::vector<double>{48, 48, 0});
  for (size_t t = 0; t < 2; ++t) {
    CHECK(first.hits_ab[t] >= 0);
    CHECK(first.hits_ab[t] <= 48);
    CHECK(first.hits_ba[t] <= 48);
  }
  CHECK(first.task_loss[2] > 0);  // caption: lm_loss over the counted tokens
}

TEST_CASE("data_reads: one read per data-reading operator with the device's rows, labels on request") {
  const sp::Model model = spindle::exec::test::shipped_model("digits-mm");
  const sp::Plan plan = one_device_plan(model);
  OneDevice d(model, plan);
  const std::vector<DataRead> reads = d.ex->data_reads(false);
  // image-text: img, txt; audio-text: aud, txt; caption: img, txt, llm targets.
  REQUIRE(reads.size() == 7);
  int targets = 0;
  for (const DataRead& r : reads) {
    CHECK(r.row_begin == 0);
    CHECK(r.row_end == r.batch);
    targets += r.kind == DataKind::targets ? 1 : 0;
  }
  CHECK(targets == 1);
  const std::vector<DataRead> with_labels = d.ex->data_reads(true);
  CHECK(with_labels.size() == 9);  // + the labels of the two contrastive tasks
}
