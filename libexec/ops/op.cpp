#include "libexec/ops/op.h"

#include <stdexcept>
#include <string>

#include "libplan/model/ops.h"

namespace spindle::exec {

namespace {
InitSpec param_init(const OpConfig& cfg, const std::string& tensor) {
  switch (cfg.kind) {
    case OpKind::patch_embed: return patch_embed_param_init(cfg, tensor);
    case OpKind::token_embed: return token_embed_param_init(cfg, tensor);
    case OpKind::transformer_layer: return transformer_layer_param_init(cfg, tensor);
    case OpKind::linear: return linear_param_init(cfg, tensor);
    case OpKind::pool_project: return pool_project_param_init(cfg, tensor);
    case OpKind::lm_loss: return lm_loss_param_init(cfg, tensor);
    case OpKind::contrastive_loss: break;
  }
  throw std::logic_error(std::string(op_name(cfg.kind)) + " has no parameter " + tensor);
}
}  // namespace

ParamSet make_params(const OpConfig& cfg, const std::string& name, uint64_t seed, int threads) {
  ParamSet set;
  set.name = name;
  set.init_threads = threads;
  // The tensors, shapes and TP splits of the op catalogue, in its order.
  for (const plan::ParamTensor& t : plan::op_param_tensors(op_name(cfg.kind), cfg.dims, cfg.max_seq))
    add_param(set, t.name, t.shape, t.shard_axis, cfg.tp_rank, cfg.tp_size, seed, param_init(cfg, t.name));
  return set;
}

namespace {
template <class State, class Init>
Op bind(OpKind kind, Init init) {
  Op op;
  op.kind = kind;
  State s;
  init(s);
  op.state = std::move(s);
  return op;
}
}  // namespace

Op make_op(const OpConfig& cfg, ParamSet& params) {
  switch (cfg.kind) {
    case OpKind::patch_embed:
      return bind<PatchEmbedState>(cfg.kind, [&](auto& s) { patch_embed_init(s, cfg, params); });
    case OpKind::token_embed:
      return bind<TokenEmbedState>(cfg.kind, [&](auto& s) { token_embed_init(s, cfg, params); });
    case OpKind::transformer_layer:
      return bind<TransformerLayerState>(cfg.kind,
                                         [&](auto& s) { transformer_layer_init(s, cfg, params); });
    case OpKind::linear:
      return bind<LinearState>(cfg.kind, [&](auto& s) { linear_init(s, cfg, params); });
    case OpKind::pool_project:
      return bind<PoolProjectState>(cfg.kind, [&](auto& s) { pool_project_init(s, cfg, params); });
    case OpKind::contrastive_loss:
      return bind<ContrastiveLossState>(cfg.kind, [&](auto& s) { contrastive_loss_init(s, cfg); });
    case OpKind::lm_loss:
      return bind<LmLossState>(cfg.kind, [&](auto& s) { lm_loss_init(s, cfg, params); });
  }
  throw std::invalid_argument("make_op: unknown op kind");
}

int op_input_count(OpKind kind) {
  return kind == OpKind::contrastive_loss || kind == OpKind::lm_loss ? 2 : 1;
}

Tensor op_forward(Op& op, std::span<const Tensor> in) {
  if (static_cast<int>(in.size()) != op_input_count(op.kind))
    throw std::invalid_argument(std::string(op_name(op.kind)) + ": wrong number of inputs");
  switch (op.kind) {
    case OpKind::patch_embed: return patch_embed_forward(std::get<PatchEmbedState>(op.state), in[0]);
    case OpKind::token_embed: return token_embed_forward(std::get<TokenEmbedState>(op.state), in[0]);
    case OpKind::transformer_layer:
      return transformer_layer_forward(std::get<TransformerLayerState>(op.state), in[0]);
    case OpKind::linear: return linear_forward(std::get<LinearState>(op.state), in[0]);
    case OpKind::pool_project: return pool_project_forward(std::get<PoolProjectState>(op.state), in[0]);
    case OpKind::contrastive_loss:
      return contrastive_loss_forward(std::get<ContrastiveLossState>(op.state), in[0], in[1]);
    case OpKind::lm_loss: return lm_loss_forward(std::get<LmLossState>(op.state), in[0], in[1]);
  }
  throw std::invalid_argument("op_forward: unknown op kind");
}

void op_release_saved(Op& op) {
  switch (op.kind) {
    case OpKind::patch_embed: std::get<PatchEmbedState>(op.state).x = Tensor(); return;
    case OpKind::token_embed: std::get<TokenEmbedState>(op.state).ids = Tensor(); return;
    case OpKind::transformer_layer: {
      auto& s = std::get<TransformerLayerState>(op.state);
      s.ln1 = {};
      s.ln2 = {};
      s.xn1 = s.xn2 = s.q = s.k = s.v = s.probs = s.attn = s.h1 = s.a1 = Tensor();
      return;
    }
    case OpKind::linear: std::get<LinearState>(op.state).x = Tensor(); return;
    case OpKind::pool_project: {
      auto& s = std::get<PoolProjectState>(op.state);
      s.ln = {};
      s.z = Tensor();
      return;
    }
    case OpKind::contrastive_loss: {
      auto& s = std::get<ContrastiveLossState>(op.state);
      s.u = s.w = s.norm_a = s.norm_b = s.probs_rows = s.probs_cols = Tensor();
      return;
    }
    case OpKind::lm_loss: {
      auto& s = std::get<LmLossState>(op.state);
      s.ln = {};
      s.z = s.probs = s.targets = Tensor();
      return;
    }
  }
}

std::vector<Tensor> op_backward(Op& op, const Tensor& dout) {
  switch (op.kind) {
    case OpKind::patch_embed: patch_embed_backward(std::get<PatchEmbedState>(op.state), dout); return {};
    case OpKind::token_embed: token_embed_backward(std::get<TokenEmbedState>(op.state), dout); return {};
    case OpKind::transformer_layer:
      return {transformer_layer_backward(std::get<TransformerLayerState>(op.state), dout)};
    case OpKind::linear: return {linear_backward(std::get<LinearState>(op.state), dout)};
    case OpKind::pool_project: return {pool_project_backward(std::get<PoolProjectState>(op.state), dout)};
    case OpKind::contrastive_loss: {
      auto g = contrastive_loss_backward(std::get<ContrastiveLossState>(op.state), dout);
      return {g[0], g[1]};
    }
    case OpKind::lm_loss: return {lm_loss_backward(std::get<LmLossState>(op.state), dout)};
  }
  throw std::invalid_argument("op_backward: unknown op kind");
}

}  // namespace spindle::exec
