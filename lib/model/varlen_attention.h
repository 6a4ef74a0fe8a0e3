// Block-diagonal causal attention as one FlashAttention call per micro-batch: every packed
// sample of the micro-batch at once, over cumulative sequence lengths (flash-attn's varlen
// API, LibTorch's at::_flash_attention_forward / _flash_attention_backward), with
// grouped-query heads read natively (no repeated keys and values), no gathers and no padding.
// The kernels need CUDA, bf16 or fp16 inputs, a GPU of compute capability 8.0 or later and a
// head size that is a multiple of 8 up to 256; the CUDA code is varlen_attention_cuda.cpp,
// compiled only with a CUDA LibTorch. What the kernels allocate: docs/memory.md ("Varlen
// flash attention").
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace vlm::model {

// Empty when varlen_causal_attention can run queries like q [B, Hq, T, D] over `kv_heads`
// key/value heads; otherwise why not (a sentence for an error message).
std::string varlen_attention_unavailable(const torch::Tensor& q, int64_t kv_heads);

// Causal attention of q [B, Hq, T, D] over k, v [B, Hkv, T, D] (Hq a multiple of Hkv) inside
// each segment of cu_seqlens (1-D int64 boundaries over the flat B * T tokens, on the host:
// packed_attention.h). Returns [B, Hq, T, D], differentiable with respect to q, k and v.
// Throws std::invalid_argument where varlen_attention_unavailable is not empty.
torch::Tensor varlen_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, const torch::Tensor& cu_seqlens);

}  // namespace vlm::model
