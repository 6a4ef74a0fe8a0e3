// Attention over packed rows: several samples share a row of the batch, and no token may
// attend across a sample boundary (block-diagonal causal attention).
//
// cu_seqlens format (chosen here, produced by the collator): a 1-D integer tensor of
// cumulative sample boundaries over the flattened [B * T] token stream, as in flash-attn's
// varlen API: cu_seqlens[0] = 0, strictly increasing, last = B * T, and every row start
// r * T is a boundary (a sample never spans two rows). A row's trailing padding is one more
// segment (its labels are -100, so it only attends to itself and costs no loss).
#pragma once

#include <torch/types.h>

namespace vlm::model {

// Segment id of every token, [B, T] int64: the index of the cu_seqlens interval it lies in.
// Throws std::invalid_argument when cu_seqlens is not a valid boundary list for [B, T].
torch::Tensor segment_ids(const torch::Tensor& cu_seqlens, int64_t batch, int64_t seq_len);

// Boolean mask [B, 1, T, T]: true where query i may attend to key j (same segment, j <= i).
torch::Tensor packed_causal_mask(const torch::Tensor& cu_seqlens, int64_t batch, int64_t seq_len);

// Multi-head attention of q [B, Hq, T, D] over k, v [B, Hkv, T, D] (Hq a multiple of Hkv:
// grouped-query attention, query head h reads key/value head h / (Hq / Hkv)). `allowed` is
// either the 1-D cu_seqlens (causal attention computed segment by segment: O(sum len^2), what
// the language model uses), a boolean mask as from packed_causal_mask (the same result at
// O(T^2)), or undefined for full bidirectional attention (the ViT).
// Returns [B, Hq, T, D]. The LibTorch-version-specific kernel is in runtime/compat.h.
torch::Tensor multi_head_attention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& allowed);

}  // namespace vlm::model
