// Shared helpers of the libexec tests.
#pragma once

#include <cstdint>
#include <string>

#include "libexec/ops/op.h"
#include "libexec/rng.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan.h"

namespace spindle::exec::test {

// The OpConfig of one operator of `kind` (no tensor parallelism).
inline OpConfig op_config(OpKind kind, nlohmann::json dims, int64_t max_seq = 0) {
  OpConfig c;
  c.kind = kind;
  c.dims = std::move(dims);
  c.max_seq = max_seq;
  return c;
}

// Host tensor with values uniform in [-scale, scale), a function of (seed, i).
inline Tensor random_tensor(Shape shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::zeros(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = scale * uniform_pm1(seed, 77, i);
  return t;
}

// Integer ids in 0..n-1 stored as fp32.
inline Tensor random_ids(Shape shape, int64_t n, uint64_t seed) {
  Tensor t = Tensor::zeros(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i)
    t[i] = static_cast<float>(static_cast<int64_t>((uniform_pm1(seed, 91, i) + 1.0f) * 0.5f * n) % n);
  return t;
}

// Adds uniform noise in [-scale, scale) to every parameter (so LayerNorm
// gains are not 1 and biases not 0 in gradient checks).
inline void perturb(ParamSet& set, uint64_t seed, float scale = 0.5f) {
  for (Param& p : set.params)
    for (int64_t i = 0; i < p.value.numel(); ++i)
      p.value[i] += scale * uniform_pm1(seed, hash_name(p.name), i);
}

// Block t of k along `axis` of a full host tensor.
inline Tensor shard_of(const Tensor& full, int axis, int t, int k) {
  if (axis < 0) return full.clone();
  Shape local = full.shape();
  const auto a = static_cast<size_t>(axis);
  local[a] /= k;
  int64_t inner = 1;
  for (size_t d = a + 1; d < local.size(); ++d) inner *= local[d];
  const int64_t full_a = full.shape()[a], local_a = local[a];
  Tensor out = Tensor::zeros(local);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int64_t o = i / (local_a * inner), rem = i % (local_a * inner);
    out[i] = full[(o * full_a + t * local_a + rem / inner) * inner + rem % inner];
  }
  return out;
}

// Largest |a - b| relative to max(1, largest |b|).
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 1;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return a.numel() == b.numel() ? diff / scale : 1e30;
}

// A valid-enough 1-device plan: one MetaOp and one wave per operator, in the
// graph's topological order (the executor only needs slices, devices and
// waves; contraction does not change what runs).
inline plan::Plan one_device_plan(const plan::Model& model) {
  const plan::OpGraph g = plan::expand(model);
  plan::Plan plan;
  plan.model_name = model.name;
  plan.model_sha256 = model.sha256;
  plan.devices = 1;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    plan::PlanMetaOp m;
    m.id = static_cast<int>(i);
    m.task = model.tasks[static_cast<size_t>(g.ops[i].task)].name;
    m.workload = g.ops[i].workload;
    m.operators = {g.ops[i].id};
    plan.metaops.push_back(m);
    plan::Wave w;
    w.index = static_cast<int>(i);
    w.slices.push_back({static_cast<int>(i), 0, 1, {0}, 0.0});
    plan.waves.push_back(w);
  }
  return plan;
}

}  // namespace spindle::exec::test
