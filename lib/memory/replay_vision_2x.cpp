// The ViT's fp32 blocks as LibTorch 2.x runs them on the CPU (memory/replay.h); what differs
// from 1.13 (docs/memory-cpu-2x.md, B and D):
// - attention: scaled_dot_product_attention runs the flash CPU kernel on views of qkv: its
//   output (already laid out as the context, so no copy) and a log-sum-exp per head and patch
//   are kept with qkv, instead of the copies of q, k, v and the probabilities; its backward
//   makes dq, dk, dv (zeros) beside its buffers;
// - linears are at::linear = addmm: the backward makes the input's, the weight's and the
//   bias's gradients together, then the bias's and the weight's AccumulateGrad run.
#include "memory/replay.h"
#include "memory/saved_activations.h"

namespace vlm::memory::replay {
namespace {

int64_t log_sum_exp(const Vit& v, const Chunk& c) { return e * c.n * v.h * v.P; }

int64_t flash_forward(const Vit& v) {
  return flash_forward_buffer(v.threads, v.P, v.d / v.h, false);
}

// AddmmBackward0 of a linear from `in` to `out` features: the input's gradient (`grad_in`
// bytes, 0 when the input needs none), the weight's and the bias's; then the output's gradient
// (`grad_out`) when this was its last user, and the kept input; the bias's and the weight's
// gradients reach their parameters (both views: summed out of place by the second chunk).
void linear_backward(Timeline& t, int64_t grad_in, int64_t in, int64_t out, int64_t grad_out,
                     bool frees_grad, int64_t kept_input, const Sinks& sink) {
  t.alloc(grad_in + e * in * out + e * out);
  if (frees_grad) t.free(grad_out);
  t.free(kept_input);
  accumulate(t, e * out, sink);
  accumulate(t, e * in * out, sink);
}

}  // namespace

// One pre-LN block with a graph (vision_transformer.cpp): LN1 (kept by qkv), qkv (its views
// kept by the attention), the attention's output (the context, kept by it and out_proj) and
// log-sum-exp, out_proj, the residual (kept by LN2), LN2, fc1 and GELU (kept), fc2, the output.
void vit_block_forward_2x(Timeline& t, const Vit& v, const Chunk& c) {
  layer_norm_forward(t, c);
  t.alloc(3 * c.X);
  t.alloc(c.X + log_sum_exp(v, c));
  t.transient(flash_forward(v));
  t.alloc(c.X);  // out_proj
  t.alloc(c.X);  // h = x + o
  t.free(c.X);   // o
  layer_norm_forward(t, c);
  t.alloc(2 * c.M + c.X);  // fc1, GELU, fc2
  t.alloc(c.X);            // out = h + fc2
  t.free(c.X);             // fc2
}

// The same without a graph (a checkpointed block's forward, a frozen ViT): the statistics die
// with each LayerNorm, the log-sum-exp when the attention returns, its output and qkv when
// attn returns, the rest with their statements; the output stays.
void vit_block_forward_nograd_2x(Timeline& t, const Vit& v, const Chunk& c) {
  t.alloc(c.X + 2 * c.S);
  t.free(2 * c.S);
  t.alloc(3 * c.X + c.X + log_sum_exp(v, c));
  t.transient(flash_forward(v));
  t.free(log_sum_exp(v, c));
  t.alloc(c.X);            // out_proj
  t.free(c.X + 3 * c.X);   // the attention's output, qkv
  t.alloc(c.X);            // h = x + o
  t.free(2 * c.X);         // o, Y1
  t.alloc(c.X + 2 * c.S);  // LN2
  t.free(2 * c.S);
  t.alloc(2 * c.M + c.X);  // fc1, GELU, fc2
  t.free(2 * c.M);
  t.alloc(c.X);     // out = h + fc2
  t.free(3 * c.X);  // fc2, Y2, h
}

// One block's backward from its output's gradient g (X, live: the residual's buffer, which on
// return holds the block input's gradient). `nested`: inside a checkpointed block's
// autograd::grad, where the outer node holds g (LN2's gradient joins it as a new sum) and the
// block input is the checkpoint's.
void vit_block_backward_2x(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink,
                           bool nested) {
  linear_backward(t, c.M, v.m, v.d, c.X, false, c.M, sink);  // fc2; GELU's output dies
  t.alloc(c.M);                                              // GELU
  t.free(2 * c.M);
  linear_backward(t, c.X, v.d, v.m, c.M, true, c.X, sink);  // fc1; Y2 dies
  layer_norm_backward(t, v, c, sink);                       // LN2; h dies
  // dX joins g: in place, or (nested) as a new sum beside the held g, which it replaces.
  if (nested) {
    t.transient(c.X);
  } else {
    t.free(c.X);
  }
  // out_proj: the attention output's gradient; the output itself stays (the attention's).
  linear_backward(t, c.X, v.d, v.d, c.X, false, 0, sink);
  // The flash backward: dq, dk, dv and its buffers; then the incoming gradient, qkv, the
  // log-sum-exp and the output die; SplitBackward0 joins dq, dk, dv (3X).
  t.alloc(3 * c.X);
  t.transient(flash_backward_buffer(v.threads, c.n, v.h, v.P, false));
  t.free(c.X + 3 * c.X + log_sum_exp(v, c) + c.X);
  qkv_split_backward(t, 0, c.X);
  linear_backward(t, c.X, v.d, 3 * v.d, 3 * c.X, true, c.X, sink);  // qkv; Y1 dies
  layer_norm_backward(t, v, c, sink, /*frees_input=*/!nested);      // LN1
  t.free(c.X);  // dX, added into the input's gradient in place
}

}  // namespace vlm::memory::replay
