#include "memory/cuda_kernels.h"

#include <algorithm>

namespace vlm::memory::cuda {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }

int64_t last_pow2(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

int64_t cublas_workspace_bytes(const GpuShape& gpu) {
  return gpu.sm90 ? 32 * 1024 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8;
}

int64_t norm_weight_partial_rows(const GpuShape& gpu, int64_t rows, int64_t features) {
  constexpr int64_t kBlockX = 32, kRowsPerBlock = 32, kMaxGrid = 64 * 1024 / 2;
  if (rows <= 64 * 1024 || features / kBlockX >= gpu.sms / 2) return 0;
  const int64_t blocks_x = (features + kBlockX - 1) / kBlockX;
  return std::min(kMaxGrid / blocks_x, (rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

ReduceStaging reduce_staging(const GpuShape& gpu, int64_t num_outputs, int64_t inputs_per_output,
                             int64_t input_bytes, bool contiguous) {
  (void)input_bytes;  // the fp32 accumulator sizes the buffer, whatever the input dtype
  constexpr int64_t kAccBytes = 4, kMaxThreads = 512;
  int64_t dim0 = 0, dim1 = 0, out_vec = 1;
  if (contiguous) {
    dim0 = inputs_per_output;
    dim1 = num_outputs;
    if (dim0 > 128) dim0 /= 4;  // vectorised input
  } else {
    dim0 = num_outputs;
    dim1 = inputs_per_output;
    out_vec = 4;
    while (num_outputs % out_vec != 0) out_vec /= 2;
    dim0 /= out_vec;
  }
  const int64_t max_threads = kMaxThreads / out_vec;
  const int64_t d0 = dim0 < max_threads ? last_pow2(std::max<int64_t>(dim0, 1)) : max_threads;
  const int64_t d1 = dim1 < max_threads ? last_pow2(std::max<int64_t>(dim1, 1)) : max_threads;
  int64_t block_width = std::min<int64_t>(d0, 32);
  const int64_t block_height = std::min(d1, max_threads / block_width);
  block_width = std::min(d0, max_threads / block_height);
  const int64_t threads = block_width * block_height;
  int64_t step_input = 1, step_output = 1;
  bool across_warps = false, across_blocks = false;
  const bool within_block_x = contiguous;
  if (contiguous) {
    step_input *= block_width;
  } else {
    step_output *= block_width;
  }
  if (ceil_div(inputs_per_output, step_input) >= std::min<int64_t>(block_height * 16, 256)) {
    across_warps = true;
    step_input *= block_height;
  } else {
    step_output *= block_height;
  }
  const int64_t grid_x = ceil_div(num_outputs / out_vec, step_output);
  const int64_t target = gpu.sms * (gpu.threads_per_sm / threads);
  const int64_t values_per_thread = ceil_div(inputs_per_output, step_input);
  if (across_warps && values_per_thread >= 256 && grid_x <= target) {
    const int64_t ctas = std::max(std::min(ceil_div(target, grid_x), ceil_div(values_per_thread, 16)),
                                  ceil_div(values_per_thread, 256));
    across_blocks = ctas > 1;
    if (across_blocks) {
      int64_t size = kAccBytes * num_outputs * ctas;
      if (!within_block_x) size *= block_width * out_vec;
      return {size, 4 * grid_x};
    }
  }
  return {};
}

int64_t embedding_sort_scratch_bytes(int64_t n) {
  return 2 * round_up(8 * n, 256) + 16640 + round_up(ceil_div(n, 4), 256) + 255;
}

int64_t flash_varlen_softmax_d_bytes(int64_t tokens, int64_t segments, int64_t heads) {
  return heads * (tokens + 128 * segments) * 4;
}

int64_t flash_varlen_dq_accum_bytes(int64_t tokens, int64_t segments, int64_t heads,
                                    int64_t head_dim) {
  return (tokens + 128 * segments) * heads * round_up(head_dim, 32) * 4;
}

int64_t flash_softmax_d_bytes(int64_t batch, int64_t length, int64_t heads) {
  return batch * heads * round_up(length, 128) * 4;
}

int64_t flash_dq_accum_bytes(int64_t batch, int64_t length, int64_t heads, int64_t head_dim) {
  return batch * round_up(length, 128) * heads * round_up(head_dim, 32) * 4;
}

int64_t foreach_norm_partials_bytes(int64_t tensors, int64_t largest_elements) {
  return 4 * tensors * ceil_div(largest_elements, 65536);
}

int64_t efficient_lse_bytes(int64_t batch, int64_t heads, int64_t length) {
  return batch * heads * round_up(length, 32) * 4;
}

int64_t efficient_backward_workspace_bytes(int64_t batch, int64_t heads, int64_t length) {
  return batch * heads * ceil_div(length, 64) * (64 * 64 * 4 + 16);
}

}  // namespace vlm::memory::cuda
