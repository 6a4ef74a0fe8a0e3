#include "model/packed_attention.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

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

// Causal attention inside each segment of the flattened [B * T] tokens: the same result as the
// block-diagonal mask, at O(sum len^2) instead of O(T^2) time and memory per row.
torch::Tensor segment_attention(const torch::Tensor& q, const torch::Tensor& keys,
                                const torch::Tensor& values, const torch::Tensor& cu_seqlens) {
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2), dim = q.size(3);
  const auto flat = [&](const torch::Tensor& t) {  // [B, H, T, D] -> [H, B*T, D]
    return t.transpose(0, 1).reshape({heads, batch * tokens, dim});
  };
  const torch::Tensor fq = flat(q), fk = flat(keys), fv = flat(values);
  const torch::Tensor bounds = cu_seqlens.to(torch::kCPU, torch::kLong).contiguous();
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

}  // namespace

torch::Tensor multi_head_attention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& allowed) {
  const int64_t groups = q.size(1) / k.size(1);
  // repeat_interleave, as nanoVLM and HF's repeat_kv: query heads [g*j, g*j + g) share kv
  // head j, which is the layout pretrained SmolLM2 weights expect.
  const torch::Tensor keys = groups == 1 ? k : k.repeat_interleave(groups, 1);
  const torch::Tensor values = groups == 1 ? v : v.repeat_interleave(groups, 1);
  if (allowed.defined() && allowed.dim() == 1) return segment_attention(q, keys, values, allowed);
  return runtime::compat::scaled_dot_product_attention(q, keys, values, allowed);
}

}  // namespace vlm::model
