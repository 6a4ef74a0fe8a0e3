#include "memory/cuda_step.h"

#include <algorithm>
#include <stdexcept>

#include "core/dist_env.h"
#include "memory/cuda_caching_allocator.h"
#include "memory/cuda_step_walk.h"
#include "memory/magnitude.h"
#include "memory/parameter_tensors.h"
#include "spec/attention_groups.h"
#include "spec/derived.h"

namespace vlm::memory::cuda {

std::string unmodelled(const MemorySpec& spec) {
  if (spec.precision != ComputePrecision::kBf16) {
    if (spec.levers.vision_chunk_crops > 0 || spec.levers.loss_chunk_tokens > 0) {
      return "fp32 training on CUDA with model.vision_chunk_crops or model.loss_chunk_tokens is "
             "not replayed yet";
    }
    if (!spec.vision.trainable || !spec.projector.trainable || !spec.language.trainable) {
      return "fp32 training on CUDA with a frozen module is not replayed yet";
    }
    // The memory-efficient backward's workspace is known for heads of up to 64 dimensions
    // (cuda_kernels.h; the traces have 32 and 64).
    const int64_t vit_head = spec.dims.vision.hidden_size / spec.dims.vision.num_heads;
    if (vit_head > 64 || spec::language_head_dim(spec.dims.language) > 64) {
      return "fp32 training on CUDA with attention heads of more than 64 dimensions is not "
             "replayed yet";
    }
  }
  if (!spec.language.trainable) {
    if (spec.language.parameter_bytes != 2) {
      return "a decoder frozen in fp32 storage on CUDA is not replayed yet (model.frozen_dtype: "
             "bf16 is)";
    }
    if (spec.levers.checkpoint_language || spec.levers.loss_chunk_tokens > 0) {
      return "a frozen decoder with model.checkpoint_language or model.loss_chunk_tokens on CUDA "
             "is not replayed yet";
    }
  }
  if (!spec.projector.trainable) return "a frozen projector on CUDA is not replayed yet";
  if (spec.levers.vision_chunk_crops > 0 && !spec.vision.trainable) {
    return "model.vision_chunk_crops with a frozen ViT on CUDA is not replayed yet";
  }
  return "";
}

// The walk, in the order the trainer's code runs it (lib/model, train/step_runner.cpp).

StepStream::Impl::Impl(StepStream& stream) : s(stream) {
  const spec::ModelSpec& dims = s.spec_.dims;
  img = dims.vision.image_size;
  patch = dims.vision.patch_size;
  d = dims.vision.hidden_size;
  vl = dims.vision.num_layers;
  h = dims.vision.num_heads;
  m = dims.vision.mlp_size;
  ps = dims.projector.pixel_shuffle;
  D = dims.language.hidden_size;
  Ll = dims.language.num_layers;
  Hq = dims.language.num_heads;
  Hkv = dims.language.num_kv_heads;
  hd = spec::language_head_dim(dims.language);
  Fm = dims.language.mlp_size;
  V = spec::language_vocab_rows(dims.language);
  P = (img / patch) * (img / patch);
  K = 3 * patch * patch;
  Ti = P / (ps * ps);
  Pq = (Hq + 2 * Hkv) * hd;
  ckpt_v = s.spec_.levers.checkpoint_vision;
  ckpt_l = s.spec_.levers.checkpoint_language;
  freeze_v = !s.spec_.vision.trainable;
  freeze_l = !s.spec_.language.trainable;  // in bf16 storage (unmodelled says so)
  es = freeze_l ? 2 : 4;
  f32 = s.spec_.precision != ComputePrecision::kBf16;
  untied = !dims.language.tie_embeddings;
  vit_frozen_bf16 = freeze_v && s.spec_.vision.parameter_bytes == 2;
}

void StepStream::Impl::norm_weight_partials(int64_t rows, int64_t features, Id& dg, Id* db) {
  const int64_t partial_rows = norm_weight_partial_rows(s.gpu_, rows, features);
  if (partial_rows == 0) return;
  const Id dg_partials = A(partial_rows * features * 4);
  const Id db_partials = db ? A(partial_rows * features * 4) : kNone;
  const auto sum_rows = [&](Id& grad) {  // partials.sum(0), assigned over the gradient
    const Id sum = A(features * 4);
    reduction_staging(features, partial_rows, 4, false);
    F({grad});
    grad = sum;
  };
  sum_rows(dg);
  if (db) sum_rows(*db);
  F({db_partials, dg_partials});  // destroyed in reverse order of declaration
}

void StepStream::Impl::reduction_staging(int64_t outputs, int64_t inputs_per_output,
                                         int64_t input_bytes, bool contiguous) {
  const ReduceStaging r =
      reduce_staging(s.gpu_, outputs, inputs_per_output, input_bytes, contiguous);
  if (r.staging > 0) {
    const Id st = A(r.staging), sem = A(r.semaphores);
    F({sem, st});
  }
}

// cuBLAS's workspaces, at a thread's first GEMM (cuda_kernels.h).
void StepStream::Impl::gemm_workspace(bool backward, bool lt) {
  bool& cublas = backward ? s.workspace_bwd_ : s.workspace_fwd_;
  bool& cublas_lt = backward ? s.workspace_lt_bwd_ : s.workspace_lt_fwd_;
  if (!cublas) {
    A(cublas_workspace_bytes(s.gpu_));
    cublas = true;
  }
  if (lt && !cublas_lt) {
    A(kCublasLtWorkspaceBytes);
    cublas_lt = true;
  }
}

// cu_seqlens as int32 on the device, cached per thread (model/varlen_attention_cuda.cpp).
void StepStream::Impl::new_bounds(bool backward) {
  Id& cached = backward ? s.bounds_bwd_ : s.bounds_fwd_;
  const Id fresh = A((S + 1) * 4);
  if (cached >= 0) s.free(cached);
  cached = fresh;
}

// --- one micro-step ---------------------------------------------------------------------
void StepStream::Impl::set_micro_batch(const MicroBatchShape& mb) {
  N = mb.tokens, S = mb.segments, L = mb.supervised, n = mb.crops, nP = n * P;
  batch_rows = mb.rows;
  if (freeze_l && n == 0) {
    throw std::invalid_argument(
        "cuda::StepStream: a text-only micro-batch with the decoder frozen runs no backward, "
        "which the walk does not follow");
  }
  if (f32) {
    int64_t sum = 0;
    for (const int64_t len : mb.segment_lengths) sum += len;
    if (mb.segment_lengths.empty() || sum != N) {
      throw std::invalid_argument(
          "cuda::StepStream: fp32's grouped attention needs every segment's length (they sum to "
          "the micro-batch's tokens)");
    }
    groups = spec::group_shapes(mb.segment_lengths);
  }
}

void StepStream::Impl::micro_step(const MicroBatchShape& mb, bool last_micro) {
  set_micro_batch(mb);
  const bool images = n > 0;
  // The batch on the device (int32 copies converted to int64), the crops.
  Id ids = -1, pos = -1, lab = -1;
  for (Id* t : {&ids, &pos, &lab}) {
    const Id i32 = A(N * 4);
    *t = A(N * 8);
    F({i32});
  }
  const Id iti = A(n * Ti * 8), sup = A(L * 8), crops = A(n * 3 * img * img * 4);
  const Embedded e = embed();
  const Id x = decoder_forward(e.merged);
  // The final norm and the loss (model/token_loss.cpp) on the supervised rows.
  const Id nf = A(N * D * es), nfr = A(N * 4);
  if (!f32) F({sin_t, cos_t});
  loss_forward(nf);
  for (const Id c : e.cache) F({c});
  // The backward: the loss and the head, then the final norm, the blocks.
  const Id gh = loss_backward();
  const Id R = A(N * D * es);
  Id nf_dg = freeze_l ? kNone : A(D * 4);
  if (!freeze_l) norm_weight_partials(N, D, nf_dg);
  F({gh, x, nfr});
  if (!freeze_l) acc(nf_dg);
  const Id G = decoder_backward(R);
  // index_copy's backward: the token embeddings' and the image embeddings' gradients (a
  // text-only micro-batch hands the residual gradient to the embedding as it is; a frozen
  // decoder's embedding takes none).
  const Id gtok = freeze_l ? kNone : images ? A(N * D * 4) : G;
  if (images && f32) {
    image_backward_fp32(G, e.source);
  } else if (images) {
    image_backward(G, e.source, e.mp_w, e.mp_x);
  }
  if (!freeze_l) embedding_backward(gtok);
  F({lo.seed});
  // The end of the micro-step (train/step_runner.cpp): the loss summed on the device.
  // Freeing the objective and the loss releases the graph, and with it a chunked loss's
  // targets (the loss's storage stays as the running sum after the first micro-step).
  if (micro == 0) {
    F({lo.obj, lo.held_targets});
    lsum = lo.loss;
  } else {
    const Id sum = A(4);
    F({lsum, lo.obj, lo.held_targets, lo.loss});
    lsum = sum;
  }
  if (ckpt_l) F({sin_b, cos_b});
  F({sup, lab, iti, crops, pos, ids});
  if (last_micro) F({lsum});
  s.decoder_grads_ = !freeze_l;
  if (images) s.image_grads_ = true;
  ++micro;
}

// The gradient all-reduce over several ranks (runtime/distributed.cpp all_reduce_gradients):
// a parameter without a gradient on this rank gets zeros (they stay as its .grad); the
// gradients in the optimizer's order cut into buckets that close at kGradientBucketBytes, a
// bucket of several flattened by cat, two in flight. Derived from the code: no multi-GPU trace
// has been recorded (NCCL's stream may hold a finished bucket's block a little longer).
void StepStream::Impl::all_reduce() {
  if (!s.image_grads_) {
    const OptimizerOrder image = optimizer_order(s.spec_, true);
    const size_t image_tensors =
        image.elements.size() - optimizer_order(s.spec_, false).elements.size();
    for (size_t i = 0; i < image_tensors; ++i) A(4 * image.elements[i]);
    s.image_grads_ = true;
  }
  const OptimizerOrder order = optimizer_order(s.spec_, true);
  std::vector<int64_t> flattened;
  int64_t bytes = 0, tensors = 0;
  for (const int64_t elements : order.elements) {
    bytes += 4 * elements;
    ++tensors;
    if (bytes >= kGradientBucketBytes) {
      flattened.push_back(tensors > 1 ? bytes : 0);
      bytes = tensors = 0;
    }
  }
  if (tensors > 0) flattened.push_back(tensors > 1 ? bytes : 0);
  std::vector<Id> in_flight;
  for (const int64_t flat : flattened) {
    if (in_flight.size() == 2) {
      F({in_flight.front()});
      in_flight.erase(in_flight.begin());
    }
    in_flight.push_back(A(flat));
  }
  for (const Id flat : in_flight) F({flat});
}

// clip_grad_norm then the fused AdamW, one call per group (train/optimizer.cpp), over the
// parameters that have a gradient: AdamW creates a parameter's moments at its first update.
void StepStream::Impl::optimizer() {
  const OptimizerOrder order = optimizer_order(s.spec_, s.image_grads_);
  const int64_t T = static_cast<int64_t>(order.elements.size());
  const Id partials = A(foreach_norm_partials_bytes(T, order.largest));
  std::vector<Id> norms;
  for (int64_t i = 0; i < T; ++i) norms.push_back(A(4));
  F({partials});
  const Id stack = A(4 * T), total = A(4);
  F({total, stack});
  for (const Id norm : norms) F({norm});
  size_t next = 0, group = 0;
  const size_t image_groups = order.group_sizes.size() - order.decoder_groups;
  for (const size_t size : order.group_sizes) {
    const bool first = group++ < image_groups ? !s.image_moments_ : !s.decoder_moments_;
    Id step_count = -1;
    for (size_t k = 0; k < size; ++k, ++next) {
      if (first) {
        A(4 * order.elements[next]);  // exp_avg
        A(4 * order.elements[next]);  // exp_avg_sq
      }
      if (k == 0) step_count = A(4);
    }
    F({step_count});
  }
}

StepStream::StepStream(const MemorySpec& spec, GpuShape gpu) : spec_(spec), gpu_(gpu) {
  if (const std::string why = unmodelled(spec); !why.empty()) throw std::invalid_argument(why);
}

int32_t StepStream::alloc(int64_t bytes) {
  const auto id = static_cast<int32_t>(live_.size());
  live_.push_back(1);
  requests_.push_back({bytes, id});
  return id;
}

void StepStream::free(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= live_.size() || !live_[static_cast<size_t>(id)]) {
    throw std::logic_error("cuda::StepStream: free of a request that is not live");
  }
  live_[static_cast<size_t>(id)] = 0;
  requests_.push_back({0, id});
}

void StepStream::model_states() {
  // The communicator, created before the model, holds a 4-byte flag and 64 doubles on the
  // device over several ranks (runtime/distributed.cpp).
  if (spec_.ranks > 1) {
    alloc(4);
    alloc(8 * 64);
  }
  for (const int64_t bytes : model_state_bytes(spec_)) alloc(bytes);
}

void StepStream::step(const std::vector<MicroBatchShape>& micro_batches) {
  Impl walk(*this);
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    walk.micro_step(micro_batches[k], k + 1 == micro_batches.size());
  }
  if (spec_.ranks > 1) walk.all_reduce();
  walk.optimizer();
  decoder_moments_ = true;
  image_moments_ = image_moments_ || image_grads_;
}

void StepStream::optimizer_states() {
  for (const bool image : {true, false}) {
    const OptimizerOrder order = optimizer_order(spec_, true);
    size_t next = 0;
    const size_t image_tensors = [&] {
      size_t count = 0;
      for (size_t g = 0; g + order.decoder_groups < order.group_sizes.size(); ++g) {
        count += order.group_sizes[g];
      }
      return count;
    }();
    for (const int64_t elements : order.elements) {
      if ((next++ < image_tensors) == image) {
        alloc(4 * elements);
        alloc(4 * elements);
      }
    }
  }
  decoder_moments_ = image_moments_ = true;
}

void StepStream::backward_passes(const std::vector<MicroBatchShape>& micro_batches) {
  Impl walk(*this);
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    walk.micro_step(micro_batches[k], k + 1 == micro_batches.size());
  }
}

StreamPeaks replay_peaks(const std::vector<Request>& requests, size_t from, size_t to,
                         int64_t capacity) {
  // One allocator and one table per thread, emptied between predictions: building them afresh
  // (4,097 buckets, the blocks' arena) was a fifth of a prediction.
  thread_local CudaCachingAllocatorModel allocator;
  thread_local std::vector<const void*> block;
  allocator.clear();
  allocator.set_capacity(capacity);
  block.assign(requests.size(), nullptr);  // by id: ids are below the count
  const auto apply = [&](const Request& r) {
    const auto id = static_cast<size_t>(r.id);
    if (r.bytes > 0) {
      block[id] = allocator.acquire(r.bytes);
    } else {
      allocator.release(block[id]);
    }
  };
  for (size_t i = 0; i < from && i < requests.size(); ++i) apply(requests[i]);
  StreamPeaks peaks;
  peaks.allocated_before = allocator.allocated_bytes();
  peaks.reserved_before = allocator.reserved_bytes();
  allocator.reset_peaks();
  for (size_t i = from; i < to && i < requests.size(); ++i) apply(requests[i]);
  peaks.allocated = allocator.peak_allocated_bytes();
  peaks.reserved = allocator.peak_reserved_bytes();
  return peaks;
}

std::string unmodelled_on(const MemorySpec& spec, const DeviceTarget& target) {
  if (!target.cuda) return "not a CUDA target";
  if (!target.torch.at_least(2, 11)) {
    return "LibTorch " + target.torch.str() +
           "'s CUDA kernels are not replayed (the replay follows LibTorch 2.11's)";
  }
  if (!target.gpu.nvidia || target.gpu.compute_capability < 80) {
    return "the GPU " + target.gpu.name +
           " (FlashAttention needs an NVIDIA GPU of compute "
           "capability 8.0 or more; its kernels are not replayed)";
  }
  if (target.gpu.multiprocessors <= 0) {
    return "the GPU " + target.gpu.name +
           " is not in the catalog (its SM count sizes the "
           "reduction kernels' buffers)";
  }
  return unmodelled(spec);
}

std::optional<DeviceBreakdown> replayed_step(const MemorySpec& spec,
                                             const std::vector<BatchShape>& micro_batches,
                                             StepState before, const DeviceTarget& target,
                                             const DeviceCorrections& corrections) {
  if (micro_batches.empty() || !unmodelled_on(spec, target).empty()) return std::nullopt;
  GpuShape gpu;
  gpu.sms = target.gpu.multiprocessors;
  gpu.sm90 = target.gpu.compute_capability == 90;
  std::vector<MicroBatchShape> step, warm_up;
  for (const BatchShape& b : micro_batches) {
    // The model's range (memory/magnitude.h), as the tensor replay keeps it: beyond it the
    // stream's sums could overflow.
    if (step_bytes_bound(spec, static_cast<double>(b.rows), static_cast<double>(b.row_tokens),
                         static_cast<double>(b.crops)) > kMaxModelledBytes) {
      return std::nullopt;
    }
    const MicroBatchShape m{b.rows * b.row_tokens, b.segments, b.supervised_tokens, b.crops, b.rows,
                            b.segment_lengths};
    if (m.supervised <= 0) return std::nullopt;
    // fp32's grouped attention needs every segment's length.
    if (spec.precision != ComputePrecision::kBf16 && m.segment_lengths.empty()) {
      return std::nullopt;
    }
    // With the decoder frozen a text-only micro-batch's loss reaches no trained parameter: no
    // backward runs (train/step_runner.cpp), which the walk does not follow.
    if (!spec.language.trainable && m.crops == 0) return std::nullopt;
    step.push_back(m);
    warm_up.push_back(m);
    if (before.image_gradients_pending) warm_up.back().crops = 0;
  }
  // A frozen decoder has no gradients of its own: until the image path's exist, the steps before
  // had no backward at all (text only), so the process is as fresh as at its start.
  if (!spec.language.trainable && before.image_gradients_pending) before = StepState{};
  StepStream stream(spec, gpu);
  stream.model_states();
  if (before.gradients && before.moments) {
    stream.step(warm_up);
  } else if (before.gradients) {
    stream.backward_passes(warm_up);
  } else if (before.moments) {
    stream.optimizer_states();
  }
  const size_t from = stream.requests().size();
  stream.step(step);
  int64_t nccl_buffers = 0;
  if (target.ranks > 1) {
    nccl_buffers =
        target.nccl_channels * 2 * (target.nccl_buffsize + kNcclLlBuffSize + kNcclLl128BuffSize);
  }
  const int64_t capacity =
      target.device_bytes > 0
          ? std::max<int64_t>(target.device_bytes - corrections.cuda_context_bytes - nccl_buffers,
                              1)
          : 0;
  const StreamPeaks peaks =
      replay_peaks(stream.requests(), from, stream.requests().size(), capacity);
  DeviceBreakdown b;
  b.cuda = true;
  b.replayed = true;
  b.tensors = peaks.allocated;
  b.static_tensors = peaks.allocated_before;
  b.allocated = peaks.allocated;
  b.reserved = peaks.reserved;
  b.segment_slack = peaks.reserved - peaks.allocated;
  b.cuda_context = corrections.cuda_context_bytes;
  b.nccl_buffers = nccl_buffers;
  b.device = b.reserved + b.cuda_context + b.nccl_buffers;
  return b;
}

}  // namespace vlm::memory::cuda
