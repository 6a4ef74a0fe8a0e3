// The image path's kernels under bf16 autocast (LibTorch 1.13 on the CPU; memory/replay.h,
// VitKernels: the walk in replay_vision.cpp runs them): the blocks, the patch embedding and the
// projector of a ViT and projector trained or frozen in fp32 storage; and the ViT and
// projector frozen in bf16 storage, in either precision. As in the decoder
// (replay_language_bf16.cpp): each linear's product casts its weight (a view: one copy per
// use) and its fp32 input to bf16 and keeps both for the backward; LibTorch 1.13's linear on a
// 3-D input is matmul then `add_(bias)`, and adding the fp32 bias into the bf16 output in
// place converts through two fp32 temporaries; LayerNorm, the residual stream and the softmax
// stay fp32; in backward every cast converts its gradient back.
#include "memory/replay.h"
#include "memory/saved_activations.h"

namespace vlm::memory::replay {
namespace {

constexpr int64_t h = 2;  // bf16

// A ViT linear with bias on `rows` tokens from `in` to `out` features: the weight's copy, the
// input's (`cast_input`: an fp32 input), the bf16 output and the product's scratchpad, then
// the bias added in place (two fp32 temporaries of the output's size). With a graph the copies
// stay; without one they die when the product returns, before the bias.
void linear_forward(Timeline& t, const Vit& v, int64_t rows, int64_t in, int64_t out,
                    bool cast_input, bool graph = true) {
  const int64_t copies = h * in * out + (cast_input ? h * rows * in : 0);
  t.alloc(copies + h * rows * out);
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, in, out, false, true));
  if (!graph) t.free(copies);
  t.transient(2 * e * rows * out);
}

// Its backward from the output's bf16 gradient (live): the bias's gradient (summed in bf16,
// converted to fp32), the weight's (as (g^T x)^T) and the input's; then the output's gradient,
// the kept bf16 input and the weight copy are freed; the weight's gradient is converted to
// fp32 after the input's (`cast_input`: the input's cast converts its gradient first).
void linear_backward(Timeline& t, const Vit& v, int64_t rows, int64_t in, int64_t out,
                     bool cast_input, const Sinks& sink) {
  t.alloc(h * out + e * out);
  t.free(h * out);
  accumulate(t, e * out, sink);
  t.alloc(h * in * out);
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, out, rows, in, true, false));
  t.alloc(h * rows * in);
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, out, in, false, false));
  t.free(h * rows * out + h * rows * in + h * in * out);
  if (cast_input) {
    t.alloc(e * rows * in);
    t.free(h * rows * in);
  }
  t.alloc(e * in * out);
  t.free(h * in * out);
  accumulate(t, e * in * out, sink);
}

// `fp32 + bf16` (the residual adds): the branch converted to fp32 beside the sum; then the
// conversion and the branch die.
void residual_add(Timeline& t, const Chunk& c) {
  t.alloc(2 * c.X);
  t.free(c.X + c.X / 2);
}

// The attention's operands as bmm sees them. matmul reshapes the per-head views of qkv to
// [n h, P, hd]: a contiguous copy (kept) when n > 1 and h > 1, else a strided view, which a
// oneDNN product copies for its call (ATen's is_mkldnn_optimized_format).
struct Heads {
  bool copies;  // matmul's kept copies of q, k^T and v
  bool onednn;  // the products run in oneDNN
  int64_t rows, batch;
};
Heads heads_of(const Vit& v, const Chunk& c) {
  const int64_t hd = v.d / v.h;
  return {c.n > 1 && v.h > 1, onednn_bf16_product(v.onednn_bf16, c.n * v.h, v.P, hd, v.P), c.X / 2,
          c.n * v.h};
}

// A ViT linear without a graph.
void linear_forward_nograd(Timeline& t, const Vit& v, int64_t rows, int64_t in, int64_t out,
                           bool cast_input) {
  linear_forward(t, v, rows, in, out, cast_input, /*graph=*/false);
}

// One block's forward without a graph (CheckpointFunction::forward): the statistics die with
// each LayerNorm, matmul's copies with each product, the probabilities at sdpa's return, every
// other intermediate with its statement; the output stays.
void block_forward_nograd(Timeline& t, const Vit& v, const Chunk& c) {
  const Heads a = heads_of(v, c);
  const int64_t rows = c.n * v.P, hd = v.d / v.h, scores = c.A / 2;
  const bool context_copy = v.h > 1;
  t.alloc(c.X + 2 * c.S);  // ln1: Y1 and its statistics
  t.free(2 * c.S);
  linear_forward_nograd(t, v, rows, v.d, 3 * v.d, true);
  if (a.copies) t.alloc(2 * a.rows);
  t.alloc(scores);
  const int64_t call_copies = a.onednn && !a.copies ? 2 * a.rows : 0;
  t.transient(call_copies +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, hd, v.P, false, true));
  if (a.copies) t.free(2 * a.rows);
  t.transient(kWrappedScalar + h + scores);
  t.alloc(scores);
  t.free(scores);
  t.alloc(2 * c.A);  // softmax's fp32 input copy and the probabilities
  t.free(c.A);
  t.alloc(scores);  // their bf16 copy; the fp32 ones die
  t.free(c.A);
  if (a.copies) t.alloc(a.rows);
  t.alloc(a.rows);
  t.transient((a.onednn && !a.copies ? a.rows : 0) +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, v.P, hd, false, false));
  if (a.copies) t.free(a.rows);
  t.free(2 * scores);  // the scaled scores and the bf16 probabilities
  if (context_copy) t.alloc(a.rows);
  linear_forward_nograd(t, v, rows, v.d, v.d, false);
  t.free((context_copy ? a.rows : 0) + a.rows + 3 * a.rows);  // the context, attended, qkv
  residual_add(t, c);  // h = x + o
  t.free(c.X);         // Y1
  t.alloc(c.X + 2 * c.S);  // ln2
  t.free(2 * c.S);
  linear_forward_nograd(t, v, rows, v.d, v.m, true);
  t.alloc(c.M / 2);
  linear_forward_nograd(t, v, rows, v.m, v.d, false);
  t.free(c.M);         // fc1's output, GELU's
  residual_add(t, c);  // out = h + fc2
  t.free(2 * c.X);     // Y2, h
}

// One block of a ViT frozen in bf16 storage (no graph): every tensor bf16, the LayerNorm
// statistics too; no casts, and the biases are added in place without temporaries.
void frozen_bf16_block(Timeline& t, const Vit& v, const Chunk& c) {
  const Heads a = heads_of(v, c);
  const int64_t rows = c.n * v.P, hd = v.d / v.h, scores = c.A / 2, X = c.X / 2, M = c.M / 2;
  const bool context_copy = v.h > 1;
  t.alloc(X + c.S);  // ln1: Y1 and its two bf16 statistics
  t.free(c.S);
  t.alloc(3 * X);  // qkv
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, v.d, 3 * v.d, false, true));
  if (a.copies) t.alloc(2 * a.rows);
  t.alloc(scores);
  const int64_t call_copies = a.onednn && !a.copies ? 2 * a.rows : 0;
  t.transient(call_copies +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, hd, v.P, false, true));
  if (a.copies) t.free(2 * a.rows);
  t.transient(kWrappedScalar + h + scores);
  t.alloc(scores);
  t.free(scores);
  t.alloc(2 * c.A);
  t.free(c.A);
  t.alloc(scores);
  t.free(c.A);
  if (a.copies) t.alloc(a.rows);
  t.alloc(a.rows);
  t.transient((a.onednn && !a.copies ? a.rows : 0) +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, v.P, hd, false, false));
  if (a.copies) t.free(a.rows);
  t.free(2 * scores);
  if (context_copy) t.alloc(a.rows);
  t.alloc(X);  // out_proj
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, v.d, v.d, false, true));
  t.free((context_copy ? a.rows : 0) + a.rows + 3 * a.rows);  // the context, attended, qkv
  t.alloc(X);      // h = x + o
  t.free(2 * X);   // o, Y1
  t.alloc(X + c.S);  // ln2
  t.free(c.S);
  t.alloc(M);  // fc1
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, v.d, v.m, false, true));
  t.alloc(M + X);  // GELU, fc2
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, v.m, v.d, false, true));
  t.free(2 * M);
  t.alloc(X);      // out = h + fc2
  t.free(3 * X);   // fc2, Y2, h
}

// One trained pre-LN block (vision_transformer.cpp:85-88) under autocast.
void block_forward(Timeline& t, const Vit& v, const Chunk& c) {
  const Heads a = heads_of(v, c);
  const int64_t rows = c.n * v.P, hd = v.d / v.h, scores = c.A / 2;
  const bool context_copy = v.h > 1;
  layer_norm_forward(t, c);  // Y1 (fp32)
  linear_forward(t, v, rows, v.d, 3 * v.d, true);
  // q k^T: matmul's copies of q and k^T (kept), the scores, the call's own copies and the
  // scratchpad.
  if (a.copies) t.alloc(2 * a.rows);
  t.alloc(scores);
  const int64_t call_copies = a.onednn && !a.copies ? 2 * a.rows : 0;
  t.transient(call_copies +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, hd, v.P, false, true));
  // `* scale`: the wrapped scalar and its bf16 copy beside the product; the unscaled scores
  // die.
  t.transient(kWrappedScalar + h + scores);
  t.alloc(scores);
  t.free(scores);
  // softmax(.., kFloat): the fp32 copy of its input, the probabilities (kept), the copy dies;
  // their bf16 copy (kept by P v).
  t.alloc(2 * c.A);
  t.free(c.A);
  t.alloc(scores);
  // P v: v's copy (kept), the output, the call's copy of v and the scratchpad; then the scaled
  // scores die at sdpa's return.
  if (a.copies) t.alloc(a.rows);
  t.alloc(a.rows);
  t.transient((a.onednn && !a.copies ? a.rows : 0) +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, v.P, hd, false, false));
  t.free(scores);
  if (context_copy) t.alloc(a.rows);  // the context (kept by out_proj)
  linear_forward(t, v, rows, v.d, v.d, false);
  // At attn's return: the attention output (unless it is the context) and qkv (unless its
  // views are kept) die.
  t.free((context_copy ? a.rows : 0) + (a.copies ? 3 * a.rows : 0));
  residual_add(t, c);  // h = x + o, kept by ln2
  t.free(c.X);         // Y1: qkv kept its bf16 copy
  layer_norm_forward(t, c);  // Y2
  linear_forward(t, v, rows, v.d, v.m, true);  // fc1
  t.alloc(c.M / 2);                            // GELU (bf16)
  linear_forward(t, v, rows, v.m, v.d, false);  // fc2
  residual_add(t, c);  // out = h + fc2
  t.free(c.X);         // Y2
}

// One block's backward from its output's fp32 gradient g (live; on return the block input's).
// `nested`: inside a checkpointed block's autograd::grad, where g stays held by the outer node
// and the block input is the checkpoint's.
void block_backward(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink, bool nested) {
  const Heads a = heads_of(v, c);
  const int64_t rows = c.n * v.P, hd = v.d / v.h, scores = c.A / 2;
  // out = h + fc2: g goes to h and, converted to bf16, to fc2 (which kept GELU's output).
  t.alloc(c.X / 2);
  linear_backward(t, v, rows, v.m, v.d, false, sink);
  // GELU: its input's gradient; then the incoming one and the kept fc1 output die.
  t.alloc(c.M / 2);
  t.free(c.M);
  linear_backward(t, v, rows, v.d, v.m, true, sink);  // fc1, to Y2's fp32 gradient
  // ln2 (frees Y2's gradient, h, the statistics); the engine adds dX and g out of place.
  layer_norm_backward(t, v, c, sink);
  t.alloc(c.X);
  t.free((nested ? 1 : 2) * c.X);
  // h = x + o: the gradient to x, and converted to bf16 to out_proj (which kept the context).
  t.alloc(c.X / 2);
  linear_backward(t, v, rows, v.d, v.d, false, sink);
  // The context's views back to the attention output: a copy when n > 1 and h > 1.
  if (a.copies) {
    t.alloc(a.rows);
    t.free(a.rows);
  }
  // P v's backward: v's gradient (P^T dO), then P's (dO v^T); then the incoming gradient, the
  // kept bf16 probabilities and v's copy die.
  const bool o_strided = !a.copies && v.h > 1;
  t.alloc(a.rows);
  t.transient((a.onednn && o_strided ? a.rows : 0) +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, v.P, hd, true, false));
  t.alloc(scores);
  t.transient((a.onednn ? (o_strided ? a.rows : 0) + (a.copies ? 0 : a.rows) : 0) +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, hd, v.P, false, true));
  t.free(a.rows + scores + (a.copies ? a.rows : 0));
  // The probabilities' ToCopyBackward0 (to fp32), SoftmaxBackward0, the softmax input's
  // ToCopyBackward0 (to bf16); the kept fp32 probabilities die.
  t.alloc(c.A);
  t.free(scores);
  t.alloc(c.A);
  t.free(2 * c.A);
  t.alloc(scores);
  t.free(c.A);
  // `* scale`.
  t.transient(kWrappedScalar + h + scores);
  // q k^T's backward: k^T's gradient (q^T dS), then q's (dS k); then dS and the copies of q and
  // k^T (or qkv, which the views kept) die.
  t.alloc(a.rows);
  t.transient((a.onednn && !a.copies ? a.rows : 0) + bf16_matmul_scratch(v.onednn_bf16, v.threads,
                                                                         a.batch, hd, v.P, v.P,
                                                                         a.copies, false));
  t.alloc(a.rows);
  t.transient((a.onednn && !a.copies ? a.rows : 0) +
              bf16_matmul_scratch(v.onednn_bf16, v.threads, a.batch, v.P, v.P, hd, false, false));
  t.free(scores + (a.copies ? 2 * a.rows : 3 * a.rows));
  // The head views' backward: two of the three gradients are copied back to [n, P, d] when
  // h > 1; SplitBackward0 concatenates the three into qkv's bf16 gradient.
  qkv_split_backward(t, v.h > 1 ? 2 : 0, a.rows);
  linear_backward(t, v, rows, v.d, 3 * v.d, true, sink);  // qkv, to Y1's fp32 gradient
  // ln1 (frees Y1's gradient, the block input unless the checkpoint keeps it, the
  // statistics); dX and the residual's gradient summed out of place.
  layer_norm_backward(t, v, c, sink, /*frees_input=*/!nested);
  t.alloc(c.X);
  t.free(2 * c.X);
}

// The projector (mm without bias) on the fp32 features (live, freed here with the encode
// lambda): the shuffle's copy (fp32), the weight's bf16 copy (kept for the features' gradient
// when the ViT is trained), the input's (kept for the weight's gradient when the projector
// is), the bf16 output (live on return) and the scratchpad.
void project(Timeline& t, const Vit& v, const Chunk& c) {
  const int64_t weight = h * v.Dp * v.D, images = h * c.n * v.I * v.D;
  if (v.shuffle_copies) t.alloc(c.X);
  t.alloc(weight + c.X / 2 + images);
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, c.n * v.I, v.Dp, v.D, false, true));
  t.free((v.vision_trained ? 0 : weight) + (v.projector_trained ? 0 : c.X / 2));
  t.free(c.X + (v.shuffle_copies ? c.X : 0));
}

// The patch embedding under autocast: the patches (fp32, a contiguous copy), the kernel's copy,
// the patches' (kept by a trained ViT), the bf16 output and the scratchpad; the kernel's copy
// dies at once (the patches need no gradient), and without a graph the patches' copy with it,
// before the bias is added in place (as every product's copies in a frozen block); `+
// positions` converts the output to fp32 beside the sum. At the statement's end the bf16
// output and the fp32 patches die. (On a CPU with oneDNN's bf16 kernels the scratchpad's
// moment hid the frozen ViT's bias-add moment; an AVX2-only CPU, with no scratchpad, showed
// it.)
void patch_embedding(Timeline& t, const Vit& v, const Chunk& c) {
  const int64_t rows = c.n * v.P, patches = e * rows * v.patch_values;
  const int64_t kernel = h * v.d * v.patch_values;
  t.alloc(patches + kernel + patches / 2 + c.X / 2);
  t.transient(
      bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, v.patch_values, v.d, false, true));
  t.free(kernel + (v.vision_trained ? 0 : patches / 2));
  t.transient(2 * c.X);
  t.alloc(2 * c.X);
  t.free(c.X + c.X / 2 + patches);
}

// The patch embedding's backward under autocast, from the first block's input gradient g (fp32,
// live). x0 = (linear + bias) + positions: g goes, converted to bf16, to the linear's output, and
// summed over the crops to the positions (with one crop it is g itself); then g dies unless
// the positions' gradient is g.
void patch_embedding_backward(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink) {
  const int64_t rows = c.n * v.P;
  const int64_t positions = e * v.P * v.d;
  t.alloc(c.X / 2);
  if (c.n > 1) {
    t.alloc(positions);
    accumulate(t, positions, sink);
    t.free(c.X);
  } else if (sink.sink != Sink::kKeep) {
    // g itself reaches the positions: added into the .grad in place, or into the engine's
    // buffer out of place (chunks); the last chunk's buffer is then added into the .grad.
    if (sink.chunked) t.transient(positions);
    if (sink.sink == Sink::kRelease) t.free(positions);
    t.free(c.X);
  }
  // The bias's gradient (bf16, then fp32), the kernel's (the patches need none); then the
  // incoming gradient and the kept patches die; the kernel's gradient to fp32.
  t.alloc(h * v.d + e * v.d);
  t.free(h * v.d);
  accumulate(t, e * v.d, sink);
  const int64_t kernel = h * v.d * v.patch_values;
  t.alloc(kernel);
  t.transient(
      bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, v.d, rows, v.patch_values, true, false));
  t.free(c.X / 2 + h * rows * v.patch_values);
  t.alloc(2 * kernel);
  t.free(kernel);
  accumulate(t, 2 * kernel, sink);
}

// The projector's backward under autocast: the weight's gradient (a trained projector), the
// features' (a trained ViT); then the incoming gradient and the kept copies die; the
// ToCopyBackward0 of the input, then of the weight.
void project_backward(Timeline& t, const Vit& v, const Chunk& c, int64_t image_gradient, bool last,
                      const Sinks& sink) {
  const int64_t weight = h * v.Dp * v.D;
  if (v.projector_trained) {
    t.alloc(weight);
    t.transient(
        bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, v.D, c.n * v.I, v.Dp, true, false));
  }
  if (v.vision_trained) {
    t.alloc(c.X / 2);
    t.transient(
        bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, c.n * v.I, v.D, v.Dp, false, false));
  }
  t.free((last ? image_gradient : 0) + (v.projector_trained ? c.X / 2 : 0) +
         (v.vision_trained ? weight : 0));
  if (v.vision_trained) {
    t.alloc(c.X);
    t.free(c.X / 2);
  }
  if (v.projector_trained) {
    t.alloc(2 * weight);
    t.free(weight);
    accumulate(t, 2 * weight, sink);
  }
}

}  // namespace

void frozen_bf16_vit_forward(Timeline& t, const Vit& v, const Chunk& c) {
  const int64_t rows = c.n * v.P, patches = h * rows * v.patch_values, X = c.X / 2;
  t.alloc(patches);  // the chunk converted to bf16 (3 S^2 = P 3 p^2 values per crop)
  // Patch embedding: the patches (a contiguous copy), the product and its scratchpad, the
  // bias in place, `+ positions`; the product and the patches die.
  t.alloc(patches + X);
  t.transient(
      bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, rows, v.patch_values, v.d, false, true));
  t.alloc(X);
  t.free(X + patches);
  t.repeat(v.Lv, [&](Timeline& block) {
    frozen_bf16_block(block, v, c);
    block.free(X);  // its input
  });
  t.alloc(X + c.S);  // the final LayerNorm
  t.free(c.S + X);   // its statistics, the last block's output
  t.free(patches);   // the converted chunk, when the ViT returns
}

void project_bf16_storage(Timeline& t, const Vit& v, const Chunk& c, bool features_fp32) {
  const int64_t copies = (features_fp32 ? c.X / 2 : 0) + (v.shuffle_copies ? c.X / 2 : 0);
  t.alloc(copies);                       // .to(bf16), the shuffle's reshape
  t.alloc(h * c.n * v.I * v.D);          // the output
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, c.n * v.I, v.Dp, v.D, false, true));
  t.free(copies);
}

void project_backward_bf16_storage(Timeline& t, const Vit& v, const Chunk& c,
                                   int64_t image_gradient, bool last) {
  // The product's backward: the input's gradient alone (a frozen weight), then the incoming
  // gradient dies with the last chunk; the shuffle's reshape copies the permuted gradient; the
  // features' ToCopyBackward0 converts it to fp32.
  t.alloc(c.X / 2);
  t.transient(bf16_matmul_scratch(v.onednn_bf16, v.threads, 0, c.n * v.I, v.D, v.Dp, false, false));
  if (last) t.free(image_gradient);
  if (v.shuffle_copies) {
    t.alloc(c.X / 2);
    t.free(c.X / 2);
  }
  t.alloc(c.X);
  t.free(c.X / 2);
}

const VitKernels& vit_kernels_bf16() {
  static const VitKernels k{block_forward,   block_forward_nograd,     block_backward,
                            patch_embedding, patch_embedding_backward, project,
                            project_backward};
  return k;
}

}  // namespace vlm::memory::replay
