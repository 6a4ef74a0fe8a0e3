// The loss of the CUDA step replay (memory/cuda_step_walk.h): the supervised rows through the
// head and cross-entropy (model/token_loss.cpp), whole or in checkpointed chunks of
// model.loss_chunk_tokens, and their backward to the final norm's output.
#include <algorithm>

#include "memory/cuda_step_walk.h"

namespace vlm::memory::cuda {

void StepStream::Impl::loss_forward(Id nf) {
  lo = Loss{};
  lo.ne = A(N), lo.rows = A(L * D * es), lo.tgt = A(L * 8);
  const Id hsum = A(4);  // hidden.sum(): the zero loss of a batch without supervised tokens
  reduction_staging(1, N * D, 4, true);
  const Id zero = A(4), count = A(8), count_cast = A(N * 8);
  F({count_cast});
  F({hsum});
  const int64_t chunk = s.spec_.levers.loss_chunk_tokens;
  if (f32) {  // no casts: the logits are fp32 from the GEMM, which keeps the rows
    const Id logits = A(L * V * 4);
    lo.lsm = A(L * V * 4), lo.loss = A(4), lo.tw = A(4);
    F({logits, zero, lo.ne, nf, count});
    return;
  }
  if (chunk <= 0 || L <= chunk) {
    // summed_cross_entropy under autograd: the head's cast and the rows' are kept by the GEMM
    // (a frozen bf16 head casts nothing, and its GEMM keeps no input), log_softmax keeps its
    // output, nll_loss its total weight.
    if (!freeze_l) lo.hw = A(V * D * 2), lo.rows_b = A(L * D * 2);
    const Id lg16 = A(L * V * 2), lg32 = A(L * V * 4);
    F({lg16});
    lo.lsm = A(L * V * 4), lo.loss = A(4), lo.tw = A(4);
    F({lg32, zero, lo.rows, lo.ne, nf, count});
    return;
  }
  // In chunks, each under checkpointed(): the forward keeps nothing but the running sum; the
  // chunks' views keep the rows, their closures the targets.
  for (int64_t start = 0; start < L; start += chunk)
    lo.chunks.push_back(std::min(chunk, L - start));
  Id sum = zero;
  for (const int64_t c : lo.chunks) {
    const Id hw = A(V * D * 2), rb = A(c * D * 2), lg16 = A(c * V * 2);
    F({rb, hw});
    const Id lg32 = A(c * V * 4);
    F({lg16});
    const Id lsm = A(c * V * 4), nll = A(4), tw = A(4);
    F({tw, lsm, lg32});
    const Id next = A(4);  // loss.sum + chunk_sum
    F({sum, nll});
    sum = next;
  }
  lo.loss = sum;
  F({lo.ne, nf, count});
}

Id StepStream::Impl::loss_backward() {
  lo.obj = A(4), lo.seed = A(4);
  const Id gmul = A(4);
  if (lo.chunks.empty()) {
    const Id gnll = A(L * V * 4);
    F({gmul, lo.tgt, lo.tw});
    const Id glsm = A(L * V * 4);
    F({gnll, lo.lsm});
    if (f32) {
      lo.head_grad = A(V * D * 4);
      gemm_workspace(true, false);
      const Id drows = A(L * D * 4);
      F({glsm, lo.rows});
      if (untied) acc(lo.head_grad);
      const Id gh = A(N * D * 4);
      F({drows});
      return gh;
    }
    const Id glg16 = A(L * V * 2);
    F({glsm});
    if (freeze_l) {  // the rows' gradient alone, in the stream's type
      const Id drows = A(L * D * 2);
      gemm_workspace(true, false);
      F({glg16});
      const Id gh = A(N * D * 2);
      F({drows});
      return gh;
    }
    const Id dhw = A(V * D * 2);
    gemm_workspace(true, false);
    const Id drows = A(L * D * 2);
    F({glg16, lo.hw, lo.rows_b});
    const Id drows32 = A(L * D * 4);
    F({drows});
    lo.head_grad = A(V * D * 4);
    F({dhw});
    if (untied) acc(lo.head_grad);  // AccumulateGrad runs as soon as it is ready
    const Id gh = A(N * D * 4);  // index_select's backward
    F({drows32});
    return gh;
  }
  // The chunks' nodes, the last chunk first: each recomputes its chunk under autograd and runs
  // its backward; the head's gradients join one input buffer (Impl::join; not a view, but
  // the second is summed out of place as the ViT's views are), the rows' (narrow's backward:
  // a zeroed [L, D] each) another, added in place.
  Id rows_grad = -1;
  Place place;
  place.count = lo.chunks.size();
  for (size_t k = lo.chunks.size(); k-- > 0; ++place.processed) {
    const int64_t c = lo.chunks[k];
    const Id hw = A(V * D * 2), rb = A(c * D * 2), lg16 = A(c * V * 2);
    gemm_workspace(true, false);  // the recompute's GEMM runs on the backward thread
    const Id lg32 = A(c * V * 4);
    F({lg16});
    const Id lsm = A(c * V * 4), nll = A(4), tw = A(4);
    F({lg32});
    const Id gnll = A(c * V * 4);
    F({tw});
    const Id glsm = A(c * V * 4);
    F({gnll, lsm});
    const Id glg16 = A(c * V * 2);
    F({glsm});
    const Id dhw = A(V * D * 2), drows = A(c * D * 2);
    F({glg16, hw, rb});
    const Id drows32 = A(c * D * 4);
    F({drows});
    const Id dhw32 = A(V * D * 4);
    F({dhw});
    F({nll});
    if (place.last()) F({lo.rows});  // the first chunk's view was the rows' last holder
    join(lo.head_grad, dhw32, V * D * 4, place, /*view=*/true);
    if (untied && place.last()) acc(lo.head_grad);
    const Id zeros = A(L * D * 4);
    F({drows32});
    if (place.first()) {
      rows_grad = zeros;
    } else {
      F({zeros});
    }
  }
  // The zero loss's product (hidden.sum() * 0.0) takes the loss's gradient, then the rows'
  // gradient scattered to the hidden states and summed with the sum's expanded one.
  const Id zero_grad = A(4);
  F({gmul});
  const Id gh = A(N * D * 4);
  F({rows_grad});
  const Id summed = A(N * D * 4);
  F({zero_grad, gh});
  lo.held_targets = lo.tgt;  // the closures hold them until the graph goes
  return summed;
}

}  // namespace vlm::memory::cuda
