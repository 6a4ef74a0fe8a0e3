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

#include <cstdint>
#include <string>
#include <vector>

#include "spec/attention_groups.h"

namespace vlm::model {

// Segment id of every token, [B, T] int64: the index of the cu_seqlens interval it lies in.
// Throws std::invalid_argument when cu_seqlens is not a valid boundary list for [B, T].
torch::Tensor segment_ids(const torch::Tensor& cu_seqlens, int64_t batch, int64_t seq_len);

// Boolean mask [B, 1, T, T]: true where query i may attend to key j (same segment, j <= i).
torch::Tensor packed_causal_mask(const torch::Tensor& cu_seqlens, int64_t batch, int64_t seq_len);

// How causal attention runs segment by segment (all give the same result up to rounding):
//   kPerSegmentMask  one attention call per segment with a boolean lower-triangular mask. The
//                    path of LibTorch 1.13, which has no fused kernel; the memory model replays
//                    it op by op.
//   kGroupedCausal   segments of similar length padded into one batch per group, attending with
//                    is_causal and no mask, so LibTorch 2.x runs its fused kernels (flash
//                    attention on CUDA). The default from 2.0 where varlen cannot run.
//   kVarlen          one FlashAttention call over every segment of the micro-batch at once
//                    (cumulative sequence lengths, grouped-query heads native: no gathers, no
//                    padding, no repeated keys and values): CUDA, bf16 or fp16, sm80 on
//                    (model/varlen_attention.h). The default where it can run.
enum class SegmentKernel { kPerSegmentMask, kGroupedCausal, kVarlen };

// `model.attention` (core/config.h): auto, or a kernel by name.
enum class AttentionChoice { kAuto, kVarlen, kGrouped, kPerSegment };
AttentionChoice parse_attention_choice(const std::string& name);

// The kernel `choice` runs for queries like `q` (its device, dtype and head size): auto picks
// varlen where it can run, else the version's default (grouped from 2.0, per segment on
// 1.13). An explicit varlen that cannot run here throws std::invalid_argument saying why.
SegmentKernel resolve_segment_kernel(AttentionChoice choice, const torch::Tensor& q,
                                     int64_t kv_heads);
SegmentKernel default_segment_kernel();

// kGroupedCausal's groups of segments: spec/attention_groups.h.

// Causal attention of q [B, H, T, D] over keys, values [B, H, T, D] (equal heads) inside each
// segment of cu_seqlens (host or device), by `kernel`. Returns [B, H, T, D].
torch::Tensor segment_attention(const torch::Tensor& q, const torch::Tensor& keys,
                                const torch::Tensor& values, const torch::Tensor& cu_seqlens,
                                SegmentKernel kernel);

// Multi-head attention of q [B, Hq, T, D] over k, v [B, Hkv, T, D] (Hq a multiple of Hkv:
// grouped-query attention, query head h reads key/value head h / (Hq / Hkv)). `allowed` is
// either the 1-D cu_seqlens (causal attention computed segment by segment: O(sum len^2), what
// the language model uses), a boolean mask as from packed_causal_mask (the same result at
// O(T^2)), or undefined for full bidirectional attention (the ViT).
// Returns [B, Hq, T, D]. The LibTorch-version-specific kernel is in runtime/compat.h; `choice`
// picks the segment kernel when `allowed` is cu_seqlens.
torch::Tensor multi_head_attention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& allowed,
                                   AttentionChoice choice = AttentionChoice::kAuto);

}  // namespace vlm::model
