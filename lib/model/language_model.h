// Llama/SmolLM2-style decoder with nanoVLM's module and parameter names
// (huggingface/nanoVLM models/language_model.py), so that named_parameters() under
// `decoder.` equals nanoVLM's state_dict keys:
//   token_embedding.weight,
//   blocks.{i}.mlp.{gate_proj,up_proj,down_proj}.weight,
//   blocks.{i}.attn.{q_proj,k_proj,v_proj,out_proj}.weight, blocks.{i}.norm1.weight,
//   blocks.{i}.norm2.weight, norm.weight, and head.weight only when embeddings are untied.
// Buffer: rotary_embd.inv_freq (nanoVLM saves it too; it is derived from rope_base).
//
// Tied embeddings: nanoVLM assigns head.weight = token_embedding.weight (one tensor, two
// names; safetensors' save_model then keeps the alphabetically first, `decoder.head.weight`).
// Here the head is not registered at all when tied and logits use token_embedding.weight,
// so every parameter appears once (an optimizer must not see the same tensor twice).
#pragma once

#include <torch/nn.h>

#include <tuple>
#include <vector>

#include "model/packed_attention.h"
#include "spec/model_spec.h"

namespace vlm::model {

// x * rsqrt(mean(x^2) + eps) * weight, computed in fp32 and returned in x's dtype (HF Llama;
// nanoVLM computes in the input dtype, which is the same in fp32).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t hidden_size, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  double eps_;
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

// Rotary position embedding tables. inv_freq_i = base^(-2i / head_dim); angle = position *
// inv_freq; cos/sin are [B, T, head_dim] with the half-dim angles repeated twice (the
// rotate-half convention of HF Llama and nanoVLM).
// nanoVLM rescales inv_freq when a batch's largest position exceeds max_position (a
// batch-dependent "dynamic" scaling); we do not: it would make a packed row's numbers depend
// on its neighbours. The data layer keeps positions below max_position instead.
class RotaryEmbeddingImpl : public torch::nn::Module {
 public:
  RotaryEmbeddingImpl(int64_t head_dim, double base);
  // position_ids [B, T] (any integer dtype) -> {cos, sin}, fp32, [B, T, head_dim].
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& position_ids);

 private:
  torch::Tensor inv_freq;
};
TORCH_MODULE(RotaryEmbedding);

// x * cos + rotate_half(x) * sin, for x [B, H, T, D] and cos/sin [B, T, D].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

// The keys and values of one block for the tokens decoded so far, [1, kv_heads, n, head_dim]
// each (greedy generation: every token is attended to again at each later step).
struct KvCacheLayer {
  torch::Tensor keys, values;
};

// A decoder's cache: one layer per block, and how many tokens it holds.
struct KvCache {
  std::vector<KvCacheLayer> layers;
  int64_t length = 0;
};

// Linear maps without bias that read the same input x [..., d], each weight [out_i, d] ->
// their outputs [..., out_i], as one GEMM over the weights concatenated, split after (views of
// one output): the values of one linear each up to the GEMM's summation order. The decoder
// projects its q, k, v and its MLP's gate, up so on CUDA (fewer launches; what it allocates:
// docs/memory.md, "The decoder's varlen attention...") and with one linear each on the CPU,
// which the memory model replays.
std::vector<torch::Tensor> project_together(const torch::Tensor& x,
                                            const std::vector<torch::Tensor>& weights);

class LanguageModelGroupedQueryAttentionImpl : public torch::nn::Module {
 public:
  explicit LanguageModelGroupedQueryAttentionImpl(const spec::LanguageSpec& spec);
  // x [B, T, d]; cos/sin from RotaryEmbedding; `allowed` [B, 1, T, T] from packed_causal_mask.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& allowed,
                        AttentionChoice attention = AttentionChoice::kAuto);
  // One sequence's next tokens x [1, t, d] after the `cache.keys` already seen: appends their
  // keys and values to `cache` and attends causally over all of them.
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, KvCacheLayer& cache);

 private:
  // x [B, T, d] -> q and k with the rotary embedding applied, and v, each [B, n, T, D].
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project_qkv(const torch::Tensor& x,
                                                                      const torch::Tensor& cos,
                                                                      const torch::Tensor& sin);

  int64_t num_heads_, num_kv_heads_, head_dim_;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(LanguageModelGroupedQueryAttention);

// SwiGLU: down(silu(gate(x)) * up(x)).
class LanguageModelMLPImpl : public torch::nn::Module {
 public:
  explicit LanguageModelMLPImpl(const spec::LanguageSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LanguageModelMLP);

// Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(x)). Registration order (mlp, attn,
// norm1, norm2) is nanoVLM's, so parameters enumerate in its order.
class LanguageModelBlockImpl : public torch::nn::Module {
 public:
  explicit LanguageModelBlockImpl(const spec::LanguageSpec& spec);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& allowed,
                        AttentionChoice attention = AttentionChoice::kAuto);
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, KvCacheLayer& cache);

 private:
  LanguageModelMLP mlp{nullptr};
  LanguageModelGroupedQueryAttention attn{nullptr};
  RMSNorm norm1{nullptr}, norm2{nullptr};
};
TORCH_MODULE(LanguageModelBlock);

class LanguageModelImpl : public torch::nn::Module {
 public:
  explicit LanguageModelImpl(const spec::LanguageSpec& spec);

  torch::Tensor embed(const torch::Tensor& input_ids);  // [B, T] -> [B, T, d]
  // embeddings [B, T, d] -> hidden states after the final norm, [B, T, d].
  torch::Tensor forward(const torch::Tensor& embeddings, const torch::Tensor& position_ids,
                        const torch::Tensor& allowed, bool checkpoint_blocks = false,
                        AttentionChoice attention = AttentionChoice::kAuto);
  // Incremental decoding of one sequence (no gradients): embeddings [1, t, d] of the tokens at
  // positions cache.length .. cache.length + t - 1 -> their hidden states after the final norm,
  // [1, t, d]; the cache grows by t. The same numbers as forward over the whole sequence.
  torch::Tensor forward_cached(const torch::Tensor& embeddings, KvCache& cache);
  // The LM head's weight [vocab_rows, d]: head.weight, or token_embedding.weight when tied.
  torch::Tensor head_weight() const;
  torch::Tensor logits(const torch::Tensor& hidden);  // hidden @ head_weight^T

 private:
  torch::nn::Embedding token_embedding{nullptr};
  RotaryEmbedding rotary_embd{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear head{nullptr};  // null when embeddings are tied
};
TORCH_MODULE(LanguageModel);

}  // namespace vlm::model
