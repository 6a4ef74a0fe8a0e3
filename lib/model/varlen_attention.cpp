#include "model/varlen_attention.h"

#include <torch/torch.h>

#include <stdexcept>

#if VLM_WITH_CUDA
#include "model/varlen_attention_cuda.h"
#endif

namespace vlm::model {

std::string varlen_attention_unavailable(const torch::Tensor& q, int64_t kv_heads) {
#if VLM_WITH_CUDA
  return detail::cuda_varlen_unavailable(q, kv_heads);
#else
  (void)q, (void)kv_heads;
  return "this LibTorch has no CUDA (varlen attention is a CUDA kernel)";
#endif
}

torch::Tensor varlen_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, const torch::Tensor& cu_seqlens) {
  const std::string why_not = varlen_attention_unavailable(q, k.size(1));
  if (!why_not.empty()) throw std::invalid_argument("varlen attention cannot run: " + why_not);
#if VLM_WITH_CUDA
  return detail::cuda_varlen_causal_attention(q, k, v, cu_seqlens);
#else
  (void)v, (void)cu_seqlens;
  return {};  // unreachable: unavailable above
#endif
}

}  // namespace vlm::model
