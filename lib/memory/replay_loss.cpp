// The loss, the head and the token embeddings (token_loss.cpp, vision_language_model.cpp) in
// the replay of memory/replay.h: the same ops in LibTorch 1.13 and 2.x but for where 2.x's
// engine adds a second gradient in place (the chunked loss's rows and head, the embedding's
// gradient into a chunked head's).
#include "memory/replay.h"
#include "memory/saved_activations.h"

namespace vlm::memory::replay {
namespace {

// The chunked loss's backward (token_loss.cpp:38-47), from the root gradient: the chunks last
// first, each a CheckpointFunction: the RNG state saved around the recompute, the recompute
// with a graph (logits, the kept log-probabilities, loss and total weight; the logits die with
// the closure's return), then autograd::grad over it: NLL's and log-softmax's gradients, the
// head's mm (the chunk rows' gradient and the head's); the chunk's kept bytes die with the
// recomputed graph. The chunk rows' gradient goes through the narrow's SliceBackward0 (zeros
// [Ns, D] and a copy) into the rows' buffer; the head's gradient waits in the embedding's
// AccumulateGrad buffer; later chunks' are summed into both out of place. The last chunk
// releases the rows. Then `hidden.sum() * 0.0` (MulBackward1: 4 B) passes a stride-0
// gradient to the final norm before IndexSelectBackward0 scatters the rows' gradient into
// zeros [N, D] (4ND); the rows' gradient and the positions die, and the two gradients of the
// final norm's output are summed out of place.
void chunked_loss_backward(Timeline& t, const Lm& x, bool first_step) {
  const int64_t head = x.frozen ? 0 : e * x.V * x.D, hidden = e * x.N * x.D, rows = e * x.Ns * x.D;
  for (size_t k = x.loss_chunks.size(); k-- > 0;) {
    const int64_t logits = e * x.loss_chunks[k] * x.V, chunk_rows = e * x.loss_chunks[k] * x.D;
    const bool first_processed = k + 1 == x.loss_chunks.size();
    t.alloc(kCpuRngStateBytes);   // the state the recompute replaces, restored after it
    t.alloc(2 * logits + 4 + 4);  // logits, log-probabilities, loss, total weight
    t.free(logits);
    t.free(kCpuRngStateBytes);
    t.alloc(logits);     // NLL's gradient
    t.free(4);           // the total weight
    t.alloc(logits);     // log-softmax's gradient
    t.free(2 * logits);  // NLL's gradient, the log-probabilities
    t.alloc(chunk_rows + head);
    t.free(logits);            // log-softmax's gradient
    t.free(4);                 // the recomputed loss
    if (k == 0) t.free(rows);  // the last chunk releases the rows (every chunk kept a view)
    // LibTorch 1.13's InputBuffer sums out of place (old + new, then both die): the head's
    // gradient into the embedding's buffer as the node returns, then the SliceBackward0
    // result into the rows' buffer. 2.x adds in place into a buffer it owns alone: the head's
    // from the third chunk processed on (the first buffered one is the mm's transposed view,
    // summed out of place), the rows' from the second.
    const size_t processed = x.loss_chunks.size() - 1 - k;
    if (!first_processed) {
      if (!x.torch2 || processed == 1) t.transient(head);
      t.free(head);
    }
    // An untied head's AccumulateGrad runs once the last chunk's gradient is in its buffer.
    if (k == 0 && !x.tied && !x.frozen) accumulate_grad(t, head, first_step);
    t.alloc(rows);  // SliceBackward0
    t.free(chunk_rows);
    if (!first_processed) {
      if (!x.torch2) t.transient(rows);
      t.free(rows);
    }
  }
  // MulBackward1 of `* 0.0`: wrapped scalars (24 B at the top), then its 4 B gradient, which
  // SumBackward0 expands (a stride-0 view) into the final norm's buffer.
  t.transient(24);
  t.alloc(4);
  t.free(4);                // the loss's gradient: its last user has run
  t.alloc(hidden);          // IndexSelectBackward0: zeros [N, D] + index_add
  t.free(rows + 8 * x.Ns);  // the rows' gradient, the positions
  t.alloc(hidden);          // the final norm's buffer: stride-0 + dense, out of place
  t.free(4 + hidden);
}

}  // namespace

// The supervised mask (bool, until return), the positions and targets (int64) and the rows
// (the stream's dtype: bf16 in a decoder stored in bf16); then TokenLoss{(hidden.sum() *
// 0.0).to(kFloat), supervised.sum()} (:30): the sum and the product (bf16 ones converted to
// fp32 in a decoder stored in bf16; the wrapped 0.0 comes and goes), then supervised.sum()
// casts the mask to int64 (8N) beside the count it returns while the sum is still a
// temporary of the statement: the top of the preparation, the peak when Ns V is small.
void loss_preparation(Timeline& t, const Lm& x) {
  const int64_t row_bytes = x.bf16_storage ? 2 : e;
  const int64_t zero_temporaries = x.bf16_storage ? 2 + 2 : 4;
  t.alloc(x.N);
  t.alloc(8 * x.Ns + row_bytes * x.Ns * x.D + 8 * x.Ns);
  t.alloc(zero_temporaries + 4);
  t.alloc(8 * x.N);
  t.alloc(8);
  t.free(8 * x.N + zero_temporaries);
}

void loss_forward(Timeline& t, const Lm& x) {
  // Loss (token_loss.cpp:23-36): its preparation (the positions, targets and rows kept),
  // then logits and log-probabilities together (the logits local lives until
  // summed_cross_entropy returns), NLL's loss and total weight.
  loss_preparation(t, x);
  if (x.loss_chunks.empty()) {
    t.alloc(e * x.Ns * x.V);               // logits
    t.alloc(e * x.Ns * x.V);               // log-probabilities, kept
    t.alloc(4 + 4);                        // loss, total weight
    t.free(e * x.Ns * x.V);                // logits
    t.free(4);                             // the zero loss, replaced
    if (x.frozen) t.free(e * x.Ns * x.D);  // the rows, kept by nobody (a frozen head)
  } else {
    // Each chunk is checkpointed (token_loss.cpp:38-47): the CPU generator's state is kept;
    // the cross-entropy runs without a graph, so its logits, log-probabilities and total
    // weight die at once and only the chunk's loss (4 B) comes out; `loss.sum + chunk_sum`
    // then replaces the running sum and the chunk's loss dies.
    for (const int64_t rows : x.loss_chunks) {
      t.alloc(kCpuRngStateBytes);
      t.alloc(2 * e * rows * x.V + 4 + 4);
      t.free(2 * e * rows * x.V + 4);
      t.alloc(4);
      t.free(4 + 4);
    }
  }
}

void loss_backward(Timeline& t, const Lm& x, bool first_step) {
  const int64_t logits = e * x.Ns * x.V, rows = e * x.Ns * x.D, head = e * x.V * x.D;
  const int64_t hidden = e * x.N * x.D;
  if (x.loss_chunks.empty()) {
    // NllLossBackward0: zeros_like(log-probabilities) scattered; then the targets (int64) and
    // the total weight are released, and its input, the loss's gradient.
    t.alloc(logits);
    t.free(8 * x.Ns + 4);
    t.free(4);
    // LogSoftmaxBackward0: its gradient beside NLL's and the kept log-probabilities; then both
    // of those are freed.
    t.alloc(logits);
    t.free(2 * logits);
    // The head's MmBackward0: the rows' gradient and the head's (column-major, viewed back by
    // TBackward0); then the logits' gradient and the kept rows are freed. The tied head's
    // gradient waits in the embedding's AccumulateGrad input buffer, which runs only after
    // EmbeddingBackward0, the last node: 4VD held through the whole backward.
    t.alloc(rows + (x.frozen ? 0 : head));
    t.free(logits + (x.frozen ? 0 : rows));
    // An untied head's gradient reaches its own AccumulateGrad at once.
    if (!x.tied && !x.frozen) accumulate_grad(t, head, first_step);
    // IndexSelectBackward0 (token_loss.cpp:26): zeros [N, D] + index_add; then the rows'
    // gradient and the positions (int64) are freed.
    t.alloc(hidden);
    t.free(rows + 8 * x.Ns);
  } else {
    chunked_loss_backward(t, x, first_step);
  }
}

// Now live: the gradients stolen so far (first step), a tied head's buffered gradient, the
// token embeddings' gradient, the forward's outputs (12 B) and NLL's 4 B root gradient buffer.
// EmbeddingBackward0 (runs last): zeros [V, D] + index_add; its input is freed; the engine's
// InputBuffer then adds it to a tied head's buffered gradient (out of place): three V x D
// tensors at once. AccumulateGrad then steals the result (first step) or adds it in place.
void embedding_backward(Timeline& t, const Lm& x, bool first_step) {
  const int64_t head = e * x.V * x.D, hidden = e * x.N * x.D;
  t.alloc(head);
  t.free(hidden);
  // LibTorch 2.x adds it in place when the buffered head gradient is a sum of loss chunks
  // (owned alone) rather than the unchunked head's transposed view.
  const bool in_place = x.torch2 && !x.loss_chunks.empty();
  if (x.tied && in_place) {
    t.free(head);
  } else if (x.tied) {
    t.alloc(head);
    t.free(2 * head);
  }
  accumulate_grad(t, head, first_step);
}

}  // namespace vlm::memory::replay
