// The metrics file: JSON lines, one object per line, written by rank 0 only.
//
// Every record has "type" ("run" | "step" | "eval" | "summary" | "event"), "step" (the optimizer
// steps completed when it was written) and "time" (Unix seconds, fractional). Keys are flat;
// related figures share a "group/name" prefix (torchtitan's convention), e.g. "lr/vision",
// "time/forward_ms", "memory/peak_allocated_bytes", so a plotting tool can select a group by
// prefix without nested objects. Units are in the names (_ms, _bytes, _per_s). A NaN or
// infinite value is written as null (JSON has no NaN).
//
// The file is opened in append mode and flushed after each line, so a crash loses at most the
// line being written. On resume from step S the lines of steps > S (written after the
// checkpoint) are dropped first, so the file reads as one uninterrupted run; a torn last
// line left by a crash is dropped with them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "report/event_file.h"

namespace vlm::train {

// One "step" record: everything measured over one optimizer step, summed or maxed over all
// micro-steps and ranks unless a field says otherwise. JSON key in [brackets].
struct StepMetrics {
  int64_t step = 0;   // [step] optimizer steps completed, 1 for the first one
  int64_t epoch = 0;  // [epoch] passes over the data completed before this step (0-based)

  double loss = 0.0;  // [loss] sum of token losses / supervised tokens of the whole step
  // [lr/<module>] learning rate used in this step per module ("vision", "projector",
  // "language"); the decay and no-decay groups of a module share it.
  std::map<std::string, double> lr;
  double grad_norm = 0.0;            // [grad_norm] global L2 norm of all gradients before clipping
  std::optional<double> loss_scale;  // [loss_scale] fp16 dynamic loss scale; absent otherwise

  int64_t tokens = 0;             // [tokens] LM tokens processed (image tokens included,
                                  //   padding excluded), all ranks
  int64_t supervised_tokens = 0;  // [supervised_tokens] tokens with a label (the loss's N)
  int64_t samples = 0;            // [samples] samples in the step, all ranks
  int64_t images = 0;             // [images] images in the step, all ranks
  int64_t crops = 0;              // [crops] ViT crops (image tiles incl. global views)

  double tokens_per_s = 0.0;   // [throughput/tokens_per_s] tokens / step wall time
  double samples_per_s = 0.0;  // [throughput/samples_per_s] samples / step wall time

  // Wall time of the step on rank 0 and its parts [time/<name>]; the parts need not add up
  // to step_ms (logging, scheduling and host work in between are not itemised).
  double step_ms = 0.0;       // [time/step_ms] whole step, wall clock
  double data_wait_ms = 0.0;  // [time/data_wait_ms] blocked waiting for the loader
  double forward_ms = 0.0;    // [time/forward_ms] all micro-steps' forward passes
  double backward_ms = 0.0;   // [time/backward_ms] all micro-steps' backward passes
  double allreduce_ms = 0.0;  // [time/allreduce_ms] gradient all-reduce
  double optimizer_ms = 0.0;  // [time/optimizer_ms] unscale + clip + optimizer.step
  double step_ms_min = 0.0;   // [time/step_ms_min] fastest rank's step_ms
  double step_ms_max = 0.0;   // [time/step_ms_max] slowest rank's step_ms (stragglers)

  // Memory high-water marks of the step, max over ranks [memory/<name>]. CUDA: the caching
  // allocator's peak allocated and reserved bytes. CPU: the tracking allocator's peak goes into
  // peak_allocated_bytes and peak_reserved_bytes is absent.
  int64_t peak_allocated_bytes = 0;            // [memory/peak_allocated_bytes]
  std::optional<int64_t> peak_reserved_bytes;  // [memory/peak_reserved_bytes]
  // The memory model's prediction of that peak, made before the step ran, and the model
  // states it counted as live before the step (max over ranks); absent when the step's
  // configuration is not modelled yet (memory::predict_step says why, logged once).
  // On CUDA the peak is the allocated layer of the device terms (memory/device_terms.h), and
  // memory.calibration's entry for the device corrects it.
  std::optional<int64_t> predicted_peak_bytes;    // [memory/predicted_peak_bytes]
  std::optional<int64_t> predicted_static_bytes;  // [memory/predicted_static_bytes]
  // The peak before the calibration's corrections; present only when an entry applied.
  std::optional<int64_t>
      predicted_uncalibrated_peak_bytes;  // [memory/predicted_uncalibrated_peak_bytes]
  // CUDA: the predicted reserved peak and device bytes (what nvidia-smi shows), and what the
  // device held outside the caching allocator at the end of the step (total - free -
  // reserved: context, NCCL, other processes), max over ranks.
  std::optional<int64_t> predicted_reserved_bytes;  // [memory/predicted_reserved_bytes]
  std::optional<int64_t> predicted_device_bytes;    // [memory/predicted_device_bytes]
  std::optional<int64_t> device_overhead_bytes;     // [memory/device_overhead_bytes]
  // The sampler's memory budget in force (docs/sampler.md); absent without one.
  std::optional<int64_t> budget_bytes;  // [memory/budget_bytes]

  // What the step's rows carried beside the samples: padding to each micro-batch's row length,
  // all ranks, and the most crops one micro-batch held.
  int64_t padding_tokens = 0;         // [padding_tokens]
  int64_t max_micro_batch_crops = 0;  // [max_micro_batch_crops]

  int64_t oom_retries = 0;    // [oom_retries] micro-batch splits redone after OOM in this step
  int64_t micro_steps = 0;    // [micro_steps] the plan's micro-batches per rank in this step
  int64_t skipped_steps = 0;  // [skipped_steps] steps skipped so far (non-finite gradients)
  std::optional<double> mfu;  // [mfu] model FLOPs utilisation in [0, 1]; absent if unknown

  // The record, "type": "step" and "time" included.
  nlohmann::json to_json() const;
};

// Appends records to a metrics file. On ranks other than 0 every call is a no-op, so callers
// need no rank checks.
class MetricsSink {
 public:
  // rank 0 opens (creates) `path` in append mode, first dropping the lines of steps after
  // `resumed_step` when resuming. Throws vlm::Error if the file cannot be opened.
  // `tensorboard`: every record's scalars (report/run_data.h) also go to a TensorBoard event
  // file beside `path`, which starts as the scalars of the lines kept (so that TensorBoard
  // shows one uninterrupted run, as the file reads) and replaces the sink's earlier event files.
  MetricsSink(std::filesystem::path path, int rank,
              std::optional<int64_t> resumed_step = std::nullopt, bool tensorboard = false);

  bool active() const { return active_; }
  const std::filesystem::path& path() const { return path_; }

  void write_step(const StepMetrics& metrics);
  // An evaluation result: {"type": "eval", "step", "time", "eval/<name>": value, ...}.
  void write_eval(int64_t step, const std::map<std::string, double>& values);
  // End of run: {"type": "summary", "step", "time", ...fields}. `fields` must be an object.
  void write_summary(int64_t step, const nlohmann::json& fields);
  // Something that happened: {"type": "event", "step", "time", "event": name, ...details}
  // e.g. "resumed", "oom", "checkpoint_saved", "stopped_by_signal".
  void write_event(int64_t step, const std::string& name,
                   const nlohmann::json& details = nlohmann::json::object());
  // Writes one record as a line and flushes. The record must be an object with "type" and
  // "step"; "time" is added when missing.
  void write(nlohmann::json record);

 private:
  void start_event_file(int64_t first_step);

  std::filesystem::path path_;
  bool active_ = false;
  std::ofstream out_;
  std::unique_ptr<report::EventFileWriter> events_;
};

// Rewrites `path` to its prefix up to and including the last line whose "step" is
// <= `resumed_step` (lines without a step, such as a torn last line, never end the prefix).
// Writes the prefix to `<path>.tmp`, fsyncs it and renames it over `path`, so a crash during
// the rewrite leaves the old file intact. Returns the number of lines dropped. A missing file
// is not an error (returns 0).
int64_t truncate_metrics_after_step(const std::filesystem::path& path, int64_t resumed_step);

// Writes `text` to `path` (replacing it) with checked writes and fsync: the run's own files
// (config.yaml). Throws vlm::Error with kSaveFailed (exit 7) naming the path and the reason,
// as every write of the run directory's records does.
void write_synced(const std::filesystem::path& path, const std::string& text);

}  // namespace vlm::train
