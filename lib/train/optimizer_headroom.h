// AdamW updates parameters one by one, in place, so an out-of-memory error inside it would
// leave the step half applied. Its needs are known beforehand: the two fp32 moments of every
// trainable parameter on the first step, and two temporaries of the largest parameter on every
// step. They are checked before anything changes; if they do not fit, the cache is emptied
// (fragmentation is the usual cause on CUDA) and the check repeated; only a real shortage stops
// the run (ExitCode::kOutOfMemory), with the parameters untouched.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace vlm::train {

// The bytes the next optimizer step needs beyond what is allocated now.
int64_t optimizer_step_bytes(const std::vector<torch::Tensor>& parameters, bool moments_exist);

// Checks the headroom for optimizer step `step` (1-based) on `device`. `injected`: behave as if
// it did not fit at first (the oom_optimizer fault). Returns the retries taken: 0, or 1 when
// it fits only after emptying the cache; throws vlm::Error(kOutOfMemory) when it does not fit
// even then.
int64_t ensure_optimizer_headroom(const std::vector<torch::Tensor>& parameters, bool moments_exist,
                                  const torch::Device& device, int64_t step, bool injected);

}  // namespace vlm::train
