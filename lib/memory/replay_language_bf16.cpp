// The trained decoder's forward and backward under bf16 autocast (LibTorch 1.13 on the CPU),
// allocation by allocation; docs/memory.md derives the rules. What differs from fp32:
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

// Whether a [batch, rows, cols] per-head view is copied before a oneDNN product: heads of one
// segment are strided unless the view is the whole of a contiguous tensor.
struct HeadLayout {
  bool q_copied, kv_copied;
};
HeadLayout head_layout(const Lm& x, int64_t L) {
  const bool gqa = x.Hkv < x.Hq;
  // q (and k, v without GQA) keep the projection's token-major layout: strided over heads.
  // GQA's keys and values are contiguous per head: strided only when a segment is a part.
  const bool q_copied = x.Hq > 1;
  const bool kv_copied = gqa ? !(x.B == 1 && L == x.N) : x.Hq > 1;
  return {q_copied, kv_copied};
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

// summed_cross_entropy (token_loss.cpp:10-16) over `rows` rows under autocast: the head's bf16
// copy (an explicit cast) and the rows' (autocast's), the bf16 logits and the product's
// scratchpad, the fp32 logits (the bf16 ones die), log-probabilities, loss and total weight.
// With a graph both copies are kept; without one (a checkpointed chunk's forward) they die.
// On return the fp32 logits, the log-probabilities, the loss and the total weight are live.
void cross_entropy_forward(Timeline& t, const Lm& x, int64_t rows, bool graph = true) {
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

// The backward of summed_cross_entropy with a graph, from the root of its loss to the rows'
// and the head's fp32 gradients (live on return, `rows` x D and V x D): NLL's and
// log-softmax's gradients (then the total weight, the kept log-probabilities and the targets
// are released: `targets` bytes), the fp32 logits' ToCopyBackward0 to bf16, the product's
// backward (the head's gradient first, as the transposed operand), then the rows' copy's and
// the head copy's ToCopyBackward0 to fp32.
// `frees_incoming`: NLL's incoming gradient (4 B) dies when it returns (the loss's gradient,
// unchunked; a chunk's is the recompute's own).
void cross_entropy_backward(Timeline& t, const Lm& x, int64_t rows, int64_t targets,
                            bool frees_incoming = false) {
  const int64_t logits = e * rows * x.V, head = e * x.V * x.D, grad_rows = e * rows * x.D;
  t.alloc(logits);
  t.free(targets + 4);
  if (frees_incoming) t.free(4);
  t.alloc(logits);
  t.free(2 * logits);
  t.alloc(logits / 2);
  t.free(logits);
  if (!x.frozen) {
    t.alloc(head / 2);
    t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, 0, x.V, rows, x.D, true, false));
  }
  t.alloc(grad_rows / 2);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, 0, rows, x.V, x.D, false, false));
  t.free(logits / 2 + (x.frozen ? 0 : grad_rows / 2) + (x.bf16_storage ? 0 : head / 2));
  if (x.bf16_storage) return;  // the rows were bf16: their gradient stays bf16
  t.alloc(grad_rows);
  t.free(grad_rows / 2);
  if (!x.frozen) {
    t.alloc(head);
    t.free(head / 2);
  }
}

// The chunked loss's backward (token_loss.cpp:38-47) under autocast, as in fp32
// (replay_language.cpp, chunked_loss_backward) with the autocast recompute: per chunk, last
// first, the RNG state around the recompute with a graph, its backward to the chunk rows' and
// the head's fp32 gradients, SliceBackward0 into the rows' buffer; the engine sums later
// chunks' gradients out of place. Then `hidden.sum() * 0.0`'s gradient and
// IndexSelectBackward0 into the final norm's buffer.
void chunked_loss_backward_bf16(Timeline& t, const Lm& x, bool first_step) {
  const int64_t element = x.bf16_storage ? h : e;  // of the stream and the rows
  const int64_t head = x.frozen ? 0 : e * x.V * x.D, stream = element * x.N * x.D,
                rows = element * x.Ns * x.D;
  for (size_t k = x.loss_chunks.size(); k-- > 0;) {
    const int64_t c = x.loss_chunks[k];
    const bool first_processed = k + 1 == x.loss_chunks.size();
    t.alloc(kCpuRngStateBytes);
    cross_entropy_forward(t, x, c);
    t.free(e * c * x.V);  // the fp32 logits
    t.free(kCpuRngStateBytes);
    cross_entropy_backward(t, x, c, /*targets=*/0);  // the chunk's targets are a view
    t.free(4);                                       // the recomputed loss
    if (k == 0) t.free(rows);  // the last chunk releases the rows
    if (!first_processed) {
      t.transient(head);
      t.free(head);
    }
    if (k == 0 && !x.tied && !x.frozen) accumulate_grad(t, head, first_step);
    t.alloc(rows);  // SliceBackward0
    t.free(element * c * x.D);
    if (!first_processed) {
      t.transient(rows);
      t.free(rows);
    }
  }
  t.transient(24);
  t.alloc(4);
  t.free(4);  // the loss's gradient: its last user has run
  t.alloc(stream);
  t.free(rows + 8 * x.Ns);
  t.alloc(stream);
  t.free(4 + stream);
}

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


// A linear's MmBackward0 under autocast, from its output's bf16 gradient (`rows` x `out`,
// live): the weight's gradient (computed as (g^T x)^T, g^T the transposed operand), then the
// input's; then the output's gradient, the kept bf16 input (autocast's copy, or the input
// itself when it was bf16) and the kept weight copy are freed. The weight's ToCopyBackward0 runs after the input's (autocast
// casts the weight first): the caller runs them.
// Frozen: the input's gradient only, and no input was kept.
// `frees_grad`: the node holds the output's gradient's last reference (not so for a gradient
// the residual's add shares with the stream, in a decoder stored in bf16).
void linear_backward(Timeline& t, const Lm& x, int64_t rows, int64_t in, int64_t out,
                     bool frees_grad = true) {
  if (!x.frozen) {
    t.alloc(h * in * out);
    t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, 0, out, rows, in, true, false));
  }
  t.alloc(h * rows * in);
  t.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, 0, rows, out, in, false, false));
  t.free((frees_grad ? h * rows * out : 0) + (x.frozen ? 0 : h * rows * in) +
         (x.bf16_storage ? 0 : h * in * out));
}

// A bf16 weight gradient converted to fp32 (ToCopyBackward0), then its AccumulateGrad; none
// for a frozen decoder.
void weight_to_fp32(Timeline& t, const Lm& x, int64_t numel, bool keep) {
  if (x.frozen) return;
  t.alloc(e * numel);
  t.free(h * numel);
  accumulate_grad(t, e * numel, keep);
}

// The input's bf16 gradient converted to fp32 (ToCopyBackward0); `summed`: the input's
// gradient buffer already holds one, and the engine adds them out of place.
void input_to_fp32(Timeline& t, const Lm& x, bool summed) {
  if (x.bf16_storage) {  // a bf16 norm output: its bf16 gradients are summed out of place
    if (summed) {
      t.alloc(h * x.N * x.D);
      t.free(2 * h * x.N * x.D);
    }
    return;
  }
  const int64_t stream = e * x.N * x.D;
  t.alloc(stream);
  t.free(h * x.N * x.D);
  if (summed) {
    t.alloc(stream);
    t.free(2 * stream);
  }
}

// The packed attention's backward from the context's bf16 gradient dC (live): segments last
// first (compat.h:139-145 in reverse), then the per-segment gradients gathered into the flat
// q, k and v gradients by SliceBackward0 (zeros [Hq, N, hd] each; the engine sums later
// segments' out of place). The last segment processed frees dC and the kept q, k and v.
void attention_backward_bf16(Timeline& t, const Lm& x) {
  const int64_t hidden = h * x.N * x.D, kv = h * x.N * x.Dkv;
  const int64_t kv_storage = x.Hkv < x.Hq ? hidden : kv;  // what the kept k/v views keep
  for_each_segment_reversed(
      t, x.segments, [&](Timeline& s, int64_t L, bool first_processed, bool last_processed) {
        const int64_t scores = h * x.Hq * L * L, rows = h * x.Hq * L * x.hd;
        const HeadLayout layout = head_layout(x, L);
        const bool onednn = onednn_bf16_product(x.onednn_bf16, x.Hq, L, x.hd, L);
        // dO, a per-head view of dC, is strided like q.
        const int64_t o_copy = onednn && layout.q_copied ? rows : 0;
        const int64_t q_copy = o_copy, kv_copy = onednn && layout.kv_copied ? rows : 0;
        // P v's BmmBackward0: v's gradient (P^T dO), then P's (dO v^T).
        s.alloc(o_copy + rows);
        s.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, L, L, x.hd, true, false));
        s.free(o_copy);
        s.alloc(scores + o_copy + kv_copy);
        s.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, L, x.hd, L, false, true));
        s.free(o_copy + kv_copy);
        if (last_processed) s.free(hidden);      // dC
        s.free(scores);                          // the kept bf16 probabilities
        if (last_processed) s.free(kv_storage);  // v's
        // P's ToCopyBackward0 (to fp32), SoftmaxBackward0, the softmax input's ToCopyBackward0 (to
        // bf16), MaskedFillBackward0; then the mask (logical_not) is freed.
        s.alloc(2 * scores);
        s.free(scores);
        s.alloc(2 * scores);
        s.free(2 * 2 * scores);
        s.alloc(scores);
        s.free(2 * scores);
        s.alloc(scores);
        s.free(scores + L * L);
        // The scale's MulBackward1: the wrapped scalar and its bf16 copy, the product.
        s.transient(kWrappedScalar + h + scores);
        s.alloc(scores);
        s.free(scores);
        // q k^T's BmmBackward0: k's gradient (q^T dS), then q's (dS k); then dS and, for the last
        // segment, q's and k's storages.
        s.alloc(q_copy + rows);
        // q^T is a transposed view unless q was copied (then the copy is made contiguous as q^T).
        s.transient(
            bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, x.hd, L, L, q_copy == 0, false));
        s.free(q_copy);
        s.alloc(kv_copy + rows);
        s.transient(bf16_matmul_scratch(x.onednn_bf16, x.threads, x.Hq, L, L, x.hd, false, false));
        s.free(kv_copy);
        s.free(scores);
        if (last_processed) s.free(hidden + kv_storage);
        for (int k = 0; k < 3; ++k) {
          s.alloc(hidden);  // SliceBackward0
          s.free(rows);
          if (!first_processed) {
            s.alloc(hidden);
            s.free(2 * hidden);
          }
        }
      });
}

// RMSNorm's backward in a decoder stored in bf16 (rms_norm_forward_bf16_storage), from the
// output's bf16 gradient (live, freed): the weight's product (no weight gradient), the bf16
// cast's ToCopyBackward0 to fp32, then as in fp32 (rms_norm_backward) on the fp32 copy of the
// input, whose gradient is converted back to bf16 (live on return). `residual`: the input's
// gradient buffer holds the residual branch's gradient, and the engine sums the two out of
// place; `holds_incoming`: a caller still holds that gradient (a checkpointed block's output
// gradient, held by the outer node), which the sum then does not free.
void rms_norm_backward_bf16_storage(Timeline& t, const Lm& x, bool residual,
                                    bool holds_incoming = false) {
  const int64_t stream = e * x.N * x.D, hidden = h * x.N * x.D, row = e * x.N;
  t.alloc(hidden);  // grad * w
  t.free(hidden);   // the incoming gradient
  t.alloc(stream);  // to fp32
  t.free(hidden);
  t.alloc(stream);  // MulBackward0 (x * r): grad * r, then grad * x summed to [N, 1]
  t.transient(stream + row);
  t.alloc(row);
  t.free(stream);
  t.transient(2 * row);  // RsqrtBackward0
  t.alloc(row);
  t.free(row + row);
  t.transient(stream + 12);  // MeanBackward1
  t.alloc(stream);
  t.free(stream + row);
  t.transient(3 * stream);  // PowBackward0, added into the fp32 copy's gradient
  t.free(stream + stream);  // the gradient of x^2, the fp32 copy
  t.alloc(hidden);          // ToCopyBackward0 to bf16
  t.free(stream);
  if (residual) {
    t.alloc(hidden);
    t.free(holds_incoming ? hidden : 2 * hidden);
  }
}

// One trained decoder block's backward under autocast, from its output's fp32 gradient g
// (live), in the engine's order.
void block_backward_bf16(Timeline& t, const Lm& x, bool first_step, bool nested = false) {
  // nested: inside a checkpointed block's backward, autograd::grad captures the weights'
  // gradients until it returns.
  const bool keep = first_step || nested;
  const int64_t hidden = h * x.N * x.D, kv = h * x.N * x.Dkv, mlp = h * x.N * x.F;
  const bool gqa = x.Hkv < x.Hq;
  // In a decoder stored in bf16 the stream is bf16: the residual's add hands g itself on, and
  // the norms convert their own gradients.
  const bool storage = x.bf16_storage;
  // MLP. `h + down` hands g to h and, converted to bf16, to down.
  if (!storage) t.alloc(hidden);
  linear_backward(t, x, x.N, x.F, x.D, !storage);  // down; it kept the product
  weight_to_fp32(t, x, x.D * x.F, keep);
  t.alloc(2 * mlp);  // MulBackward0 (silu * up)
  t.free(3 * mlp);
  t.alloc(mlp);      // SiluBackward0
  t.free(2 * mlp);
  linear_backward(t, x, x.N, x.D, x.F);  // up
  input_to_fp32(t, x, false);
  weight_to_fp32(t, x, x.D * x.F, keep);
  linear_backward(t, x, x.N, x.D, x.F);  // gate
  input_to_fp32(t, x, true);
  weight_to_fp32(t, x, x.D * x.F, keep);
  if (storage) {
    rms_norm_backward_bf16_storage(t, x, /*residual=*/true, /*holds_incoming=*/nested);  // norm2
  } else {
    rms_norm_backward(t, x, keep, /*residual=*/true, /*checkpoint_input=*/false,
                      /*holds_incoming=*/nested);  // norm2, into h's gradient
  }
  // `x + o` hands h's gradient to x and, converted to bf16, to o; out_proj (its input, the
  // context, was bf16: no cast).
  if (!storage) t.alloc(hidden);
  linear_backward(t, x, x.N, x.D, x.D, !storage);  // it kept the context
  weight_to_fp32(t, x, x.D * x.D, keep);
  attention_backward_bf16(t, x);
  // v, k, q (created last first).
  if (gqa) {
    t.alloc(kv);
    t.free(hidden + 8 * x.Hq);
    t.alloc(kv);
    t.free(hidden + 8 * x.Hq);
  }
  t.alloc(kv);  // the head view's copy
  t.free(kv);
  linear_backward(t, x, x.N, x.D, x.Dkv);
  input_to_fp32(t, x, false);
  weight_to_fp32(t, x, x.D * x.Dkv, keep);
  for (const bool q : {false, true}) {
    const int64_t width = q ? hidden : kv, cast = h * x.N * x.hd;
    t.alloc(width);  // grad * s
    t.free(cast);    // sin's bf16 copy
    t.alloc(width);  // grad * c
    t.free(width + cast);  // the incoming gradient, cos's copy
    t.alloc(width / 2 + width);  // NegBackward0, SplitBackward0's cat
    t.free(width + width / 2);   // grad * s, the negated half
    t.alloc(width);              // the sum
    t.free(2 * width);
    t.alloc(width);  // the head view's copy
    t.free(width);
    linear_backward(t, x, x.N, x.D, q ? x.D : x.Dkv);
    input_to_fp32(t, x, true);
    weight_to_fp32(t, x, x.D * (q ? x.D : x.Dkv), keep);
  }
  if (storage) {
    rms_norm_backward_bf16_storage(t, x, /*residual=*/true);  // norm1
  } else {
    rms_norm_backward(t, x, keep, /*residual=*/true, /*checkpoint_input=*/nested);  // norm1
  }
}


// A checkpointed block's backward under autocast (activation_checkpoint.cpp:67-102), as in
// fp32: the RNG state around the recompute with a graph, the nested backward, then the
// recomputed output, the output's gradient and the saved input die; on later steps the
// captured parameter gradients are added into .grad and freed.
void checkpointed_block_backward_bf16(Timeline& t, const Lm& x, bool first_step) {
  const int64_t stream = (x.bf16_storage ? h : e) * x.N * x.D;
  const int64_t parameters =
      x.frozen ? 0 : e * (2 * x.D * x.D + 2 * x.D * x.Dkv + 3 * x.D * x.F + 2 * x.D);
  t.alloc(kCpuRngStateBytes);
  block_forward_bf16(t, x);
  t.free(kCpuRngStateBytes);
  block_backward_bf16(t, x, first_step, /*nested=*/true);
  t.free(3 * stream);
  if (!first_step) t.free(parameters);
}

}  // namespace

void language_forward_no_graph_bf16(Timeline& t, const Lm& x) {
  const int64_t element = x.bf16_storage ? h : e;  // of the stream and the rows
  const int64_t stream = element * x.N * x.D, tables = 2 * e * x.N * x.hd;
  decoder_prologue(t, x);
  block_forward_nograd_bf16(t, x);
  t.repeat(x.Ll - 1, [&](Timeline& block) {
    block_forward_nograd_bf16(block, x);
    block.free(stream);
  });
  (x.bf16_storage ? rms_norm_forward_bf16_storage_nograd : rms_norm_forward_nograd)(t, x);
  t.free(stream + tables);  // the last block's output and the tables, at return
  loss_preparation(t, x);
  if (x.loss_chunks.empty()) {
    cross_entropy_forward(t, x, x.Ns, /*graph=*/false);
    t.free(2 * e * x.Ns * x.V + 4 + 4);  // ... and the zero loss, replaced
  } else {
    for (const int64_t rows : x.loss_chunks) {
      cross_entropy_forward(t, x, rows, /*graph=*/false);
      t.free(2 * e * rows * x.V + 4);
      t.alloc(4);
      t.free(4 + 4);
    }
  }
  t.free(8 * x.Ns + element * x.Ns * x.D + 8 * x.Ns + x.N);
  t.free(stream);  // hidden
}

void language_forward_bf16(Timeline& t, const Lm& x) {
  const int64_t stream = e * x.N * x.D;
  const int64_t tables = 2 * e * x.N * x.hd;
  decoder_prologue(t, x);
  const int64_t hidden = h * x.N * x.D;
  if (x.bf16_storage && !x.checkpoint) {
    // Nothing keeps a block's bf16 input (its norm keeps an fp32 copy): it dies when `x` is
    // reassigned, but the LM input, which its caller holds.
    block_forward_bf16(t, x);
    t.repeat(x.Ll - 1, [&](Timeline& block) {
      block_forward_bf16(block, x);
      block.free(hidden);
    });
    rms_norm_forward_bf16_storage(t, x);  // the final norm
    t.free(hidden);                       // the last block's output, at return
  } else {
    t.repeat(x.Ll, [&](Timeline& block) {
      if (x.checkpoint) {
        block.alloc(kCpuRngStateBytes);  // kept by the block's CheckpointFunction
        block_forward_nograd_bf16(block, x);
      } else {
        block_forward_bf16(block, x);
      }
    });
    // The final norm; in a decoder stored in bf16 the last block's output, which the norm
    // keeps an fp32 copy of, dies at return.
    if (x.bf16_storage) {
      rms_norm_forward_bf16_storage(t, x);
      t.free(hidden);
    } else {
      (x.frozen ? rms_norm_forward_frozen : rms_norm_forward)(t, x);
    }
  }
  // The products kept bf16 copies: the fp32 tables die with the forward's scope, unless the
  // checkpointed blocks' closures keep them.
  if (!x.checkpoint) t.free(tables);
  // Loss (token_loss.cpp): as in fp32 up to the rows and the count; then the head's bf16 copy
  // (an explicit cast, kept), the rows' (autocast, kept), bf16 logits and the scratchpad, the
  // fp32 logits (the bf16 ones die), log-probabilities (kept), loss and total weight.
  // A decoder stored in bf16 gives bf16 rows.
  const int64_t row_bytes = x.bf16_storage ? h : e;
  loss_preparation(t, x);
  if (x.loss_chunks.empty()) {
    const int64_t logits = e * x.Ns * x.V;
    cross_entropy_forward(t, x, x.Ns);
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
      cross_entropy_forward(t, x, rows, /*graph=*/false);
      t.free(2 * e * rows * x.V + 4);
      t.alloc(4);
      t.free(4 + 4);
    }
  }
  t.free(x.N);                                // supervised
  t.free(x.bf16_storage ? hidden : stream);  // hidden
}

void language_backward_bf16(Timeline& t, const Lm& x, bool first_step) {
  const int64_t element = x.bf16_storage ? h : e;  // of the stream and the rows
  const int64_t rows = element * x.Ns * x.D, head = e * x.V * x.D, stream = element * x.N * x.D;
  objective_backward(t);
  if (x.loss_chunks.empty()) {
    cross_entropy_backward(t, x, x.Ns, 8 * x.Ns, /*frees_incoming=*/true);
    // An untied head's gradient reaches its AccumulateGrad; a tied one waits for the
    // embedding's.
    if (!x.tied && !x.frozen) accumulate_grad(t, head, first_step);
    t.alloc(stream);  // IndexSelectBackward0
    t.free(rows + 8 * x.Ns);
  } else {
    chunked_loss_backward_bf16(t, x, first_step);
  }
  if (x.bf16_storage) {
    rms_norm_backward_bf16_storage(t, x, /*residual=*/false);
  } else {
    rms_norm_backward(t, x, first_step, /*residual=*/false);
  }
  t.repeat(x.Ll, [&](Timeline& block) {
    if (x.checkpoint) {
      checkpointed_block_backward_bf16(block, x, first_step);
    } else {
      block_backward_bf16(block, x, first_step);
    }
  });
}

}  // namespace vlm::memory::replay
