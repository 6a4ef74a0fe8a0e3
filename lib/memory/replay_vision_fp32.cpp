// The image path's fp32 kernels (memory/replay.h, VitKernels): LibTorch 1.13's ViT blocks, and
// the patch embedding and the projector in fp32 on either version (2.x's blocks are in
// replay_vision_2x.cpp; the walk that runs them in replay_vision.cpp).
//
// Per chunk of n crops: X = 4nPd (a d-wide activation), M = 4nPm (an MLP activation),
// A = 4nhP^2 (one attention score matrix per head), S = 4nP (a LayerNorm statistic).
#include "memory/replay.h"

#include "memory/saved_activations.h"

namespace vlm::memory::replay {
namespace {

// A linear with bias backward. LibTorch 1.13's linear on a 3-D input is matmul, then the bias
// added in place, so two nodes run: the in-place add's, whose bias gradient is the engine's
// sum_to over the rows (it reaches its AccumulateGrad at once), then matmul's mm: the weight's
// gradient (column-major, viewed back by TBackward0) and the input's (`grad_in` bytes, 0 when
// the input needs none); then the output's gradient (`grad_out` bytes) is freed if the mm
// held its last reference (`frees_grad`), then the kept input (`kept_input` bytes).
void linear_backward(Timeline& t, int64_t grad_in, int64_t in, int64_t out, int64_t grad_out,
                     bool frees_grad, int64_t kept_input, const Sinks& sink) {
  t.alloc(e * out);
  accumulate(t, e * out, sink);
  t.alloc(e * in * out + grad_in);
  if (frees_grad) t.free(grad_out);
  t.free(kept_input);
  accumulate(t, e * in * out, sink);
}

// One pre-LN block (vision_transformer.cpp:85-88; attention :56-67 and compat.h's math path).
// matmul reshapes the per-head views of qkv to [n h, P, hd] for bmm: a contiguous copy of each
// of q, k^T and v (kept by bmm) when n > 1 and h > 1; otherwise the reshape is a view (a size-1
// dimension merges with anything) and the views keep qkv's storage instead. The context,
// `attended.transpose(1, 2).contiguous()`, is a copy when h > 1 and the attention output
// itself when h == 1.
void block_forward(Timeline& t, const Vit& v, const Chunk& c) {
  const bool head_copies = c.n > 1 && v.h > 1, context_copy = v.h > 1;
  layer_norm_forward(t, c);           // Y1, kept by qkv_proj
  t.alloc(3 * c.X);                   // qkv
  if (head_copies) t.alloc(2 * c.X);  // matmul(q, k^T): the copies of q and k^T,
  t.alloc(c.A);                       // the scores
  // `* scale`: the wrapped scale beside the scaled scores; the unscaled ones die.
  t.alloc(kWrappedScalar + c.A);
  t.free(kWrappedScalar + c.A);
  t.alloc(c.A);                   // softmax, kept
  if (head_copies) t.alloc(c.X);  // matmul(P, v): v's copy and the output
  t.alloc(c.X);
  t.free(c.A);                     // the scaled scores, at sdpa's return
  if (context_copy) t.alloc(c.X);  // the context (kept by out_proj)
  t.alloc(c.X);                    // out_proj
  // At attn's return: the attention output (unless it is the context) and qkv (unless its
  // views are kept) die.
  t.free((context_copy ? c.X : 0) + (head_copies ? 3 * c.X : 0));
  t.alloc(c.X);              // h = x + o, kept by ln2
  t.free(c.X);               // o
  layer_norm_forward(t, c);  // Y2, kept by fc1
  t.alloc(2 * c.M);          // fc1 (kept by GELU), GELU (kept by fc2)
  t.alloc(c.X);              // fc2
  t.alloc(c.X);              // out = h + fc2, kept by the next LayerNorm
  t.free(c.X);               // fc2
}

// One block's forward without a graph (CheckpointFunction::forward under NoGradGuard): the
// LayerNorm statistics die with the call, matmul's head copies when it returns, every other
// intermediate with its statement or scope; the output stays.
void block_forward_nograd(Timeline& t, const Vit& v, const Chunk& c) {
  const bool head_copies = c.n > 1 && v.h > 1, context_copy = v.h > 1;
  t.alloc(c.X + 2 * c.S);  // ln1: Y1 (a temporary of the statement) and its statistics
  t.free(2 * c.S);
  t.alloc(3 * c.X);  // qkv
  if (head_copies) t.alloc(2 * c.X);
  t.alloc(c.A);  // q k^T
  if (head_copies) t.free(2 * c.X);
  t.alloc(kWrappedScalar + c.A);  // * scale
  t.free(kWrappedScalar + c.A);   // the wrapped scale, the unscaled scores
  t.alloc(c.A);                   // softmax
  if (head_copies) t.alloc(c.X);  // P v: v's copy, the output
  t.alloc(c.X);
  if (head_copies) t.free(c.X);
  t.free(2 * c.A);  // the scores and probabilities, at sdpa's return
  if (context_copy) t.alloc(c.X);
  t.alloc(c.X);                                      // out_proj
  t.free((context_copy ? c.X : 0) + c.X + 3 * c.X);  // the context, attended, qkv
  t.alloc(c.X);                                      // h = x + o
  t.free(2 * c.X);                                   // o, Y1
  t.alloc(c.X + 2 * c.S);                            // ln2: Y2 and its statistics
  t.free(2 * c.S);
  t.alloc(2 * c.M + c.X);  // fc1, GELU, fc2
  t.free(2 * c.M);
  t.alloc(c.X);     // out = h + fc2
  t.free(3 * c.X);  // fc2, Y2, h
}

// One block's backward, from its output's gradient g (X, live, kept live: on return it is the
// block input's gradient).
// `nested`: inside a checkpointed block's autograd::grad (its parameter gradients captured:
// `sink` keeps them), where the block output's gradient g stays held by the outer node and the
// block input is the checkpoint's (its gradient captured as an out-of-place sum).
void block_backward(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink, bool nested) {
  // out = h + fc2 passes g to both. fc2 (g stays: h's buffer shares it): GELU's output freed.
  linear_backward(t, c.M, v.m, v.d, c.X, false, c.M, sink);
  // GELU: its input's gradient; then fc2's input gradient and the kept fc1 output are freed.
  t.alloc(c.M);
  t.free(2 * c.M);
  // fc1: Y2's gradient; its input gradient and Y2 freed.
  linear_backward(t, c.X, v.d, v.m, c.M, true, c.X, sink);
  // ln2 (frees Y2's gradient, h, the statistics); dX is summed with g into a new buffer, and
  // both addends die (g lives on when the outer node holds it).
  layer_norm_backward(t, v, c, sink);
  if (nested) {
    t.transient(c.X);
  } else {
    t.free(c.X);
  }
  // h = x + o passes g on. out_proj: the context's gradient; the kept context freed.
  linear_backward(t, c.X, v.d, v.d, c.X, false, c.X, sink);
  // The context's views back to the attention output: reshaping the transposed gradient to
  // [n h, P, hd] copies it when n > 1 and h > 1 (else a view); the context's gradient dies.
  const bool head_copies = c.n > 1 && v.h > 1;
  if (head_copies) {
    t.alloc(c.X);
    t.free(c.X);
  }
  // P @ v: the probabilities' and v's gradients; the incoming gradient and v's copy die.
  t.alloc(c.A + c.X);
  t.free(c.X + (head_copies ? c.X : 0));
  // softmax: its input's gradient; the incoming one and the probabilities die.
  t.alloc(c.A);
  t.free(2 * c.A);
  // `* scale` (the wrapped scale and a 4 B temporary at its top).
  t.transient(12);
  t.alloc(c.A);
  t.free(c.A);
  // q k^T: q's and k^T's gradients; the incoming one dies, and the copies of q and k^T (or
  // qkv, which the views kept).
  t.alloc(2 * c.X);
  t.free(c.A + (head_copies ? 2 * c.X : 3 * c.X));
  // Each head view's backward reshapes a transposed gradient to [n, P, d]: a copy each when
  // h > 1; then SplitBackward0.
  qkv_split_backward(t, v.h > 1 ? 3 : 0, c.X);
  // qkv_proj: Y1's gradient; the concatenated gradient and Y1 die.
  linear_backward(t, c.X, v.d, 3 * v.d, 3 * c.X, true, c.X, sink);
  // ln1 (frees Y1's gradient, the block input, the statistics); dX summed with g.
  layer_norm_backward(t, v, c, sink, /*frees_input=*/!nested);
  if (nested) t.transient(c.X);
  t.free(c.X);
}

// The patch embedding (vision_transformer.cpp:45-58): the patches (a contiguous copy, kept by
// the linear for the kernel's gradient), the linear's output, the positions added; the
// linear's output dies with the statement (a frozen ViT: the patches at return too).
void patch_embedding(Timeline& t, const Vit& v, const Chunk& c) {
  const int64_t patches = e * c.n * v.P * v.patch_values;
  t.alloc(patches + c.X + c.X);
  t.free(c.X);
  if (!v.vision_trained) t.free(patches);
}

// Its backward from the first block's input gradient g (X, live).
void patch_embedding_backward(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink) {
  // Patch embedding: x0 = linear + positions. The positions' gradient is g summed over the
  // crops (a new [1, P, d]). With one crop it is g itself, shared with the linear's branch, so
  // nothing can take it over: AccumulateGrad clones a first gradient and adds a later one in
  // place, while the engine's buffer (chunks) keeps the first and sums the others out of place
  // (a new sum, the old one freed).
  const int64_t positions = e * v.P * v.d;
  bool g_dies = true;
  if (c.n > 1) {
    t.alloc(positions);
    accumulate(t, positions, sink, /*view=*/false);
  } else if (sink.sink == Sink::kKeep) {
    if (sink.chunked) {
      g_dies = false;  // the buffer holds g itself
    } else {
      t.alloc(positions);
    }
  } else if (sink.chunked) {
    t.transient(positions);
    if (sink.sink == Sink::kRelease) t.free(positions);
  }
  // The linear (the patches need no gradient): the bias's gradient, then the kernel's (2.x's
  // addmm: both at once); then g (unless the positions' buffer holds it) and the kept patches
  // die.
  const int64_t patches = e * c.n * v.P * v.patch_values;
  if (v.torch2) {
    t.alloc(e * v.patch_values * v.d + e * v.d);
    if (g_dies) t.free(c.X);
    t.free(patches);
    accumulate(t, e * v.d, sink);
    accumulate(t, e * v.patch_values * v.d, sink);
  } else {
    linear_backward(t, 0, v.patch_values, v.d, c.X, g_dies, patches, sink);
  }
}

// The projector: the pixel shuffle's contiguous copy (kept by the linear when its weight is
// trained; with a factor of 1 the reshapes are views and the features themselves are kept),
// the linear's output. The copy dies with the statement when nothing keeps it, the features
// when the encode lambda returns unless kept.
void project(Timeline& t, const Vit& v, const Chunk& c) {
  if (v.shuffle_copies) t.alloc(c.X);
  t.alloc(e * c.n * v.I * v.D);
  if (v.shuffle_copies && !v.projector_trained) t.free(c.X);
  if (v.shuffle_copies || !v.projector_trained) t.free(c.X);
}

// Its backward (mm without bias): the shuffled features' gradient (a trained ViT) and the
// weight's (a trained projector); then the image gradient (if this holds its last view) and
// the kept shuffle copy (or the features; kept only for the weight's gradient).
void project_backward(Timeline& t, const Vit& v, const Chunk& c, int64_t image_gradient, bool last,
                      const Sinks& sink) {
  const int64_t weight = v.projector_trained ? e * v.Dp * v.D : 0;
  t.alloc((v.vision_trained ? c.X : 0) + weight);
  if (last) t.free(image_gradient);
  if (v.projector_trained) t.free(c.X);
  if (v.projector_trained) accumulate(t, weight, sink);
}

}  // namespace

const VitKernels& vit_kernels_fp32() {
  static const VitKernels k{block_forward,   block_forward_nograd,     block_backward,
                            patch_embedding, patch_embedding_backward, project,
                            project_backward};
  return k;
}

const VitKernels& vit_kernels_fp32_2x() {
  static const VitKernels k{vit_block_forward_2x,     vit_block_forward_nograd_2x,
                            vit_block_backward_2x,    patch_embedding,
                            patch_embedding_backward, project,
                            project_backward};
  return k;
}

}  // namespace vlm::memory::replay
