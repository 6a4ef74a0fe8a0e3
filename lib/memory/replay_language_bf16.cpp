// The trained decoder under bf16 autocast (LibTorch 1.13 on the CPU), allocation by allocation:
// the forward here, the backward in replay_language_bf16_backward.cpp; docs/memory.md derives
// the rules. What differs from fp32:
// - every linear casts its weight (reached through `weight.t()`, a view autocast does not
//   cache) and, when fp32, its input to bf16, keeps both for the backward, and writes a bf16
//   output; oneDNN allocates a scratchpad for the product (bf16_matmul_scratch);
// - RMSNorm, the residual stream, the RoPE tables, the softmax and the loss stay fp32: adding
//   a bf16 branch to the fp32 stream first converts it to fp32;
// - in backward each cast is a ToCopyBackward0 node that converts its gradient back (a bf16
//   weight gradient to fp32 before AccumulateGrad), and bf16 products need contiguous operands
//   (ATen's is_mkldnn_optimized_format): strided per-head views are copied first.
// A decoder frozen in bf16 storage (Lm::bf16_storage) runs the same ops in either precision
// without any cast: a bf16 stream that nobody keeps (each RMSNorm keeps an fp32 copy of its
// input), bf16 weights used as they are, bf16 + bf16 residual adds.
#include "memory/replay.h"
#include "memory/saved_activations.h"

namespace vlm::memory::replay {
namespace {

constexpr int64_t h = 2;  // bf16

// A linear on an input of `rows` tokens from `in` to `out` features, trained, under autocast:
// the weight's bf16 copy, the input's (when `cast_input`: an fp32 input), the output, then the
// product's scratchpad. The copies stay (kept for the backward); the output is the caller's.
// A frozen decoder's linear keeps only the weight's copy (for its input's gradient): the
// input's copy dies with the product (a bf16 input is the caller's to free).
void linear_forward(Timeline& t, const Lm& x, int64_t rows, int64_t in, int64_t out,
                    bool cast_input) {
  t.alloc(x.bf16_storage ? 0 : h * in * out);  // a bf16 weight is used as it is
  if (cast_input) t.alloc(h * rows * in);
  t.alloc(h * rows * out);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, 0, rows, in, out, false, true));
  if (x.frozen && cast_input) t.free(h * rows * in);
}

// RoPE on a bf16 projection of `width` bytes (language_model.cpp:53-58): cos and sin cast to
// bf16 (kept by the products), rotate_half's negated half and cat, rot * s, x * c and the sum;
// everything but the sum and the casts dies, the projection output too.
void rotary_bf16(Timeline& t, const Lm& x, int64_t width) {
  t.alloc(2 * h * x.N * x.hd);  // cos, sin in bf16
  t.alloc(width / 2 + width);   // -halves[1], cat
  t.free(width / 2);
  t.alloc(3 * width);           // rot * s, x * c, the sum
  t.free(3 * width);            // cat, rot * s, x * c
  t.free(width);                // the projection
}

// RMSNorm on a bf16 input with a frozen bf16 weight (a decoder frozen in bf16 storage,
// language_model.cpp:33-37): the fp32 copy of the input (kept with x^2 and rsqrt), the
// statement as in fp32, x * r converted to bf16 and multiplied by the weight (which keeps only
// the weight); x * r and its bf16 copy die at return, the bf16 output stays.
void rms_norm_forward_bf16_storage(Timeline& t, const Lm& x) {
  const int64_t stream = e * x.N * x.D, row = e * x.N;
  t.alloc(stream);        // x.to(kFloat)
  t.alloc(stream + row);  // x^2 (kept), its mean
  t.alloc(kWrappedScalar + row);
  t.free(kWrappedScalar);
  t.alloc(row + stream);  // rsqrt (kept), x * r
  t.free(2 * row);        // the mean, mean + eps
  t.alloc(h * x.N * x.D);  // .to(bf16)
  t.alloc(h * x.N * x.D);  // * weight
  t.free(h * x.N * x.D + stream);
}

// The same without a graph (a checkpointed block's forward): only the bf16 output stays.
void rms_norm_forward_bf16_storage_nograd(Timeline& t, const Lm& x) {
  const int64_t stream = e * x.N * x.D, row = e * x.N;
  t.alloc(stream);        // x.to(kFloat)
  t.alloc(stream + row);  // x^2, its mean
  t.alloc(kWrappedScalar + row);
  t.free(kWrappedScalar);
  t.alloc(row + stream);      // rsqrt, x * r
  t.free(stream + 3 * row);   // x^2, the mean, mean + eps, rsqrt
  t.alloc(h * x.N * x.D);     // .to(bf16)
  t.alloc(h * x.N * x.D);     // * weight
  t.free(h * x.N * x.D + 2 * stream);  // the bf16 copy, x * r, the fp32 copy
}

// `fp32 + bf16` (the residual adds, language_model.cpp:108-109): the bf16 branch converted to
// fp32, the sum, then the conversion and the branch die. The sum stays.
void residual_add(Timeline& t, const Lm& x) {
  if (x.bf16_storage) {  // bf16 + bf16: the sum, then the branch dies
    t.alloc(h * x.N * x.D);
    t.free(h * x.N * x.D);
    return;
  }
  const int64_t stream = e * x.N * x.D;
  t.alloc(2 * stream);
  t.free(stream + h * x.N * x.D);
}

// Per segment of length L, the 1.13 math attention (compat.h:139-145) in bf16.
void segment_forward(Timeline& t, const Lm& x, int64_t L) {
  const int64_t scores = h * x.Hq * L * L, rows = h * x.Hq * L * x.hd;
  const HeadLayout layout = head_layout(x, L);
  const bool onednn = onednn_bf16_product(x.onednn_bf16, x.Hq, L, x.hd, L);
  t.alloc(L * L);  // ones
  t.alloc(L * L);  // tril (the causal mask, until the segment's end)
  t.free(L * L);
  // q k^T: the output, the copies of q and k, the scratchpad.
  t.alloc(scores);
  const int64_t qk_copies =
      onednn ? (layout.q_copied ? rows : 0) + (layout.kv_copied ? rows : 0) : 0;
  t.alloc(qk_copies);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, L, x.hd, L, false, true));
  t.free(qk_copies);
  // * scale: the wrapped scalar and its bf16 copy, the product; the unscaled scores die.
  t.transient(kWrappedScalar + h + scores);
  t.alloc(scores);
  t.free(scores);
  t.alloc(L * L + scores);  // logical_not (kept), masked_fill
  t.free(scores);           // the scaled scores
  // softmax(.., kFloat): the fp32 copy of its input, the probabilities (kept), then the copy
  // dies; .to(bf16) (kept by P v).
  t.alloc(2 * 2 * scores);
  t.free(2 * scores);
  t.alloc(scores);
  // P v: the output (kept), v's copy, the scratchpad.
  const int64_t v_copy = onednn && layout.kv_copied ? rows : 0;
  t.alloc(rows + v_copy);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, L, L, x.hd, false, false));
  t.free(v_copy);
  t.free(scores + L * L);  // the masked scores, the causal mask
}

// A linear without a graph (a checkpointed block's forward): the copies die after the product,
// the output stays.
void linear_forward_nograd(Timeline& t, const Lm& x, int64_t rows, int64_t in, int64_t out,
                           bool cast_input) {
  // A frozen decoder's linear freed its input's copy already.
  const int64_t copies =
      (x.bf16_storage ? 0 : h * in * out) + (cast_input && !x.frozen ? h * rows * in : 0);
  linear_forward(t, x, rows, in, out, cast_input);
  t.free(copies);
}

// RoPE without a graph: everything but the sum dies, the bf16 cos and sin too.
void rotary_bf16_nograd(Timeline& t, const Lm& x, int64_t width) {
  t.alloc(2 * h * x.N * x.hd);
  t.alloc(width / 2 + width);
  t.free(width / 2);
  t.alloc(3 * width);
  t.free(3 * width + 2 * h * x.N * x.hd);
  t.free(width);
}

// Per segment, the math attention without a graph: the masks, scores and probabilities die
// within the segment; its output stays.
void segment_forward_nograd(Timeline& t, const Lm& x, int64_t L) {
  const int64_t scores = h * x.Hq * L * L, rows = h * x.Hq * L * x.hd;
  const HeadLayout layout = head_layout(x, L);
  const bool onednn = onednn_bf16_product(x.onednn_bf16, x.Hq, L, x.hd, L);
  t.alloc(L * L);
  t.alloc(L * L);
  t.free(L * L);
  t.alloc(scores);
  const int64_t qk_copies =
      onednn ? (layout.q_copied ? rows : 0) + (layout.kv_copied ? rows : 0) : 0;
  t.alloc(qk_copies);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, L, x.hd, L, false, true));
  t.free(qk_copies);
  t.transient(kWrappedScalar + h + scores);
  t.alloc(scores);
  t.free(scores);           // the unscaled scores
  t.alloc(L * L + scores);  // logical_not, masked_fill
  t.free(scores + L * L);   // the scaled scores, logical_not
  t.alloc(2 * 2 * scores);  // the fp32 copy, the probabilities
  t.free(2 * scores);
  t.alloc(scores);          // their bf16 copy
  t.free(2 * scores);       // the fp32 probabilities
  const int64_t v_copy = onednn && layout.kv_copied ? rows : 0;
  t.alloc(rows + v_copy);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, L, L, x.hd, false, false));
  t.free(v_copy);
  t.free(2 * scores + L * L);  // the bf16 probabilities, the masked scores, the causal mask
}

// One decoder block's forward without a graph under autocast (CheckpointFunction::forward):
// the output stays.
void block_forward_nograd_bf16(Timeline& t, const Lm& x) {
  const int64_t stream = e * x.N * x.D, hidden = h * x.N * x.D, kv = h * x.N * x.Dkv,
                mlp = h * x.N * x.F;
  const bool gqa = x.Hkv < x.Hq;
  const auto norm =
      x.bf16_storage ? rms_norm_forward_bf16_storage_nograd : rms_norm_forward_nograd;
  const bool cast = !x.bf16_storage;
  const int64_t y = x.bf16_storage ? hidden : stream;  // the norm's output
  norm(t, x);  // y1
  linear_forward_nograd(t, x, x.N, x.D, x.D, cast);
  rotary_bf16_nograd(t, x, hidden);
  linear_forward_nograd(t, x, x.N, x.D, x.Dkv, cast);
  rotary_bf16_nograd(t, x, kv);
  linear_forward_nograd(t, x, x.N, x.D, x.Dkv, cast);  // v
  if (gqa) {
    t.alloc(2 * (hidden + 8 * x.Hq));  // repeat_interleave's keys and values (and indices)
    t.free(2 * 8 * x.Hq);
    if (x.B > 1) t.alloc(2 * hidden);  // flat() copies them
  }
  for_each_segment(t, x.segments, [&](Timeline& s, int64_t L) { segment_forward_nograd(s, x, L); });
  t.alloc(hidden);  // torch::cat(outputs)
  t.free(hidden);   // the outputs
  if (gqa) t.free((x.B > 1 ? 2 * hidden : 0) + 2 * hidden);
  t.alloc(hidden);  // the context
  linear_forward_nograd(t, x, x.N, x.D, x.D, false);
  t.free(3 * hidden + 2 * kv);  // attended, the context, q, k, v
  residual_add(t, x);           // h = x + o
  t.free(y);                    // y1
  norm(t, x);                   // y2
  linear_forward_nograd(t, x, x.N, x.D, x.F, cast);   // gate
  linear_forward_nograd(t, x, x.N, x.D, x.F, cast);   // up
  t.alloc(2 * mlp);                                   // silu(gate), the product
  linear_forward_nograd(t, x, x.N, x.F, x.D, false);  // down
  t.free(4 * mlp);
  residual_add(t, x);                           // out = h + down
  t.free(y + (x.bf16_storage ? hidden : stream));  // y2, h
}

}  // namespace

// summed_cross_entropy (token_loss.cpp:10-16) over `rows` rows under autocast: the head's bf16
// copy (an explicit cast) and the rows' (autocast's), the bf16 logits and the product's
// scratchpad, the fp32 logits (the bf16 ones die), log-probabilities, loss and total weight.
// With a graph both copies are kept; without one (a checkpointed chunk's forward) they die.
// On return the fp32 logits, the log-probabilities, the loss and the total weight are live.
void cross_entropy_forward_bf16(Timeline& t, const Lm& x, int64_t rows, bool graph) {
  // A head stored in bf16 multiplies the bf16 rows as they are.
  const int64_t logits = e * rows * x.V,
                copies = x.bf16_storage ? 0 : h * x.V * x.D + h * rows * x.D;
  t.alloc(copies + logits / 2);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, 0, rows, x.D, x.V, false, true));
  if (!graph) t.free(copies);
  if (graph && x.frozen && copies > 0) t.free(h * rows * x.D);  // a frozen head needs no rows' copy
  t.alloc(logits);
  t.free(logits / 2);
  t.alloc(logits + 4 + 4);
}

namespace {

// One trained decoder block (language_model.cpp:105-110) under autocast.
void block_forward_bf16(Timeline& t, const Lm& x) {
  const int64_t stream = e * x.N * x.D, hidden = h * x.N * x.D, kv = h * x.N * x.Dkv,
                mlp = h * x.N * x.F;
  const bool gqa = x.Hkv < x.Hq;
  const auto norm = x.bf16_storage ? rms_norm_forward_bf16_storage
                    : x.frozen     ? rms_norm_forward_frozen
                                   : rms_norm_forward;
  // The norm's output: fp32 (cast by each linear), or bf16 in a decoder stored in bf16.
  const bool cast = !x.bf16_storage;
  const int64_t y = x.bf16_storage ? hidden : stream;
  norm(t, x);  // y1, a temporary of the statement
  linear_forward(t, x, x.N, x.D, x.D, cast);
  rotary_bf16(t, x, hidden);
  linear_forward(t, x, x.N, x.D, x.Dkv, cast);
  rotary_bf16(t, x, kv);
  linear_forward(t, x, x.N, x.D, x.Dkv, cast);  // v, kept
  if (gqa) {
    // repeat_interleave: an Hq-long int64 index (kept) and the [B, Hq, T, hd] keys and values;
    // flat() clones them unless B == 1.
    t.alloc(2 * (hidden + 8 * x.Hq));
    if (x.B > 1) t.alloc(2 * hidden);
  }
  for_each_segment(t, x.segments, [&](Timeline& s, int64_t L) { segment_forward(s, x, L); });
  t.alloc(hidden);  // torch::cat(outputs)
  t.free(hidden);   // the outputs
  if (gqa && x.B > 1) t.free(2 * hidden);
  t.alloc(hidden);  // the context, contiguous (kept by out_proj)
  linear_forward(t, x, x.N, x.D, x.D, false);
  t.free(hidden);  // attended (the cat)
  if (x.frozen) t.free(hidden);  // the context: a frozen out_proj keeps its weight only
  if (gqa) t.free(2 * kv);
  residual_add(t, x);  // h = x + o, kept by norm2
  t.free(y);           // y1
  norm(t, x);          // y2
  linear_forward(t, x, x.N, x.D, x.F, cast);  // gate
  linear_forward(t, x, x.N, x.D, x.F, cast);  // up
  t.alloc(2 * mlp);                           // silu(gate), the product
  linear_forward(t, x, x.N, x.F, x.D, false); // down
  if (x.frozen) t.free(mlp);  // the product
  residual_add(t, x);  // out = h + down
  t.free(y);           // y2
  if (x.bf16_storage) t.free(hidden);  // h: its norm kept an fp32 copy, not h itself
}

// The final norm under autocast, or of a decoder stored in bf16, whose last block's output (an
// fp32 copy of which the norm keeps) dies at return.
void norm_forward(Timeline& t, const Lm& x) {
  if (x.bf16_storage) {
    rms_norm_forward_bf16_storage(t, x);
    t.free(h * x.N * x.D);
    return;
  }
  (x.frozen ? rms_norm_forward_frozen : rms_norm_forward)(t, x);
}

void norm_forward_nograd(Timeline& t, const Lm& x) {
  (x.bf16_storage ? rms_norm_forward_bf16_storage_nograd : rms_norm_forward_nograd)(t, x);
}

void cross_entropy_nograd(Timeline& t, const Lm& x, int64_t rows) {
  cross_entropy_forward_bf16(t, x, rows, /*graph=*/false);
}

// The loss (token_loss.cpp) under autocast: as in fp32 up to the rows and the count; then the
// head's bf16 copy (an explicit cast, kept), the rows' (autocast, kept), bf16 logits and the
// scratchpad, the fp32 logits (the bf16 ones die), log-probabilities (kept), loss and total
// weight. A decoder stored in bf16 gives bf16 rows.
void loss_forward_bf16(Timeline& t, const Lm& x) {
  const int64_t row_bytes = x.bf16_storage ? h : e;
  loss_preparation(t, x);
  if (x.loss_chunks.empty()) {
    const int64_t logits = e * x.Ns * x.V;
    cross_entropy_forward_bf16(t, x, x.Ns, /*graph=*/true);
    t.free(logits);
    t.free(4);  // the zero loss, replaced
    // The fp32 rows (the product kept their bf16 copy), or the bf16 rows of a frozen head.
    t.free(row_bytes * x.Ns * x.D);
  } else {
    // Each chunk checkpointed, its forward without a graph: only its loss comes out, which
    // `loss.sum + chunk_sum` then replaces; every chunk keeps the RNG state and a view of the
    // fp32 rows.
    for (const int64_t rows : x.loss_chunks) {
      t.alloc(kCpuRngStateBytes);
      cross_entropy_forward_bf16(t, x, rows, /*graph=*/false);
      t.free(2 * e * rows * x.V + 4);
      t.alloc(4);
      t.free(4 + 4);
    }
  }
}

}  // namespace

const DecoderKernels& decoder_kernels_bf16() {
  static const DecoderKernels k{block_forward_bf16,
                                block_forward_nograd_bf16,
                                block_backward_bf16,
                                norm_forward,
                                norm_forward_nograd,
                                norm_backward_bf16,
                                loss_forward_bf16,
                                loss_backward_bf16,
                                cross_entropy_nograd,
                                /*tables_die_with_forward=*/true};
  return k;
}

}  // namespace vlm::memory::replay
