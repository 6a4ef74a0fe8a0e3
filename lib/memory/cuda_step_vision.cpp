// The image path of the CUDA step replay (memory/cuda_step_walk.h): the ViT's blocks forward,
// checkpointed and frozen, chunk by chunk, the projector and the image embeddings merged into
// the token embeddings, and their backward with each parameter's gradient gathered over the
// chunks.
#include <algorithm>

#include "memory/cuda_step_walk.h"

namespace vlm::memory::cuda {

// A block under autograd (the forward, or a checkpointed block's recompute).
// `cast`: the chunk that casts the block's weights and biases (the first: autocast caches the
// casts of leaf parameters for its scope, and the later chunks reuse them).
VitBlock StepStream::Impl::vit_block_grad(bool recompute, bool cast) {
  const auto C = [&](int64_t bytes) { return cast ? A(bytes) : kNone; };
  VitBlock b;
  b.ln1 = A(nP * d * 4), b.ln1m = A(nP * 4), b.ln1r = A(nP * 4);
  b.qkv_b = C(3 * d * 2), b.qkv_w = C(3 * d * d * 2), b.qkv_x = A(nP * d * 2);
  b.qkv = A(nP * 3 * d * 2);
  if (recompute) gemm_workspace(true, true);
  b.att = A(nP * d * 2), b.lse = A(n * h * P * 4), b.r16 = A(kFlashRngStateBytes),
  b.r8 = A(kFlashRngPlaceholderBytes);
  b.o_b = C(d * 2), b.o_w = C(d * d * 2), b.o_out = A(nP * d * 2);
  b.h = A(nP * d * 4);
  F({b.o_out, b.ln1});
  b.ln2 = A(nP * d * 4), b.ln2m = A(nP * 4), b.ln2r = A(nP * 4);
  b.fc1_b = C(m * 2), b.fc1_w = C(m * d * 2), b.fc1_x = A(nP * d * 2);
  b.fc1 = A(nP * m * 2), b.gelu = A(nP * m * 2);
  b.fc2_b = C(d * 2), b.fc2_w = C(d * m * 2), b.fc2_out = A(nP * d * 2);
  b.out = A(nP * d * 4);
  F({b.fc2_out, b.ln2});
  b.cached = {b.qkv_b, b.o_b, b.fc1_b, b.fc2_b};
  return b;
}

// A checkpointed block's forward without a graph; the weights still require a gradient, so
// autocast caches their casts until the forward's end (`cast`: the first chunk makes them).
VitBlock StepStream::Impl::vit_block_checkpointed(bool cast) {
  const auto C = [&](int64_t bytes) { return cast ? A(bytes) : kNone; };
  VitBlock b;
  b.ln1 = A(nP * d * 4), b.ln1m = A(nP * 4), b.ln1r = A(nP * 4);
  F({b.ln1m, b.ln1r});
  b.qkv_b = C(3 * d * 2), b.qkv_w = C(3 * d * d * 2), b.qkv_x = A(nP * d * 2);
  b.qkv = A(nP * 3 * d * 2);
  F({b.qkv_x});
  b.att = A(nP * d * 2), b.lse = A(n * h * P * 4), b.r16 = A(kFlashRngStateBytes),
  b.r8 = A(kFlashRngPlaceholderBytes);
  F({b.lse, b.r16, b.r8});
  b.o_b = C(d * 2), b.o_w = C(d * d * 2), b.o_out = A(nP * d * 2);
  F({b.att, b.qkv});
  b.h = A(nP * d * 4);
  F({b.o_out, b.ln1});
  b.ln2 = A(nP * d * 4), b.ln2m = A(nP * 4), b.ln2r = A(nP * 4);
  F({b.ln2m, b.ln2r});
  b.fc1_b = C(m * 2), b.fc1_w = C(m * d * 2), b.fc1_x = A(nP * d * 2);
  b.fc1 = A(nP * m * 2);
  F({b.fc1_x});
  b.gelu = A(nP * m * 2);
  b.fc2_b = C(d * 2), b.fc2_w = C(d * m * 2), b.fc2_out = A(nP * d * 2);
  F({b.gelu, b.fc1});
  b.out = A(nP * d * 4);
  F({b.fc2_out, b.ln2, b.h});
  b.cached = {b.qkv_b, b.qkv_w, b.o_b, b.o_w, b.fc1_b, b.fc1_w, b.fc2_b, b.fc2_w};
  return b;
}

// A frozen ViT's block (no autograd). fp32 weights: each linear casts its bias, weight and
// input and frees them after the GEMM; bf16 weights: nothing cast but the LayerNorms'
// parameters and input (autocast's fp32 list), and the residual stream is bf16.
Id StepStream::Impl::vit_block_frozen(Id x) {
  const int64_t stream = vit_frozen_bf16 ? 2 : 4;
  const auto layer_norm = [&] {
    Id w32 = -1, b32 = -1, x32 = -1;
    if (vit_frozen_bf16) w32 = A(d * 4), b32 = A(d * 4), x32 = A(nP * d * 4);
    const Id out = A(nP * d * 4), mean = A(nP * 4), rstd = A(nP * 4);
    F({mean, rstd});
    if (vit_frozen_bf16) F({x32, b32, w32});
    return out;
  };
  const auto linear = [&](int64_t in, int64_t out_width, bool cast_input) {
    Id bias = -1, weight = -1, input = -1;
    if (!vit_frozen_bf16) bias = A(out_width * 2), weight = A(out_width * in * 2);
    if (cast_input) input = A(nP * in * 2);
    const Id out = A(nP * out_width * 2);
    if (cast_input) F({input});
    if (!vit_frozen_bf16) F({weight, bias});
    return out;
  };
  const Id ln1 = layer_norm();
  const Id qkv = linear(d, 3 * d, true);
  const Id att = A(nP * d * 2), lse = A(n * h * P * 4), r16 = A(kFlashRngStateBytes),
           r8 = A(kFlashRngPlaceholderBytes);
  F({lse, r16, r8});
  const Id o = linear(d, d, false);
  F({att, qkv});
  const Id hidden = A(nP * d * stream);
  F({o, ln1});
  const Id ln2 = layer_norm();
  const Id fc1 = linear(d, m, true);
  const Id gelu = A(nP * m * 2);
  const Id fc2 = linear(m, d, false);
  F({gelu, fc1});
  const Id out = A(nP * d * stream);
  F({fc2, ln2, hidden});
  F({x});  // the block input: the caller's variable is reassigned
  return out;
}

// The ViT to its final LayerNorm's output; the casts autocast caches are returned.
std::vector<Id> StepStream::Impl::vit_forward() {
  std::vector<Id> cache;
  if (f32) {
    vit_forward_fp32();
    return cache;
  }
  if (freeze_v) {
    Id crops16 = -1, x = -1;
    if (vit_frozen_bf16) {
      crops16 = A(n * 3 * img * img * 2);
      const Id patches = A(nP * K * 2);
      const Id pe_out = A(nP * d * 2);
      gemm_workspace(false, true);
      x = A(nP * d * 2);
      F({pe_out, patches});
    } else {
      const Id patches = A(nP * K * 4);
      const Id pe_b = A(d * 2), wc = A(d * K * 2), px = A(nP * K * 2);
      const Id pe_out = A(nP * d * 2);
      gemm_workspace(false, true);
      F({px, wc, pe_b});
      x = A(nP * d * 4);
      F({pe_out, patches});
    }
    for (int64_t l = 0; l < vl; ++l) x = vit_block_frozen(x);
    Id w32 = -1, b32 = -1, x32 = -1;
    if (vit_frozen_bf16) w32 = A(d * 4), b32 = A(d * 4), x32 = A(nP * d * 4);
    lnf = A(nP * d * 4), lnfm = A(nP * 4), lnfr = A(nP * 4);
    F({lnfm, lnfr});
    if (vit_frozen_bf16) F({x32, b32, w32});
    F({x});
    if (vit_frozen_bf16) F({crops16});  // chunk.to(bf16) dies with the ViT call's statement
    return cache;
  }
  // Trained: chunk by chunk (VisionLanguageModel::encode_crops), each through the patch
  // embedding, the blocks, the final LayerNorm and the projector; the first chunk casts the
  // weights and biases, which autocast caches for the rest (the patch kernel and the
  // projector's weight are views, cast anew per chunk).
  const int64_t total = n, per = s.spec_.levers.vision_chunk_crops;
  chunks.clear();
  for (int64_t first = 0; first < total; first += (per > 0 ? per : total)) {
    VitChunk c;
    c.crops = per > 0 ? std::min(per, total - first) : total;
    set_chunk(c.crops);
    const bool cast = chunks.empty();
    const Id patches = A(nP * K * 4);
    const Id pe_b = cast ? A(d * 2) : kNone;
    const Id pe_wc = A(d * K * 2);
    c.pe_x = A(nP * K * 2);
    const Id pe_out = A(nP * d * 2);
    gemm_workspace(false, true);
    F({pe_wc});
    c.x_v0 = A(nP * d * 4);
    F({pe_out, patches});
    if (pe_b != kNone) cache.push_back(pe_b);
    for (int64_t l = 0; l < vl; ++l) {
      c.blocks.push_back(ckpt_v ? vit_block_checkpointed(cast) : vit_block_grad(false, cast));
      for (const Id k : c.blocks.back().cached) {
        if (k != kNone) cache.push_back(k);
      }
    }
    c.lnf = A(nP * d * 4), c.lnfm = A(nP * 4), c.lnfr = A(nP * 4);
    c.vit_last = c.blocks.empty() ? c.x_v0 : c.blocks.back().out;
    // The projector (pixel shuffle, a bias-free linear): its weight's cast is kept per chunk.
    const Id shuffled = A(nP * d * 4);
    c.mp_w = A(D * d * ps * ps * 2), c.mp_x = A(nP * d * 2);
    c.mp_out = A(n * Ti * D * 2);
    F({shuffled, c.lnf});
    chunks.push_back(std::move(c));
  }
  set_chunk(total);
  return cache;
}

StepStream::Impl::AddmmGrads StepStream::Impl::addmm_backward(int64_t in, int64_t out) {
  AddmmGrads g{A(nP * in * 2), A(out * in * 2), A(out * 2)};
  reduction_staging(out, nP, 2, false);
  return g;
}

// One ViT block's backward from the residual gradient `G` (shared, accumulated in place;
// checkpointed: the node's own, and the block's gradients are captured, returned in `keep`),
// for the chunk at `place`, gathering the parameters' gradients in `grads`.
Id StepStream::Impl::vit_block_backward(const VitBlock& b, Id G, Id xin, bool ckpt,
                                        std::vector<Id>& keep, const Place& place,
                                        BlockGrads& grads) {
  // A linear's weight and bias gradients (bf16, of the cached casts) gathered over the chunks;
  // once the last has added its own, converted to fp32 (ToCopyBackward0), weight first. A
  // checkpointed block's are captured by autograd::grad instead (one chunk).
  const auto gather = [&](LinearGrads& g, Id dw, Id db, int64_t in, int64_t out) {
    if (ckpt) {  // the chunk's recompute is a graph of its own
      g.b = db, g.w = dw;
      return;
    }
    join(g.b, db, out * 2, place, true);
    join(g.w, dw, out * in * 2, place, true);
  };
  const auto to_fp32 = [&](LinearGrads& g, int64_t in, int64_t out) {
    if (!ckpt && !place.last()) return;
    if (ckpt) {
      const Id w32 = A(out * in * 4);
      F({g.w});
      keep.push_back(w32);
      const Id b32 = A(out * 4);
      F({g.b});
      keep.push_back(b32);
      return;
    }
    convert(g.w, out * in * 4);
    convert(g.b, out * 4);
  };
  const auto layer_norm = [&](Id& g_buffer, Id& b_buffer, Id dg, Id db) {
    if (ckpt) {
      keep.push_back(dg);
      keep.push_back(db);
      return;
    }
    join(g_buffer, dg, d * 4, place, false);
    join(b_buffer, db, d * 4, place, false);
    if (place.last()) {
      acc_image(g_buffer);
      acc_image(b_buffer);
    }
  };
  const Id g16 = A(nP * d * 2);
  const AddmmGrads fc2 = addmm_backward(m, d);
  F({g16, b.gelu, b.fc2_w});
  gather(grads.fc2, fc2.dw, fc2.db, m, d);
  to_fp32(grads.fc2, m, d);
  const Id gg = A(nP * m * 2);
  F({fc2.dx, b.fc1});
  const AddmmGrads fc1 = addmm_backward(d, m);
  F({gg, b.fc1_x, b.fc1_w});
  gather(grads.fc1, fc1.dw, fc1.db, d, m);
  const Id fc1_dx32 = A(nP * d * 4);
  F({fc1.dx});
  to_fp32(grads.fc1, d, m);
  const Id dn2 = A(nP * d * 4);
  Id dg2 = A(d * 4), db2 = A(d * 4);
  norm_weight_partials(nP, d, dg2, &db2);
  F({fc1_dx32, b.h, b.ln2m, b.ln2r});
  Id R = G;
  if (ckpt) {
    R = A(nP * d * 4);  // summed out of place: the outer node holds the output's gradient
  }
  F({dn2});
  layer_norm(grads.ln2_g, grads.ln2_b, dg2, db2);
  const Id g16a = A(nP * d * 2);
  const AddmmGrads o = addmm_backward(d, d);
  F({g16a, b.o_w});
  gather(grads.o, o.dw, o.db, d, d);
  to_fp32(grads.o, d, d);
  // Flash attention's backward (sdpa on [n, h, P, d/h], bf16).
  const Id dq = A(nP * d * 2), dk = A(nP * d * 2), dv = A(nP * d * 2);
  const Id sd = A(flash_softmax_d_bytes(n, P, h));
  const Id dqacc = A(flash_dq_accum_bytes(n, P, h, d / h));
  F({dqacc, sd, o.dx, b.qkv, b.lse, b.att, b.r16, b.r8});
  const Id gqkv = A(nP * 3 * d * 2);
  F({dq, dk, dv});
  const AddmmGrads qkv = addmm_backward(d, 3 * d);
  F({gqkv, b.qkv_x, b.qkv_w});
  gather(grads.qkv, qkv.dw, qkv.db, d, 3 * d);
  const Id qkv_dx32 = A(nP * d * 4);
  F({qkv.dx});
  to_fp32(grads.qkv, d, 3 * d);
  const Id dn1 = A(nP * d * 4);
  Id dg1 = A(d * 4), db1 = A(d * 4);
  norm_weight_partials(nP, d, dg1, &db1);
  if (ckpt) {
    F({qkv_dx32, b.ln1m, b.ln1r, dn1});
  } else {
    F({qkv_dx32, xin, b.ln1m, b.ln1r, dn1});
  }
  layer_norm(grads.ln1_g, grads.ln1_b, dg1, db1);
  return R;
}

// From the residual gradient at the LM input: the image embeddings' gradient through the
// projector and the ViT.
void StepStream::Impl::image_backward(Id G, Id source, Id mp_w, Id mp_x) {
  Id gimg16 = -1;
  if (freeze_l) {  // a bf16 stream: the gradient is the projection's type
    gimg16 = A(n * Ti * D * 2);
    F({G, source});
  } else {
    const Id gimg = A(n * Ti * D * 4);
    F({G, source});
    gimg16 = A(n * Ti * D * 2);
    F({gimg});
  }
  if (freeze_v) {
    const Id dWp = A(D * d * ps * ps * 2);
    F({gimg16, mp_x});
    const Id dWp32 = A(D * d * ps * ps * 4);
    F({dWp});
    acc_image(dWp32);
    return;
  }
  // The chunks last first: each parameter's gradient gathered over them (Place, join), the
  // shared casts' converted to fp32 once the first chunk, processed last, has added its own.
  const int64_t total = n;
  ImageGrads grads(static_cast<size_t>(vl));
  for (size_t k = chunks.size(); k-- > 0;) {
    const VitChunk& c = chunks[k];
    const Place place{chunks.size() - 1 - k, chunks.size()};
    set_chunk(c.crops);
    const Id dWp = A(D * d * ps * ps * 2), dXp = A(nP * d * 2);
    if (place.last()) F({gimg16});
    F({c.mp_w, c.mp_x});
    const Id dXp32 = A(nP * d * 4);
    F({dXp});
    const Id dWp32 = A(D * d * ps * ps * 4);
    F({dWp});
    join(grads.projector, dWp32, D * d * ps * ps * 4, place, true);
    if (place.last()) acc_image(grads.projector);
    const Id gps = A(nP * d * 4);
    F({dXp32});
    const Id RV = A(nP * d * 4);
    Id lnf_dg = A(d * 4), lnf_db = A(d * 4);
    norm_weight_partials(nP, d, lnf_dg, &lnf_db);
    F({gps, c.vit_last, c.lnfm, c.lnfr});
    join(grads.lnf_g, lnf_dg, d * 4, place, false);
    join(grads.lnf_b, lnf_db, d * 4, place, false);
    if (place.last()) {
      acc_image(grads.lnf_g);
      acc_image(grads.lnf_b);
    }
    G = RV;
    for (int64_t l = vl; l-- > 0;) {
      const size_t li = static_cast<size_t>(l);
      const Id xin = l == 0 ? c.x_v0 : c.blocks[li - 1].out;
      std::vector<Id> keep;
      if (ckpt_v) {
        const VitBlock recomputed = vit_block_grad(true);
        for (const Id cached : recomputed.cached) F({cached});
        const Id next = vit_block_backward(recomputed, G, -1, true, keep, place, grads.blocks[li]);
        F({recomputed.out, G, xin});
        // The chunks' nodes feed each parameter's AccumulateGrad: the first chunk's gradient
        // is its input buffer, the others are added into it, and it runs after the last.
        std::vector<Id>& buffers = grads.blocks[li].captured;
        buffers.resize(keep.size(), -1);
        for (size_t i = 0; i < keep.size(); ++i) {
          join(buffers[i], keep[i], 0, place, false);
          if (place.last()) acc_image(buffers[i]);
        }
        G = next;
      } else {
        G = vit_block_backward(c.blocks[li], G, xin, false, keep, place, grads.blocks[li]);
      }
    }
    patch_embedding_backward(c, G, place, grads);
  }
  set_chunk(total);
}

// The patch embedding's backward from the residual gradient `G` at the ViT's input (freed):
// the positions' gradient, the kernel's (a view, cast per chunk) and the bias's (a cached cast).
void StepStream::Impl::patch_embedding_backward(const VitChunk& c, Id G, const Place& place,
                                                ImageGrads& grads) {
  // With one crop the positions' gradient (a sum over the crops) is a view of the residual
  // gradient: nothing allocated, and the residual gradient stays as long as it is buffered.
  const Id pe_g16 = A(nP * d * 2);
  Id pe_gpos = G;
  if (n > 1) {
    pe_gpos = A(P * d * 4);
    F({G});
  } else if (place.first()) {
    grads.positions_shared = true;
  }
  // Added in place even into a buffered view (a one-crop chunk processed first: the trace of
  // tiny-bf16-vitchunk8's step 3, 57 crops in chunks of 8, says so).
  join(grads.positions, pe_gpos, P * d * 4, place, false);
  if (place.last()) {
    // AccumulateGrad cannot take over a shared gradient as the .grad: it clones it.
    if (grads.positions_shared && !s.image_grads_) {
      A(P * d * 4);
      F({grads.positions});
    } else {
      acc_image(grads.positions);
    }
  }
  const Id pe_dW = A(d * K * 2), pe_db = A(d * 2);
  reduction_staging(d, nP, 2, false);
  F({pe_g16, c.pe_x});
  join(grads.pe_b, pe_db, d * 2, place, true);
  const Id pe_dW32 = A(d * K * 4);
  F({pe_dW});
  if (place.last()) convert(grads.pe_b, d * 4);
  join(grads.pe_w, pe_dW32, d * K * 4, place, true);
  if (place.last()) acc_image(grads.pe_w);
}

// The token embeddings, then with crops the image path and the projector, and index_copy of
// the image embeddings into the token embeddings: the decoder's input.
StepStream::Impl::Embedded StepStream::Impl::embed() {
  Embedded e;
  const Id emb = A(N * D * es);
  e.merged = emb;
  if (n == 0) return e;  // a text-only micro-batch skips the image path entirely
  e.cache = vit_forward();
  Id embeddings = kNone;
  if (freeze_v) {
    // The projector (pixel shuffle, a bias-free linear) after the frozen ViT.
    const Id shuffled = A(nP * d * 4);
    e.mp_w = A(D * d * ps * ps * 2), e.mp_x = A(nP * d * 2);
    embeddings = A(n * Ti * D * 2);
    F({e.mp_w});  // W.t() is a view: not saved when the input needs no gradient
    F({shuffled, lnf});
  } else if (chunks.size() == 1) {
    embeddings = chunks.front().mp_out;
  } else {  // the chunks' projections concatenated (torch::cat)
    embeddings = A(n * Ti * D * 2);
    for (const VitChunk& c : chunks) F({c.mp_out});
  }
  // index_copy keeps its source for the backward: the embeddings as the stream's type.
  if (freeze_l || f32) {
    e.source = embeddings, e.merged = A(N * D * es);
    F({emb});
  } else {
    e.source = A(n * Ti * D * 4), e.merged = A(N * D * 4);
    F({embeddings, emb});
  }
  return e;
}

}  // namespace vlm::memory::cuda
