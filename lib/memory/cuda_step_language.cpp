// The decoder of the CUDA step replay (memory/cuda_step_walk.h): the RoPE tables and its blocks
// forward and checkpointed (fused q/k/v and gate/up GEMMs, RoPE, varlen FlashAttention, fused
// RMSNorm), frozen, their backward, and the embedding's backward (with a tied head's gradient).
#include <algorithm>

#include "memory/cuda_step_walk.h"

namespace vlm::memory::cuda {

// --- the decoder ----------------------------------------------------------------------
// RoPE on q then k (language_model.cpp apply_rotary) in elements of `e` bytes: the negated
// half, the cat, two products and their sum; only the rotated tensor stays.
void StepStream::Impl::rotary(DecBlock& b, int64_t e) {
  for (const bool q : {true, false}) {
    const int64_t width = N * (q ? Hq : Hkv) * hd;
    const Id neg = A(width * e / 2), cat = A(width * e);
    F({neg});
    const Id m2 = A(width * e), m1 = A(width * e);
    (q ? b.qrot : b.krot) = A(width * e);
    F({m1, m2, cat});
  }
}

// RoPE's backward on `grad` (q's or k's, freed), in elements of `e` bytes: the rotated input's
// gradient (returned); `tables`: the first layer's q frees the rotary tables on the way.
Id StepStream::Impl::rotary_backward(Id grad, bool q, bool tables, int64_t e) {
  const int64_t width = N * (q ? Hq : Hkv) * hd;
  const Id g1 = A(width * e);
  if (tables) F({cos_b});
  const Id g2 = A(width * e);
  F({grad});
  if (tables) F({sin_b});
  const Id gn = A(width * e / 2), gc = A(width * e);
  F({g2, gn, gc});
  return g1;
}

DecBlock StepStream::Impl::dec_block_grad(bool backward_thread, bool first_layer_of_pass) {
  DecBlock b;
  b.n1 = A(N * D * 4), b.n1r = A(N * 4);
  b.qkv_cat = A(Pq * D * 4), b.qkv_w = A(Pq * D * 2), b.qkv_x = A(N * D * 2);
  b.qkv = A(N * Pq * 2);
  gemm_workspace(backward_thread, false);  // a no-op once the thread has its workspace
  F({b.qkv_cat});
  rotary(b, 2);
  if (first_layer_of_pass) new_bounds(backward_thread);
  b.v = A(N * Hkv * hd * 2);
  b.o = A(N * Hq * hd * 2), b.lse = A(Hq * N * 4), b.r16 = A(kFlashRngStateBytes),
  b.r8 = A(kFlashRngPlaceholderBytes);
  b.o_w = A(D * Hq * hd * 2), b.o_out = A(N * D * 2);
  F({b.qkv});
  b.h = A(N * D * 4);
  F({b.o_out, b.n1});
  b.n2 = A(N * D * 4), b.n2r = A(N * 4);
  b.gu_cat = A(2 * Fm * D * 4), b.gu_w = A(2 * Fm * D * 2), b.gu_x = A(N * D * 2);
  b.gu = A(N * 2 * Fm * 2);
  F({b.gu_cat});
  b.silu = A(N * Fm * 2), b.mul = A(N * Fm * 2);
  b.d_w = A(Fm * D * 2), b.d_out = A(N * D * 2);
  b.out = A(N * D * 4);
  F({b.d_out, b.n2});
  return b;
}

DecBlock StepStream::Impl::dec_block_checkpointed(bool first_layer) {
  DecBlock b;
  b.n1 = A(N * D * 4), b.n1r = A(N * 4);
  F({b.n1r});
  b.qkv_cat = A(Pq * D * 4), b.qkv_w = A(Pq * D * 2), b.qkv_x = A(N * D * 2);
  b.qkv = A(N * Pq * 2);
  gemm_workspace(false, false);
  F({b.qkv_x, b.qkv_w, b.qkv_cat});
  rotary(b, 2);
  if (first_layer) new_bounds(false);
  b.v = A(N * Hkv * hd * 2);
  b.o = A(N * Hq * hd * 2), b.lse = A(Hq * N * 4), b.r16 = A(kFlashRngStateBytes),
  b.r8 = A(kFlashRngPlaceholderBytes);
  F({b.lse, b.r16, b.r8, b.v});
  b.o_w = A(D * Hq * hd * 2), b.o_out = A(N * D * 2);
  F({b.o_w, b.o, b.krot, b.qrot, b.qkv});
  b.h = A(N * D * 4);
  F({b.o_out, b.n1});
  b.n2 = A(N * D * 4), b.n2r = A(N * 4);
  F({b.n2r});
  b.gu_cat = A(2 * Fm * D * 4), b.gu_w = A(2 * Fm * D * 2), b.gu_x = A(N * D * 2);
  b.gu = A(N * 2 * Fm * 2);
  F({b.gu_x, b.gu_w, b.gu_cat});
  b.silu = A(N * Fm * 2), b.mul = A(N * Fm * 2);
  b.d_w = A(Fm * D * 2), b.d_out = A(N * D * 2);
  F({b.d_w, b.mul, b.silu, b.gu});
  b.out = A(N * D * 4);
  F({b.d_out, b.n2, b.h});
  return b;
}

// From the attention output's gradient `dXo`: FlashAttention's varlen backward (cuda_kernels.h)
// and RoPE's, k then q, to the fused q/k/v gradient.
Id StepStream::Impl::attention_backward(const DecBlock& b, Id dXo, bool frees_tables) {
  const Id dq = A(N * Hq * hd * 2), dk = A(N * Hkv * hd * 2), dv = A(N * Hkv * hd * 2);
  const Id sd = A(flash_varlen_softmax_d_bytes(N, S, Hq));
  const Id dqacc = A(flash_varlen_dq_accum_bytes(N, S, Hq, hd));
  if (Hq != Hkv) {  // GQA: dK and dV at the query heads, summed into dk, dv
    const Id dke = A(N * Hq * hd * 2), dve = A(N * Hq * hd * 2);
    F({dve, dke});
  }
  F({dqacc, sd, dXo, b.qrot, b.krot, b.v, b.o, b.lse, b.r16, b.r8});
  const Id gk = rotary_backward(dk, false, false, 2);
  const Id gq = rotary_backward(dq, true, frees_tables, 2);
  const Id gqkv = A(N * Pq * 2);
  F({gq, gk, dv});
  return gqkv;
}

// SwiGLU's backward (silu(gate) * up) from the down projection's input gradient `dXd` (freed),
// in elements of `e` bytes: the fused gate/up gradient (returned).
Id StepStream::Impl::swiglu_backward(const DecBlock& b, Id dXd, int64_t e) {
  const Id gup = A(N * Fm * e), gsilu = A(N * Fm * e);
  F({dXd, b.silu});
  const Id gs = A(N * Fm * e);
  F({gsilu, b.gu});
  const Id ggu = A(N * 2 * Fm * e);
  F({gs, gup});
  return ggu;
}

// One decoder block's backward (the varlen flash backward in the middle); as the ViT's.
Id StepStream::Impl::dec_block_backward(const DecBlock& b, Id G, Id xin, int64_t layer, bool ckpt,
                                        std::vector<Id>& keep) {
  const auto pacc = [&](Id grad) { ckpt ? keep.push_back(grad) : acc(grad); };
  const Id g16 = A(N * D * 2);
  const Id dWd = A(Fm * D * 2);
  gemm_workspace(true, false);
  const Id dXd = A(N * Fm * 2);
  F({g16, b.d_w, b.mul});
  const Id dWd32 = A(Fm * D * 4);
  F({dWd});
  pacc(dWd32);
  const Id ggu = swiglu_backward(b, dXd, 2);
  const Id dWgu = A(2 * Fm * D * 2), dX2 = A(N * D * 2);
  F({ggu, b.gu_w, b.gu_x});
  const Id dX2_32 = A(N * D * 4);
  F({dX2});
  const Id dWgu32 = A(2 * Fm * D * 4);
  F({dWgu});
  pacc(dWgu32);
  const Id dn2 = A(N * D * 4);
  Id dg2 = A(D * 4);
  norm_weight_partials(N, D, dg2);
  F({dX2_32, b.h, b.n2r});
  Id R = G;
  if (ckpt) R = A(N * D * 4);  // summed out of place: the outer node holds the output's
  F({dn2});
  pacc(dg2);
  const Id g16a = A(N * D * 2);
  const Id dWo = A(D * D * 2), dXo = A(N * D * 2);
  F({g16a, b.o_w});
  const Id dWo32 = A(D * D * 4);
  F({dWo});
  pacc(dWo32);
  const Id gqkv = attention_backward(b, dXo, layer == 0 && !ckpt);
  const Id dWqkv = A(Pq * D * 2), dX1 = A(N * D * 2);
  F({gqkv, b.qkv_w, b.qkv_x});
  const Id dX1_32 = A(N * D * 4);
  F({dX1});
  const Id dWqkv32 = A(Pq * D * 4);
  F({dWqkv});
  pacc(dWqkv32);
  const Id dn1 = A(N * D * 4);
  Id dg1 = A(D * 4);
  norm_weight_partials(N, D, dg1);
  if (ckpt) {
    F({dX1_32, b.n1r, dn1});
  } else {
    F({dX1_32, xin, b.n1r, dn1});
  }
  pacc(dg1);
  return R;
}

// A decoder frozen in bf16 storage: a bf16 stream, no casts (the fused projections' weights
// concatenated as they are and kept by the GEMM), the GEMMs' inputs not kept (no weight
// gradient needs them).
DecBlock StepStream::Impl::dec_block_frozen(bool first_layer) {
  DecBlock b;
  b.n1 = A(N * D * 2), b.n1r = A(N * 4);
  b.qkv_cat = A(Pq * D * 2);
  b.qkv = A(N * Pq * 2);
  gemm_workspace(false, false);
  rotary(b, 2);
  if (first_layer) new_bounds(false);
  b.v = A(N * Hkv * hd * 2);
  b.o = A(N * Hq * hd * 2), b.lse = A(Hq * N * 4), b.r16 = A(kFlashRngStateBytes),
  b.r8 = A(kFlashRngPlaceholderBytes);
  b.o_out = A(N * D * 2);
  F({b.qkv});
  b.h = A(N * D * 2);
  F({b.o_out, b.n1});
  b.n2 = A(N * D * 2), b.n2r = A(N * 4);
  b.gu_cat = A(2 * Fm * D * 2);
  b.gu = A(N * 2 * Fm * 2);
  b.silu = A(N * Fm * 2), b.mul = A(N * Fm * 2);
  b.d_out = A(N * D * 2);
  F({b.mul});
  b.out = A(N * D * 2);
  F({b.d_out, b.n2});
  return b;
}

// A frozen block's backward: the inputs' gradients alone, each norm's added in place into the
// residual's gradient.
void StepStream::Impl::dec_block_backward_frozen(const DecBlock& b, Id xin, bool first_layer) {
  const Id dXd = A(N * Fm * 2);
  gemm_workspace(true, false);
  const Id ggu = swiglu_backward(b, dXd, 2);
  const Id dX2 = A(N * D * 2);
  F({ggu, b.gu_cat});
  const Id dn2 = A(N * D * 2);
  F({dX2, b.h, b.n2r, dn2});
  const Id dXo = A(N * D * 2);
  const Id gqkv = attention_backward(b, dXo, first_layer);
  const Id dX1 = A(N * D * 2);
  F({gqkv, b.qkv_cat});
  const Id dn1 = A(N * D * 2);
  F({dX1, xin, b.n1r, dn1});
}

// EmbeddingBackward0 (aten/src/ATen/native/cuda/Embedding.cu) from the token embeddings'
// gradient: the sort path above 3,072 indices, then joined with a tied head's gradient.
void StepStream::Impl::embedding_backward(Id gtok) {
  Id eb_gw = -1;
  if (N > kEmbeddingSortThreshold) {
    const Id sorted = A(N * 8), orig = A(N * 8), range = A(N * 8);
    const Id cub1 = A(embedding_sort_scratch_bytes(N));
    F({cub1, range});
    eb_gw = A(V * D * 4);
    const Id segoff = A(N * 8), nseg = A(8), t1 = A(N * 8);
    const Id cub2 = A(kEmbeddingCubScratchBytes);
    F({cub2, t1});
    // At most min(N, V) segments (distinct rows), each split into partial segments of up to
    // 10 indices (NROWS_PER_THREAD).
    const int64_t segments = std::min(N, V);
    const Id pps = A(segments * 8), ppso = A(segments * 8);
    const Id cub3 = A(kEmbeddingCubScratchBytes);
    F({cub3});
    const Id npseg = A(8);
    const int64_t partial_segments = N / 10 + segments;
    const Id pso = A(partial_segments * 8), gwps = A(partial_segments * D * 4);
    F({gwps, pso, npseg, ppso, pps, nseg, segoff, orig, sorted});
  } else {
    eb_gw = A(V * D * 4);
  }
  F({gtok});
  if (untied) {
    acc(eb_gw);
    return;
  }
  if (!lo.chunks.empty()) {  // the chunks' sum is the buffer: added in place
    F({eb_gw});
    acc(lo.head_grad);
    return;
  }
  const Id eb_sum = A(V * D * 4);
  F({lo.head_grad, eb_gw});
  acc(eb_sum);
}

// The RoPE tables (their bf16 casts kept for every layer under autocast), then the blocks.
Id StepStream::Impl::decoder_forward(Id x) {
  const Id posf = A(N * 4), ang = A(N * hd / 2 * 4);
  F({posf});
  const Id rcat = A(N * hd * 4);
  cos_t = A(N * hd * 4), sin_t = A(N * hd * 4);
  F({rcat, ang});
  if (f32) {  // used as they are, until the first layer's backward
    cos_b = cos_t, sin_b = sin_t;
  } else {
    cos_b = A(N * hd * 2), sin_b = A(N * hd * 2);
  }
  dec.clear();
  dec_inputs.clear();
  for (int64_t l = 0; l < Ll; ++l) {
    dec_inputs.push_back(x);
    dec.push_back(f32        ? (ckpt_l ? dec_block_fp32_nograd() : dec_block_fp32(false))
                  : freeze_l ? dec_block_frozen(l == 0)
                  : ckpt_l   ? dec_block_checkpointed(l == 0)
                             : dec_block_grad(false, l == 0));
    x = dec.back().out;
  }
  return x;
}

// The blocks' backward, last first, from the residual gradient at the final norm's input to the
// one at the decoder's input (returned). A checkpointed block recomputes its forward on the
// backward thread; its parameters' gradients, captured, are accumulated after its node.
Id StepStream::Impl::decoder_backward(Id G) {
  for (int64_t l = Ll; l-- > 0;) {
    std::vector<Id> keep;
    const size_t li = static_cast<size_t>(l);
    if (f32 && ckpt_l) {
      const DecBlock recomputed = dec_block_fp32(true);
      captured = &keep;
      const Id next = dec_block_backward_fp32(recomputed, G, -1, l == 0, true);
      captured = nullptr;
      F({recomputed.out, G, dec_inputs[li]});
      for (const Id k : keep) acc(k);
      G = next;
    } else if (f32) {
      G = dec_block_backward_fp32(dec[li], G, dec_inputs[li], l == 0, false);
    } else if (freeze_l) {
      dec_block_backward_frozen(dec[li], dec_inputs[li], l == 0);
    } else if (ckpt_l) {
      const DecBlock recomputed = dec_block_grad(true, l == Ll - 1);
      const Id next = dec_block_backward(recomputed, G, -1, l, true, keep);
      F({recomputed.out, G, dec_inputs[li]});
      for (const Id k : keep) acc(k);
      G = next;
    } else {
      G = dec_block_backward(dec[li], G, dec_inputs[li], l, false, keep);
    }
  }
  return G;
}

}  // namespace vlm::memory::cuda
