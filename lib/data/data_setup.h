// Everything the data pipeline needs, built from a Config: tokenizer (with the image tokens
// added), chat template, sample builder, skip counter, and the options of every stage.
// Shared by `train`, `inspect-batches` and `tokenize`.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/config.h"
#include "data/batch/loader.h"
#include "data/packing/planning_pipeline.h"
#include "data/packing/worst_case.h"
#include "data/source/sample_builder.h"
#include "data/source/skip_counter.h"
#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/tokenizer.h"

namespace vlm::data {

// A byte cap on every micro-batch the step planner forms (the memory-aware sampler:
// sampler/micro_batch_memory.h): a predictor and the cap it is held to. Empty: no cap.
struct MemoryCap {
  MemoryPredictor predict;
  int64_t bytes = 0;
};

// The options of every planning stage (filter, packer, step planner) from a config.
PlanningOptions planning_options(const Config& config, int64_t ranks, const MemoryCap& cap = {});
// What the theoretical worst micro-batch of a config is computed from.
WorstCaseInputs worst_case_inputs(const Config& config);
// A benchmark length stream packed with the config's limits (needs no tokenizer or images).
std::unique_ptr<PlanningPipeline> length_pipeline(const Config& config, int64_t ranks,
                                                  const std::string& path,
                                                  const MemoryCap& cap = {});

class DataSetup {
 public:
  // Loads the tokenizer (DataError when unusable) and checks it against the model's
  // vocabulary. `ranks` is the world size the steps are planned for.
  DataSetup(const Config& config, int64_t ranks, const MemoryCap& cap = {});

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ChatTemplate& chat() const { return *chat_; }
  const SampleBuilder& builder() const { return *builder_; }
  // The limits every pipeline's own skip counter gets.
  const SkipCounter& skip_limits() const { return *skips_; }
  const ImageTokenIds& image_tokens() const { return image_ids_; }

  LoaderOptions loader_options(int64_t rank) const;

  // The training stream: every train dataset, mixed by weight, shuffled, endless.
  std::unique_ptr<PlanningPipeline> training_pipeline() const;
  // One ordered pass over the validation datasets (empty when none are configured). Their
  // drop warning is said once, not once per evaluation.
  std::unique_ptr<PlanningPipeline> validation_pipeline() const;

 private:
  const Config& config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ImageTokenIds image_ids_;
  std::unique_ptr<ChatTemplate> chat_;
  std::unique_ptr<SampleBuilder> builder_;
  std::unique_ptr<SkipCounter> skips_;
  PlanningOptions planning_;
  std::shared_ptr<std::atomic<bool>> validation_drop_warning_ =
      std::make_shared<std::atomic<bool>>(false);
};

}  // namespace vlm::data
