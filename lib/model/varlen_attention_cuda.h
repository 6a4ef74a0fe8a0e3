// The CUDA side of varlen_attention.h (varlen_attention_cuda.cpp, compiled only with a CUDA
// LibTorch).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace vlm::model::detail {

std::string cuda_varlen_unavailable(const torch::Tensor& q, int64_t kv_heads);
torch::Tensor cuda_varlen_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v, const torch::Tensor& cu_seqlens);

}  // namespace vlm::model::detail
