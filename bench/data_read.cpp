// data_read: what reading training data from files costs, as a share of a
// CPU training step, on the shipped real example (configs/models/digits-mm
// on configs/data/digits, docs/spec/data.md).
//
//   build/bench/data_read [--steps 40] [--warmup 5]
//
// One device (one process, CPU backend, a one-device plan: every operator
// its own wave): per step, the time to read and check the step's batch from
// the memory-mapped .npy files (DataSource::prepare: sampling, the shuffle,
// dtype conversion, value checks) and the time of the training step itself
// (Executor::step). Prints medians and the share read / (read + step)
// against the target (< 5%, bench/README.md). One device reads every row of every
// task: with N devices each reads about 1/N of the rows and steps take
// longer per row, so the share on one device is the upper end.
#include <cstdio>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.h"
#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/data/dataset.h"
#include "libexec/exec/data.h"
#include "libexec/exec/executor.h"
#include "libexec/ops/op.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"
#include "test/exec/helpers.h"

using namespace spindle;

// Every operator in its own wave on device 0 (the executor tests' plan).
using exec::test::one_device_plan;

int main(int argc, char** argv) {
  int steps = 40, warmup = 5;
  CLI::App app{"data_read: data-reading cost as a share of a CPU step on the shipped digits example"};
  app.add_option("--steps", steps, "measured steps")->capture_default_str();
  app.add_option("--warmup", warmup, "steps before measuring")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::string root = SPINDLE_SOURCE_DIR;
  auto model = plan::load_model(root + "/configs/models/digits-mm.yaml");
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.error().message.c_str()), 2;
  auto spec = exec::load_data_spec(root + "/configs/data/digits/train.yaml", *model, false);
  if (!spec.ok()) return std::fprintf(stderr, "%s\n", spec.error().message.c_str()), 2;
  auto data = exec::FileSource::open(*spec, *model, 0);
  if (!data.ok()) return std::fprintf(stderr, "%s\n", data.error().message.c_str()), 2;

  const plan::Plan plan = one_device_plan(*model);
  exec::SelfComm world;
  exec::GroupComms groups;
  groups[{0}] = std::make_unique<exec::SelfComm>();
  auto backend = exec::make_backend("cpu");
  exec::Executor ex(*model, plan, world, std::move(groups), *backend, exec::ExecOptions{});
  ex.set_data(data->get());
  const std::vector<exec::DataRead> reads = ex.data_reads(false);

  std::vector<double> read_ms, step_ms;
  for (int s = 0; s < warmup + steps; ++s) {
    std::string error;
    const double r = bench::time_ms([&] { error = (*data)->prepare(reads, s); });
    if (!error.empty()) return std::fprintf(stderr, "%s\n", error.c_str()), 1;
    const double t = bench::time_ms([&] { ex.step(); });
    if (s >= warmup) {
      read_ms.push_back(r);
      step_ms.push_back(t);
    }
  }
  int64_t rows = 0;
  for (const exec::DataRead& r : reads) rows += r.rows();
  const double read = bench::median(read_ms), step = bench::median(step_ms);
  const double share = read / (read + step);
  std::printf("data_read: %s, %s\n", bench::utc_date().c_str(), bench::machine_line().c_str());
  std::printf("model digits-mm on configs/data/digits/train, one CPU device, %zu reads (%lld node rows) per step, "
              "median of %d steps\n",
              reads.size(), static_cast<long long>(rows), steps);
  std::printf("read and check a step's batch  %8.3f ms\n", read);
  std::printf("training step                  %8.3f ms\n", step);
  std::printf("data-reading share of a step   %8.3f %%  target 5%% -> ratio %.3f\n", 100 * share, share / 0.05);

  // The synthetic data a GPU rank draws without --data: multitask-clip-4's
  // ViT-H image read (in_dim 588, seq 257) for a local batch of 32, on one
  // host thread and on every core (ExecOptions::host_threads), same values.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const exec::SampleRange vit{0, "image-text", 0, 32};
  std::vector<double> one_ms, all_ms;
  bool same = true;
  for (int s = 0; s < 5; ++s) {
    exec::Tensor a, b;
    one_ms.push_back(bench::time_ms([&] { a = exec::synth_features(vit, "img", "vision", 257, 588, 1); }));
    all_ms.push_back(bench::time_ms([&] { b = exec::synth_features(vit, "img", "vision", 257, 588, cores); }));
    for (int64_t i = 0; i < a.numel(); ++i) same = same && a[i] == b[i];
  }
  const double one = bench::median(one_ms), all = bench::median(all_ms);
  std::printf("synthetic ViT-H read, 32 x 257 x 588 values (median of 5): 1 thread %.1f ms, %d threads %.1f ms, "
              "speedup %.2fx, values %s\n",
              one, cores, all, one / all, same ? "identical" : "DIFFER");

  // Seeding one ViT-H layer's parameters at start (make_params), the same way.
  exec::OpConfig layer;
  layer.kind = exec::OpKind::transformer_layer;
  layer.dims = {{"hidden", 1280}, {"heads", 16}, {"ffn", 5120}, {"causal", false}};
  std::vector<double> seed_one, seed_all;
  bool seeded_same = true;
  int64_t values = 0;
  for (int s = 0; s < 3; ++s) {
    exec::ParamSet a, b;
    seed_one.push_back(bench::time_ms([&] { a = exec::make_params(layer, "vision/1.0", 0, 1); }));
    seed_all.push_back(bench::time_ms([&] { b = exec::make_params(layer, "vision/1.0", 0, cores); }));
    values = a.local_count();
    for (size_t p = 0; p < a.params.size(); ++p) {
      const exec::Tensor& x = a.params[p].value;
      seeded_same = seeded_same && std::equal(x.data(), x.data() + x.numel(), b.params[p].value.data());
    }
  }
  const double s1 = bench::median(seed_one), sa = bench::median(seed_all);
  std::printf("seeding a ViT-H layer's %lld parameters (median of 3): 1 thread %.1f ms (%.1f ns each), %d threads "
              "%.1f ms, speedup %.2fx, values %s\n",
              static_cast<long long>(values), s1, 1e6 * s1 / static_cast<double>(values), cores, sa, s1 / sa,
              seeded_same ? "identical" : "DIFFER");
  return same && seeded_same ? 0 : 1;
}
