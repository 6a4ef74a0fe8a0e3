// The decoder's fp32 kernels (memory/replay.h, DecoderKernels): LibTorch 1.13's blocks
// (trained, frozen, without a graph, and their backward) and the final norm and loss as each
// version runs them in fp32 (2.x's blocks are in replay_language_2x.cpp, RMSNorm in
// replay_rms_norm.cpp, the loss in replay_loss.cpp; the walk that runs them in
// replay_language.cpp).
#include "memory/replay.h"

#include "memory/saved_activations.h"

namespace vlm::memory::replay {

// q = apply_rotary(q_proj(y1)), then k at the KV width (language_model.cpp:80-81, :53-58;
// GCC evaluates `x * c + rotate_half(x) * s` right to left): the projection, rotate_half's
// negated half (dying with its statement) and cat, rot * s, x * c and the sum are alive
// together; only the sum stays, whether or not a graph is built (the muls keep only the
// cos/sin views, and nobody keeps the projection output).
void rotary_projections(Timeline& t, const Lm& x) {
  for (const int64_t width : {e * x.N * x.D, e * x.N * x.Dkv}) {
    t.alloc(width + width / 2 + width);
    t.free(width / 2);
    t.alloc(3 * width);
    t.free(3 * width);
    t.free(width);
  }
}

namespace {

// v, then the packed attention with a graph (q, k and v require a gradient), up to the
// concatenated output: the same whether the block's weights are trained or frozen.
void attention_forward(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv;
  const bool gqa = x.Hkv < x.Hq;
  t.alloc(kv);  // v = v_proj(y1) (:82), a view of the projection
  if (gqa) {
    // repeat_interleave (packed_attention.cpp:93-94) = index_select with an Hq-long int64
    // index (kept) into contiguous [B, Hq, T, hd] keys and values; flat() (:66-69) then
    // clones them, unless B == 1 where the reshape is a view.
    t.alloc(2 * (hidden + 8 * x.Hq));
    if (x.B > 1) t.alloc(2 * hidden);
  }
  // Per segment (packed_attention.cpp:74-82, compat.h:139-145), the top is at matmul(P, v):
  // the causal mask (L^2, bool), its logical_not (kept by masked_fill), the masked scores S2
  // and the probabilities P (4 Hq L^2 each) and the output. P, the mask and the output stay.
  for_each_segment(t, x.segments, [&](Timeline& s, int64_t L) {
    const int64_t out = e * x.Hq * L * x.hd;
    s.transient(2 * L * L + 8 * x.Hq * L * L + out);
    s.alloc(e * x.Hq * L * L + L * L + out);
  });
  t.alloc(hidden);                         // torch::cat(outputs) (:83)
  t.free(hidden);                          // the outputs, at segment_attention's return
  if (gqa && x.B > 1) t.free(2 * hidden);  // keys, values at multi_head_attention's return
}

// One decoder block, fp32, trainable (language_model.cpp:105-110).
void block_forward(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv;
  const bool gqa = x.Hkv < x.Hq;
  rms_norm_forward(t, x);  // norm1: sq1, r1, n1, y1 (y1 kept by q/k/v projections)
  rotary_projections(t, x);
  attention_forward(t, x);
  t.alloc(hidden);  // ctx = transpose().contiguous() (language_model.cpp:85), kept by out_proj
  t.alloc(hidden);  // o = out_proj(ctx)
  t.free(hidden);   // attended (the cat) at attn's return
  if (gqa) t.free(2 * kv);  // k and v (not kept: the index_select keeps its index only)
  t.alloc(hidden);          // h = x + o (:108), kept by norm2
  t.free(hidden);           // o
  rms_norm_forward(t, x);   // norm2
  const int64_t mlp = e * x.N * x.F;
  t.alloc(4 * mlp);  // gate, silu, up, product (language_model.cpp:95), all kept
  t.alloc(hidden);   // down
  t.alloc(hidden);   // out = h + down (:109), kept by the next norm
  t.free(hidden);    // down
}

// One decoder block with frozen weights, a gradient flowing through it to a trained image
// path: the linears keep only their weights, so their inputs (y1, the context, y2, the
// product) die with their statements; the rest is kept as when trained.
void block_forward_frozen(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv, mlp = e * x.N * x.F;
  const bool gqa = x.Hkv < x.Hq;
  rms_norm_forward_frozen(t, x);  // y1, a temporary of the statement
  rotary_projections(t, x);
  attention_forward(t, x);
  t.alloc(2 * hidden);            // the context, out_proj
  t.free(2 * hidden);             // the context (kept by nobody), attended
  if (gqa) t.free(2 * kv);        // k and v
  t.alloc(hidden);                // h = x + o, kept by norm2
  t.free(2 * hidden);             // o, y1
  rms_norm_forward_frozen(t, x);  // y2
  t.alloc(4 * mlp + hidden);      // up, gate, silu (kept), the product, down
  t.free(mlp);                    // the product
  t.alloc(hidden);                // out = h + down, kept by the next norm
  t.free(2 * hidden);             // down, y2
}

// One decoder block's forward without a graph (CheckpointFunction::forward runs it under
// NoGradGuard): every intermediate dies with its statement or scope; the output stays.
void block_forward_nograd(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv, mlp = e * x.N * x.F;
  const bool gqa = x.Hkv < x.Hq;
  rms_norm_forward_nograd(t, x);  // y1, a temporary of the statement (language_model.cpp:108)
  rotary_projections(t, x);
  t.alloc(kv);  // v = v_proj(y1)
  if (gqa) {
    t.alloc(2 * (hidden + 8 * x.Hq));  // repeat_interleave's keys and values (and indices)
    t.free(2 * 8 * x.Hq);
    if (x.B > 1) t.alloc(2 * hidden);  // flat() copies them
  }
  for_each_segment(t, x.segments, [&](Timeline& s, int64_t L) {
    const int64_t scores = e * x.Hq * L * L, out = e * x.Hq * L * x.hd;
    s.alloc(L * L);  // the causal mask (ones, then tril; the ones die)
    s.alloc(L * L);
    s.free(L * L);
    s.alloc(scores + kWrappedScalar + scores);  // q k^T, the wrapped scale, * scale
    s.free(kWrappedScalar + scores);
    s.alloc(L * L + scores);  // logical_not, masked_fill; the scaled scores and the not die
    s.free(scores + L * L);
    s.alloc(scores + out);       // softmax, P v
    s.free(2 * scores + L * L);  // probabilities, masked scores, the mask
  });
  t.alloc(hidden);                                           // torch::cat(outputs)
  t.free(hidden);                                            // the outputs
  if (gqa) t.free((x.B > 1 ? 2 * hidden : 0) + 2 * hidden);  // copies, keys, values
  t.alloc(2 * hidden);                                       // the context, out_proj
  t.free(hidden + hidden + hidden + 2 * kv);                 // the context, attended, q, k, v
  t.alloc(hidden);                                           // h = x + o
  t.free(2 * hidden);                                        // o, y1
  rms_norm_forward_nograd(t, x);                             // y2
  t.alloc(4 * mlp + hidden);  // up, gate, silu, product, down (:95, right to left)
  t.free(4 * mlp);
  t.alloc(hidden);     // out = h + down
  t.free(3 * hidden);  // down, y2, h
}

}  // namespace

// down's MmBackward0 (the product's gradient, 4NF, and W_down's; the kept product is
// released), MulBackward0 (silu * up: both factors' gradients; then its input gradient and the
// kept silu output and up projection die), SiluBackward0 (one 4NF; then silu's gradient and
// the kept gate projection die): the same in 1.13 and 2.x. On return the gate projection's
// gradient (4NF) is live.
void swiglu_backward(Timeline& t, const Lm& x, bool keep) {
  const int64_t mlp = e * x.N * x.F;
  const int64_t w = x.frozen ? 0 : e, kept_input = x.frozen ? 0 : 1;
  t.alloc(mlp + w * x.D * x.F);
  t.free(kept_input * mlp);
  accumulate_grad(t, w * x.D * x.F, keep);
  t.alloc(2 * mlp);
  t.free(3 * mlp);
  t.alloc(mlp);
  t.free(2 * mlp);
}

namespace {

// One decoder block's backward (language_model.cpp:105-110), from its output's gradient g
// (4ND, live), nodes in the engine's order (highest sequence_nr first), each freeing what it
// saved once it has run and its input gradients once consumed.
void block_backward(Timeline& t, const Lm& x, bool first_step, bool first_block, bool nested) {
  const bool keep = first_step || nested;  // nested: autograd::grad captures the gradients
  const int64_t hidden = e * x.N * x.D, kv = e * x.N * x.Dkv, mlp = e * x.N * x.F;
  const bool gqa = x.Hkv < x.Hq;
  // A frozen decoder computes no weight gradient and kept no linear input (y1, the context,
  // y2, the product): the weights' bytes and those releases are 0.
  const int64_t w = x.frozen ? 0 : e, kept_input = x.frozen ? 0 : 1;
  // MLP (:95). AddBackward0 (out = h + down) hands g to both h and down, allocating nothing.
  swiglu_backward(t, x, keep);
  // up's and gate's MmBackward0: y2's gradient (4ND) and the weight's; then their input
  // gradients; after the second, y2 is released and the two y2 gradients are summed in place.
  for (int k = 0; k < 2; ++k) {
    t.alloc(hidden + w * x.D * x.F);
    t.free(mlp);
    accumulate_grad(t, w * x.D * x.F, keep);
  }
  t.free(kept_input * hidden + hidden);
  // norm2 (:109), into h's gradient buffer (g, which h's add passed on).
  rms_norm_backward(t, x, first_step || nested, /*residual=*/true, /*checkpoint_input=*/false,
                    /*holds_incoming=*/nested);
  // AddBackward0 (h = x + o) passes g on. out_proj's MmBackward0: the context's gradient dC
  // (4ND) and W_o's; the kept context is released.
  t.alloc(hidden + w * x.D * x.D);
  t.free(kept_input * hidden);
  accumulate_grad(t, w * x.D * x.D, keep);
  // The views back to the cat (packed_attention.cpp:83) are free: each segment's output
  // gradient is a narrow view of dC, which lives until the first segment's P @ V backward.
  // Segments run last first. Per segment: P @ V's BmmBackward0 (dP, dV_i), SoftmaxBackward0,
  // MaskedFillBackward0, the scale's MulBackward1 (a wrapped scalar and 4 B), Q K^T's
  // BmmBackward0 (dQ_i, dK_i), then three SliceBackward0: zeros [Hq, N, hd] each, kept as the
  // flat q/k/v gradient by the first segment; for later ones the engine's InputBuffer
  // allocates old + new (measured: not in place) and frees both.
  const int64_t k_storage = gqa ? hidden : kv;  // what the kept k/v views keep alive
  for_each_segment_reversed(t, x.segments,
                            [&](Timeline& s, int64_t L, bool first_processed, bool last_processed) {
                              const int64_t scores = e * x.Hq * L * L, rows = e * x.Hq * L * x.hd;
                              s.alloc(scores + rows);                          // dP, dV_i
                              if (last_processed) s.free(k_storage + hidden);  // v's storage; dC
                              s.alloc(scores);                                 // dS
                              s.free(2 * scores);                              // dP, P
                              s.alloc(scores);         // masked_fill's gradient
                              s.free(scores + L * L);  // dS, the mask
                              s.transient(12);         // the wrapped scale
                              s.alloc(scores);         // * scale
                              s.free(scores);          //
                              s.alloc(2 * rows);       // dQ_i, dK_i
                              s.free(scores);          // its input gradient
                              if (last_processed)
                                s.free(hidden + k_storage);  // q's and k's storages
                              for (int k = 0; k < 3; ++k) {
                                s.alloc(hidden);
                                s.free(rows);
                                if (!first_processed) {
                                  // The engine's InputBuffer adds it out of place (old + new) and
                                  // frees both.
                                  s.alloc(hidden);
                                  s.free(2 * hidden);
                                }
                              }
                            });
  // v (created last): GQA's IndexSelectBackward0 for v then k (zeros [B, Hkv, T, hd] +
  // index_add; the flat gradient and the kept index are freed); the head view's backward copies
  // the gradient (a reshape of a transposed tensor); v_proj's MmBackward0: y1's gradient and
  // W_v's (the first y1 gradient: kept in y1's buffer).
  if (gqa) {
    t.alloc(kv);
    t.free(hidden + 8 * x.Hq);
    t.alloc(kv);
    t.free(hidden + 8 * x.Hq);
  }
  t.alloc(kv);  // view copy
  t.free(kv);   // v's gradient (flat at g == 1, index_select's at g > 1)
  t.alloc(hidden + w * x.D * x.Dkv);
  t.free(kv);
  accumulate_grad(t, w * x.D * x.Dkv, keep);
  // k then q: RoPE's backward (:57): grad * s, grad * c, then the incoming gradient is freed;
  // rotate_half's NegBackward0 (half width) and SplitBackward0 (a cat, full width); then
  // those are freed but the sum; the view copy; the projection's MmBackward0; y1's gradients
  // summed in place. Block 0's q muls are the last to keep RoPE's cos and sin (4N hd each).
  for (const bool q : {false, true}) {
    const int64_t width = q ? hidden : kv, weight = w * x.D * (q ? x.D : x.Dkv);
    const bool frees_tables = q && first_block;
    t.alloc(width);                            // grad * s
    if (frees_tables) t.free(e * x.N * x.hd);  // sin
    t.alloc(width);                            // grad * c
    if (frees_tables) t.free(e * x.N * x.hd);  // cos
    t.free(width);  // the flat q gradient, or k's (flat at g == 1, index_select's at g > 1)
    t.alloc(width / 2);
    t.alloc(width);
    t.free(width + width / 2 + width);
    t.alloc(width);  // view copy
    t.free(width);
    t.alloc(hidden + weight);
    t.free(width);
    if (q) t.free(kept_input * hidden);  // y1, released by its last user (q_proj)
    t.free(hidden);                      // y1's gradient, summed in place
    accumulate_grad(t, weight, keep);
  }
  rms_norm_backward(t, x, first_step || nested, /*residual=*/true,
                    /*checkpoint_input=*/nested);  // norm1
}

// A trained block, or a frozen one with a gradient flowing through it.
void block_forward_with_graph(Timeline& t, const Lm& x) {
  (x.frozen ? block_forward_frozen : block_forward)(t, x);
}

void norm_forward(Timeline& t, const Lm& x) {
  (x.frozen ? rms_norm_forward_frozen : rms_norm_forward)(t, x);
}

// The final norm's backward: its input, the last block's output, is kept by this norm only.
void norm_backward(Timeline& t, const Lm& x, bool first_step) {
  rms_norm_backward(t, x, first_step, /*residual=*/false);
}

void norm_backward_2x(Timeline& t, const Lm& x, bool first_step) {
  rms_norm_backward_2x(t, x, first_step, /*residual=*/false, /*held=*/false,
                       /*keeps_input=*/false);
}

// summed_cross_entropy without a graph: logits and log-probabilities together, the loss and the
// total weight.
void cross_entropy_nograd(Timeline& t, const Lm& x, int64_t rows) {
  t.alloc(2 * e * rows * x.V + 4 + 4);
}

}  // namespace

const DecoderKernels& decoder_kernels_fp32() {
  static const DecoderKernels k{block_forward_with_graph,
                                block_forward_nograd,
                                block_backward,
                                norm_forward,
                                rms_norm_forward_nograd,
                                norm_backward,
                                loss_forward,
                                loss_backward,
                                cross_entropy_nograd,
                                /*tables_die_with_forward=*/false};
  return k;
}

const DecoderKernels& decoder_kernels_fp32_2x() {
  static const DecoderKernels k{block_forward_2x,
                                block_forward_nograd_2x,
                                block_backward_2x,
                                rms_norm_forward_2x,
                                rms_norm_forward_nograd,
                                norm_backward_2x,
                                loss_forward,
                                loss_backward,
                                cross_entropy_nograd,
                                /*tables_die_with_forward=*/false};
  return k;
}

}  // namespace vlm::memory::replay
