// The machinery behind memory/step_peaks.h: a phase of a training step replayed allocation by
// allocation, in the order LibTorch 1.13 runs it, keeping the live bytes and their maximum;
// one replay per tower. Internal to lib/memory.
//
// Backward order (autograd's engine on CPU): the ready node with the highest sequence_nr runs
// first (the most recently created), AccumulateGrad (a parameter's gradient) as soon as it is
// ready; a node's input gradients are freed when it returns (unless passed on or shared), then
// what it saved. docs/memory.md derives the terms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "memory/batch_shape.h"
#include "memory/cpu_kernels.h"
#include "memory/memory_spec.h"

namespace vlm::memory::replay {

constexpr int64_t e = 4;  // fp32
// `tensor op double` wraps the double in a 0-dim tensor for the call.
constexpr int64_t kWrappedScalar = 8;

// Live bytes over a replayed phase and their maximum.
struct Timeline {
  int64_t live = 0;
  int64_t peak = 0;
  void alloc(int64_t bytes) {
    live += bytes;
    peak = std::max(peak, live);
  }
  void free(int64_t bytes) { live -= bytes; }
  // A moment where `bytes` more are live for a while and then freed.
  void transient(int64_t bytes) { peak = std::max(peak, live + bytes); }
  // `n` runs in a row of `run`, a phase that allocates and frees the same bytes at every run
  // (the identical blocks of a tower): replayed once from nothing and extrapolated, which is
  // exactly what the n runs give (run k starts k times the run's net bytes higher), at the
  // cost of one run. What makes the sampler's predictions cheap (docs/BENCHMARKS.md).
  template <class Run>
  void repeat(int64_t n, Run&& run) {
    if (n <= 0) return;
    Timeline one;
    run(one);
    peak = std::max(peak, live + one.peak + std::max<int64_t>(0, (n - 1) * one.live));
    live += n * one.live;
  }
};

// Replays `segment(t, L)` for every attention segment in order, each run of equal consecutive
// lengths once (Timeline::repeat, exact): the worst case's rows are all alike, so 65,536 rows
// cost one segment's replay, not 65,536 (a recommendation search at batch_size 65536 took 17 s).
template <class Segment>
void for_each_segment(Timeline& t, const std::vector<int64_t>& segments, Segment&& segment) {
  for (size_t i = 0; i < segments.size();) {
    size_t end = i + 1;
    while (end < segments.size() && segments[end] == segments[i]) ++end;
    const int64_t L = segments[i];
    t.repeat(static_cast<int64_t>(end - i), [&](Timeline& one) { segment(one, L); });
    i = end;
  }
}

// The same, last segment first, as the backward runs them: `segment(t, L, first, last)` with
// `first` for the first one processed (the last segment) and `last` for the last one (the
// first segment); runs of equal lengths between them are replayed once.
template <class Segment>
void for_each_segment_reversed(Timeline& t, const std::vector<int64_t>& segments,
                               Segment&& segment) {
  const size_t n = segments.size();
  if (n == 0) return;
  segment(t, segments[n - 1], true, n == 1);
  // The segments between, last first, in runs of equal lengths: [begin, end).
  for (size_t end = n - 1; end > 1;) {
    size_t begin = end - 1;
    while (begin > 1 && segments[begin - 1] == segments[end - 1]) --begin;
    const int64_t L = segments[end - 1];
    t.repeat(static_cast<int64_t>(end - begin),
             [&](Timeline& one) { segment(one, L, false, false); });
    end = begin;
  }
  if (n > 1) segment(t, segments[0], false, true);
}

// A parameter's gradient reaching its AccumulateGrad: with no .grad yet it is stolen as the
// .grad (it stays); otherwise it is added in place into the .grad and freed.
inline void accumulate_grad(Timeline& t, int64_t bytes, bool steal) {
  if (!steal) t.free(bytes);
}

// The start of the trainer's backward (train/step_runner.cpp): `objective = loss_sum * inv_n`
// runs backward, its root gradient (4 B) held by backward() until it returns; MulBackward1
// makes the loss's gradient (4 B, the scalar wrapped for the product), which the loss's first
// node frees when it returns (the replays below).
inline void objective_backward(Timeline& t) {
  t.alloc(4);
  t.transient(kWrappedScalar + 4);
  t.alloc(4);
}

// One call of the decoder's grouped causal attention (LibTorch 2.x, spec/attention_groups.h):
// n segments padded to L tokens, S real tokens among them.
struct AttentionGroup {
  int64_t n, L, S;
};

// The language side, in the symbols of memory/saved_activations.h.
struct Lm {
  int64_t B, N, D, Dkv, F, Hq, Hkv, hd, Ll, V, Ns;
  bool tied;
  std::vector<int64_t> segments;
  bool checkpoint = false;  // model.checkpoint_language: every block checkpointed
  bool frozen = false;      // the decoder is frozen (fp32 storage): no weight gradients
  // Supervised rows per checkpointed loss chunk (model.loss_chunk_tokens), in order; empty when
  // the loss runs unchunked (no chunking, or Ns <= loss_chunk_tokens).
  std::vector<int64_t> loss_chunks;
  bool bf16 = false;     // train.precision bf16: autocast (replay_language_bf16.cpp)
  int64_t threads = 1;   // intra-op threads (oneDNN's per-thread scratchpads)
  bool onednn_bf16 = true;  // bf16 products run in oneDNN (memory_spec.h)
  // The decoder frozen in model.frozen_dtype bf16: it computes in bf16 in either precision
  // (replay_language_bf16.cpp), with no cast of its weights or of its bf16 activations.
  bool bf16_storage = false;
  // No tensor needs a gradient: a frozen decoder with no trained module before it (a text-only
  // micro-batch). The forward keeps nothing, and there is no backward.
  bool no_graph = false;
  // LibTorch 2.x's CPU kernels and engine (replay_language_2x.cpp); 1.13's otherwise.
  bool torch2 = false;
  std::vector<AttentionGroup> groups{};  // torch2: the grouped attention's calls, in order
};
Lm lm_of(const MemorySpec& spec, const BatchShape& shape);

// The image path: `crops` crops of P patches in chunks of `chunk` (vision_chunk_crops; all at
// once when 0), ViT width d, MLP m, heads h, Lv blocks; `patch_values` = 3 p^2 per patch, I
// image tokens per crop of width Dp = d s^2 into the LM's D. `shuffle_copies`: pixel shuffle
// > 1, whose reshape copies the features (and its backward copies their gradient).
struct Vit {
  int64_t crops, chunk, P, d, m, h, Lv, patch_values, I, Dp, D, threads;
  bool shuffle_copies;
  bool onednn_bf16;  // bf16 products run in oneDNN (memory_spec.h)
  bool checkpoint;  // model.checkpoint_vision: every block checkpointed
  bool vision_trained, projector_trained;
  bool bf16 = false;  // train.precision bf16: autocast (replay_vision_bf16.cpp)
  bool vision_bf16_storage = false;  // the ViT frozen with model.frozen_dtype bf16
  bool projector_bf16_storage = false;  // the projector frozen with model.frozen_dtype bf16
  bool torch2 = false;                  // LibTorch 2.x's CPU kernels (replay_vision_2x.cpp)
  std::vector<int64_t> chunks() const;  // crops per chunk, in forward order
};
Vit vit_of(const MemorySpec& spec, const BatchShape& shape);

// --- language (the walk in replay_language.cpp; the loss, head and embeddings in replay_loss.cpp)
// segment_ids and the RoPE tables, before the blocks: cos and sin (4 N hd each) live on return.
void decoder_prologue(Timeline& t, const Lm& x);
// The loss's preparation (token_loss.cpp:23-30): on return the supervised mask, the positions,
// the rows, the targets, the zero loss (4 B) and the count (8 B) are live.
void loss_preparation(Timeline& t, const Lm& x);

// The decoder and the loss, from the LM input live (counted by the caller) to the forward's
// end; `t.live` then holds what they save.
void language_forward(Timeline& t, const Lm& x);
// From the saved bytes to the LM input's gradient (4ND, live on return); the tied head's
// gradient (4VD) waits in the embedding's AccumulateGrad buffer, live on return too.
void language_backward(Timeline& t, const Lm& x, bool first_step);
// EmbeddingBackward0 (the last node) from the token embeddings' gradient (4ND, freed).
void embedding_backward(Timeline& t, const Lm& x, bool first_step);
// The loss (token_loss.cpp) from the final norm's output: its preparation, then unchunked
// the logits and kept log-probabilities, or chunk by chunk without a graph; on return the
// supervised mask and `hidden` are the caller's to free.
void loss_forward(Timeline& t, const Lm& x);
// Its backward from the objective's gradient to the final norm's output gradient (4ND, live
// on return); a tied head's gradient waits in the embedding's buffer.
void loss_backward(Timeline& t, const Lm& x, bool first_step);
// q = RoPE(q_proj(y1)), then k: only the rotated tensors stay (fp32, both versions;
// replay_language_fp32.cpp).
void rotary_projections(Timeline& t, const Lm& x);

// RMSNorm on an fp32 input (language_model.cpp:33-37; replay_rms_norm.cpp), as the trained
// decoder runs it in either precision on LibTorch 1.13: forward from its input (live) to its output
// y (4ND, live on return); backward from y's gradient (4ND, freed) to the input's (4ND, live on
// return). `residual`: the input's gradient buffer already holds the residual branch's gradient;
// `checkpoint_input` and `holds_incoming`: inside a checkpointed block's backward
// (replay_language.cpp).
void rms_norm_forward(Timeline& t, const Lm& x);
// The same without a graph (a checkpointed block's forward): only y stays.
void rms_norm_forward_nograd(Timeline& t, const Lm& x);
// The same with a frozen weight: x^2 and rsqrt kept, x * r not.
void rms_norm_forward_frozen(Timeline& t, const Lm& x);
void rms_norm_backward(Timeline& t, const Lm& x, bool first_step, bool residual,
                       bool checkpoint_input = false, bool holds_incoming = false);

// down_proj, SiLU and the product backward, the same in both versions (replay_language_fp32.cpp).
void swiglu_backward(Timeline& t, const Lm& x, bool keep);

// A decoder block on LibTorch 2.x, fp32 (replay_language_2x.cpp; decoder_kernels_fp32_2x's):
// with a graph (trained, or frozen with a gradient through it), without one, and the backward
// (`nested`: inside a checkpointed block's autograd::grad).
void block_forward_2x(Timeline& t, const Lm& x);
void block_forward_nograd_2x(Timeline& t, const Lm& x);
void block_backward_2x(Timeline& t, const Lm& x, bool first_step, bool first_block, bool nested);
// RMSNorm on LibTorch 2.x (replay_rms_norm.cpp): forward (a frozen weight keeps no n) and
// backward, `residual` as above (`held`: an outer node holds x's gradient buffer, so the first
// addition is a new sum; `keeps_input`: the checkpoint keeps x).
void rms_norm_forward_2x(Timeline& t, const Lm& x);
void rms_norm_backward_2x(Timeline& t, const Lm& x, bool first_step, bool residual, bool held,
                          bool keeps_input);

// The decoder's kernels under bf16 autocast or stored in bf16 (LibTorch 1.13's, which a 2.x CPU
// keeps for bf16 products: memory::cpu_unreplayed) that decoder_kernels_bf16
// (replay_language_bf16.cpp) takes from the backward's file (replay_language_bf16_backward.cpp):
// a block's backward, the loss's and the final norm's.
void block_backward_bf16(Timeline& t, const Lm& x, bool first_step, bool first_block, bool nested);
void loss_backward_bf16(Timeline& t, const Lm& x, bool first_step);
void norm_backward_bf16(Timeline& t, const Lm& x, bool first_step);

// What the decoder's and the loss's kernels allocate, per LibTorch version and precision: the
// walk (replay_language.cpp: the blocks, checkpointed or not, the final norm, the loss, the
// checkpointed block's frame) is one, and runs these rules. fp32 on 1.13 and 2.x
// (replay_language_fp32.cpp; 2.x's blocks in replay_language_2x.cpp), bf16 autocast and a
// decoder stored in bf16 on 1.13 (replay_language_bf16.cpp, replay_language_bf16_backward.cpp;
// a 2.x CPU keeps them for bf16 products, memory::cpu_unreplayed).
struct DecoderKernels {
  // One block with a graph (trained, or frozen with a gradient through it), without one, and
  // its backward from the output's gradient (live; on return the input's). `first_block`: the
  // block whose input is the LM input; `nested`: inside a checkpointed block's
  // autograd::grad, which captures the parameter gradients.
  void (*block_forward)(Timeline& t, const Lm& x);
  void (*block_forward_nograd)(Timeline& t, const Lm& x);
  void (*block_backward)(Timeline& t, const Lm& x, bool first_step, bool first_block, bool nested);
  // The final norm with a graph, without one, and its backward (its input's gradient live on
  // return).
  void (*norm_forward)(Timeline& t, const Lm& x);
  void (*norm_forward_nograd)(Timeline& t, const Lm& x);
  void (*norm_backward)(Timeline& t, const Lm& x, bool first_step);
  // The loss from the final norm's output, and its backward to that output's gradient.
  void (*loss_forward)(Timeline& t, const Lm& x);
  void (*loss_backward)(Timeline& t, const Lm& x, bool first_step);
  // summed_cross_entropy over `rows` rows without a graph: on return the logits, the
  // log-probabilities, the loss and the total weight are live.
  void (*cross_entropy_nograd)(Timeline& t, const Lm& x, int64_t rows);
  // The products keep bf16 copies, not the fp32 RoPE tables, which then die with the forward.
  bool tables_die_with_forward;
};
const DecoderKernels& decoder_kernels_fp32();     // LibTorch 1.13
const DecoderKernels& decoder_kernels_fp32_2x();  // LibTorch 2.x
const DecoderKernels& decoder_kernels_bf16();     // LibTorch 1.13, autocast or bf16 storage

// Whether a [batch, rows, cols] per-head view is copied before a oneDNN product: heads of one
// segment are strided unless the view is the whole of a contiguous tensor.
struct HeadLayout {
  bool q_copied, kv_copied;
};
inline HeadLayout head_layout(const Lm& x, int64_t L) {
  const bool gqa = x.Hkv < x.Hq;
  // q (and k, v without GQA) keep the projection's token-major layout: strided over heads.
  // GQA's keys and values are contiguous per head: strided only when a segment is a part.
  const bool q_copied = x.Hq > 1;
  const bool kv_copied = gqa ? !(x.B == 1 && L == x.N) : x.Hq > 1;
  return {q_copied, kv_copied};
}
// summed_cross_entropy over `rows` rows under autocast (replay_language_bf16.cpp), shared by the
// forward and the chunked loss's recompute: `graph`: its copies kept for a backward, else they
// die.
void cross_entropy_forward_bf16(Timeline& t, const Lm& x, int64_t rows, bool graph);

// --- vision (replay_vision.cpp) ------------------------------------------------------------
// The ViT and the projector over every chunk (and the concatenation of the chunks' outputs):
// on return the image embeddings (4 n I D; 2 n I D under autocast or from a projector stored in
// bf16) and what the towers save are live.
void vision_forward(Timeline& t, const Vit& v);
// From the image embeddings' gradient (as large, freed on the way) through every chunk, last
// chunk first; parameter gradients are stolen by the first chunk processed when `first_step`.
void vision_backward(Timeline& t, const Vit& v, bool first_step);

// A ViT frozen in bf16 storage, in either precision (replay_vision_bf16.cpp): the chunk
// converted to bf16 and run without a graph, every tensor bf16 (the LayerNorm statistics too)
// but the softmax; on return its bf16 output (2 n P d) is live, nothing else.
struct Chunk;
void frozen_bf16_vit_forward(Timeline& t, const Vit& v, const Chunk& c);

// A projector frozen in bf16 storage, in either precision (replay_vision_bf16.cpp): the
// features converted to bf16 (`features_fp32`; a ViT stored in bf16 gives them in bf16), the
// shuffle's bf16 copy, the bf16 output (live on return) and the product's scratchpad; it keeps
// nothing, so the copies die at once (the features are the caller's to free).
void project_bf16_storage(Timeline& t, const Vit& v, const Chunk& c, bool features_fp32);
// Its backward, from the chunk's slice of the image embeddings' bf16 gradient to the features'
// fp32 gradient (4 n P d, live on return); `last`: the chunk processed last, which frees the
// whole incoming gradient (`image_gradient` bytes).
void project_backward_bf16_storage(Timeline& t, const Vit& v, const Chunk& c,
                                   int64_t image_gradient, bool last);

// --- pieces shared by the image path's replays --------------------------------------------
struct Sinks;
// One ViT block on LibTorch 2.x, fp32 (replay_vision_2x.cpp; vit_kernels_fp32_2x's): with a
// graph, without one, and its backward (`nested`: inside a checkpointed block's
// autograd::grad).
void vit_block_forward_2x(Timeline& t, const Vit& v, const Chunk& c);
void vit_block_forward_nograd_2x(Timeline& t, const Vit& v, const Chunk& c);
void vit_block_backward_2x(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink,
                           bool nested);

// What the image path's kernels allocate, per LibTorch version and precision: the walk
// (replay_vision.cpp: chunks, blocks, checkpointing, where each chunk's gradients go) is one,
// and runs these rules. fp32 on 1.13 and 2.x (replay_vision_fp32.cpp; 2.x's blocks in
// replay_vision_2x.cpp), bf16 autocast on 1.13 (replay_vision_bf16.cpp).
struct VitKernels {
  // One block with a graph, without one (a checkpointed block's forward, a frozen ViT), and
  // its backward from the output's gradient g (live; on return the input's gradient).
  // `nested`: inside a checkpointed block's autograd::grad, where the outer node holds g and
  // the block input is the checkpoint's.
  void (*block_forward)(Timeline& t, const Vit& v, const Chunk& c);
  void (*block_forward_nograd)(Timeline& t, const Vit& v, const Chunk& c);
  void (*block_backward)(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink, bool nested);
  // The patch embedding from the chunk's pixels to the first block's input (live on return),
  // and its backward from that input's gradient (live; freed, unless the positions' gradient
  // buffer holds it: one crop in the first chunk processed).
  void (*patch_embedding)(Timeline& t, const Vit& v, const Chunk& c);
  void (*patch_embedding_backward)(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink);
  // The projector (pixel shuffle and linear) on the fp32 features (live, the caller's; freed
  // here when nothing keeps them): the image embeddings live on return.
  void (*project)(Timeline& t, const Vit& v, const Chunk& c);
  // Its backward from the chunk's slice of the image embeddings' gradient (`last`: the chunk
  // processed last, which frees the whole gradient, `image_gradient` bytes) to the features'
  // gradient (live on return when the ViT is trained).
  void (*project_backward)(Timeline& t, const Vit& v, const Chunk& c, int64_t image_gradient,
                           bool last, const Sinks& sink);
};
const VitKernels& vit_kernels_fp32();     // LibTorch 1.13
const VitKernels& vit_kernels_fp32_2x();  // LibTorch 2.x
const VitKernels& vit_kernels_bf16();     // LibTorch 1.13, bf16 autocast

// One chunk's sizes in fp32 bytes: the residual stream X, the MLP M, the scores A, one
// statistic per token S.
struct Chunk {
  int64_t n, X, M, A, S;
};

inline Chunk chunk_of(const Vit& v, int64_t n) {
  return Chunk{n, e * n * v.P * v.d, e * n * v.P * v.m, e * n * v.h * v.P * v.P, e * n * v.P};
}

// Where one chunk's gradient of a parameter goes. AccumulateGrad runs once every chunk has
// contributed; until then the engine sums the contributions in its input buffer, out of place
// in LibTorch 1.13 (old + new: a third tensor for a moment, then both addends die).
enum class Sink {
  kKeep,     // the first contribution stays: in the buffer, then as the stolen .grad
  kAdd,      // added into the buffer (or into the .grad, unchunked), then freed
  kRelease,  // the last contribution when the .grad exists: added into the buffer, which is
             // added into the .grad; both freed
};

struct Sinks {
  Sink sink;
  bool chunked;
  size_t processed = 0;  // chunks processed before this one
  // LibTorch 2.x: the engine adds into a buffer it owns alone in place; only a view buffered
  // by the first chunk processed (a linear's weight or bias gradient) is summed out of place.
  bool torch2 = false;
};

inline Sinks sinks_of(size_t processed, size_t chunks, bool first_step, bool torch2) {
  if (chunks == 1) return {first_step ? Sink::kKeep : Sink::kAdd, false, processed, torch2};
  if (processed == 0) return {Sink::kKeep, true, processed, torch2};
  if (processed + 1 == chunks && !first_step) return {Sink::kRelease, true, processed, torch2};
  return {Sink::kAdd, true, processed, torch2};
}

// Whether a chunk's gradient joins the buffer as a new sum (old + new: a third tensor for a
// moment) rather than in place. `view`: the gradient is a view (a linear's weight or bias).
inline bool sums_out_of_place(const Sinks& s, bool view) {
  return s.chunked && s.sink != Sink::kKeep && (!s.torch2 || (view && s.processed == 1));
}

// A gradient of `bytes` (live) reaching its parameter.
inline void accumulate(Timeline& t, int64_t bytes, const Sinks& s, bool view = true) {
  if (s.sink == Sink::kKeep) return;
  if (sums_out_of_place(s, view)) t.transient(bytes);  // the sum beside both addends
  t.free(s.sink == Sink::kRelease ? 2 * bytes : bytes);
}

// LayerNorm (native_layer_norm on CPU) on a contiguous input: the output and the mean and
// rstd per row; the statistics are kept by the backward node, the output by its consumer.
inline void layer_norm_forward(Timeline& t, const Chunk& c) { t.alloc(c.X + 2 * c.S); }

// Its backward, from the output's gradient (X, live; freed): dX, the weight's and bias's
// gradients and the [2, threads, d] accumulation buffer at once; the buffer is freed when the
// kernel ends, the gradient when the node returns, then the saved input and statistics. On
// return dX is live (added in place into the residual's gradient by the caller, or it is the
// residual's gradient); the weight and bias gradients have reached their AccumulateGrad.
inline void layer_norm_backward(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink,
                         bool frees_input = true) {
  const int64_t buffer = layer_norm_backward_buffer(v.threads, v.d);
  t.alloc(c.X + 2 * e * v.d);
  t.transient(buffer);
  t.free(c.X);  // the output's gradient
  // The input (unless a checkpoint keeps it), mean and rstd.
  t.free((frees_input ? c.X : 0) + 2 * c.S);
  accumulate(t, e * v.d, sink, /*view=*/false);
  accumulate(t, e * v.d, sink, /*view=*/false);
}

// The head views' gradients reshaped back to [n, P, d] (`copies` of them copied, `part` bytes
// each; the gradient each came from dies), then SplitBackward0 concatenating q's, k's and v's
// into qkv's gradient (3 parts), which the caller's linear backward consumes at once.
inline void qkv_split_backward(Timeline& t, int copies, int64_t part) {
  for (int k = 0; k < copies; ++k) {
    t.alloc(part);
    t.free(part);
  }
  t.alloc(3 * part);
  t.free(3 * part);
}

// A block's parameters in block->parameters() order: ln1, qkv, out, ln2, fc1, fc2 (weight,
// bias each), in elements.
inline std::vector<int64_t> block_parameters(const Vit& v) {
  return {v.d, v.d, 3 * v.d * v.d, 3 * v.d, v.d * v.d, v.d, v.d, v.d, v.m * v.d, v.m, v.d * v.m,
          v.d};
}

}  // namespace vlm::memory::replay
