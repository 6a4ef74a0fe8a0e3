// Internal to lib/memory: the walk behind cuda::StepStream (memory/cuda_step.h), one file per
// job: the step's frame, the all-reduce and the optimizer (cuda_step.cpp), the image path
// (cuda_step_vision.cpp), the decoder and the embeddings (cuda_step_language.cpp), the loss
// (cuda_step_loss.cpp), the fp32 path's blocks (cuda_step_fp32.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "memory/cuda_step.h"
#include "memory/parameter_tensors.h"
#include "spec/attention_groups.h"

namespace vlm::memory::cuda {
namespace detail {

using Id = int32_t;

// One ViT block's tensors that outlive its statements (docs/memory.md, "On CUDA").
struct VitBlock {
  Id ln1 = -1, ln1m = -1, ln1r = -1, qkv_b = -1, qkv_w = -1, qkv_x = -1, qkv = -1, att = -1,
     lse = -1, r16 = -1, r8 = -1, o_b = -1, o_w = -1, o_out = -1, h = -1, ln2 = -1, ln2m = -1,
     ln2r = -1, fc1_b = -1, fc1_w = -1, fc1_x = -1, fc1 = -1, gelu = -1, fc2_b = -1, fc2_w = -1,
     fc2_out = -1, out = -1;
  std::vector<Id> cached;  // autocast's casts of the block's parameters, freed with the scope
};

struct DecBlock {
  Id n1 = -1, n1r = -1, qkv_cat = -1, qkv_w = -1, qkv_x = -1, qkv = -1, qrot = -1, krot = -1,
     v = -1, o = -1, lse = -1, r16 = -1, r8 = -1, o_w = -1, o_out = -1, h = -1, n2 = -1, n2r = -1,
     gu_cat = -1, gu_w = -1, gu_x = -1, gu = -1, silu = -1, mul = -1, d_w = -1, d_out = -1,
     out = -1;
  // fp32's grouped attention: per group what its backward reads, and the inverse index.
  struct Group {
    spec::GroupShape shape;
    Id gather = -1, q = -1, k = -1, v = -1, out = -1, lse = -1, keep = -1;
  };
  std::vector<Group> groups;
  Id inverse = -1;
};

}  // namespace detail

using detail::DecBlock;
using detail::Id;
using detail::VitBlock;

// The walk, in the order the trainer's code runs it (lib/model, train/step_runner.cpp).
struct StepStream::Impl {
  StepStream& s;
  // Dimensions (spec/model_spec.h): ViT, projector, decoder.
  int64_t img, patch, d, vl, h, m, ps, D, Ll, Hq, Hkv, hd, Fm, V, P, K, Ti, Pq;
  bool ckpt_v, ckpt_l, freeze_v, vit_frozen_bf16, freeze_l, f32;
  bool untied;  // the head's own weight: its gradient to its own AccumulateGrad
  int64_t es;  // the decoder's stream element: 4 (fp32), 2 with the decoder frozen in bf16
  // The micro-batch.
  int64_t N = 0, S = 0, L = 0, n = 0, nP = 0, batch_rows = 1;
  std::vector<spec::GroupShape> groups;  // fp32's grouped attention (its segments' groups)
  int micro = 0;
  Id lsum = -1;
  // Forward state the backward reads: the RoPE tables (fp32) and the ones the blocks use.
  Id cos_t = -1, sin_t = -1, cos_b = -1, sin_b = -1;
  // The image path per chunk of crops (model.vision_chunk_crops; one chunk without it).
  struct VitChunk {
    int64_t crops = 0;
    Id x_v0 = -1, pe_x = -1, lnf = -1, lnfm = -1, lnfr = -1, vit_last = -1;
    Id mp_w = -1, mp_x = -1, mp_out = -1;
    std::vector<VitBlock> blocks;
  };
  std::vector<VitChunk> chunks;
  Id lnf = -1, lnfm = -1, lnfr = -1;  // a frozen ViT's final LayerNorm (one chunk)
  void set_chunk(int64_t crops) { n = crops, nP = n * P; }
  std::vector<DecBlock> dec;
  std::vector<Id> dec_inputs;

  explicit Impl(StepStream& stream);

  // A tensor of no bytes is no request (the allocator skips size 0): kNone, freed as nothing.
  static constexpr Id kNone = -2;
  Id A(int64_t bytes) { return bytes > 0 ? s.alloc(bytes) : kNone; }
  void F(std::initializer_list<Id> ids) {
    for (const Id id : ids) {
      if (id != kNone) s.free(id);
    }
  }
  // AccumulateGrad on an fp32 gradient: added into .grad and freed, or stolen as the .grad
  // (the first backward to reach the parameter's tower).
  void acc(Id grad) {
    if (s.decoder_grads_) F({grad});
  }
  void acc_image(Id grad) {
    if (s.image_grads_) F({grad});
  }

  // A norm backward over `rows` x `features` after its outputs (the input's gradient, then
  // `dg` and `db`; RMSNorm has no `db`): the two-stage weight gradients where the kernel takes
  // them (cuda_kernels.h norm_weight_partial_rows): the partial sums, each summed into a new
  // gradient that replaces the first, the partials freed. `dg` and `db` then name the results.
  void norm_weight_partials(int64_t rows, int64_t features, Id& dg, Id* db = nullptr);

  // A reduction's cross-block staging and semaphores (cuda_kernels.h reduce_staging), taken and
  // given back within the kernel.
  void reduction_staging(int64_t outputs, int64_t inputs_per_output, int64_t input_bytes,
                         bool contiguous);

  // cuBLAS's workspaces, at a thread's first GEMM (cuda_kernels.h).
  void gemm_workspace(bool backward, bool lt);

  // cu_seqlens as int32 on the device, cached per thread (model/varlen_attention_cuda.cpp).
  void new_bounds(bool backward);

  // --- the image path -------------------------------------------------------------------
  // A chunk's place in the backward, which runs the chunks last first.
  struct Place {
    size_t processed = 0, count = 1;
    bool first() const { return processed == 0; }
    bool last() const { return processed + 1 == count; }
  };
  // A chunk's gradient of a parameter joins the engine's input buffer `buffer`: the first
  // chunk processed leaves it there; the second, when the buffered gradient is a view (of a
  // cast weight's transpose, a bias's sum_to, the patch kernel's view), is summed out of place;
  // every other one is added in place (torch/csrc/autograd/input_buffer.cpp, LibTorch 2.x).
  void join(Id& buffer, Id grad, int64_t bytes, const Place& place, bool view) {
    if (place.first()) {
      buffer = grad;
    } else if (view && place.processed == 1) {
      const Id sum = A(bytes);
      F({buffer, grad});
      buffer = sum;
    } else {
      F({grad});
    }
  }
  // A cached cast's gathered bf16 gradient converted to fp32 (ToCopyBackward0) and accumulated.
  void convert(Id& buffer, int64_t fp32_bytes) {
    const Id fp32 = A(fp32_bytes);
    F({buffer});
    buffer = fp32;
    acc_image(fp32);
  }
  struct LinearGrads {
    Id w = -1, b = -1;
  };
  struct BlockGrads {
    LinearGrads qkv, o, fc1, fc2;
    Id ln1_g = -1, ln1_b = -1, ln2_g = -1, ln2_b = -1;
    std::vector<Id> captured;  // a checkpointed block's, in the chunks' input buffers
  };
  struct ImageGrads {
    explicit ImageGrads(size_t layers) : blocks(layers) {}
    std::vector<BlockGrads> blocks;
    Id projector = -1, lnf_g = -1, lnf_b = -1, positions = -1, pe_w = -1, pe_b = -1;
    bool positions_shared = false;  // the buffered positions' gradient is the residual's
  };
  // A block under autograd (the forward, or a checkpointed block's recompute).
  // `cast`: the chunk that casts the block's weights and biases (the first: autocast caches the
  // casts of leaf parameters for its scope, and the later chunks reuse them).
  VitBlock vit_block_grad(bool recompute, bool cast = true);

  // A checkpointed block's forward without a graph; the weights still require a gradient, so
  // autocast caches their casts until the forward's end (`cast`: the first chunk makes them).
  VitBlock vit_block_checkpointed(bool cast);

  // A frozen ViT's block (no autograd). fp32 weights: each linear casts its bias, weight and
  // input and frees them after the GEMM; bf16 weights: nothing cast but the LayerNorms'
  // parameters and input (autocast's fp32 list), and the residual stream is bf16.
  Id vit_block_frozen(Id x);

  // The ViT to its final LayerNorm's output; the casts autocast caches are returned.
  std::vector<Id> vit_forward();

  // A linear's backward on CUDA (addmm): dX, dW, db, and the bias gradient's reduction staging.
  struct AddmmGrads {
    Id dx, dw, db;
  };
  AddmmGrads addmm_backward(int64_t in, int64_t out);

  // One ViT block's backward from the residual gradient `G` (shared, accumulated in place;
  // checkpointed: the node's own, and the block's gradients are captured, returned in `keep`),
  // for the chunk at `place`, gathering the parameters' gradients in `grads`.
  Id vit_block_backward(const VitBlock& b, Id G, Id xin, bool ckpt, std::vector<Id>& keep,
                        const Place& place, BlockGrads& grads);

  // --- the decoder ----------------------------------------------------------------------
  // RoPE on q then k (language_model.cpp apply_rotary) in elements of `e` bytes: only the
  // rotated tensor stays; its backward on q's or k's gradient (freed), returning the input's.
  void rotary(DecBlock& b, int64_t e);
  Id rotary_backward(Id grad, bool q, bool tables, int64_t e);
  // SwiGLU's backward from the down projection's input gradient (freed) to the fused gate/up one.
  Id swiglu_backward(const DecBlock& b, Id dXd, int64_t e);

  DecBlock dec_block_grad(bool backward_thread, bool first_layer_of_pass);

  DecBlock dec_block_checkpointed(bool first_layer);

  // A decoder frozen in bf16 storage: a bf16 stream, no casts (the fused projections' weights
  // concatenated as they are and kept by the GEMM), the GEMMs' inputs not kept (no weight
  // gradient needs them).
  DecBlock dec_block_frozen(bool first_layer);

  // One decoder block's backward (the varlen flash backward in the middle); as the ViT's.
  Id dec_block_backward(const DecBlock& b, Id G, Id xin, int64_t layer, bool ckpt,
                        std::vector<Id>& keep);

  // A frozen block's backward: the inputs' gradients alone, added in place into the residual's.
  void dec_block_backward_frozen(const DecBlock& b, Id xin, bool first_layer);

  // From the attention output's gradient `dXo`: FlashAttention's varlen backward and RoPE's,
  // to the fused q/k/v gradient (returned); the first layer's frees the rotary tables.
  Id attention_backward(const DecBlock& b, Id dXo, bool frees_tables);

  // --- fp32 (cuda_step_fp32.cpp): no autocast, memory-efficient and grouped attention ---------
  void vit_forward_fp32();
  VitBlock vit_block_fp32(bool recompute);
  VitBlock vit_block_fp32_nograd();
  // A parameter's gradient to its AccumulateGrad, or into `captured` in a checkpointed block's
  // recompute (accumulated once its node has returned).
  std::vector<Id>* captured = nullptr;
  void give(Id grad, bool image);
  // A linear's backward (addmm) after which `released` go: dX (returned), dW, db and the bias
  // reduction's staging, then the bias's and the weight's AccumulateGrad.
  Id addmm_backward_fp32(int64_t rows, int64_t in, int64_t out, std::initializer_list<Id> released);
  // A ViT LayerNorm's backward after which `released` go: its input gradient joins the
  // residual's in place, then the weight's and bias's AccumulateGrad.
  Id layer_norm_backward_fp32(std::initializer_list<Id> released, bool out_of_place);
  Id vit_block_backward_fp32(const VitBlock& b, Id G, Id xin, bool ckpt);
  // The memory-efficient backward's buffers beyond dq, dk, dv for B sequences of L, H heads.
  void efficient_backward_buffers(int64_t batch, int64_t heads, int64_t length,
                                  int64_t output_bytes);
  void image_backward_fp32(Id G, Id source);
  DecBlock dec_block_fp32(bool backward_thread);
  DecBlock dec_block_fp32_nograd();
  void grouped_attention(DecBlock& b, bool graph);
  Id grouped_attention_backward(const DecBlock& b, Id dXo, bool frees_tables);
  Id dec_block_backward_fp32(const DecBlock& b, Id G, Id xin, bool first_layer, bool ckpt);

  // --- the loss (cuda_step_loss.cpp) ------------------------------------------------------
  // The loss's tensors between its forward and its backward.
  struct Loss {
    Id ne = -1, rows = -1, tgt = -1, hw = -1, rows_b = -1, lsm = -1, tw = -1, loss = -1;
    Id obj = -1, seed = -1, head_grad = -1;
    Id held_targets = kNone;      // chunked: the targets, freed with the graph
    std::vector<int64_t> chunks;  // model.loss_chunk_tokens: the chunks' rows; empty: whole
  };
  Loss lo;
  // After the final norm (`nf`, its output): the supervised rows gathered, the head and the
  // cross-entropy, whole or in checkpointed chunks (model/token_loss.cpp), to the loss.
  void loss_forward(Id nf);
  // The loss's backward to the gradient at the final norm's output (returned); a tied head's
  // gradient is left in `lo.head_grad` for the embedding's backward (an untied head's goes to
  // its own AccumulateGrad).
  Id loss_backward();

  // --- one micro-step ---------------------------------------------------------------------
  void micro_step(const MicroBatchShape& mb, bool last_micro);
  // The micro-batch's sizes (and fp32's segment groups), checked against what the walk follows.
  void set_micro_batch(const MicroBatchShape& mb);
  // What the embedding and the image path leave for the decoder and for their backward.
  struct Embedded {
    Id merged = -1;                 // the decoder's input
    Id source = kNone;              // index_copy's saved source (with crops)
    Id mp_w = kNone, mp_x = kNone;  // a frozen ViT's projector: its weight and input casts
    std::vector<Id> cache;          // autocast's cached casts, freed after the loss
  };
  Embedded embed();
  Id decoder_forward(Id x);  // the RoPE tables and the blocks, to the last block's output
  Id decoder_backward(Id G);

  // From the residual gradient at the LM input: the image embeddings' gradient (index_copy's
  // saved `source`: their fp32 copy, or with a frozen bf16 decoder the embeddings themselves)
  // through the projector and the ViT.
  void image_backward(Id G, Id source, Id mp_w, Id mp_x);
  // The patch embedding's backward for the chunk `c` at `place`, from the residual gradient `G`
  // at the ViT's input (freed).
  void patch_embedding_backward(const VitChunk& c, Id G, const Place& place, ImageGrads& grads);

  // EmbeddingBackward0 (aten/src/ATen/native/cuda/Embedding.cu) from the token embeddings'
  // gradient: the sort path above 3,072 indices, then joined with the tied head's gradient
  // (`lo.head_grad`): summed out of place, or, after a chunked loss's sum, added into it; an
  // untied head's went to its own AccumulateGrad.
  void embedding_backward(Id gtok);

  // The gradient all-reduce over several ranks (runtime/distributed.cpp all_reduce_gradients):
  // a parameter without a gradient on this rank gets zeros (they stay as its .grad); the
  // gradients in the optimizer's order cut into buckets that close at kGradientBucketBytes, a
  // bucket of several flattened by cat, two in flight. Derived from the code: no multi-GPU trace
  // has been recorded (NCCL's stream may hold a finished bucket's block a little longer).
  void all_reduce();

  // clip_grad_norm then the fused AdamW, one call per group (train/optimizer.cpp), over the
  // parameters that have a gradient: AdamW creates a parameter's moments at its first update.
  void optimizer();
};

}  // namespace vlm::memory::cuda
