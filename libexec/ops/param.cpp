#include "libexec/ops/param.h"

#include <stdexcept>

#include "libexec/rng.h"
#include "libplan/util/parallel.h"

namespace spindle::exec {

Param& ParamSet::get(const std::string& tensor) {
  const std::string full = name + "/" + tensor;
  for (Param& p : params)
    if (p.name == full) return p;
  throw std::out_of_range("no parameter " + full);
}

int64_t ParamSet::local_count() const {
  int64_t n = 0;
  for (const Param& p : params) n += p.value.numel();
  return n;
}

int64_t ParamSet::full_count() const {
  int64_t n = 0;
  for (const Param& p : params) n += shape_numel(p.full_shape);
  return n;
}

void ParamSet::zero_grads() {
  for (Param& p : params) p.grad.zero();
}

void add_param(ParamSet& set, const std::string& tensor, Shape full_shape, int shard_axis,
               int tp_rank, int tp_size, uint64_t seed, InitSpec init) {
  Param p;
  p.name = set.name + "/" + tensor;
  p.full_shape = full_shape;
  p.shard_axis = shard_axis;
  Shape local = full_shape;
  int64_t inner = 1, full_a = 1, local_a = 1, offset = 0;
  if (shard_axis >= 0) {
    const auto a = static_cast<size_t>(shard_axis);
    if (a >= full_shape.size() || full_shape[a] % tp_size != 0)
      throw std::invalid_argument(p.name + ": axis " + std::to_string(shard_axis) + " of " +
                                  shape_str(full_shape) + " does not split into " +
                                  std::to_string(tp_size));
    local[a] = full_shape[a] / tp_size;
    for (size_t d = a + 1; d < full_shape.size(); ++d) inner *= full_shape[d];
    full_a = full_shape[a];
    local_a = local[a];
    offset = tp_rank * local_a;
  }
  p.value = Tensor::zeros(local);
  p.grad = Tensor::zeros(local);
  const uint64_t stream = hash_name(p.name);
  plan::parallel_ranges(p.value.numel(), set.init_threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t g = i;  // global flat index of local element i
      if (shard_axis >= 0) {
        const int64_t o = i / (local_a * inner), rem = i % (local_a * inner);
        g = (o * full_a + offset + rem / inner) * inner + rem % inner;
      }
      float v = 0;
      switch (init.kind) {
        case InitKind::zeros: v = 0; break;
        case InitKind::ones: v = 1; break;
        case InitKind::uniform: v = init.scale * uniform_pm1(seed, stream, g); break;
        case InitKind::normal: v = init.scale * normal01(seed, stream, g); break;
      }
      p.value[i] = v;
    }
  });
  set.params.push_back(std::move(p));
}

}  // namespace spindle::exec
