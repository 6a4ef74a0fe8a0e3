// What LibTorch 2.11's CUDA kernels request from the caching allocator beyond their outputs:
// one function per kernel or library, each citing the PyTorch source it reads (docs/memory.md,
// "On CUDA"). The step's request stream (cuda_step.h) calls these; torch-free.
#pragma once

#include <cstdint>

namespace vlm::memory::cuda {

// The GPU's shape as the kernels see it: streaming multiprocessors and threads per SM (the
// reduction kernel's grid), and whether cuBLAS gets sm90's larger default workspace.
struct GpuShape {
  int64_t sms = 132;  // H100 SXM, H200
  int64_t threads_per_sm = 2048;
  bool sm90 = true;
};

// cuBLAS's workspace per (handle, stream), taken at a thread's first GEMM and kept for the
// process (aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize: the default
// CUBLAS_WORKSPACE_CONFIG ":4096:8" on sm90, ":4096:2:16:8" elsewhere).
int64_t cublas_workspace_bytes(const GpuShape& gpu);
// cuBLASLt's, taken at a thread's first GEMM with a bias epilogue (addmm): CUBLASLT_WORKSPACE_SIZE,
// 1024 KiB by default (CublasHandlePool.cpp getCUDABlasLtWorkspaceSize).
inline constexpr int64_t kCublasLtWorkspaceBytes = 1024 * 1024;

// The cross-block staging buffer and semaphores of PyTorch's reduction kernel
// (aten/src/ATen/native/cuda/Reduce.cuh: setReduceConfig, global_memory_size, semaphore_size)
// for a sum of `inputs_per_output` elements into each of `num_outputs` outputs, of
// `input_bytes` each, accumulated in fp32. `contiguous`: the reduced dimension is the fastest
// moving one (a full sum of a contiguous tensor); otherwise a sum over dim 0 of [R, C] (a
// bias gradient). {0, 0} when the kernel reduces within blocks only.
struct ReduceStaging {
  int64_t staging = 0;
  int64_t semaphores = 0;
};
ReduceStaging reduce_staging(const GpuShape& gpu, int64_t num_outputs, int64_t inputs_per_output,
                             int64_t input_bytes, bool contiguous);

// The weight gradients of the LayerNorm and RMSNorm backward in two stages
// (aten/src/ATen/native/cuda/layer_norm_kernel.cu, LayerNormBackwardKernelImplInternal, PyTorch
// 2.11): over M > 65,536 rows of N features with N / 32 < SMs / 2, each weight's gradient is
// first summed into Y x N partial sums in the weight's dtype, Y = min(32,768 / ceil(N / 32),
// ceil(M / 32)), then `partials.sum(0)` replaces the gradient allocated before. The rows Y, or 0
// when the one-stage kernel runs (every recorded run of one 4096-token row: a ViT of at most
// 64 crops of 1,024 patches).
int64_t norm_weight_partial_rows(const GpuShape& gpu, int64_t rows, int64_t features);

// embedding_dense_backward's sort path (aten/src/ATen/native/cuda/Embedding.cu, taken above
// 3,072 indices): cub's radix-sort temporary storage for N int64 keys with their positions.
// Fitted on N = 4,088, 4,096 and 8,192 from the recorded traces (bench/gpu/2026-11-28-h100):
// the two alternate key/value buffers, cub's aligned sub-allocations and its alignment slack.
int64_t embedding_sort_scratch_bytes(int64_t indices);
// The two small cub scratch requests of the same backward (segment offsets, partial sums).
inline constexpr int64_t kEmbeddingCubScratchBytes = 1279;
inline constexpr int64_t kEmbeddingSortThreshold = 3072;

// FlashAttention 2's varlen backward (aten/src/ATen/native/transformers/cuda/flash_attn/
// flash_api.cpp mha_varlen_bwd) over N tokens in S segments, Hq query heads of head_dim:
// softmax_d [Hq, N + 128 S] fp32 and the dq accumulator [N + 128 S, Hq, round32(head_dim)] fp32.
int64_t flash_varlen_softmax_d_bytes(int64_t tokens, int64_t segments, int64_t heads);
int64_t flash_varlen_dq_accum_bytes(int64_t tokens, int64_t segments, int64_t heads,
                                    int64_t head_dim);
// The same for a batch of B sequences of L (the ViT's scaled_dot_product_attention in bf16):
// softmax_d [B, H, round128(L)] and dq accumulator [B, round128(L), H, round32(head_dim)].
int64_t flash_softmax_d_bytes(int64_t batch, int64_t length, int64_t heads);
int64_t flash_dq_accum_bytes(int64_t batch, int64_t length, int64_t heads, int64_t head_dim);
// Every flash forward keeps a 16-byte RNG state and an 8-byte placeholder on the GPU, even
// without dropout (flash_api.cpp).
inline constexpr int64_t kFlashRngStateBytes = 16;
inline constexpr int64_t kFlashRngPlaceholderBytes = 8;

// Memory-efficient attention (aten/src/ATen/native/transformers/cuda/attention.cu,
// attention_backward.cu, mem_eff_attention/kernel_backward.h; scaled_dot_product_attention in
// fp32) on B sequences of L, H heads: the forward keeps its log-sum-exp [B, H, round32(L)] fp32
// (kAlignLSE); the backward takes a workspace of B * H * ceil(L / 64) * 16,400 bytes (per block
// of 64 queries the fp32 gradient accumulator of 64 x 64 and a 16-byte counter: head_dim up to
// 64, the traces' 32 and 64).
int64_t efficient_lse_bytes(int64_t batch, int64_t heads, int64_t length);
int64_t efficient_backward_workspace_bytes(int64_t batch, int64_t heads, int64_t length);

// _foreach_norm's per-chunk partial norms (aten/src/ATen/native/cuda/ForeachReduceOp.cu):
// one fp32 per tensor and 65,536-element chunk of the largest tensor.
int64_t foreach_norm_partials_bytes(int64_t tensors, int64_t largest_elements);

}  // namespace vlm::memory::cuda
