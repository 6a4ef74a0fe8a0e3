// The CPU kernels' own buffers (memory/cpu_kernels.h); oneDNN's bf16 scratchpad is in
// onednn_scratch.cpp.
#include "memory/cpu_kernels.h"

#include <algorithm>

namespace vlm::memory::replay {
namespace {

constexpr int64_t e = 4;  // fp32

int64_t flash_kv_split(int64_t L) { return std::min<int64_t>(L, 512); }

}  // namespace

int64_t flash_q_split(int64_t L) {
  return std::min<int64_t>(L, L >= 768 ? 256 : L >= 192 ? 64 : 32);
}

// _scaled_dot_product_flash_attention_for_cpu's buffers (aten/src/ATen/native/cpu/
// FlashAttentionKernel.cpp): per intra-op thread, the forward's fp32 `buf` of qS x kvS scores,
// two qS statistics and a qS x hd accumulator (bf16 inputs add `buf_reduced`, qS x kvS of
// theirs); the backward's fp32 `buf` of 2 qS x kvS (bf16 adds `buf_reduced`) and `dsum`, qS
// floats per worker thread that gets work (the threads share the calls x heads sequences;
// each allocates its own when it starts, so how many are alive at once depends on timing: the
// replay counts one per thread that gets work, the most there can be).
int64_t flash_forward_buffer(int64_t threads, int64_t L, int64_t hd, bool bf16) {
  const int64_t qS = flash_q_split(L), kvS = flash_kv_split(L);
  return threads * (e * (qS * kvS + 2 * qS + qS * hd) + (bf16 ? 2 * qS * kvS : 0));
}

int64_t flash_backward_buffer(int64_t threads, int64_t calls, int64_t heads, int64_t L, bool bf16) {
  const int64_t qS = flash_q_split(L), kvS = flash_kv_split(L);
  const int64_t work = calls * heads;
  return threads * (e * 2 * qS * kvS + (bf16 ? 2 * 2 * qS * kvS : 0)) +
         std::min(threads, work) * e * qS;
}

}  // namespace vlm::memory::replay
