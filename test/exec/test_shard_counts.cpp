// The lowering states gradient bucket sizes from the operator catalogue
// (plan::op_shard_param_count); the runtime allocates parameters with
// make_params from the catalogue's tensors (plan::op_param_tensors). The
// two must agree for every op and tensor-parallel degree, tensor by tensor
// (the order is a bucket's flat layout), or predicted and measured bytes
// differ.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "libexec/ops/op.h"
#include "libplan/model/ops.h"

using namespace spindle::exec;
namespace sp = spindle::plan;

TEST_CASE("catalogue shard counts equal the runtime's parameter shards") {
  const int64_t max_seq = 10;
  const std::vector<std::pair<const char*, nlohmann::json>> ops = {
      {"patch_embed", {{"in_dim", 12}, {"hidden", 8}}},
      {"token_embed", {{"vocab", 20}, {"hidden", 8}}},
      {"transformer_layer", {{"hidden", 8}, {"heads", 4}, {"ffn", 16}, {"causal", false}}},
      {"linear", {{"in", 8}, {"out", 6}}},
      {"pool_project", {{"in", 8}, {"out", 6}}},
      {"contrastive_loss", {{"dim", 6}, {"temperature", 0.07}}},
      {"lm_loss", {{"hidden", 8}, {"vocab", 20}}},
  };
  for (const auto& [name, dims] : ops) {
    const bool tp_op = std::string(name) == "transformer_layer" || std::string(name) == "lm_loss";
    for (int k : {1, 2, 4}) {
      if (k > 1 && !tp_op) continue;
      for (int t = 0; t < k; ++t) {
        INFO(name << " TP rank " << t << " of " << k);
        OpConfig cfg;
        cfg.kind = op_kind(name).value();
        cfg.dims = dims;
        cfg.max_seq = max_seq;
        cfg.tp_rank = t;
        cfg.tp_size = k;
        const ParamSet set = make_params(cfg, "m/0.0", 1);
        CHECK(set.local_count() == sp::op_shard_param_count(name, dims, max_seq, k));
        CHECK(set.full_count() == sp::op_param_count(name, dims, max_seq));
        const std::vector<sp::ParamTensor> tensors = sp::op_param_tensors(name, dims, max_seq);
        REQUIRE(set.params.size() == tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
          const Param& p = set.params[i];
          CHECK(p.name == "m/0.0/" + tensors[i].name);
          CHECK(p.full_shape == tensors[i].shape);
          CHECK(p.shard_axis == tensors[i].shard_axis);
          Shape local = tensors[i].shape;   // rank t's block along the split axis
          if (tensors[i].shard_axis >= 0) local[static_cast<size_t>(tensors[i].shard_axis)] /= k;
          CHECK(p.value.shape() == local);
        }
      }
    }
  }
}
