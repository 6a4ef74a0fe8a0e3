// What LibTorch's CPU kernels allocate beyond their outputs, one function per kernel, each
// citing the source it reads: the buffers the replay of a CPU step (memory/replay.h) adds as
// transients. The CUDA kernels' are in cuda_kernels.h. Torch-free.
#pragma once

#include <cstdint>

namespace vlm::memory::replay {

// --- oneDNN's bf16 products (LibTorch 1.13; onednn_scratch.cpp) ---------------------------
// The scratchpad oneDNN allocates, through LibTorch's allocator, for the duration of one bf16
// matrix product on the CPU: `batch` products (0: one 2-D mm, as a linear folds its input to)
// of [M, K] x [K, N]; `a_transposed`, `b_transposed`: the operand is a transposed view of a
// contiguous tensor. Zero when ATen runs the product natively: on a CPU without oneDNN's bf16
// kernels (`onednn` false), or below their minimum size. LibTorch 2.x's bundled oneDNN is not
// in here yet (docs/memory-cpu-2x.md).
int64_t bf16_matmul_scratch(bool onednn, int64_t threads, int64_t batch, int64_t M, int64_t K,
                            int64_t N, bool a_transposed, bool b_transposed);
// Whether ATen hands a bf16 product of `batch` (0: one 2-D mm) [M, K] x [K, N] to oneDNN: on
// a CPU with its bf16 kernels, above 16^3 multiply-adds (1.13's use_mkldnn_bf16_matmul).
bool onednn_bf16_product(bool onednn, int64_t batch, int64_t M, int64_t K, int64_t N);

// --- scaled_dot_product_attention's flash kernel (LibTorch 2.x; cpu_kernels.cpp) ----------
// _scaled_dot_product_flash_attention_for_cpu's transient buffers for a query length L: the
// forward's (`threads` intra-op threads, head size hd) and the backward's over `calls` x
// `heads` sequences (its per-thread `dsum` once per thread that gets work).
int64_t flash_forward_buffer(int64_t threads, int64_t L, int64_t hd, bool bf16);
int64_t flash_backward_buffer(int64_t threads, int64_t calls, int64_t heads, int64_t L, bool bf16);
// Its query block for a query length L: min(L, 256 from L = 768, 64 from 192, else 32).
int64_t flash_q_split(int64_t L);

// --- LayerNorm's backward (both versions) -------------------------------------------------
// native_layer_norm_backward's accumulation buffer for the weight's and bias's gradients,
// [2, threads, width] fp32 (aten/src/ATen/native/cpu/layer_norm_kernel.cpp,
// LayerNormBackwardKernelImplInternal), alive while the kernel runs.
inline int64_t layer_norm_backward_buffer(int64_t threads, int64_t width) {
  return 4 * 2 * threads * width;
}

}  // namespace vlm::memory::replay
