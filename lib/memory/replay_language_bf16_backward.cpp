// The trained decoder's backward under bf16 autocast (LibTorch 1.13 on the CPU), allocation by
// allocation, and a decoder frozen in bf16 storage's; the forward and what differs from fp32
// are in replay_language_bf16.cpp.
#include "memory/replay.h"
#include "memory/saved_activations.h"

namespace vlm::memory::replay {
namespace {

constexpr int64_t h = 2;  // bf16

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
// (replay_loss.cpp, chunked_loss_backward) with the autocast recompute: per chunk, last
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
    cross_entropy_forward_bf16(t, x, c, /*graph=*/true);
    t.free(e * c * x.V);  // the fp32 logits
    t.free(kCpuRngStateBytes);
    cross_entropy_backward(t, x, c, /*targets=*/0);  // the chunk's targets are a view
    t.free(4);                                       // the recomputed loss
    if (k == 0) t.free(rows);                        // the last chunk releases the rows
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

// A linear's MmBackward0 under autocast, from its output's bf16 gradient (`rows` x `out`,
// live): the weight's gradient (computed as (g^T x)^T, g^T the transposed operand), then the
// input's; then the output's gradient, the kept bf16 input (autocast's copy, or the input
// itself when it was bf16) and the kept weight copy are freed. The weight's ToCopyBackward0 runs
// after the input's (autocast casts the weight first): the caller runs them. Frozen: the input's
// gradient only, and no input was kept. `frees_grad`: the node holds the output's gradient's last
// reference (not so for a gradient the residual's add shares with the stream, in a decoder stored
// in bf16).
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

}  // namespace

// One trained decoder block's backward under autocast, from its output's fp32 gradient g
// (live), in the engine's order.
void block_backward_bf16(Timeline& t, const Lm& x, bool first_step, bool /*first_block*/,
                         bool nested) {
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
  t.alloc(mlp);  // SiluBackward0
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
    t.alloc(width);              // grad * s
    t.free(cast);                // sin's bf16 copy
    t.alloc(width);              // grad * c
    t.free(width + cast);        // the incoming gradient, cos's copy
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

void loss_backward_bf16(Timeline& t, const Lm& x, bool first_step) {
  const int64_t element = x.bf16_storage ? h : e;  // of the stream and the rows
  const int64_t rows = element * x.Ns * x.D, head = e * x.V * x.D, stream = element * x.N * x.D;
  if (!x.loss_chunks.empty()) return chunked_loss_backward_bf16(t, x, first_step);
  cross_entropy_backward(t, x, x.Ns, 8 * x.Ns, /*frees_incoming=*/true);
  // An untied head's gradient reaches its AccumulateGrad; a tied one waits for the
  // embedding's.
  if (!x.tied && !x.frozen) accumulate_grad(t, head, first_step);
  t.alloc(stream);  // IndexSelectBackward0
  t.free(rows + 8 * x.Ns);
}

void norm_backward_bf16(Timeline& t, const Lm& x, bool first_step) {
  if (x.bf16_storage) return rms_norm_backward_bf16_storage(t, x, /*residual=*/false);
  rms_norm_backward(t, x, first_step, /*residual=*/false);
}

}  // namespace vlm::memory::replay
