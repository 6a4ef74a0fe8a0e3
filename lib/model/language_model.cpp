#include "model/language_model.h"

#include <torch/torch.h>

#include "model/activation_checkpoint.h"
#include "model/packed_attention.h"
#include "runtime/compat.h"
#include "spec/derived.h"

namespace vlm::model {
namespace {

// nanoVLM's LanguageModel._init_weights: Linear and Embedding N(0, 0.02), RMSNorm 1.
constexpr double kInitStd = 0.02;

torch::nn::Linear init_linear(int64_t in, int64_t out) {
  torch::nn::Linear linear(torch::nn::LinearOptions(in, out).bias(false));
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, kInitStd);
  return linear;
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

}  // namespace

std::vector<torch::Tensor> project_together(const torch::Tensor& x,
                                            const std::vector<torch::Tensor>& weights) {
  std::vector<int64_t> widths;
  widths.reserve(weights.size());
  for (const torch::Tensor& weight : weights) widths.push_back(weight.size(0));
  // Under autocast: one cast of x and one of the concatenated weights instead of one each per
  // projection; in the backward one GEMM pair and one gradient of x instead of one per
  // projection summed.
  return torch::nn::functional::linear(x, torch::cat(weights, 0)).split_with_sizes(widths, -1);
}

RMSNormImpl::RMSNormImpl(int64_t hidden_size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({hidden_size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // CUDA: one fused kernel forward and one backward (runtime/compat.h) instead of a dozen
  // elementwise launches; it too normalises in fp32.
  if (runtime::compat::kFusedRmsNorm && x.is_cuda()) {
    return runtime::compat::fused_rms_norm(x, weight.to(x.scalar_type()), eps_);
  }
  const torch::Tensor x32 = x.to(torch::kFloat);
  const torch::Tensor normalized = x32 * torch::rsqrt(x32.pow(2).mean(-1, true) + eps_);
  return normalized.to(x.scalar_type()) * weight.to(x.scalar_type());
}

RotaryEmbeddingImpl::RotaryEmbeddingImpl(int64_t head_dim, double base) {
  const torch::Tensor exponents =
      torch::arange(0, head_dim, 2, torch::kFloat) / static_cast<double>(head_dim);
  inv_freq = register_buffer("inv_freq", 1.0 / torch::pow(base, exponents));
}

std::pair<torch::Tensor, torch::Tensor> RotaryEmbeddingImpl::forward(
    const torch::Tensor& position_ids) {
  const torch::Tensor angles =
      position_ids.to(torch::kFloat).unsqueeze(-1) * inv_freq.to(torch::kFloat);  // [B, T, D/2]
  const torch::Tensor repeated = torch::cat({angles, angles}, -1);
  return {repeated.cos(), repeated.sin()};
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  const torch::Tensor c = cos.unsqueeze(1).to(x.scalar_type());  // broadcast over heads
  const torch::Tensor s = sin.unsqueeze(1).to(x.scalar_type());
  return x * c + rotate_half(x) * s;
}

LanguageModelGroupedQueryAttentionImpl::LanguageModelGroupedQueryAttentionImpl(
    const spec::LanguageSpec& spec)
    : num_heads_(spec.num_heads),
      num_kv_heads_(spec.num_kv_heads),
      head_dim_(spec::language_head_dim(spec)) {
  const int64_t d = spec.hidden_size, kv_width = head_dim_ * num_kv_heads_;
  q_proj = register_module("q_proj", init_linear(d, d));
  k_proj = register_module("k_proj", init_linear(d, kv_width));
  v_proj = register_module("v_proj", init_linear(d, kv_width));
  out_proj = register_module("out_proj", init_linear(d, d));
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>
LanguageModelGroupedQueryAttentionImpl::project_qkv(const torch::Tensor& x,
                                                    const torch::Tensor& cos,
                                                    const torch::Tensor& sin) {
  const int64_t batch = x.size(0), tokens = x.size(1);
  const auto heads = [&](const torch::Tensor& t, int64_t count) {  // [B, T, n * D] -> [B, n, T, D]
    return t.view({batch, tokens, count, head_dim_}).transpose(1, 2);
  };
  if (x.is_cuda()) {  // one GEMM (project_together): views of one output, alive while v is
    const auto qkv = project_together(x, {q_proj->weight, k_proj->weight, v_proj->weight});
    return {apply_rotary(heads(qkv[0], num_heads_), cos, sin),
            apply_rotary(heads(qkv[1], num_kv_heads_), cos, sin), heads(qkv[2], num_kv_heads_)};
  }
  // One linear each, each output freed once used: what the memory model replays on the CPU.
  torch::Tensor q = apply_rotary(heads(q_proj->forward(x), num_heads_), cos, sin);
  torch::Tensor k = apply_rotary(heads(k_proj->forward(x), num_kv_heads_), cos, sin);
  return {std::move(q), std::move(k), heads(v_proj->forward(x), num_kv_heads_)};
}

torch::Tensor LanguageModelGroupedQueryAttentionImpl::forward(const torch::Tensor& x,
                                                              const torch::Tensor& cos,
                                                              const torch::Tensor& sin,
                                                              const torch::Tensor& allowed,
                                                              AttentionChoice attention) {
  const int64_t batch = x.size(0), tokens = x.size(1);
  const auto [q, k, v] = project_qkv(x, cos, sin);
  const torch::Tensor attended = multi_head_attention(q, k, v, allowed, attention);
  return out_proj->forward(
      attended.transpose(1, 2).contiguous().view({batch, tokens, num_heads_ * head_dim_}));
}

torch::Tensor LanguageModelGroupedQueryAttentionImpl::forward_cached(const torch::Tensor& x,
                                                                     const torch::Tensor& cos,
                                                                     const torch::Tensor& sin,
                                                                     KvCacheLayer& cache) {
  const int64_t tokens = x.size(1);
  const auto [q, k, v] = project_qkv(x, cos, sin);
  cache.keys = cache.keys.defined() ? torch::cat({cache.keys, k}, 2) : k;
  cache.values = cache.values.defined() ? torch::cat({cache.values, v}, 2) : v;
  const int64_t groups = num_heads_ / num_kv_heads_;
  const torch::Tensor keys = groups == 1 ? cache.keys : cache.keys.repeat_interleave(groups, 1);
  const torch::Tensor values =
      groups == 1 ? cache.values : cache.values.repeat_interleave(groups, 1);
  const int64_t seen = keys.size(2);
  torch::Tensor attended;
  if (tokens == 1) {  // the newest token sees every key
    attended = runtime::compat::scaled_dot_product_attention(q, keys, values, torch::Tensor());
  } else if (tokens == seen) {  // a prompt on an empty cache
    attended = runtime::compat::causal_attention(q, keys, values);
  } else {  // query i (at position seen - tokens + i) sees keys 0 .. seen - tokens + i
    const torch::Tensor allowed =
        torch::ones({tokens, seen}, torch::TensorOptions().dtype(torch::kBool).device(x.device()))
            .tril(seen - tokens);
    attended = runtime::compat::scaled_dot_product_attention(q, keys, values, allowed);
  }
  return out_proj->forward(
      attended.transpose(1, 2).contiguous().view({1, tokens, num_heads_ * head_dim_}));
}

LanguageModelMLPImpl::LanguageModelMLPImpl(const spec::LanguageSpec& spec) {
  gate_proj = register_module("gate_proj", init_linear(spec.hidden_size, spec.mlp_size));
  up_proj = register_module("up_proj", init_linear(spec.hidden_size, spec.mlp_size));
  down_proj = register_module("down_proj", init_linear(spec.mlp_size, spec.hidden_size));
}

torch::Tensor LanguageModelMLPImpl::forward(const torch::Tensor& x) {
  if (x.is_cuda()) {  // one GEMM (project_together)
    const auto gate_up = project_together(x, {gate_proj->weight, up_proj->weight});
    return down_proj->forward(torch::silu(gate_up[0]) * gate_up[1]);
  }
  return down_proj->forward(torch::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

LanguageModelBlockImpl::LanguageModelBlockImpl(const spec::LanguageSpec& spec) {
  mlp = register_module("mlp", LanguageModelMLP(spec));
  attn = register_module("attn", LanguageModelGroupedQueryAttention(spec));
  norm1 = register_module("norm1", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
  norm2 = register_module("norm2", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
}

torch::Tensor LanguageModelBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                              const torch::Tensor& sin,
                                              const torch::Tensor& allowed,
                                              AttentionChoice attention) {
  const torch::Tensor h = x + attn->forward(norm1->forward(x), cos, sin, allowed, attention);
  return h + mlp->forward(norm2->forward(h));
}

torch::Tensor LanguageModelBlockImpl::forward_cached(const torch::Tensor& x,
                                                     const torch::Tensor& cos,
                                                     const torch::Tensor& sin,
                                                     KvCacheLayer& cache) {
  const torch::Tensor h = x + attn->forward_cached(norm1->forward(x), cos, sin, cache);
  return h + mlp->forward(norm2->forward(h));
}

LanguageModelImpl::LanguageModelImpl(const spec::LanguageSpec& spec) {
  const int64_t rows = spec::language_vocab_rows(spec);
  token_embedding =
      register_module("token_embedding", torch::nn::Embedding(rows, spec.hidden_size));
  rotary_embd = register_module("rotary_embd",
                                RotaryEmbedding(spec::language_head_dim(spec), spec.rope_base));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) blocks->push_back(LanguageModelBlock(spec));
  norm = register_module("norm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
  if (!spec.tie_embeddings) head = register_module("head", init_linear(spec.hidden_size, rows));
  torch::NoGradGuard no_grad;
  token_embedding->weight.normal_(0.0, kInitStd);
}

torch::Tensor LanguageModelImpl::embed(const torch::Tensor& input_ids) {
  return token_embedding->forward(input_ids);
}

torch::Tensor LanguageModelImpl::forward(const torch::Tensor& embeddings,
                                         const torch::Tensor& position_ids,
                                         const torch::Tensor& allowed, bool checkpoint_blocks,
                                         AttentionChoice attention) {
  const auto tables = rotary_embd->forward(position_ids);
  torch::Tensor cos = tables.first, sin = tables.second;
  if (embeddings.is_cuda() && !blocks->is_empty()) {
    // CUDA: the tables cast once to the dtype the attention computes in (the autocast dtype, or
    // the blocks' own), so that no layer casts them again for q and for k: 4 launches a layer
    // fewer. The CPU keeps the per-layer casts, which the 1.13 memory model replays.
    const runtime::compat::AutocastState autocast = runtime::compat::autocast_state();
    const torch::Dtype dtype = autocast.cuda_enabled
                                   ? autocast.cuda_dtype
                                   : blocks->ptr(0)->parameters().front().scalar_type();
    cos = cos.to(dtype);
    sin = sin.to(dtype);
  }
  torch::Tensor x = embeddings;
  for (const auto& module : *blocks) {
    const auto block = std::dynamic_pointer_cast<LanguageModelBlockImpl>(module);
    if (checkpoint_blocks) {
      // The closure keeps cos/sin/allowed alive until backward; all blocks share them.
      x = checkpointed(
          [block, cos, sin, allowed, attention](const torch::Tensor& h) {
            return block->forward(h, cos, sin, allowed, attention);
          },
          x, block->parameters());
    } else {
      x = block->forward(x, cos, sin, allowed, attention);
    }
  }
  return norm->forward(x);
}

torch::Tensor LanguageModelImpl::forward_cached(const torch::Tensor& embeddings, KvCache& cache) {
  torch::NoGradGuard no_grad;
  const int64_t tokens = embeddings.size(1);
  const torch::Tensor positions =
      torch::arange(cache.length, cache.length + tokens,
                    torch::TensorOptions().dtype(torch::kLong).device(embeddings.device()))
          .view({1, tokens});
  const auto tables = rotary_embd->forward(positions);
  cache.layers.resize(blocks->size());
  torch::Tensor x = embeddings;
  for (size_t i = 0; i < blocks->size(); ++i) {
    const auto block = std::dynamic_pointer_cast<LanguageModelBlockImpl>(blocks->ptr(i));
    x = block->forward_cached(x, tables.first, tables.second, cache.layers[i]);
  }
  cache.length += tokens;
  return norm->forward(x);
}

torch::Tensor LanguageModelImpl::head_weight() const {
  return head ? head->weight : token_embedding->weight;
}

torch::Tensor LanguageModelImpl::logits(const torch::Tensor& hidden) {
  return torch::matmul(hidden, head_weight().to(hidden.scalar_type()).t());
}

}  // namespace vlm::model
