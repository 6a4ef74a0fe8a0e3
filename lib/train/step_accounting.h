// What a planned step carries, counted from its plan (every rank plans every rank's
// micro-batches, so each rank can count the whole step without communication): totals for the
// metrics line, the sample ids for the sample ledger, and the model FLOPs behind MFU.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "data/packing/step_planner.h"
#include "spec/model_spec.h"

namespace vlm::train {

struct StepTotals {
  int64_t tokens = 0;
  int64_t samples = 0;
  int64_t images = 0;
  int64_t crops = 0;
  int64_t padding_tokens = 0;         // rows padded to their micro-batch's row length
  int64_t max_micro_batch_crops = 0;  // the most crops of one micro-batch
};

// Over every rank's micro-batches.
StepTotals step_totals(const data::StepPlan& plan);

// Every sample id of the step, rank by rank, micro-batch by micro-batch, pack by pack.
std::vector<uint64_t> step_sample_ids(const data::StepPlan& plan);

// Forward + backward model FLOPs of the step: 3x the forward FLOPs of its samples' LM tokens
// and its crops (spec/derived.h, PaLM appendix B).
double step_model_flops(const data::StepPlan& plan, const spec::ModelSpec& dims);

// Model FLOPs utilisation of a step of `step_ms` over `ranks` GPUs named `device_name` in the
// GPU catalog (core/gpu_catalog.h); nullopt for an unknown GPU.
std::optional<double> model_flops_utilisation(double model_flops, double step_ms, int ranks,
                                              const std::string& device_name);

}  // namespace vlm::train
