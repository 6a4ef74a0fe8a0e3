#include "model/activation_checkpoint.h"

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "runtime/compat.h"

namespace vlm::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved input: the closure and the state to replay it in.
// A CustomClassHolder so that it can ride in ctx->saved_data as an IValue capsule.
struct Replay : torch::CustomClassHolder {
  BlockForward fn;
  runtime::compat::RngState rng;
  runtime::compat::AutocastState autocast;
};

// Sets the replay state for its lifetime and puts the caller's state back afterwards.
class ReplayStateGuard {
 public:
  ReplayStateGuard(const Replay& replay, const torch::Device& device)
      : rng_(runtime::compat::rng_state(device)), autocast_(runtime::compat::autocast_state()) {
    runtime::compat::set_rng_state(replay.rng);
    runtime::compat::set_autocast_state(replay.autocast);
  }
  ~ReplayStateGuard() {
    runtime::compat::set_autocast_state(autocast_);
    runtime::compat::set_rng_state(rng_);
  }
  ReplayStateGuard(const ReplayStateGuard&) = delete;
  ReplayStateGuard& operator=(const ReplayStateGuard&) = delete;

 private:
  runtime::compat::RngState rng_;
  runtime::compat::AutocastState autocast_;
};

// Gradient slots returned by backward, one per forward argument: 0 the replay (not a
// tensor), 1 the hidden state, 2.. the parameters (a TensorList gives one slot per tensor).
// needs_input_grad() counts tensor inputs only (its edges), so edge = slot - 1.
constexpr size_t kHiddenSlot = 1;
constexpr size_t kFirstParameterSlot = 2;
bool slot_needs_grad(const AutogradContext* ctx, size_t slot) {
  return ctx->needs_input_grad(slot - 1);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Replay> replay,
                               const torch::Tensor& hidden, at::TensorList parameters) {
    replay->rng = runtime::compat::rng_state(hidden.device());
    replay->autocast = runtime::compat::autocast_state();
    variable_list to_save{hidden};
    to_save.insert(to_save.end(), parameters.begin(), parameters.end());
    ctx->save_for_backward(std::move(to_save));
    const Replay* replay_state = replay.get();
    ctx->saved_data["replay"] = c10::IValue::make_capsule(std::move(replay));
    torch::NoGradGuard no_grad;
    return {replay_state->fn(hidden)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list output_grads) {
    const auto replay =
        c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();

    // Leaves of the recomputation: a detached copy of the input, and the parameters that
    // need a gradient (the very tensors the closure uses, so the graph reaches them).
    const torch::Tensor hidden =
        saved[0].detach().requires_grad_(slot_needs_grad(ctx, kHiddenSlot));
    variable_list wrt;
    std::vector<size_t> wrt_slots;
    if (hidden.requires_grad()) {
      wrt.push_back(hidden);
      wrt_slots.push_back(kHiddenSlot);
    }
    for (size_t i = 1; i < saved.size(); ++i) {
      const size_t slot = kFirstParameterSlot + i - 1;
      if (!slot_needs_grad(ctx, slot)) continue;
      wrt.push_back(saved[i]);
      wrt_slots.push_back(slot);
    }

    torch::Tensor output;
    {
      ReplayStateGuard replay_state(*replay, hidden.device());
      torch::AutoGradMode enable_grad(true);
      output = replay->fn(hidden);
      // The recompute ran under the forward's autocast state, which caches a low-precision
      // copy of every weight it casts. Nothing else would clear that cache: the copies would
      // outlive the step (memory nobody counts) and the next forward would be served the
      // stale, pre-update copies. The recomputed graph keeps what it needs.
      if (replay->autocast.cpu_enabled || replay->autocast.cuda_enabled) {
        at::autocast::clear_cache();
      }
    }
    variable_list grads(kFirstParameterSlot + saved.size() - 1);
    if (wrt.empty() || !output.requires_grad() || !output_grads[0].defined()) return grads;
    const variable_list computed =
        torch::autograd::grad({output}, wrt, {output_grads[0]}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < computed.size(); ++i) grads[wrt_slots[i]] = computed[i];
    return grads;
  }
};

}  // namespace

torch::Tensor checkpointed(const BlockForward& fn, const torch::Tensor& hidden,
                           at::TensorList parameters) {
  bool any_requires_grad = hidden.requires_grad();
  for (const auto& p : parameters) any_requires_grad = any_requires_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !any_requires_grad) return fn(hidden);
  auto replay = c10::make_intrusive<Replay>();
  replay->fn = fn;
  return CheckpointFunction::apply(replay, hidden, parameters)[0];
}

}  // namespace vlm::model
