// The one place where LibTorch versions differ (Debian's 1.13 on CI, CUDA 2.x on clusters).
// Everything version-dependent is an inline function or alias here, selected by
// TORCH_VERSION_MAJOR / TORCH_VERSION_MINOR from <torch/version.h>; the rest of the code calls
// these and compiles unchanged against both. Runtime sits below the model layer, which
// includes this header for autocast, RNG replay and attention.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <tuple>
#include <vector>

#if defined(VLM_WITH_CUDA)
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

// True when the LibTorch this is compiled against is at least major.minor.
#define VLM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||      \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace vlm::runtime::compat {

// --- allocator ----------------------------------------------------------------------------
// c10::Allocator::allocate is `const` up to 2.2 and non-const from 2.3 (pytorch/pytorch#120969).
// An allocator subclass declares `at::DataPtr allocate(size_t n) VLM_ALLOCATE_CONST override;`.
// 2.3 also added the pure virtual `copy_data(dest, src, count) const`; allocators declare it
// without `override` so the same declaration compiles (as a plain member) on 1.13.
#if VLM_TORCH_AT_LEAST(2, 3)
#define VLM_ALLOCATE_CONST
#else
#define VLM_ALLOCATE_CONST const
#endif

// --- autocast -----------------------------------------------------------------------------
// 1.13 .. 2.3: per-device functions (is_enabled = CUDA, is_cpu_enabled, get_autocast_gpu_dtype
// ...). 2.4 deprecates them for is_autocast_enabled(device_type) / get_autocast_dtype(...).

struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;
};

inline AutocastState autocast_state() {
  AutocastState s;
#if VLM_TORCH_AT_LEAST(2, 4)
  s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
  s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
#else
  s.cpu_enabled = at::autocast::is_cpu_enabled();
  s.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
  s.cuda_enabled = at::autocast::is_enabled();
  s.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
  return s;
}

inline void set_autocast_state(const AutocastState& s) {
#if VLM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu_enabled);
  at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, s.cuda_enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
#else
  at::autocast::set_cpu_enabled(s.cpu_enabled);
  at::autocast::set_autocast_cpu_dtype(s.cpu_dtype);
  at::autocast::set_enabled(s.cuda_enabled);
  at::autocast::set_autocast_gpu_dtype(s.cuda_dtype);
#endif
}

// --- optimizer ----------------------------------------------------------------------------
// Fused AdamW: one multi-tensor kernel updates every parameter of a group (at::_fused_adamw_;
// LibTorch 2.1 on, CUDA), where torch::optim::AdamW launches about a dozen kernels per
// parameter (its optimizer phase took 30 ms a step for the 222M preset on an H200, the fused
// one 15.5 ms with clipping; docs/BENCHMARKS.md, "GPU").
// The same update as torch::optim::AdamW (decoupled weight decay, bias corrections, eps after
// the square root), in fp32 with another rounding order. `steps` holds each parameter's step
// count after this update: 0-dimensional float tensors on the parameters' device.
// A build may leave it out with -DVLM_NO_FUSED_ADAMW (a LibTorch where it does not compile).
#if VLM_TORCH_AT_LEAST(2, 1) && !defined(VLM_NO_FUSED_ADAMW)
inline constexpr bool kFusedAdamW = true;
#else
inline constexpr bool kFusedAdamW = false;
#endif

inline void fused_adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs, at::TensorList steps, double lr,
                         double beta1, double beta2, double weight_decay, double eps) {
#if VLM_TORCH_AT_LEAST(2, 1) && !defined(VLM_NO_FUSED_ADAMW)
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/at::TensorList(),
                    steps, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                    /*maximize=*/false);
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr,
      (void)beta1, (void)beta2, (void)weight_decay, (void)eps;
  TORCH_CHECK(false, "fused AdamW needs LibTorch 2.1 or later");
#endif
}

// --- RNG state ----------------------------------------------------------------------------
// What activation checkpointing must replay: the CPU generator and, for CUDA inputs, the
// generator of the input's device (the same across versions; CUDA only when Torch has it).

struct RngState {
  at::Tensor cpu;
  at::Tensor cuda;  // undefined unless the state was taken for a CUDA device
  c10::DeviceIndex cuda_index = -1;
};

inline at::Tensor generator_state(const at::Generator& generator) {
  at::Generator g = generator;
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

inline void set_generator_state(const at::Generator& generator, const at::Tensor& state) {
  at::Generator g = generator;
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

inline RngState rng_state(const at::Device& device) {
  RngState s;
  s.cpu = generator_state(at::detail::getDefaultCPUGenerator());
#if defined(VLM_WITH_CUDA)
  if (device.is_cuda()) {
    s.cuda_index = device.has_index() ? device.index() : 0;
    s.cuda = generator_state(at::cuda::detail::getDefaultCUDAGenerator(s.cuda_index));
  }
#endif
  return s;
}

inline void set_rng_state(const RngState& s) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), s.cpu);
#if defined(VLM_WITH_CUDA)
  if (s.cuda.defined()) {
    set_generator_state(at::cuda::detail::getDefaultCUDAGenerator(s.cuda_index), s.cuda);
  }
#endif
}

// --- attention ----------------------------------------------------------------------------
// softmax(q k^T / sqrt(head_dim) + mask) v over q, k, v of shape [B, H, T, head_dim] (equal
// heads: repeat GQA's key/value heads first). `allowed` is a boolean mask broadcastable to
// [B, H, T, T], true where a query may attend to a key, or undefined for full attention.
// Every query must be allowed at least one key (itself, in our uses).
//
// >= 2.0: at::scaled_dot_product_attention (fused / memory-efficient kernels; its default
// scale is 1/sqrt(head_dim)). 1.13: the math path, with the softmax in fp32 so that bf16
// inputs give the same probabilities on every device.
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& allowed) {
#if TORCH_VERSION_MAJOR >= 2
  const c10::optional<at::Tensor> mask =
      allowed.defined() ? c10::optional<at::Tensor>(allowed) : c10::nullopt;
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false);
#else
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (allowed.defined()) {
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  }
  const at::Tensor probabilities = at::softmax(scores, -1, at::kFloat).to(v.scalar_type());
  return at::matmul(probabilities, v);
#endif
}

// Causal attention (query i sees keys 0..i) of q, k, v [N, H, L, head_dim], without a mask.
// >= 2.0: is_causal lets the fused kernels run (flash attention on CUDA: no L x L matrix is
// stored, forward or backward). 1.13 has no such kernel: the math path with a lower-triangular
// mask, as above.
inline constexpr bool kFusedCausalAttention = TORCH_VERSION_MAJOR >= 2;

inline at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, c10::nullopt, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  const int64_t length = q.size(-2);
  return scaled_dot_product_attention(
      q, k, v, at::ones({length, length}, q.options().dtype(at::kBool)).tril());
#endif
}

// Which fused kernels scaled_dot_product_attention may pick. Packed rows give the attention
// calls new shapes at every step, and cuDNN's attention (2.3 on) builds an execution plan per
// new shape, which costs more than the attention itself (the tiny preset's bf16 steps took
// 300-800 ms with it on an H100, 44 ms without it on an H200); flash and memory-efficient
// attention have no per-shape set-up. Called once before training on CUDA.
inline void use_shape_agnostic_attention_kernels() {
#if VLM_TORCH_AT_LEAST(2, 3)
  at::globalContext().setSDPUseCuDNN(false);
#endif
}

// RMSNorm as one op (model/language_model.cpp, on CUDA tensors): at::rms_norm, which 2.11 runs
// as one fused kernel forward and one backward on CUDA (normalising in fp32, as the op-by-op
// form does) instead of a dozen elementwise launches. Earlier versions keep the op-by-op form.
inline constexpr bool kFusedRmsNorm = VLM_TORCH_AT_LEAST(2, 11);

inline at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#if VLM_TORCH_AT_LEAST(2, 11)
  return at::rms_norm(x, {x.size(-1)}, weight, eps).to(x.scalar_type());
#else
  (void)x, (void)weight, (void)eps;
  TORCH_CHECK(false, "fused RMSNorm needs LibTorch 2.11");
#endif
}

// A linear layer with a bias (the ViT's): at::linear from 2.x, which runs a 3-D input as one
// GEMM with the bias in its epilogue (addmm). 1.13 keeps the C++ frontend's
// torch::nn::functional::linear, a matmul followed by an in-place bias addition, whose
// allocations the 1.13 memory model replays; on 2.x under autocast that addition was an fp32
// bias added into a bf16 product by the casting (non-vectorised) kernel, the largest single
// kernel of a 460M step (docs/BENCHMARKS.md).
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
#if TORCH_VERSION_MAJOR >= 2
  return at::linear(x, weight, bias);
#else
  if (x.dim() == 2 && bias.defined()) return at::addmm(bias, x, weight.t());
  at::Tensor out = at::matmul(x, weight.t());
  if (bias.defined()) out += bias;
  return out;
#endif
}

// FlashAttention over cumulative sequence lengths (model/varlen_attention_cuda.cpp): the
// forward returns (out, logsumexp, rng seed, rng offset, debug mask), the backward takes the
// seed and offset back. The arguments below are 2.11's declarations (ATen/ops/
// _flash_attention_{forward,backward}.h), scale and windows left at their defaults; older 2.x
// versions, whose argument lists changed several times, keep the grouped path.
#define VLM_VARLEN_FLASH_ATTENTION VLM_TORCH_AT_LEAST(2, 11)

struct FlashVarlenSaved {
  at::Tensor out, logsumexp, rng_seed, rng_offset;
};

#if VLM_VARLEN_FLASH_ATTENTION
// q [N, Hq, D], k, v [N, Hkv, D], cu_seqlens int32 [S + 1] on the device; causal per segment.
inline FlashVarlenSaved flash_varlen_forward(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& cu_seqlens,
                                             int64_t max_length) {
  auto [out, logsumexp, seed, offset, debug] = at::_flash_attention_forward(
      q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, /*dropout_p=*/0.0,
      /*is_causal=*/true, /*return_debug_mask=*/false);
  (void)debug;
  return {out, logsumexp, seed, offset};
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_varlen_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& cu_seqlens, int64_t max_length, const FlashVarlenSaved& saved) {
  return at::_flash_attention_backward(
      grad_out, q, k, v, saved.out, saved.logsumexp, cu_seqlens, cu_seqlens, max_length, max_length,
      /*dropout_p=*/0.0, /*is_causal=*/true, saved.rng_seed, saved.rng_offset);
}
#endif

}  // namespace vlm::runtime::compat

// --- CUDA allocator stats, c10d class split ------------------------------------------------

// CUDA caching-allocator statistics: getDeviceStats / resetPeakStats / setMemoryFraction take an
// `int` device up to 2.2 and a `c10::DeviceIndex` from 2.3, and the StatType enum moved to
// c10::CachingAllocator in 2.x. memory_stats_cuda.cpp therefore passes a c10::DeviceIndex
// (which converts to either parameter type) and indexes stat arrays with kAggregateStatIndex.
namespace vlm::runtime::compat {
inline constexpr int kAggregateStatIndex = 0;  // StatType::AGGREGATE in every version
}  // namespace vlm::runtime::compat

// c10d: in 1.13 ProcessGroupGloo / ProcessGroupNCCL derive from c10d::ProcessGroup; from 2.0
// they are c10d::Backend objects (ProcessGroup became a dispatcher over backends). Both bases
// have allreduce / broadcast / barrier with the same signatures, which is all this layer uses.
namespace c10d {
#if VLM_TORCH_AT_LEAST(2, 0)
class Backend;
#else
class ProcessGroup;
#endif
}  // namespace c10d

namespace vlm::runtime::compat {
#if VLM_TORCH_AT_LEAST(2, 0)
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif
}  // namespace vlm::runtime::compat

// --- profiling ----------------------------------------------------------------------------
// The Kineto profiler's C++ API as runtime/profiler.cpp uses it (ProfilerResult::events with
// KinetoEvent::activityType, startNs/endNs; enableProfiler with a scope set) is 2.1's; 1.13
// has an older one and Debian's build has no Kineto. VLM_KINETO_PROFILER selects the code.
#if VLM_TORCH_AT_LEAST(2, 1)
#define VLM_KINETO_PROFILER 1
#else
#define VLM_KINETO_PROFILER 0
#endif
// The CUDA caching allocator's trace tracker (attachAllocatorTraceTracker, for
// runtime/memory_trace_cuda.cpp) exists from 2.1 on.
#define VLM_CUDA_TRACE_TRACKER VLM_TORCH_AT_LEAST(2, 1)
