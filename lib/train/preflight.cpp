#include "train/preflight.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/units.h"
#include "data/data_setup.h"
#include "data/packing/worst_case.h"
#include "runtime/memory_stats.h"
#include "runtime/oom.h"
#include "spec/derived.h"

namespace vlm::train {
namespace {

// One forward and backward of `rows` x `T` random tokens with `crops` random crops (fewer if
// their image tokens would not fit the rows). Returns the crops it ran.
int64_t trial_step(const Config& config, const PreflightTarget& t, int64_t rows, int64_t T,
                   int64_t crops) {
  const auto& dims = config.model.dims;
  const int64_t per_crop = spec::image_tokens_per_crop(dims);
  model::VlmBatch b;
  b.input_ids = torch::randint(0, dims.language.vocab_size, {rows, T}, torch::kLong).to(t.device);
  b.position_ids = torch::arange(T).repeat({rows, 1}).to(t.device);
  b.labels = b.input_ids.clone();
  b.cu_seqlens = torch::arange(0, rows * T + 1, T, torch::kLong);  // host: attention reads it
  const int64_t S = dims.vision.image_size;
  const int64_t image_tokens = std::min(crops * per_crop, rows * T);
  crops = image_tokens / per_crop;
  if (crops > 0) {
    b.crops = torch::randn({crops, 3, S, S}).to(t.device);
    b.image_token_index = torch::arange(crops * per_crop, torch::kLong).to(t.device);
  }
  AutocastScope autocast(t.precision, t.device);
  torch::Tensor loss = t.model->forward(b).loss_sum;
  if (loss.requires_grad()) (loss * 1e-9).backward();  // text only, decoder frozen: nothing
  t.optimizer.zero_grad();
  return crops;
}

// The most crops a one-pack micro-batch may carry and still be predicted within the budget
// (0 when not even one crop does; a cap of 0 means none), by bisection over the crop cap.
int64_t crops_that_fit(const Config& config, const MemoryBudgetKeeper& budget, int64_t most) {
  const auto fits = [&](int64_t crops) {
    Config capped = config;
    capped.train.max_crops_per_micro_batch = crops;
    capped.packing.max_crops_per_pack = crops;
    const auto h = budget.heaviest(capped, 1);
    return h && h->rows > 0;
  };
  if (most < 1 || !fits(1)) return 0;
  int64_t lo = 1, hi = most;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace

void run_preflight(const Config& config, const PreflightTarget& t) {
  const data::WorstCase worst = data::worst_case(data::worst_case_inputs(config));
  const int64_t T = config.packing.max_seq_len;
  int64_t rows = config.train.rows_by_limits();
  int64_t crops = worst.crops_per_micro_batch;
  // The prediction first.
  const int64_t most_rows = config.train.batch_size_auto()
                                ? (config.train.global_batch_size + t.ranks - 1) / t.ranks
                                : config.train.batch_size;
  if (const auto heaviest = t.budget ? t.budget->heaviest(config, most_rows) : std::nullopt) {
    if (heaviest->rows == 0) {
      const int64_t fits = crops_that_fit(config, *t.budget, worst.crops_per_pack);
      throw Error(
          ExitCode::kOutOfMemory,
          "preflight: the heaviest micro-batch this config allows, even of one pack (" +
              std::to_string(T) + " tokens, " + std::to_string(worst.crops_per_pack) +
              " crops), is predicted to need " + format_bytes(heaviest->one_row) +
              ", over the memory budget of " + format_bytes(t.budget->usable_bytes()) + " (" +
              t.budget->source() + ", less memory.safety_margin)" +
              (fits > 0 ? "; " + std::to_string(fits) +
                              " crops do: set train.max_crops_per_micro_batch and "
                              "packing.max_crops_per_pack to " + std::to_string(fits)
                        : "; not even one crop fits: lower packing.max_seq_len, enable "
                          "activation checkpointing or set model.loss_chunk_tokens") +
              "; `vlmtrain estimate-memory` recommends settings that fit");
    }
    spdlog::info("preflight: the heaviest micro-batch the budget admits ({} x {} tokens, {} "
                 "crops) is predicted at {} of {}",
                 heaviest->rows, T, heaviest->crops, format_bytes(heaviest->predicted),
                 format_bytes(t.budget->usable_bytes()));
    rows = heaviest->rows;
    crops = heaviest->crops;
  }
  // Nothing to measure against without memory: real CUDA memory or a simulated CPU cap.
  if (!t.device.is_cuda() && config.memory.simulate_device_bytes.bytes == 0) return;
  try {
    trial_step(config, t, rows, T, crops);
    spdlog::info("preflight: the heaviest micro-batch ({} x {} tokens, {} crops) fits", rows, T,
                 crops);
    return;
  } catch (const std::exception& e) {
    if (!runtime::is_out_of_memory(e)) throw;
  }
  t.optimizer.zero_grad();
  runtime::empty_cache(t.device);
  int64_t fits = -1;
  for (int64_t c = crops / 2; c >= 1 && fits < 0; c /= 2) {
    try {
      trial_step(config, t, rows, T, c);
      fits = c;
    } catch (const std::exception& e) {
      if (!runtime::is_out_of_memory(e)) throw;
      t.optimizer.zero_grad();
      runtime::empty_cache(t.device);
    }
  }
  throw Error(
      ExitCode::kOutOfMemory,
      "preflight: the heaviest micro-batch this config allows (" + std::to_string(rows) + " x " +
          std::to_string(T) + " tokens, " + std::to_string(crops) +
          " crops) does not fit in memory" +
          (fits > 0 ? "; " + std::to_string(fits) +
                          " crops do: set train.max_crops_per_micro_batch: " + std::to_string(fits)
                    : "; not even one crop fits: lower train.batch_size or packing.max_seq_len, "
                      "or enable activation checkpointing"));
}

}  // namespace vlm::train
