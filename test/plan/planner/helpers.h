// Shared helpers for the planner tests: hand-built operator graphs and
// scaling curves with known closed forms.
#pragma once

#include <string>
#include <vector>

#include "libplan/cost/curve.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/cluster.h"

namespace spindle::plan::test {

inline Workload workload(const std::string& op, int hidden, int64_t seq = 16, int64_t batch = 8) {
  Workload w;
  w.op = op;
  w.dims = nlohmann::json{{"hidden", hidden}};
  w.seq = seq;
  w.batch = batch;
  return w;
}

// Appends an operator (id "T/name/0.rep") and returns its index.
inline int add_op(OpGraph& g, const Workload& w, const std::vector<int>& inputs, int task = 0,
                  int tensor_parallel = 1) {
  Operator op;
  const int idx = static_cast<int>(g.ops.size());
  op.id = "t" + std::to_string(task) + "/n/0." + std::to_string(idx);
  op.param = "m/0." + std::to_string(idx);
  op.task = task;
  op.tensor_parallel = tensor_parallel;
  op.workload = w;
  op.inputs = inputs;
  for (int in : inputs) g.ops[static_cast<size_t>(in)].outputs.push_back(idx);
  g.ops.push_back(std::move(op));
  return idx;
}

// Appends a chain of `length` operators of workload w; returns the last index.
inline int add_chain(OpGraph& g, const Workload& w, int length, std::vector<int> inputs,
                     int task = 0) {
  int last = -1;
  for (int k = 0; k < length; ++k) {
    last = add_op(g, w, inputs, task);
    inputs = {last};
  }
  return last;
}

// `islands` x `per_island` A800-like devices: 80 GiB, 312 TFLOP/s,
// 2039 GB/s memory; links intra 200 GB/s, 3 us, inter 50 GB/s, 8 us.
inline Cluster test_cluster(int islands, int per_island) {
  Cluster c;
  c.name = "test";
  c.islands = islands;
  c.devices_per_island = per_island;
  c.memory_gib = 80;
  c.peak_tflops = 312;
  c.memory_gbytes_per_s = 2039;
  c.intra_island = {200, 3};
  c.inter_island = {50, 8};
  return c;
}

// Curve profiled at `counts` with T(n) = alpha + beta / n.
inline ScalingCurve alpha_beta_curve(double alpha, double beta, const std::vector<int>& counts) {
  std::vector<ProfilePoint> pts;
  for (int n : counts) pts.push_back({n, alpha + beta / n, 0});
  return ScalingCurve::fit(pts).value();
}

}  // namespace spindle::plan::test
