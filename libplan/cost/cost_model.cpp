#include "libplan/cost/cost_model.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "libplan/rules/devices.h"
#include "libplan/rules/memory.h"

namespace spindle::plan {

double ring_allreduce_ms(const Cluster& cluster, double bytes, const std::vector<int>& devices) {
  return ring_allreduce_ms(cluster.intra_island, cluster.inter_island, cluster.devices_per_island, bytes, devices);
}

double ring_allgather_ms(const Cluster& cluster, double bytes, const std::vector<int>& devices) {
  return ring_allgather_ms(cluster.intra_island, cluster.inter_island, cluster.devices_per_island, bytes, devices);
}

// ---- ProfileCostModel ----

Result<std::unique_ptr<ProfileCostModel>> ProfileCostModel::create(const Profile& profile,
                                                                    const Cluster& cluster,
                                                                    const OpGraph& graph) {
  const std::string file = profile.path.empty() ? std::string("<profile>") : profile.path;
  std::map<std::string, size_t> index;   // workload key -> entry index
  for (size_t i = 0; i < profile.entries.size(); ++i) {
    index.emplace(profile.entries[i].workload.key(), i);
  }
  auto model = std::unique_ptr<ProfileCostModel>(new ProfileCostModel(cluster));
  for (const Operator& op : graph.ops) {
    const std::string key = op.workload.key();   // once per operator: it is not cheap
    if (model->has_entry(key)) continue;
    auto it = index.find(key);
    if (it == index.end()) {
      return Error{file + ": no entry for op " + op.workload.op + " dims " +
                   op.workload.dims.dump() + " seq " + std::to_string(op.workload.seq) +
                   " batch " + std::to_string(op.workload.batch) + " (operator " + op.id +
                   "); regenerate the profile for this model with spindle-profile"};
    }
    const ProfileEntry& e = profile.entries[it->second];
    if (e.points.size() < 2 && several_valid_device_counts(cluster.devices(), op.tensor_parallel, op.workload.batch)) {
      return Error{file + ": entries[" + std::to_string(it->second) + "] (" + key + "): one point (" +
                   std::to_string(e.points.front().devices) + " devices), but several device counts are valid on " +
                   std::to_string(cluster.devices()) + " devices: a profile gives at least two points wherever "
                   "more than one count is valid (spec/profile.md)"};
    }
    // Inside a training step, as measured (Profile::compute_scale).
    std::vector<ProfilePoint> points = e.points;
    if (profile.compute_scale)
      for (ProfilePoint& pt : points) pt.ms *= *profile.compute_scale;
    auto curve = ScalingCurve::fit(points);
    if (!curve.ok()) {
      return Error{file + ": entries[" + std::to_string(it->second) + "] (" + key +
                   "): " + curve.error().message};
    }
    model->set_entry(key, Entry{std::move(curve).value(), e.param_bytes, e.activation_bytes_per_sample, e.forward_share});
  }
  if (profile.links) model->use_measured_links(*profile.links);
  if (profile.overhead) model->set_overhead(*profile.overhead);
  if (profile.optimizer_gbytes_per_s) model->set_optimizer_rate(*profile.optimizer_gbytes_per_s);
  return model;
}

// ---- TableCostModel ----

void TableCostModel::set(const Workload& w, ScalingCurve curve, int64_t param_bytes,
                         int64_t activation_bytes_per_sample) {
  set_entry(w.key(), Entry{std::move(curve), param_bytes, activation_bytes_per_sample});
}

void TableCostModel::set_forward_share(const Workload& w, double share) {
  auto it = entries_.find(w.key());
  if (it == entries_.end() || !(share >= 0 && share <= 1))
    throw std::invalid_argument("set_forward_share: " + w.key() + ": no entry, or a share outside [0, 1]");
  if (it->second.forward_share < 0) ++forward_shares_;
  it->second.forward_share = share;
}

double TableCostModel::forward_share(const Workload& w) const {
  auto it = entries_.find(w.key());
  return it == entries_.end() ? -1 : it->second.forward_share;
}

const ScalingCurve* TableCostModel::curve(const Workload& w) const {
  auto it = entries_.find(w.key());
  return it == entries_.end() ? nullptr : &it->second.curve;
}

int64_t TableCostModel::param_bytes(const Workload& w) const {
  auto it = entries_.find(w.key());
  return it == entries_.end() ? 0 : it->second.param_bytes;
}

int64_t TableCostModel::activation_bytes_per_sample(const Workload& w) const {
  auto it = entries_.find(w.key());
  return it == entries_.end() ? 0 : it->second.activation_bytes_per_sample;
}

double TableCostModel::p2p_ms(double bytes, bool cross_island) const {
  return link_ms(cross_island ? cluster_.inter_island : cluster_.intra_island, bytes);
}

double TableCostModel::optimizer_ms(int64_t values) const {
  return plan::optimizer_ms(values, optimizer_gbytes_per_s_);
}

double TableCostModel::norm_sum_ms(int64_t values) const {
  return plan::norm_sum_ms(values, optimizer_gbytes_per_s_);
}

double TableCostModel::collective_ms(Collective c, double bytes, const std::vector<int>& devices) const {
  if (devices.size() <= 1) return 0.0;
  // A ring reduce-scatter moves what a ring all-gather moves; an all-reduce is both.
  const double ring_ms = c == Collective::allreduce ? ring_allreduce_ms(allreduce_cluster_, bytes, devices)
                                                    : ring_allgather_ms(allreduce_cluster_, bytes, devices);
  return ring_ms + collective_overhead_ms(overhead_, c, bytes);
}

double TableCostModel::allreduce_ms(double bytes, const std::vector<int>& devices) const {
  return collective_ms(Collective::allreduce, bytes, devices);
}

double TableCostModel::allgather_ms(double bytes, const std::vector<int>& devices) const {
  return collective_ms(Collective::allgather, bytes, devices);
}

double TableCostModel::reduce_scatter_ms(double bytes, const std::vector<int>& devices) const {
  return collective_ms(Collective::reduce_scatter, bytes, devices);
}

void TableCostModel::use_measured_links(const ProfileLinks& links) {
  auto take = [](Link& into, const Link& measured) {
    if (measured.gbytes_per_s > 0) into = measured;
  };
  take(cluster_.intra_island, links.intra_p2p);
  take(cluster_.inter_island, links.inter_p2p);
  take(allreduce_cluster_.intra_island, links.intra_allreduce);
  take(allreduce_cluster_.inter_island, links.inter_allreduce);
  progress_in_calls_ = links.progress_in_calls;
}

}  // namespace spindle::plan
