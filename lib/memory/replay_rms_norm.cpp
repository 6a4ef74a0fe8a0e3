// RMSNorm on an fp32 input (language_model.cpp RMSNormImpl::forward: x^2, its mean, + eps,
// rsqrt, x * r, * w), op by op as the CPU runs it in either precision, in the replay of
// memory/replay.h: LibTorch 1.13's (MeanBackward1 keeps x^2; the engine sums x's gradients out
// of place) and 2.x's (x^2 dies in the forward; in-place sums). The one place that says what
// RMSNorm allocates on the CPU.
#include "memory/replay.h"

namespace vlm::memory::replay {

// --- LibTorch 1.13 -------------------------------------------------------------------------

// RMSNorm forward (language_model.cpp:33-37) on an fp32 input: x^2 (kept by MeanBackward1),
// its mean, the mean + eps (with the wrapped eps), rsqrt (kept), x * r (kept); the mean and
// mean + eps die at the end of the statement (:35). Then n * w, the output.
void rms_norm_forward(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, row = e * x.N;
  t.alloc(hidden);                        // sq = x^2
  t.transient(2 * row + kWrappedScalar);  // mean, wrapped eps, mean + eps
  t.transient(3 * row + hidden);          // mean, mean + eps, r, n: the statement's top
  t.alloc(row + hidden);                  // r and n stay (saved)
  t.alloc(hidden);                        // y = n * w
}

// RMSNorm forward without a graph (inside a checkpointed block's forward): x^2, its mean, the
// mean + eps, rsqrt and x * r, then the statement's temporaries die; n * w; n dies at return.
void rms_norm_forward_nograd(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, row = e * x.N;
  t.alloc(hidden + row);  // x^2, its mean
  t.alloc(kWrappedScalar + row);
  t.free(kWrappedScalar);
  t.alloc(row + hidden);     // rsqrt, x * r
  t.free(hidden + 3 * row);  // x^2, mean, mean + eps, rsqrt
  t.alloc(hidden);           // y = n * w
  t.free(hidden);            // n
}

// RMSNorm forward with a frozen weight (a gradient still flows through it): x^2 and rsqrt kept
// as when trained, but n (x * r) is kept by nobody (the frozen weight's product keeps the
// weight only) and dies at return; y is kept by nobody either.
void rms_norm_forward_frozen(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, row = e * x.N;
  t.alloc(hidden + row);  // x^2 (kept), its mean
  t.alloc(kWrappedScalar + row);
  t.free(kWrappedScalar);
  t.alloc(row + hidden);  // rsqrt (kept), n
  t.free(2 * row);        // mean, mean + eps
  t.alloc(hidden);        // y = n * w
  t.free(hidden);         // n
}

// RMSNorm backward (language_model.cpp:33-37), from the output's gradient `grad` (4ND, live):
// the nodes in reverse order, each freeing what it saved once it has run; the norm's input x
// (kept by pow and x * r only) is freed at the end.
// On return the gradient of x (4ND) is live and `grad` has been freed. `residual`: x's
// gradient buffer already holds the residual branch's gradient (decoder norms), so x's
// gradients from the norm are added into it in place and freed.
void rms_norm_backward(Timeline& t, const Lm& x, bool first_step, bool residual,
                       bool checkpoint_input, bool holds_incoming) {
  const int64_t hidden = e * x.N * x.D, row = e * x.N, weight = e * x.D;
  // MulBackward0 (n * w): grad * w first, then grad * n summed to [D] (both live for a moment).
  // A frozen weight: grad * w alone (n was not kept).
  t.alloc(hidden);
  if (x.frozen) {
    t.free(hidden);  // its input gradient
  } else {
    t.transient(hidden + weight);
    t.alloc(weight);
    t.free(hidden + hidden);  // its input gradient and the kept n
    accumulate_grad(t, weight, first_step);
  }
  // MulBackward0 (x * r): grad * r, then grad * x summed to [N, 1].
  t.alloc(hidden);
  t.transient(hidden + row);
  t.alloc(row);
  t.free(hidden);  // grad of n
  // grad * r, added into x's gradient buffer (old + new): the old one dies unless a caller
  // still holds it (`nested`: a checkpointed block's output gradient, held by the outer node).
  if (residual && !holds_incoming) t.free(hidden);
  // RsqrtBackward0: -0.5 * grad * r^3 (three [N, 1] temporaries at the top), then r is freed.
  t.transient(2 * row);
  t.alloc(row);
  t.free(row + row);  // grad of r, r
  // MeanBackward1: grad.expand(x^2) / D (4ND; the divisor wrapped), then x^2 is freed.
  t.transient(hidden + 12);
  t.alloc(hidden);
  t.free(hidden + row);  // x^2, the grad of the mean
  // PowBackward0: grad * 2 * x^1 (three 4ND at the top); added in place into x's gradient.
  // Then x itself is freed: only this norm kept it (the residual's add keeps nothing).
  if (checkpoint_input) {
    // A checkpointed block's input is the checkpoint's (released later); autograd::grad
    // captures its gradient: the pow's result plus the residual's, summed out of place.
    t.alloc(3 * hidden);
    t.free(2 * hidden);  // the two temporaries
    t.free(hidden);      // grad of x^2
    t.alloc(hidden);     // the sum
    t.free(2 * hidden);  // its addends
  } else {
    t.transient(3 * hidden);
    t.free(hidden + hidden);  // grad of x^2, x
  }
}

// --- LibTorch 2.x --------------------------------------------------------------------------

namespace {

// The mean's division by D and `+ eps`: each a wrapped scalar and its fp32 copy (12 B).
constexpr int64_t kScalarPair = 12;

}  // namespace

// RMSNorm forward (language_model.cpp RMSNormImpl::forward) on an fp32 input: x^2 and its
// mean, `+ eps`, rsqrt (kept), x * r (kept when the weight is trained), then the sum, the mean
// and x^2 die; y = n * w. A frozen weight keeps neither n nor y: n dies at return.
void rms_norm_forward_2x(Timeline& t, const Lm& x) {
  const int64_t hidden = e * x.N * x.D, row = e * x.N;
  t.alloc(hidden + row);
  t.transient(kScalarPair);
  t.alloc(kScalarPair + row);
  t.free(kScalarPair);
  t.alloc(row + hidden);
  t.free(2 * row + hidden);
  t.alloc(hidden);
  if (x.frozen) t.free(hidden);
}

// Its backward from y's gradient (4ND, live; freed) to x's. `residual`: x's gradient buffer
// holds the residual branch's gradient, into which grad * r and the pow's gradient are added
// in place (`held`: an outer node also holds that buffer, so the first addition is a new sum);
// without it (the final norm) grad * r becomes x's buffer. x itself, kept by pow and x * r
// only, dies at the end unless the checkpoint keeps it (`keeps_input`).
void rms_norm_backward_2x(Timeline& t, const Lm& x, bool first_step, bool residual, bool held,
                          bool keeps_input) {
  const int64_t hidden = e * x.N * x.D, row = e * x.N, weight = e * x.D;
  // MulBackward0 (n * w): grad * n summed to [D] (a trained weight), grad * w; then the
  // incoming gradient and n die.
  if (x.frozen) {
    t.alloc(hidden);
    t.free(hidden);
  } else {
    t.alloc(2 * hidden + weight);
    t.free(hidden);
    t.free(2 * hidden);
    accumulate_grad(t, weight, first_step);
  }
  // MulBackward0 (x * r): grad * x summed to [N, 1], grad * r; the incoming gradient dies.
  t.alloc(2 * hidden + row);
  t.free(2 * hidden);
  if (residual) {
    if (held) {
      t.alloc(hidden);  // the new sum beside the held buffer
    }
    t.free(hidden);  // grad * r, added into x's buffer
  }
  // RsqrtBackward0: -0.5 * grad * r^3 (r^3, a wrapped scalar, two products); then its
  // temporaries, the incoming gradient and r die.
  t.alloc(row + kScalarPair + row);
  t.free(kScalarPair);
  t.alloc(row);
  t.free(2 * row);
  t.free(2 * row);
  // MeanBackward1: grad.expand / D; the incoming gradient dies (x^2 was not kept).
  t.transient(kScalarPair);
  t.alloc(hidden);
  t.free(row);
  // PowBackward0: x^1, * 2 (a wrapped scalar), * grad; the temporaries, the incoming gradient
  // and x die; the result is added into x's buffer in place.
  t.alloc(2 * hidden + kScalarPair);
  t.free(kScalarPair);
  t.alloc(hidden);
  t.free(3 * hidden);
  if (!keeps_input) t.free(hidden);
  t.free(hidden);
}

}  // namespace vlm::memory::replay
