// The varlen FlashAttention path of model/varlen_attention.h: an autograd Function over
// LibTorch's flash kernels (runtime/compat.h, flash_varlen_forward / flash_varlen_backward).
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "model/varlen_attention_cuda.h"
#include "runtime/compat.h"

namespace vlm::model::detail {

#if VLM_VARLEN_FLASH_ATTENTION
namespace {

// One forward and backward over token-major q [N, Hq, D], k, v [N, Hkv, D]. Saved for the
// backward: the inputs, the output, the log-sum-exp [Hq, N] fp32 and the (empty, no dropout)
// RNG state, as scaled_dot_product_attention's flash path saves them.
struct VarlenFlash : public torch::autograd::Function<VarlenFlash> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& cu_seqlens, int64_t max_length) {
    const runtime::compat::FlashVarlenSaved saved =
        runtime::compat::flash_varlen_forward(q, k, v, cu_seqlens, max_length);
    ctx->save_for_backward(
        {q, k, v, saved.out, saved.logsumexp, cu_seqlens, saved.rng_seed, saved.rng_offset});
    ctx->saved_data["max_length"] = max_length;
    return saved.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const runtime::compat::FlashVarlenSaved saved{s[3], s[4], s[6], s[7]};
    auto [dq, dk, dv] =
        runtime::compat::flash_varlen_backward(grads[0].contiguous(), s[0], s[1], s[2], s[5],
                                               ctx->saved_data["max_length"].toInt(), saved);
    return {dq, dk, dv, torch::Tensor(), torch::Tensor()};
  }
};

// The boundaries as the kernels read them: int32 on the device, and the longest segment. Every
// decoder layer of a forward attends over the same boundaries, so the last ones are kept per
// thread (the backward's recomputation runs on autograd's) and reused while their values are
// equal: one host-to-device copy per micro-batch instead of one per layer.
struct DeviceBounds {
  torch::Tensor host;    // int64, the values the rest were made from
  torch::Tensor bounds;  // int32 on the device
  int64_t longest = 0;
};

const DeviceBounds& on_device(const torch::Tensor& host, const torch::Device& device) {
  thread_local DeviceBounds last;
  if (last.host.defined() && last.bounds.device() == device && torch::equal(last.host, host)) {
    return last;
  }
  const int64_t* b = host.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i + 1 < host.size(0); ++i) longest = std::max(longest, b[i + 1] - b[i]);
  // Staged in pinned memory and copied without blocking the host.
  last = DeviceBounds{
      host.clone(), host.to(torch::kInt32).pin_memory().to(device, /*non_blocking=*/true), longest};
  return last;
}

}  // namespace
#endif

std::string cuda_varlen_unavailable(const torch::Tensor& q, int64_t kv_heads) {
#if !VLM_VARLEN_FLASH_ATTENTION
  (void)q, (void)kv_heads;
  return "it needs LibTorch 2.11 or later (" TORCH_VERSION ")";
#else
  if (!q.is_cuda()) return "the queries are on " + q.device().str() + ", not a CUDA device";
  if (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf) {
    return std::string("the attention computes in ") + c10::toString(q.scalar_type()) +
           " (FlashAttention needs bf16 or fp16: train.precision bf16 or fp16)";
  }
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(q.device().index());
  if (props->major < 8) {
    return "the GPU (" + std::string(props->name) + ") has compute capability " +
           std::to_string(props->major) + "." + std::to_string(props->minor) +
           "; FlashAttention needs 8.0 or later";
  }
  const int64_t head_dim = q.size(-1);
  if (head_dim % 8 != 0 || head_dim > 256) {
    return "the head size is " + std::to_string(head_dim) +
           " (FlashAttention needs a multiple of 8 up to 256)";
  }
  if (kv_heads <= 0 || q.size(1) % kv_heads != 0) {
    return std::to_string(q.size(1)) + " query heads are not a multiple of " +
           std::to_string(kv_heads) + " key/value heads";
  }
  return {};
#endif
}

torch::Tensor cuda_varlen_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v,
                                           const torch::Tensor& cu_seqlens) {
#if !VLM_VARLEN_FLASH_ATTENTION
  (void)q, (void)k, (void)v, (void)cu_seqlens;
  TORCH_CHECK(false, "varlen attention needs LibTorch 2.11 or later");
#else
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2), dim = q.size(3);
  const torch::Tensor bounds = cu_seqlens.to(torch::kCPU, torch::kLong).contiguous();
  TORCH_CHECK(
      bounds.dim() == 1 && bounds.size(0) >= 2 && bounds[-1].item<int64_t>() == batch * tokens,
      "varlen attention: cu_seqlens must end at B * T = ", batch * tokens);
  const DeviceBounds& device_bounds = on_device(bounds, q.device());
  const auto token_major = [&](const torch::Tensor& t) {  // [B, H, T, D] -> [B*T, H, D]
    return t.transpose(1, 2).reshape({batch * tokens, t.size(1), dim}).contiguous();
  };
  const torch::Tensor out = VarlenFlash::apply(token_major(q), token_major(k), token_major(v),
                                               device_bounds.bounds, device_bounds.longest);
  return out.view({batch, tokens, heads, dim}).transpose(1, 2);
#endif
}

}  // namespace vlm::model::detail
