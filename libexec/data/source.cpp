#include "libexec/data/source.h"

#include "libexec/exec/data.h"

namespace spindle::exec {

bool op_data_read(const plan::Model& model, const plan::Operator& op, DataRead* out) {
  const plan::Workload& w = op.workload;
  DataRead r;
  if (w.op == "patch_embed") {
    r.kind = DataKind::features;
    r.width = w.dims.at("in_dim").get<int64_t>();
  } else if (w.op == "token_embed") {
    r.kind = DataKind::tokens;
    r.width = w.dims.at("vocab").get<int64_t>();
  } else if (w.op == "lm_loss") {
    r.kind = DataKind::targets;
    r.width = w.dims.at("vocab").get<int64_t>();
  } else {
    return false;
  }
  const plan::Task& task = model.tasks[static_cast<size_t>(op.task)];
  const plan::Node& node = task.nodes[static_cast<size_t>(op.node)];
  r.task = op.task;
  r.task_name = task.name;
  r.node = node.id;
  r.module = node.module;
  r.seq = w.seq;
  r.batch = w.batch;
  r.row_begin = 0;
  r.row_end = w.batch;
  *out = std::move(r);
  return true;
}

std::string DataSource::prepare(const std::vector<DataRead>& reads, int64_t batch) {
  prepared_.clear();
  prepared_batch_ = batch;
  try {
    for (const DataRead& r : reads) prepared_[r.key()] = load(r, batch);
  } catch (const DataError& e) {
    prepared_.clear();
    return e.what();
  }
  return "";
}

void DataSource::release() {
  prepared_.clear();
  prepared_batch_ = -1;
}

Tensor DataSource::read(const DataRead& r, int64_t batch) {
  if (batch == prepared_batch_) {
    const auto it = prepared_.find(r.key());
    if (it != prepared_.end()) return it->second;
  }
  return load(r, batch);
}

Tensor SyntheticSource::load(const DataRead& r, int64_t batch) {
  // Evaluation streams start far beyond any training sample index.
  const int64_t first = static_cast<int64_t>(stream_ << 40) + batch * r.batch + r.row_begin;
  const SampleRange s{seed_, r.task_name, first, r.rows()};
  switch (r.kind) {
    case DataKind::features: return synth_features(s, r.node, r.module, r.seq, r.width, threads_);
    case DataKind::tokens: return synth_tokens(s, r.module, r.seq, r.width, threads_);
    case DataKind::targets: return synth_targets(s, r.module, r.seq, r.width, threads_);
    case DataKind::labels: return Tensor();  // synthetic pairs are their own class
  }
  return Tensor();
}

}  // namespace spindle::exec
