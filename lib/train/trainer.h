// `vlmtrain train`: the training loop of one process (one rank).
//
// One optimizer step (docs/architecture.md "One optimizer step"; the parts: step_runner.h,
// optimizer_headroom.h, training_checkpoint.h, progress.h):
//   loader -> this rank's micro-batches of the step and the step's supervised tokens N
//   -> per micro-batch: forward under autocast, backward of loss_sum / N
//      (the flag all-reduce after every micro-step lets every rank learn of an OOM anywhere)
//   -> gradient all-reduce (sum) -> [fp16: unscale] -> clip -> AdamW -> schedule
//   -> metrics line, checkpoint when due, evaluation when due.
// The loss of a step is the sum of token losses over all micro-steps and ranks divided by N,
// so it does not depend on how the step is split. An OOM frees the step, splits the offending
// micro-batch and redoes the step: no sample is dropped and N is unchanged.
#pragma once

#include <string>

#include "core/config_io.h"
#include "core/dist_env.h"
#include "core/error.h"

namespace vlm::train {

// Runs training to train.max_steps (resuming from the newest complete checkpoint in the
// output dir unless output.resume is never). Returns the exit code: kOk, or kStoppedBySignal
// after a SIGTERM/SIGUSR1 and a saved checkpoint. Throws vlm::Error for failures (the error's
// code: kTrainingFailed, kOutOfMemory, kData, kUsage).
ExitCode run_training(const LoadedConfig& loaded, const DistEnv& dist);

}  // namespace vlm::train
