#include "data/data_setup.h"

#include "spec/derived.h"

namespace vlm::data {
namespace {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& source) {
  if (source == "builtin:bytes") return std::make_unique<Tokenizer>(Tokenizer::builtin_bytes());
  return std::make_unique<Tokenizer>(Tokenizer::from_file(source));
}

std::vector<DatasetSpec> dataset_specs(const std::vector<DatasetConfig>& datasets) {
  std::vector<DatasetSpec> specs;
  for (const auto& d : datasets)
    specs.push_back({d.path, d.weight, parse_dataset_format(d.format)});
  return specs;
}

ImageGridOptions grid_options(const Config& config) {
  ImageGridOptions grid;
  grid.crop_size = config.model.dims.vision.image_size;
  grid.max_img_size = config.data.max_img_size;
  grid.resize_to_max = config.data.resize_to_max;
  grid.allow_upscale = config.data.allow_upscale;
  return grid;
}

// A pack may never hold more crops than a micro-batch may.
int64_t crops_per_pack(const Config& config) {
  const int64_t pack_cap = config.packing.max_crops_per_pack;
  const int64_t micro_cap = config.train.max_crops_per_micro_batch;
  if (micro_cap > 0 && (pack_cap == 0 || pack_cap > micro_cap)) return micro_cap;
  return pack_cap;
}

}  // namespace

PlanningOptions planning_options(const Config& config, int64_t ranks, const MemoryCap& cap) {
  PlanningOptions p;
  p.limits = SampleLimits{config.data.max_sample_length, config.data.max_images_per_example,
                          config.packing.max_seq_len, config.packing.max_images_per_knapsack,
                          crops_per_pack(config)};
  p.packer.max_seq_len = config.packing.max_seq_len;
  p.packer.max_images_per_pack = config.packing.max_images_per_knapsack;
  p.packer.max_crops_per_pack = crops_per_pack(config);
  p.packer.buffer_samples = config.packing.buffer_samples;
  p.packer.max_deferrals = config.packing.max_deferrals;
  p.packer.emission_window = config.packing.emission_window;
  p.packer.seed = static_cast<uint64_t>(config.train.seed);
  p.planner.ranks = ranks;
  p.planner.micro_steps = config.train.gradient_accumulation_steps;
  p.planner.batch_size = config.train.batch_size;  // 0: auto
  p.planner.global_batch = config.train.global_batch_size;
  p.planner.max_crops_per_micro_batch = config.train.max_crops_per_micro_batch;
  if (cap.predict && cap.bytes > 0) {
    p.planner.predict_bytes = cap.predict;
    p.planner.max_micro_batch_bytes = cap.bytes;
  }
  return p;
}

WorstCaseInputs worst_case_inputs(const Config& config) {
  WorstCaseInputs in;
  in.grid = grid_options(config);
  in.image_tokens_per_crop = spec::image_tokens_per_crop(config.model.dims);
  in.max_seq_len = config.packing.max_seq_len;
  in.max_images_per_pack = config.packing.max_images_per_knapsack;
  in.max_crops_per_pack = crops_per_pack(config);
  in.batch_size = config.train.rows_by_limits();
  in.max_crops_per_micro_batch = config.train.max_crops_per_micro_batch;
  return in;
}

std::unique_ptr<PlanningPipeline> length_pipeline(const Config& config, int64_t ranks,
                                                  const std::string& path, const MemoryCap& cap) {
  return std::make_unique<PlanningPipeline>(std::make_unique<LengthSource>(path),
                                            planning_options(config, ranks, cap));
}

DataSetup::DataSetup(const Config& config, int64_t ranks, const MemoryCap& cap)
    : config_(config) {
  tokenizer_ = load_tokenizer(config.model.tokenizer);
  image_ids_ = add_image_tokens(*tokenizer_);
  const int64_t rows = spec::language_vocab_rows(config.model.dims.language);
  if (tokenizer_->vocab_size() > rows) {
    throw DataError("the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                        " tokens (image tokens included) but the model embeds only " +
                        std::to_string(rows) +
                        " (model.language.vocab_size + model.language.extra_tokens)",
                    SourceLocation{config.model.tokenizer});
  }
  chat_ =
      std::make_unique<ChatTemplate>(*tokenizer_, spec::image_tokens_per_crop(config.model.dims));

  builder_ = std::make_unique<SampleBuilder>(*chat_, grid_options(config));
  skips_ = std::make_unique<SkipCounter>(config.data.max_skipped_fraction,
                                         config.data.min_skipped_for_error);

  planning_ = planning_options(config, ranks, cap);
}

LoaderOptions DataSetup::loader_options(int64_t rank) const {
  LoaderOptions o;
  o.rank = rank;
  o.workers = config_.data.workers;
  o.prefetch_batches = config_.data.prefetch_batches;
  o.collate.crop_size = config_.model.dims.vision.image_size;
  o.collate.pad_id = tokenizer_->token_id("<|endoftext|>").value_or(0);
  o.collate.image_token_id = image_ids_.image;
  o.collate.image_tokens_per_crop = spec::image_tokens_per_crop(config_.model.dims);
  for (int c = 0; c < 3; ++c) {
    o.collate.normalize.mean[c] = static_cast<float>(config_.data.image_mean[c]);
    o.collate.normalize.std[c] = static_cast<float>(config_.data.image_std[c]);
  }
  return o;
}

std::unique_ptr<PlanningPipeline> DataSetup::training_pipeline() const {
  if (config_.data.train.empty()) {
    throw ConfigError("no training data: set data.train (a list of {path, weight, format})");
  }
  auto source = std::make_unique<DatasetSource>(dataset_specs(config_.data.train), *builder_,
                                                *skips_, static_cast<uint64_t>(config_.train.seed),
                                                /*shuffle=*/true);
  return std::make_unique<PlanningPipeline>(std::move(source), planning_);
}

std::unique_ptr<PlanningPipeline> DataSetup::validation_pipeline() const {
  if (config_.data.validation.empty()) return nullptr;
  auto source = std::make_unique<DatasetSource>(dataset_specs(config_.data.validation), *builder_,
                                                *skips_, 0, /*shuffle=*/false, /*one_pass=*/true);
  PlanningOptions options = planning_;
  options.planner.micro_steps = 1;
  options.packer.emission_window = 0;  // evaluation order does not matter, keep it stable
  auto pipeline = std::make_unique<PlanningPipeline>(std::move(source), options);
  pipeline->share_drop_warning(validation_drop_warning_);
  return pipeline;
}

}  // namespace vlm::data
