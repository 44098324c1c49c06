// The operator catalogue (spec/model.md table).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "libplan/model/ops.h"

using namespace spindle::plan;
using nlohmann::json;

TEST_CASE("catalogue lists the seven ops with defaults", "[ops]") {
  REQUIRE(op_catalogue().size() == 7);
  REQUIRE(find_op("nope") == nullptr);
  const OpSpec* tl = find_op("transformer_layer");
  REQUIRE(tl != nullptr);
  REQUIRE(tl->dims.size() == 4);
  CHECK(tl->dims[3].name == std::string("causal"));
  CHECK_FALSE(tl->dims[3].required);
  CHECK(tl->dims[3].default_value == json(false));
  const OpSpec* cl = find_op("contrastive_loss");
  REQUIRE(cl != nullptr);
  CHECK(cl->is_loss);
  CHECK(cl->dims[1].default_value.get<double>() == Approx(0.07));
  CHECK(find_op("patch_embed")->reads_data);
  CHECK(find_op("token_embed")->reads_data);
  CHECK(find_op("lm_loss")->is_loss);
  CHECK_FALSE(find_op("linear")->reads_data);
  // What a forward draws from the data: the readers' input, lm_loss's targets.
  for (const OpSpec& op : op_catalogue()) {
    const std::string name = op.name;
    const bool reads = name == "patch_embed" || name == "token_embed" || name == "lm_loss";
    CHECK(op_reads_from_data(name) == reads);
    CHECK(op.reads_targets == (name == "lm_loss"));
  }
  CHECK_FALSE(op_reads_from_data("nope"));
  // Widths come from the dimensions the catalogue names.
  CHECK(find_op("pool_project")->in_width == std::string("in"));
  CHECK(find_op("contrastive_loss")->out_width == nullptr);
  CHECK(find_op("token_embed")->in_width == nullptr);
  // Split over tensor-parallel ranks: the layer's heads and MLP, the LM head's vocabulary.
  const std::vector<const char*>& layer = find_op("transformer_layer")->tp_split;
  CHECK(std::vector<std::string>(layer.begin(), layer.end()) == std::vector<std::string>{"heads", "ffn"});
  const std::vector<const char*>& head = find_op("lm_loss")->tp_split;
  CHECK(std::vector<std::string>(head.begin(), head.end()) == std::vector<std::string>{"vocab"});
  CHECK(find_op("linear")->tp_split.empty());
}

TEST_CASE("widths and parameter counts follow the table", "[ops]") {
  const json pe = {{"in_dim", 588}, {"hidden", 1280}};
  CHECK(op_in_width("patch_embed", pe) == 0);
  CHECK(op_out_width("patch_embed", pe) == 1280);
  CHECK(op_param_count("patch_embed", pe, 257) == 588 * 1280 + 1280 + 257 * 1280);

  const json te = {{"vocab", 49408}, {"hidden", 1024}};
  CHECK(op_param_count("token_embed", te, 77) == 49408LL * 1024 + 77 * 1024);

  const json tl = {{"hidden", 1280}, {"heads", 16}, {"ffn", 5120}, {"causal", false}};
  CHECK(op_in_width("transformer_layer", tl) == 1280);
  CHECK(op_out_width("transformer_layer", tl) == 1280);
  // 4*1280^2 + 2*1280*5120 + 5120 + 9*1280 = 6553600 + 13107200 + 5120 + 11520
  CHECK(op_param_count("transformer_layer", tl, 0) == 19677440);

  const json lin = {{"in", 32}, {"out", 16}};
  CHECK(op_in_width("linear", lin) == 32);
  CHECK(op_out_width("linear", lin) == 16);
  CHECK(op_param_count("linear", lin, 5) == 32 * 16 + 16);
  CHECK(op_param_count("pool_project", lin, 5) == 32 * 16 + 16 + 64);
  CHECK(op_out_width("pool_project", lin) == 16);

  const json cl = {{"dim", 1024}, {"temperature", 0.07}};
  CHECK(op_in_width("contrastive_loss", cl) == 1024);
  CHECK(op_out_width("contrastive_loss", cl) == 0);
  CHECK(op_param_count("contrastive_loss", cl, 1) == 0);

  const json lm = {{"hidden", 32}, {"vocab", 64}};
  CHECK(op_in_width("lm_loss", lm) == 32);
  CHECK(op_out_width("lm_loss", lm) == 0);
  CHECK(op_param_count("lm_loss", lm, 9) == 32 * 64 + 64);
}

TEST_CASE("parameter tensors: names, shapes and tensor-parallel splits as docs/spec/ops.md lists them", "[ops]") {
  const json tl = {{"hidden", 8}, {"heads", 2}, {"ffn", 12}, {"causal", true}};
  const std::vector<ParamTensor> t = op_param_tensors("transformer_layer", tl, 0);
  std::vector<std::string> names;
  for (const ParamTensor& p : t) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"ln1_g", "ln1_b", "w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o",
                                          "ln2_g", "ln2_b", "w_1", "b_1", "w_2", "b_2"});
  auto find = [&](const std::string& n) -> const ParamTensor& {
    return *std::find_if(t.begin(), t.end(), [&](const ParamTensor& p) { return p.name == n; });
  };
  // Column-parallel (q, k, v, w_1 and their biases), row-parallel (w_o,
  // w_2), whole (LayerNorms, b_o, b_2).
  CHECK(find("w_q").shape == std::vector<int64_t>{8, 8});
  CHECK(find("w_q").shard_axis == 1);
  CHECK(find("b_q").shard_axis == 0);
  CHECK(find("w_o").shard_axis == 0);
  CHECK(find("w_1").shape == std::vector<int64_t>{8, 12});
  CHECK(find("w_1").shard_axis == 1);
  CHECK(find("w_2").shape == std::vector<int64_t>{12, 8});
  CHECK(find("w_2").shard_axis == 0);
  for (const char* whole : {"ln1_g", "ln1_b", "b_o", "ln2_g", "ln2_b", "b_2"}) CHECK(find(whole).shard_axis == -1);
  // 4 h^2 + 2 h f + f + 9 h = 256 + 192 + 12 + 72; on 2 ranks the split
  // part (4 h^2 + 3 h + 2 h f + f = 484) halves and 6 h stay whole.
  CHECK(op_param_count("transformer_layer", tl, 0) == 532);
  CHECK(op_shard_param_count("transformer_layer", tl, 0, 2) == 484 / 2 + 48);
  const json lm = {{"hidden", 8}, {"vocab", 12}};
  CHECK(op_shard_param_count("lm_loss", lm, 0, 3) == 8 * 12 / 3 + 16);
  const std::vector<ParamTensor> pe = op_param_tensors("patch_embed", json{{"in_dim", 6}, {"hidden", 4}}, 5);
  REQUIRE(pe.size() == 3);
  CHECK(pe[2].name == "pos");
  CHECK(pe[2].shape == std::vector<int64_t>{5, 4});   // max_seq rows
  CHECK(op_param_tensors("contrastive_loss", json{{"dim", 4}, {"temperature", 0.07}}, 1).empty());
  CHECK(op_param_tensors("no_such_op", json::object(), 1).empty());
}
