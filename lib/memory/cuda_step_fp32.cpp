// The fp32 path of the CUDA step replay (memory/cuda_step_walk.h): no autocast, so no casts and
// every activation fp32; scaled_dot_product_attention runs the memory-efficient kernel, and the
// decoder's packed attention is the grouped path (model/packed_attention.cpp grouped_attention:
// the segments in groups of similar length, spec/attention_groups.h). Each parameter's gradient
// reaches its AccumulateGrad straight from the node that computes it.
#include "memory/cuda_step_walk.h"
#include "spec/attention_groups.h"

namespace vlm::memory::cuda {

// --- the image path -----------------------------------------------------------------------
// The patch embedding (addmm over the unfolded patches, kept for the weight's gradient), the
// blocks, the final LayerNorm and the projector (pixel shuffle kept for its weight's gradient).
void StepStream::Impl::vit_forward_fp32() {
  chunks.clear();
  VitChunk c;
  c.crops = n;
  c.pe_x = A(nP * K * 4);  // the patches
  const Id pe_out = A(nP * d * 4);
  gemm_workspace(false, true);
  c.x_v0 = A(nP * d * 4);  // + the positions
  F({pe_out});
  for (int64_t l = 0; l < vl; ++l) {
    c.blocks.push_back(ckpt_v ? vit_block_fp32_nograd() : vit_block_fp32(false));
  }
  c.lnf = A(nP * d * 4), c.lnfm = A(nP * 4), c.lnfr = A(nP * 4);
  c.vit_last = c.blocks.empty() ? c.x_v0 : c.blocks.back().out;
  c.mp_w = kNone, c.mp_x = A(nP * d * 4);  // the shuffled rows
  c.mp_out = A(n * Ti * D * 4);
  F({c.lnf});
  chunks.push_back(std::move(c));
}

VitBlock StepStream::Impl::vit_block_fp32(bool recompute) {
  VitBlock b;
  b.ln1 = A(nP * d * 4), b.ln1m = A(nP * 4), b.ln1r = A(nP * 4);
  b.qkv = A(nP * 3 * d * 4);
  if (recompute) gemm_workspace(true, true);  // the backward thread's first addmm
  b.att = A(nP * d * 4), b.lse = A(efficient_lse_bytes(n, h, P));
  b.o_out = A(nP * d * 4);
  b.h = A(nP * d * 4);
  F({b.o_out});
  b.ln2 = A(nP * d * 4), b.ln2m = A(nP * 4), b.ln2r = A(nP * 4);
  b.fc1 = A(nP * m * 4), b.gelu = A(nP * m * 4);
  b.fc2_out = A(nP * d * 4);
  b.out = A(nP * d * 4);
  F({b.fc2_out});
  return b;
}

// A checkpointed block's forward without a graph: no log-sum-exp, everything but the output
// freed as soon as it is used.
VitBlock StepStream::Impl::vit_block_fp32_nograd() {
  VitBlock b;
  b.ln1 = A(nP * d * 4), b.ln1m = A(nP * 4), b.ln1r = A(nP * 4);
  F({b.ln1m, b.ln1r});
  b.qkv = A(nP * 3 * d * 4);
  b.att = A(nP * d * 4);
  b.o_out = A(nP * d * 4);
  F({b.att, b.qkv});
  b.h = A(nP * d * 4);
  F({b.o_out, b.ln1});
  b.ln2 = A(nP * d * 4), b.ln2m = A(nP * 4), b.ln2r = A(nP * 4);
  F({b.ln2m, b.ln2r});
  b.fc1 = A(nP * m * 4), b.gelu = A(nP * m * 4);
  b.fc2_out = A(nP * d * 4);
  F({b.gelu, b.fc1});
  b.out = A(nP * d * 4);
  F({b.fc2_out, b.ln2, b.h});
  return b;
}

// A parameter's gradient: to its AccumulateGrad, or, in a checkpointed block's recompute,
// captured by autograd::grad (accumulated once the node has returned).
void StepStream::Impl::give(Id grad, bool image) {
  if (captured) {
    captured->push_back(grad);
  } else if (image) {
    acc_image(grad);
  } else {
    acc(grad);
  }
}

// A linear's backward (addmm): the input's gradient, the weight's, the bias's (a reduction),
// then the bias's and the weight's AccumulateGrad.
Id StepStream::Impl::addmm_backward_fp32(int64_t rows, int64_t in, int64_t out,
                                         std::initializer_list<Id> released) {
  const Id dx = A(rows * in * 4), dw = A(out * in * 4), db = A(out * 4);
  reduction_staging(out, rows, 4, false);
  F(released);
  give(db, true);
  give(dw, true);
  return dx;
}

// A LayerNorm's backward: the input's gradient added in place into the residual's (or, with
// `out_of_place`, summed with it into a new one, returned: a checkpointed block's outer node
// holds its output's gradient), then the weight's and the bias's AccumulateGrad.
Id StepStream::Impl::layer_norm_backward_fp32(std::initializer_list<Id> released,
                                              bool out_of_place) {
  const Id dn = A(nP * d * 4);
  Id dg = A(d * 4), db = A(d * 4);
  norm_weight_partials(nP, d, dg, &db);
  F(released);
  const Id sum = out_of_place ? A(nP * d * 4) : -1;
  F({dn});
  give(dg, true);
  give(db, true);
  return sum;
}

// One block's backward from the residual gradient `G`, which its norms' gradients join in
// place; a checkpointed block's recompute (its input the node's, not freed here) sums the first
// into a new residual gradient. Returns the residual gradient its input gets.
Id StepStream::Impl::vit_block_backward_fp32(const VitBlock& b, Id G, Id xin, bool ckpt) {
  const Id fc2_dx = addmm_backward_fp32(nP, m, d, {b.gelu});
  const Id gg = A(nP * m * 4);
  F({fc2_dx, b.fc1});
  const Id fc1_dx = addmm_backward_fp32(nP, d, m, {gg, b.ln2});
  const Id sum = layer_norm_backward_fp32({fc1_dx, b.h, b.ln2m, b.ln2r}, ckpt);
  const Id o_dx = addmm_backward_fp32(nP, d, d, {});
  const Id dq = A(nP * d * 4), dk = A(nP * d * 4), dv = A(nP * d * 4);
  efficient_backward_buffers(n, h, P, nP * d * 4);
  F({o_dx, b.qkv, b.lse, b.att});  // q, k, v are views of the projection
  const Id gqkv = A(nP * 3 * d * 4);
  F({dq, dk, dv});
  const Id qkv_dx = addmm_backward_fp32(nP, d, 3 * d, {gqkv, b.ln1});
  if (ckpt) {
    layer_norm_backward_fp32({qkv_dx, b.ln1m, b.ln1r}, false);
    return sum;
  }
  layer_norm_backward_fp32({qkv_dx, xin, b.ln1m, b.ln1r}, false);
  return G;
}

// The memory-efficient backward's own buffers after dq, dk, dv: delta = (grad_out * out).sum(-1)
// transposed to [B, H, L] and made contiguous (a copy unless L or H is 1), and the workspace.
void StepStream::Impl::efficient_backward_buffers(int64_t batch, int64_t heads, int64_t length,
                                                  int64_t output_bytes) {
  const Id product = A(output_bytes), delta = A(batch * heads * length * 4);
  Id contiguous = delta;
  if (length > 1 && heads > 1) {
    contiguous = A(batch * heads * length * 4);
    F({delta});
  }
  F({product});
  const Id workspace = A(efficient_backward_workspace_bytes(batch, heads, length));
  F({contiguous, workspace});
}

// From the residual gradient at the LM input through the projector, the ViT and the patch
// embedding (index_copy's saved source is the projection itself).
void StepStream::Impl::image_backward_fp32(Id G, Id source) {
  const VitChunk& c = chunks.front();
  const Id gimg = A(n * Ti * D * 4);
  F({G, source});
  const Id dWp = A(D * d * ps * ps * 4), dXp = A(nP * d * 4);
  F({gimg, c.mp_x});
  acc_image(dWp);
  const Id gps = A(nP * d * 4);  // the pixel shuffle's gradient (a copy)
  F({dXp});
  const Id RV = A(nP * d * 4);
  Id lnf_dg = A(d * 4), lnf_db = A(d * 4);
  norm_weight_partials(nP, d, lnf_dg, &lnf_db);
  F({gps, c.vit_last, c.lnfm, c.lnfr});
  acc_image(lnf_dg);
  acc_image(lnf_db);
  Id G_v = RV;
  for (int64_t l = vl; l-- > 0;) {
    const size_t li = static_cast<size_t>(l);
    const Id xin = l == 0 ? c.x_v0 : c.blocks[li - 1].out;
    if (!ckpt_v) {
      G_v = vit_block_backward_fp32(c.blocks[li], G_v, xin, false);
      continue;
    }
    const VitBlock recomputed = vit_block_fp32(true);
    std::vector<Id> keep;
    captured = &keep;
    const Id next = vit_block_backward_fp32(recomputed, G_v, -1, true);
    captured = nullptr;
    F({recomputed.out, G_v, xin});
    for (const Id k : keep) acc_image(k);
    G_v = next;
  }
  // The positions' gradient (AddBackward0: the sum over the crops, to its AccumulateGrad; with
  // one crop a view of the residual gradient, which AccumulateGrad clones to keep it as the
  // .grad), then the patch embedding's weight and bias.
  if (n > 1) {
    acc_image(A(P * d * 4));
  } else if (!s.image_grads_) {
    A(P * d * 4);
  }
  const Id pe_dw = A(d * K * 4), pe_db = A(d * 4);
  reduction_staging(d, nP, 4, false);
  F({G_v, c.pe_x});
  acc_image(pe_db);
  acc_image(pe_dw);
}

// --- the decoder --------------------------------------------------------------------------
DecBlock StepStream::Impl::dec_block_fp32(bool backward_thread) {
  DecBlock b;
  b.n1 = A(N * D * 4), b.n1r = A(N * 4);
  b.qkv_cat = A(Pq * D * 4);
  b.qkv = A(N * Pq * 4);
  gemm_workspace(backward_thread, false);  // a text-only micro-batch's first GEMM
  rotary(b, 4);
  grouped_attention(b, true);
  b.o_out = A(N * D * 4);
  F({b.krot, b.qrot, b.qkv});
  b.h = A(N * D * 4);
  F({b.o_out});
  b.n2 = A(N * D * 4), b.n2r = A(N * 4);
  b.gu_cat = A(2 * Fm * D * 4);
  b.gu = A(N * 2 * Fm * 4);
  b.silu = A(N * Fm * 4), b.mul = A(N * Fm * 4);
  b.d_out = A(N * D * 4);
  b.out = A(N * D * 4);
  F({b.d_out});
  return b;
}

// A checkpointed block's forward without a graph.
DecBlock StepStream::Impl::dec_block_fp32_nograd() {
  DecBlock b;
  b.n1 = A(N * D * 4), b.n1r = A(N * 4);
  F({b.n1r});
  b.qkv_cat = A(Pq * D * 4);
  b.qkv = A(N * Pq * 4);
  gemm_workspace(false, false);
  F({b.qkv_cat});
  rotary(b, 4);
  grouped_attention(b, false);
  b.o_out = A(N * D * 4);
  F({b.o, b.krot, b.qrot, b.qkv});
  b.h = A(N * D * 4);
  F({b.o_out, b.n1});
  b.n2 = A(N * D * 4), b.n2r = A(N * 4);
  F({b.n2r});
  b.gu_cat = A(2 * Fm * D * 4);
  b.gu = A(N * 2 * Fm * 4);
  F({b.gu_cat});
  b.silu = A(N * Fm * 4), b.mul = A(N * Fm * 4);
  b.d_out = A(N * D * 4);
  F({b.mul, b.silu, b.gu});
  b.out = A(N * D * 4);
  F({b.d_out, b.n2, b.h});
  return b;
}

// grouped_attention: keys and values repeated to the query heads (expand + clone; token-major
// copies of them when the micro-batch has several rows), then per group, longest first, the
// gather index and the gathers of q, k, v padded to the group's longest, the fused call's
// output and log-sum-exp, the keep index and the group's rows; the rows joined (from two
// groups), the inverse index and its gather: the context.
void StepStream::Impl::grouped_attention(DecBlock& b, bool graph) {
  const int64_t hidden = N * D * 4;
  std::vector<Id> copies;
  if (Hq != Hkv) {
    for (int i = 0; i < (batch_rows > 1 ? 4 : 2); ++i) copies.push_back(A(hidden));
  }
  std::vector<Id> group_rows;
  group_rows.reserve(groups.size());
  b.groups.clear();
  b.groups.reserve(groups.size());
  for (const spec::GroupShape& g : groups) {
    const int64_t padded = g.segments * g.padded, bytes = padded * D * 4;
    DecBlock::Group kept;
    kept.shape = g;
    kept.gather = A(padded * 8);
    kept.q = A(bytes), kept.k = A(bytes), kept.v = A(bytes);
    if (!graph) {  // no log-sum-exp without a graph; the gathers die with the call
      kept.out = A(bytes);
      F({kept.v, kept.k, kept.q});
      kept.keep = A(g.tokens * 8);
      group_rows.push_back(A(g.tokens * D * 4));
      F({kept.keep, kept.out, kept.gather});
      continue;
    }
    kept.out = A(bytes), kept.lse = A(efficient_lse_bytes(g.segments, Hq, g.padded));
    kept.keep = A(g.tokens * 8);
    group_rows.push_back(A(g.tokens * D * 4));
    b.groups.push_back(kept);
  }
  const Id join = group_rows.size() > 1 ? A(hidden) : kNone;
  b.inverse = A(N * 8);
  b.o = A(hidden);  // the context
  if (!graph) F({b.inverse});
  F({join});
  for (const Id r : group_rows) F({r});
  for (size_t i = copies.size(); i-- > 0;) F({copies[i]});
}

// The grouped attention's backward from the context's gradient to the fused q/k/v gradient:
// the inverse gather's, then per group, last first, the keep gather's (the join's gradient goes
// with the group processed last), the fused backward, the three gathers' into q's, k's and v's
// buffers (the first group processed makes them, the others add in place); then the repeats
// summed back, the views' copies, RoPE's.
Id StepStream::Impl::grouped_attention_backward(const DecBlock& b, Id dXo, bool frees_tables) {
  const int64_t hidden = N * D * 4, kv = N * Hkv * hd * 4;
  const Id gctx = A(hidden);
  F({dXo, b.inverse});
  Id buffer[3] = {-1, -1, -1};  // q, k, v
  for (size_t k = b.groups.size(); k-- > 0;) {
    const DecBlock::Group& g = b.groups[k];
    const bool first_processed = k + 1 == b.groups.size();
    const int64_t bytes = g.shape.segments * g.shape.padded * D * 4;
    const Id grad_out = A(bytes);
    if (k == 0) F({gctx});
    F({g.keep});
    const Id dq = A(bytes), dk = A(bytes), dv = A(bytes);
    efficient_backward_buffers(g.shape.segments, Hq, g.shape.padded, bytes);
    F({grad_out, g.k, g.v, g.q, g.lse, g.out});
    const Id grads[3] = {dq, dk, dv};
    for (int i = 0; i < 3; ++i) {
      const Id scattered = A(hidden);
      F({grads[i]});
      if (i == 2) F({g.gather});
      if (first_processed) {
        buffer[i] = scattered;
      } else {
        F({scattered});
      }
    }
  }
  Id g_v = buffer[2], g_k = buffer[1];
  if (Hq != Hkv) {  // ExpandBackward0: v's, then k's
    g_v = A(kv);
    F({buffer[2]});
    g_k = A(kv);
    F({buffer[1]});
  }
  const Id v_view = A(kv);  // ViewBackward0: a copy into v's shape
  F({g_v});
  const Id gk = rotary_backward(g_k, false, false, 4);
  const Id k_view = A(kv);  // ViewBackward0 on k's rotated gradient: a copy
  F({gk});
  const Id gq = rotary_backward(buffer[0], true, frees_tables, 4);
  const Id gqkv = A(N * Pq * 4);
  F({gq, k_view, v_view});
  return gqkv;
}

// A block's backward from the residual gradient `G`; as the ViT's (`ckpt`: a checkpointed
// block's recompute, whose first norm gradient sums into a new residual gradient). Returns the
// residual gradient its input gets.
Id StepStream::Impl::dec_block_backward_fp32(const DecBlock& b, Id G, Id xin, bool first_layer,
                                             bool ckpt) {
  const Id dWd = A(Fm * D * 4), dXd = A(N * Fm * 4);
  gemm_workspace(true, false);
  F({b.mul});
  give(dWd, false);
  const Id ggu = swiglu_backward(b, dXd, 4);
  const Id dWgu = A(2 * Fm * D * 4), dX2 = A(N * D * 4);
  F({ggu, b.gu_cat, b.n2});
  give(dWgu, false);
  const Id dn2 = A(N * D * 4);
  Id dg2 = A(D * 4);
  norm_weight_partials(N, D, dg2);
  F({dX2, b.h, b.n2r});
  const Id R = ckpt ? A(N * D * 4) : G;
  F({dn2});
  give(dg2, false);
  const Id dWo = A(D * D * 4), dXo = A(N * D * 4);
  F({b.o});
  give(dWo, false);
  const Id gqkv = grouped_attention_backward(b, dXo, first_layer && !ckpt);
  const Id dWqkv = A(Pq * D * 4), dX1 = A(N * D * 4);
  F({gqkv, b.qkv_cat, b.n1});
  give(dWqkv, false);
  const Id dn1 = A(N * D * 4);
  Id dg1 = A(D * 4);
  norm_weight_partials(N, D, dg1);
  if (ckpt) {
    F({dX1, b.n1r, dn1});
  } else {
    F({dX1, xin, b.n1r, dn1});
  }
  give(dg1, false);
  return R;
}

}  // namespace vlm::memory::cuda
