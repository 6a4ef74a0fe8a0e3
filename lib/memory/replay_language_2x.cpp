// The decoder's fp32 forward and backward as LibTorch 2.x runs them on the CPU (memory/replay.h),
// allocation by allocation; docs/memory-cpu-2x.md lists every difference from 1.13 with its
// measurement. What changes the walk:
// - attention: scaled_dot_product_attention runs the flash CPU kernel, so the packed causal
//   attention is the grouped path (model/packed_attention.cpp grouped_attention): per group of
//   segments (spec/attention_groups.h) gathers of q, k, v padded to the group's longest, one
//   fused call keeping its output and log-sum-exp, the rows kept, one inverse gather;
// - GQA repeats keys and values by expand + clone (no index);
// - RMSNorm's x^2 dies in the forward (MeanBackward1 keeps only its input's sizes);
// - autograd's engine adds a second gradient into its input buffer in place when the buffered
//   tensor is owned alone (torch/csrc/autograd/input_buffer.cpp); a view (matmul's folded input
//   gradient) or a tensor an outer node still holds is summed out of place, as 1.13 always did.
#include "memory/replay.h"
#include "memory/saved_activations.h"

namespace vlm::memory::replay {
namespace {

// The queries of the projection (language_model.cpp project_qkv), keys, values, then the
// attention up to its context (kept by out_proj): multi_head_attention repeats k and v to the
// query heads (expand + clone), segment_attention's token-major views (copies of the repeats
// when B > 1), then grouped_attention, group by group (longest first): the gather index and the
// gathers (kept by IndexSelectBackward0 and the fused call), the fused output and log-sum-exp
// (kept), its buffer, the keep index (kept) and the group's rows; then the rows joined (cat,
// from 2 groups) and the inverse index (kept) and gather: the context. The join, the rows, the
// copies and the repeats die as the calls return. `graph`: a graph is built (else the gathers,
// log-sum-exp, output and indices die within each group, and only the context is left).
void attention_forward(Timeline& t, const Lm& x, bool graph) {
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv;
  const bool gqa = x.Hkv < x.Hq;
  t.alloc(kv);  // v = v_proj(y1)
  const int64_t copies = gqa ? (x.B > 1 ? 4 : 2) * hidden : 0;
  t.alloc(copies);
  for (const AttentionGroup& g : x.groups) {
    const int64_t padded = g.n * g.L, rows = e * padded * x.D, lse = e * g.n * x.Hq * g.L;
    t.alloc(8 * padded + 3 * rows + rows + lse);
    t.transient(flash_forward_buffer(x.threads, g.L, x.hd, false));
    if (!graph) t.free(lse + 3 * rows);  // log-sum-exp at the call's return, the gathers
    t.alloc(8 * g.S + e * g.S * x.D);
    if (!graph) t.free(8 * g.S + rows + 8 * padded);  // keep index, output, gather index
  }
  const int64_t join = x.groups.size() > 1 ? hidden : 0;
  t.alloc(join + 8 * x.N + hidden);
  if (!graph) t.free(8 * x.N);
  t.free(join + hidden + copies);
}

// The attention's backward from the context's gradient dC (4ND, live; freed) to the gradients
// of q (4ND), k and v (4N Dkv; a repeated one summed back by ExpandBackward0), each live on
// return as its buffer. The inverse gather's gradient (new_zeros), then per group, last first:
// the keep gather's (freeing the join's gradient at the last group), the fused backward (dq,
// dk, dv zeros and its buffers; then its saved tensors die), the three gathers' gradients, into
// q's, k's and v's buffers (the first group processed makes them; later ones add in place).
void attention_backward(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv;
  t.alloc(hidden);
  t.free(hidden + 8 * x.N);
  for (size_t k = x.groups.size(); k-- > 0;) {
    const AttentionGroup& g = x.groups[k];
    const bool first_processed = k + 1 == x.groups.size();
    const int64_t padded = g.n * g.L, rows = e * padded * x.D, lse = e * g.n * x.Hq * g.L;
    t.alloc(rows);
    t.free((k == 0 ? hidden : 0) + 8 * g.S);
    t.alloc(3 * rows);
    t.transient(flash_backward_buffer(x.threads, g.n, x.Hq, g.L, false));
    t.free(rows + 3 * rows + lse + rows);  // grad_out, q, k, v gathers, log-sum-exp, output
    for (int i = 0; i < 3; ++i) {
      t.alloc(hidden);
      t.free(rows);
      if (!first_processed) t.free(hidden);
    }
    t.free(8 * padded);
  }
  if (x.Hkv < x.Hq) {  // ExpandBackward0: v's, then k's
    t.alloc(kv);
    t.free(hidden);
    t.alloc(kv);
    t.free(hidden);
  }
}

// q and k after RoPE, v, the attention and out_proj (language_model.cpp GQA forward), a graph
// built: on return the attention's kept tensors and the context are live, q, k and v died.
void attention_block_forward(Timeline& t, const Lm& x, bool graph) {
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv;
  rotary_projections(t, x);
  attention_forward(t, x, graph);
  t.alloc(hidden);             // out_proj
  t.free(hidden + 2 * kv);     // q, k, v at attn's return
  if (!graph) t.free(hidden);  // the context (kept by out_proj only with a graph)
}

}  // namespace

// One decoder block with a graph (language_model.cpp:105-110): trained, or frozen with a
// gradient flowing through it (its linears keep no input, its norms no n).
void block_forward_2x(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, mlp = e * x.N * x.F;
  rms_norm_forward_2x(t, x);
  attention_block_forward(t, x, /*graph=*/true);
  if (x.frozen) t.free(hidden);  // the context: kept by a trained out_proj only
  t.alloc(hidden);               // h = x + o, kept by norm2
  t.free(hidden);                // o
  if (x.frozen) t.free(hidden);  // y1, kept by trained projections only
  rms_norm_forward_2x(t, x);
  t.alloc(4 * mlp);              // up, gate, silu, product (:95, right to left)
  t.alloc(hidden);               // down
  if (x.frozen) t.free(mlp);     // the product: kept by a trained down_proj only
  t.alloc(hidden);               // out = h + down, kept by the next norm
  t.free(hidden);                // down
  if (x.frozen) t.free(hidden);  // y2
}

// One block without a graph (a checkpointed block's forward).
void block_forward_nograd_2x(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, mlp = e * x.N * x.F;
  rms_norm_forward_nograd(t, x);
  attention_block_forward(t, x, false);
  t.alloc(hidden);     // h = x + o
  t.free(2 * hidden);  // o, y1
  rms_norm_forward_nograd(t, x);
  t.alloc(4 * mlp + hidden);  // up, gate, silu, product, down
  t.free(4 * mlp);
  t.alloc(hidden);     // out = h + down
  t.free(3 * hidden);  // down, y2, h
}

namespace {

// RoPE's backward on a gradient of `width` (live; freed): grad * c (the input's buffer, with
// block 0's q freeing the cos table it kept), grad * s (then sin), rotate_half's NegBackward0
// and SplitBackward0 (a cat, added in place into the buffer).
void rotary_backward(Timeline& t, const Lm& x, int64_t width, bool frees_tables) {
  const int64_t table = e * x.N * x.hd;
  t.alloc(width);
  if (frees_tables) t.free(table);
  t.alloc(width);
  t.free(width);  // the incoming gradient
  if (frees_tables) t.free(table);
  t.alloc(width / 2 + width);
  t.free(width + width / 2 + width);
}

}  // namespace

// One block's backward from its output's gradient G (4ND, live: the residual's buffer, kept
// live: on return it holds the block input's gradient). `nested`: inside a checkpointed
// block's autograd::grad, where the outer node holds G and the parameter gradients are
// captured (kept) until it returns.
void block_backward_2x(Timeline& t, const Lm& x, bool first_step, bool first_block, bool nested) {
  const bool keep = first_step || nested;
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv, mlp = e * x.N * x.F;
  const bool gqa = x.Hkv < x.Hq;
  const int64_t w = x.frozen ? 0 : e, kept_input = x.frozen ? 0 : 1;
  swiglu_backward(t, x, keep);
  // gate's, then up's MmBackward0; y2's second gradient is summed out of place (the first is
  // a view), before up's weight gradient reaches its AccumulateGrad.
  t.alloc(w * x.D * x.F + hidden);
  t.free(mlp);
  accumulate_grad(t, w * x.D * x.F, keep);
  t.alloc(w * x.D * x.F + hidden);
  t.free(mlp + kept_input * hidden);
  t.alloc(hidden);
  t.free(2 * hidden);
  accumulate_grad(t, w * x.D * x.F, keep);
  rms_norm_backward_2x(t, x, keep, /*residual=*/true, /*held=*/nested, /*keeps_input=*/false);
  // out_proj's MmBackward0: W_o's gradient and the context's; the kept context dies.
  t.alloc(w * x.D * x.D + hidden);
  t.free(kept_input * hidden);
  accumulate_grad(t, w * x.D * x.D, keep);
  attention_backward(t, x);
  const int64_t v_grad = gqa ? kv : hidden;  // v's and k's buffers: summed back, or q-wide
  // v: the head view's backward copies a gradient laid out [B, Hkv, T, hd] (GQA's sum; the
  // gathers' buffers are token-major already); v_proj: y1's first gradient (a view: kept).
  if (gqa) {
    t.alloc(kv);
    t.free(kv);
  }
  t.alloc(w * x.D * x.Dkv + hidden);
  t.free(v_grad);
  accumulate_grad(t, w * x.D * x.Dkv, keep);
  // k: RoPE, the view copy, k_proj; y1's two gradients summed out of place.
  rotary_backward(t, x, kv, false);
  if (gqa) {
    t.alloc(kv);
    t.free(kv);
  }
  t.alloc(w * x.D * x.Dkv + hidden);
  t.free(kv);
  t.alloc(hidden);
  t.free(2 * hidden);
  accumulate_grad(t, w * x.D * x.Dkv, keep);
  // q: RoPE (block 0 frees the tables), q_proj; y1 dies with its last user, its third
  // gradient is added in place.
  rotary_backward(t, x, hidden, first_block);
  t.alloc(w * x.D * x.D + hidden);
  t.free(hidden + kept_input * hidden);
  t.free(hidden);
  accumulate_grad(t, w * x.D * x.D, keep);
  rms_norm_backward_2x(t, x, keep, /*residual=*/true, /*held=*/false, /*keeps_input=*/nested);
}

}  // namespace vlm::memory::replay
