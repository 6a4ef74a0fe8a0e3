// The decoder and the loss in the replay of memory/replay.h, forward and backward, one walk for
// every LibTorch version and precision: the blocks (repeated, checkpointed or not, trained,
// frozen or without a graph), the final norm, the loss, and the checkpointed block's frame;
// what a kernel allocates and keeps is the DecoderKernels the walk is given (fp32 on 1.13 and
// 2.x: replay_language_fp32.cpp, replay_language_2x.cpp, replay_rms_norm.cpp, replay_loss.cpp;
// bf16 autocast and a decoder stored in bf16: replay_language_bf16.cpp and
// replay_language_bf16_backward.cpp).
#include "memory/replay.h"

#include "memory/saved_activations.h"
#include "spec/attention_groups.h"
#include "spec/derived.h"

namespace vlm::memory::replay {

Lm lm_of(const MemorySpec& spec, const BatchShape& b) {
  const auto& l = spec.dims.language;
  const int64_t hd = spec::language_head_dim(l);
  Lm x{b.rows,
       b.tokens(),
       l.hidden_size,
       l.num_kv_heads * hd,
       l.mlp_size,
       l.num_heads,
       l.num_kv_heads,
       hd,
       l.num_layers,
       spec::language_vocab_rows(l),
       b.supervised_tokens,
       l.tie_embeddings,
       b.segment_lengths,
       spec.levers.checkpoint_language,
       !spec.language.trainable,
       {},
       spec.precision == ComputePrecision::kBf16,
       spec.threads,
       spec.onednn_bf16};
  x.bf16_storage = !spec.language.trainable && spec.language.parameter_bytes == 2;
  // The 2.x walk covers fp32 products; bf16 ones (autocast, bf16 storage) run in 2.x's bundled
  // oneDNN, whose scratchpads are not replayed yet: they keep 1.13's walk (docs/memory.md).
  x.torch2 = spec.torch.at_least(2, 0) && !x.bf16 && !x.bf16_storage;
  if (x.torch2) {
    for (const spec::GroupShape& g : spec::group_shapes(b.segment_lengths)) {
      x.groups.push_back({g.segments, g.padded, g.tokens});
    }
  }
  x.no_graph = !spec.language.trainable &&
               (b.crops == 0 || !(spec.vision.trainable || spec.projector.trainable));
  const int64_t C = spec.levers.loss_chunk_tokens;
  if (C > 0 && b.supervised_tokens > C) {
    for (int64_t start = 0; start < b.supervised_tokens; start += C) {
      x.loss_chunks.push_back(std::min(C, b.supervised_tokens - start));
    }
  }
  return x;
}

// segment_ids (vision_language_model.cpp:101, packed_attention.cpp:39-46): arange,
// searchsorted and the `- 1` (int64 each), all freed at once; then the RoPE tables
// (language_model.cpp:45-51): angles, their cat, cos and sin; cos and sin stay.
void decoder_prologue(Timeline& t, const Lm& x) {
  const int64_t tables = 2 * e * x.N * x.hd;
  t.transient(3 * 8 * x.N + kWrappedScalar);
  t.transient(e * x.N * x.hd / 2 + e * x.N * x.hd + tables);
  t.alloc(tables);
}

namespace {

const DecoderKernels& kernels_of(const Lm& x) {
  if (x.bf16 || x.bf16_storage) return decoder_kernels_bf16();
  return x.torch2 ? decoder_kernels_fp32_2x() : decoder_kernels_fp32();
}

// The bytes of one value of the residual stream and the loss's rows: bf16 in a decoder stored
// in bf16, fp32 otherwise.
int64_t element_bytes(const Lm& x) { return x.bf16_storage ? 2 : e; }
int64_t stream_bytes(const Lm& x) { return element_bytes(x) * x.N * x.D; }

// The decoder and the loss without a graph (Lm::no_graph): checkpointed() calls each block (and
// each loss chunk) directly, every intermediate dies as it goes, each block's input when `x` is
// reassigned (the LM input is its caller's), and nothing is kept for a backward: the
// log-probabilities and the rows die with their calls. Only the loss and the count stay.
void language_forward_no_graph(Timeline& t, const Lm& x, const DecoderKernels& k) {
  const int64_t stream = stream_bytes(x), tables = 2 * e * x.N * x.hd;
  decoder_prologue(t, x);
  k.block_forward_nograd(t, x);
  t.repeat(x.Ll - 1, [&](Timeline& block) {
    k.block_forward_nograd(block, x);
    block.free(stream);
  });
  k.norm_forward_nograd(t, x);  // the final norm
  t.free(stream + tables);      // the last block's output and the tables, at return
  loss_preparation(t, x);
  if (x.loss_chunks.empty()) {
    k.cross_entropy_nograd(t, x, x.Ns);
    t.free(2 * e * x.Ns * x.V + 4 + 4);  // ... and the zero loss, replaced
  } else {
    for (const int64_t rows : x.loss_chunks) {
      k.cross_entropy_nograd(t, x, rows);
      t.free(2 * e * rows * x.V + 4);
      t.alloc(4);
      t.free(4 + 4);
    }
  }
  // The positions, rows, targets and supervised mask; then hidden.
  t.free(8 * x.Ns + element_bytes(x) * x.Ns * x.D + 8 * x.Ns + x.N);
  t.free(stream);
}

// A checkpointed block's backward (activation_checkpoint.cpp:67-102), from its output's
// gradient: the RNG state the recompute replaces (restored after it), the recompute with a
// graph, then autograd::grad over it, which holds every parameter gradient of the block until
// it returns (captured, not accumulated); the block input is the checkpoint's, released after.
// The same frame around every version's and precision's block.
void checkpointed_block_backward(Timeline& t, const Lm& x, bool first_step,
                                 const DecoderKernels& k) {
  const int64_t parameters =
      x.frozen ? 0 : e * (2 * x.D * x.D + 2 * x.D * x.Dkv + 3 * x.D * x.F + 2 * x.D);
  t.alloc(kCpuRngStateBytes);
  k.block_forward(t, x);
  t.free(kCpuRngStateBytes);
  k.block_backward(t, x, first_step, /*first_block=*/false, /*nested=*/true);
  // The recomputed output, the output's gradient (with the node's inputs), the saved input.
  t.free(3 * stream_bytes(x));
  if (!first_step) t.free(parameters);
}

}  // namespace

// The decoder's and the loss's forward; `t.live` gains their saved bytes (saved_activations,
// checked by the test).
//
// With a trained decoder the maximum is the loss moment (logits beside the kept
// log-probabilities, with `hidden` and the mask) unless the image path's peak is higher: every
// earlier moment's transient is smaller than what the forward saves after it. The earlier
// moments (segment_ids, RoPE, the blocks' rotary and attention tops) follow the per-op
// accounting of docs/memory.md and are kept in the replay; the attention tops were checked to
// the byte against the allocator block by block. With very few supervised tokens the top is
// instead `supervised.sum()` (token_loss.cpp:30), which casts the mask to int64 (8N bytes).
void language_forward(Timeline& t, const Lm& x) {
  const DecoderKernels& k = kernels_of(x);
  if (x.no_graph) return language_forward_no_graph(t, x, k);
  const int64_t stream = stream_bytes(x);
  decoder_prologue(t, x);
  if (x.bf16_storage && !x.checkpoint) {
    // Nothing keeps a block's bf16 input (its norm keeps an fp32 copy): it dies when `x` is
    // reassigned, but the LM input, which its caller holds.
    k.block_forward(t, x);
    t.repeat(x.Ll - 1, [&](Timeline& block) {
      k.block_forward(block, x);
      block.free(stream);
    });
  } else {
    t.repeat(x.Ll, [&](Timeline& block) {
      if (x.checkpoint) {
        block.alloc(kCpuRngStateBytes);  // kept by the block's CheckpointFunction
        k.block_forward_nograd(block, x);
      } else {
        k.block_forward(block, x);
      }
    });
  }
  // The final norm (language_model.cpp:147); `hidden` lives until forward_embeddings returns
  // (vision_language_model.cpp:103-107), through the loss.
  k.norm_forward(t, x);
  // Products that keep bf16 copies keep no fp32 RoPE table: the tables die with the forward's
  // scope, unless the checkpointed blocks' closures keep them.
  if (k.tables_die_with_forward && !x.checkpoint) t.free(2 * e * x.N * x.hd);
  k.loss_forward(t, x);
  t.free(x.N);     // supervised
  t.free(stream);  // hidden
}

// Backward of the loss, the head and the final norm, then the blocks, last first; each ends
// with its input's gradient live.
void language_backward(Timeline& t, const Lm& x, bool first_step) {
  const DecoderKernels& k = kernels_of(x);
  objective_backward(t);
  k.loss_backward(t, x, first_step);
  k.norm_backward(t, x, first_step);
  if (x.checkpoint) {
    t.repeat(x.Ll, [&](Timeline& block) { checkpointed_block_backward(block, x, first_step, k); });
  } else {
    t.repeat(x.Ll - 1, [&](Timeline& block) {
      k.block_backward(block, x, first_step, /*first_block=*/false, /*nested=*/false);
    });
    k.block_backward(t, x, first_step, /*first_block=*/true, /*nested=*/false);
  }
}

}  // namespace vlm::memory::replay
