#include "model/packed_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/varlen_attention.h"
#include "runtime/compat.h"

namespace vlm::model {
namespace {

void validate_cu_seqlens(const torch::Tensor& cu_seqlens, int64_t batch, int64_t seq_len) {
  const std::string where =
      "cu_seqlens for a [" + std::to_string(batch) + ", " + std::to_string(seq_len) + "] batch";
  if (cu_seqlens.dim() != 1 || cu_seqlens.size(0) < 2) {
    throw std::invalid_argument(where + " must be 1-D with at least 2 entries");
  }
  const torch::Tensor boundaries = cu_seqlens.to(torch::kCPU, torch::kLong);
  if (boundaries[0].item<int64_t>() != 0 || boundaries[-1].item<int64_t>() != batch * seq_len) {
    throw std::invalid_argument(
        where + " must start at 0 and end at B * T = " + std::to_string(batch * seq_len));
  }
  const torch::Tensor steps = boundaries.slice(0, 1) - boundaries.slice(0, 0, -1);
  if ((steps <= 0).any().item<bool>()) {
    throw std::invalid_argument(where + " must be strictly increasing");
  }
  const torch::Tensor row_starts = torch::arange(0, batch * seq_len, seq_len, torch::kLong);
  if (!torch::isin(row_starts, boundaries).all().item<bool>()) {
    throw std::invalid_argument(where +
                                " must contain every row start r * T: a sample may "
                                "not span two rows");
  }
}

}  // namespace

torch::Tensor segment_ids(const torch::Tensor& cu_seqlens, int64_t batch, int64_t seq_len) {
  validate_cu_seqlens(cu_seqlens, batch, seq_len);
  const torch::Tensor boundaries = cu_seqlens.to(torch::kLong);
  const torch::Tensor positions = torch::arange(
      batch * seq_len, torch::TensorOptions().dtype(torch::kLong).device(cu_seqlens.device()));
  // right=true: a token at a boundary belongs to the segment that starts there.
  return (torch::searchsorted(boundaries, positions, /*out_int32=*/false, /*right=*/true) - 1)
      .view({batch, seq_len});
}

torch::Tensor packed_causal_mask(const torch::Tensor& cu_seqlens, int64_t batch, int64_t seq_len) {
  const torch::Tensor segments = segment_ids(cu_seqlens, batch, seq_len);
  const torch::Tensor same_segment = segments.unsqueeze(2) == segments.unsqueeze(1);
  const torch::Tensor causal =
      torch::ones({seq_len, seq_len},
                  torch::TensorOptions().dtype(torch::kBool).device(segments.device()))
          .tril();
  return (same_segment & causal).unsqueeze(1);
}

namespace {

torch::Tensor host_index(const std::vector<int64_t>& values, const torch::Device& device) {
  const torch::Tensor host =
      torch::from_blob(const_cast<int64_t*>(values.data()),
                       {static_cast<int64_t>(values.size())}, torch::kLong);
  if (!device.is_cuda()) return host.clone();
  // Pinned, so the copy runs without blocking the host (the caching host allocator keeps the
  // buffer until the copy has run).
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

// The fused path over token-major q, k, v [N, H, D]: the segments of a group are gathered into
// one [n, H, L, D] batch (each padded at its end by repeating its last token) and attend with
// is_causal, so no mask is built and the fused kernels can run. A query never sees a later
// key, so the padding changes no real token's output, and the padded queries' outputs are
// dropped (no gradient reaches the repeated keys). One index_select restores token order.
torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const int64_t* bounds,
                                int64_t segment_count) {
  const int64_t heads = q.size(1), dim = q.size(2);
  std::vector<int64_t> lengths(static_cast<size_t>(segment_count));
  for (int64_t s = 0; s < segment_count; ++s) {
    lengths[static_cast<size_t>(s)] = bounds[s + 1] - bounds[s];
  }
  std::vector<torch::Tensor> outputs;
  std::vector<int64_t> token_order;  // the token of each output row, in output order
  token_order.reserve(static_cast<size_t>(q.size(0)));
  for (const spec::SegmentGroup& group : spec::group_segments(lengths)) {
    const int64_t n = static_cast<int64_t>(group.segments.size()), padded = group.padded;
    std::vector<int64_t> gather, keep;
    gather.reserve(static_cast<size_t>(n * padded));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = group.segments[static_cast<size_t>(i)];
      const int64_t start = bounds[s], length = lengths[static_cast<size_t>(s)];
      for (int64_t j = 0; j < padded; ++j) gather.push_back(start + std::min(j, length - 1));
      for (int64_t j = 0; j < length; ++j) {
        keep.push_back(i * padded + j);
        token_order.push_back(start + j);
      }
    }
    const torch::Tensor gather_index = host_index(gather, q.device());
    const auto batched = [&](const torch::Tensor& t) {  // [N, H, D] -> [n, H, L, D]
      return t.index_select(0, gather_index).view({n, padded, heads, dim}).transpose(1, 2);
    };
    const torch::Tensor attended =
        runtime::compat::causal_attention(batched(q), batched(k), batched(v));
    outputs.push_back(attended.transpose(1, 2).reshape({n * padded, heads, dim})
                          .index_select(0, host_index(keep, q.device())));
  }
  // Every token exactly once (cu_seqlens covered [0, B*T)), or the inverse would be wrong.
  TORCH_CHECK(static_cast<int64_t>(token_order.size()) == q.size(0),
              "grouped attention: the segments cover ", token_order.size(), " of ", q.size(0),
              " tokens");
  std::vector<int64_t> inverse(token_order.size(), -1);
  for (size_t i = 0; i < token_order.size(); ++i) {
    int64_t& slot = inverse[static_cast<size_t>(token_order[i])];
    TORCH_CHECK(slot < 0, "grouped attention: token ", token_order[i], " is in two segments");
    slot = static_cast<int64_t>(i);
  }
  const torch::Tensor joined = outputs.size() == 1 ? outputs[0] : torch::cat(outputs, 0);
  return joined.index_select(0, host_index(inverse, q.device()));
}

}  // namespace

torch::Tensor segment_attention(const torch::Tensor& q, const torch::Tensor& keys,
                                const torch::Tensor& values, const torch::Tensor& cu_seqlens,
                                SegmentKernel kernel) {
  if (kernel == SegmentKernel::kVarlen) return varlen_causal_attention(q, keys, values, cu_seqlens);
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2), dim = q.size(3);
  const torch::Tensor bounds = cu_seqlens.to(torch::kCPU, torch::kLong).contiguous();
  if (kernel == SegmentKernel::kGroupedCausal) {
    const auto token_major = [&](const torch::Tensor& t) {  // [B, H, T, D] -> [B*T, H, D]
      return t.transpose(1, 2).reshape({batch * tokens, heads, dim});
    };
    return grouped_attention(token_major(q), token_major(keys), token_major(values),
                             bounds.data_ptr<int64_t>(), bounds.size(0) - 1)
        .view({batch, tokens, heads, dim})
        .transpose(1, 2);
  }
  const auto flat = [&](const torch::Tensor& t) {  // [B, H, T, D] -> [H, B*T, D]
    return t.transpose(0, 1).reshape({heads, batch * tokens, dim});
  };
  const torch::Tensor fq = flat(q), fk = flat(keys), fv = flat(values);
  const int64_t* b = bounds.data_ptr<int64_t>();
  std::vector<torch::Tensor> outputs;
  outputs.reserve(static_cast<size_t>(bounds.size(0) - 1));
  for (int64_t i = 0; i + 1 < bounds.size(0); ++i) {
    const int64_t start = b[i], length = b[i + 1] - b[i];
    const torch::Tensor causal =
        torch::ones({length, length}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
            .tril();
    outputs.push_back(runtime::compat::scaled_dot_product_attention(
        fq.narrow(1, start, length), fk.narrow(1, start, length), fv.narrow(1, start, length),
        causal));
  }
  return torch::cat(outputs, 1).view({heads, batch, tokens, dim}).transpose(0, 1);
}

SegmentKernel default_segment_kernel() {
  return runtime::compat::kFusedCausalAttention ? SegmentKernel::kGroupedCausal
                                                : SegmentKernel::kPerSegmentMask;
}

AttentionChoice parse_attention_choice(const std::string& name) {
  if (name == "auto") return AttentionChoice::kAuto;
  if (name == "varlen") return AttentionChoice::kVarlen;
  if (name == "grouped") return AttentionChoice::kGrouped;
  if (name == "per_segment") return AttentionChoice::kPerSegment;
  throw std::invalid_argument("unknown attention kernel '" + name +
                              "' (known: auto, varlen, grouped, per_segment)");
}

SegmentKernel resolve_segment_kernel(AttentionChoice choice, const torch::Tensor& q,
                                     int64_t kv_heads) {
  switch (choice) {
    case AttentionChoice::kGrouped:
      return SegmentKernel::kGroupedCausal;
    case AttentionChoice::kPerSegment:
      return SegmentKernel::kPerSegmentMask;
    case AttentionChoice::kVarlen: {
      const std::string why_not = varlen_attention_unavailable(q, kv_heads);
      if (!why_not.empty()) {
        throw std::invalid_argument("model.attention is varlen, which cannot run here: " + why_not);
      }
      return SegmentKernel::kVarlen;
    }
    case AttentionChoice::kAuto:
      break;
  }
  return varlen_attention_unavailable(q, kv_heads).empty() ? SegmentKernel::kVarlen
                                                           : default_segment_kernel();
}

torch::Tensor multi_head_attention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& allowed,
                                   AttentionChoice choice) {
  const bool segments = allowed.defined() && allowed.dim() == 1;
  const SegmentKernel kernel =
      segments ? resolve_segment_kernel(choice, q, k.size(1)) : default_segment_kernel();
  if (segments && kernel == SegmentKernel::kVarlen) {
    return varlen_causal_attention(q, k, v, allowed);  // grouped-query heads native
  }
  const int64_t groups = q.size(1) / k.size(1);
  // repeat_interleave, as nanoVLM and HF's repeat_kv: query heads [g*j, g*j + g) share kv
  // head j, which is the layout pretrained SmolLM2 weights expect.
  const torch::Tensor keys = groups == 1 ? k : k.repeat_interleave(groups, 1);
  const torch::Tensor values = groups == 1 ? v : v.repeat_interleave(groups, 1);
  if (segments) return segment_attention(q, keys, values, allowed, kernel);
  return runtime::compat::scaled_dot_product_attention(q, keys, values, allowed);
}

}  // namespace vlm::model
