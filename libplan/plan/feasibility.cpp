#include "libplan/plan/feasibility.h"

#include "libplan/alloc/alloc.h"

namespace spindle::plan {

Status check_model_fits_cluster(const Model& model, const Cluster& cluster) {
  for (const Module& m : model.modules) {
    if (m.tensor_parallel > cluster.devices())
      return make_error({model.path, "modules." + m.name + ".tensor_parallel", m.mark.line, m.mark.column},
                        "tensor_parallel " + std::to_string(m.tensor_parallel) + " is larger than cluster '" +
                            cluster.name + "' (" + std::to_string(cluster.devices()) + " devices)");
  }
  for (size_t t = 0; t < model.tasks.size(); ++t) {
    const Task& task = model.tasks[t];
    for (const Node& node : task.nodes) {
      const Module* m = model.find_module(node.module);
      if (!m || !valid_device_counts(cluster.devices(), m->tensor_parallel, task.batch).empty()) continue;
      return make_error({model.path, "tasks[" + std::to_string(t) + "].batch", task.mark.line, task.mark.column},
                        "batch " + std::to_string(task.batch) + " of task '" + task.name +
                            "' admits no device count for module '" + m->name + "' (tensor_parallel " +
                            std::to_string(m->tensor_parallel) + ") on " + std::to_string(cluster.devices()) +
                            " devices: a slice needs a multiple of tensor_parallel that divides the batch");
    }
  }
  return Status::Ok();
}

}  // namespace spindle::plan
