// Step planner: which packs go to which (rank, micro-step) slot of one optimizer step.
//
// A fixed batch size: one step = ranks x micro_steps micro-batches of up to batch_size packs
// each. The planner takes the packs left over from the previous step first (oldest first, so
// none waits forever), then fresh packs longest-processing-time first (highest cost first),
// each into the rank with the least cost so far that has a slot within the caps, and inside
// that rank into the cheapest micro-batch with room. Caps per micro-batch: batch_size packs,
// crops (0 = none) and predicted bytes (a predictor hook plus a byte cap; either unset =
// none). Packs that fit no slot wait for the next step.
//
// batch_size 0 (auto): one step = global_batch packs, none deferred. Each goes, in the same
// order, to the rank with the least cost so far, into its cheapest micro-batch under the caps,
// or into a new micro-batch of that rank when none can take it; so a micro-batch holds as many
// packs as its predicted bytes allow (image-heavy packs: fewer). Every rank then runs the
// largest rank's count of micro-steps (the others end with empty ones).
//
// The plan is a pure function of its inputs, so every rank computes the same plan without
// communication; it carries the step's total supervised tokens N (the loss divisor) and per
// micro-batch totals.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "data/packing/pack_item.h"

namespace vlm::data {

// What a memory predictor needs to know about a micro-batch.
struct MicroBatchShape {
  int64_t packs = 0;
  int64_t tokens = 0;           // LM tokens of all samples
  int64_t max_pack_tokens = 0;  // the longest row (rows are padded to a common length)
  int64_t images = 0;
  int64_t crops = 0;
  int64_t supervised = 0;
  int64_t sum_sample_len_sq = 0;  // sum over samples of tokens^2 (block-diagonal attention)
  int64_t samples = 0;

  void add(const Pack& pack);
  // The collated layout (collated_row_length): rows of row_length() tokens, padding_tokens()
  // of them not samples'. 0 for an empty micro-batch.
  int64_t row_length() const;
  int64_t padding_tokens() const { return packs * row_length() - tokens; }
};

// The length every row of a collated micro-batch is padded to, when its longest pack has
// `longest` tokens: rounded up to a multiple of 8 (at least 8). The one definition of the rows'
// layout that the collator (data/batch/host_batch.h), the batch report and the step metrics use.
int64_t collated_row_length(int64_t longest);

// cost = per_token * tokens + per_len_sq * sum(len^2) + per_crop * crops, in units of one LM
// token's forward FLOPs. Defaults are nanoVLM's default model (SmolLM2-360M: d=960, 32
// layers, GQA 15/5, SwiGLU 2560, vocab 49218; SigLIP2-base-512: d=768, 12 layers, MLP 3072,
// 1024 patches per crop):
//   LM token: 2 * (32 * (2.67 d^2 + 3 d * 2560) + d * 49218) = 7.23e8 FLOPs         -> 1
//   causal attention per sample: 4 d * 32 layers * len^2 / 2 = 61440 len^2          -> 8.5e-5
//   ViT crop: 1024 * 2 * 12 * (4 * 768^2 + 2 * 768 * 3072) + 12 * 4 * 768 * 1024^2
//             = 2.13e11                                                              -> 294
struct CostModel {
  double per_token = 1.0;
  double per_len_sq = 8.5e-5;
  double per_crop = 294.0;

  double cost(const Pack& pack) const;
};

// The predicted peak bytes of a micro-batch made of `packs`, in the order the collator lays
// them out. It may return any value above the byte cap as soon as it knows the micro-batch
// does not fit (a cheap lower bound): only the predictions of micro-batches that fit are kept.
using MemoryPredictor = std::function<int64_t(const std::vector<const Pack*>& packs)>;

struct StepPlannerOptions {
  int64_t ranks = 1;
  int64_t micro_steps = 1;                // gradient_accumulation_steps (fixed batch_size)
  int64_t batch_size = 1;                 // packs per micro-batch (at most); 0 = auto
  int64_t global_batch = 0;               // batch_size auto: packs per step, all ranks
  int64_t max_crops_per_micro_batch = 0;  // 0 = no cap
  int64_t max_micro_batch_bytes = 0;      // 0 = no cap; needs predict_bytes
  MemoryPredictor predict_bytes;          // unset = no byte cap
  CostModel cost;

  bool auto_batch() const { return batch_size == 0; }
  int64_t packs_per_step() const {
    return auto_batch() ? global_batch : ranks * micro_steps * batch_size;
  }
  void validate() const;  // throws ConfigError
};

struct MicroBatch {
  std::vector<Pack> packs;
  MicroBatchShape shape;
  double cost = 0;
  int64_t predicted_bytes = 0;  // 0 when there is no predictor
};

struct StepPlan {
  std::vector<std::vector<MicroBatch>> micro_batches;  // [rank][micro_step]
  int64_t supervised_tokens = 0;                       // N: the step's loss divisor
  int64_t packs = 0;

  double rank_cost(int64_t rank) const;
  // max over ranks of total cost / mean - 1 (0 for an empty step).
  double rank_imbalance() const;
};

struct PlanResult {
  StepPlan plan;
  std::vector<Pack> deferred;  // wait for the next step, in order
};

// A pack that no micro-batch can take under the caps, even alone (it would wait forever): the
// config error plan_step throws, which estimate-memory reads as "does not fit".
class PackFitsNoMicroBatch : public ConfigError {
 public:
  PackFitsNoMicroBatch(std::string message, bool over_budget)
      : ConfigError(std::move(message)), over_budget_(over_budget) {}
  // Its predicted bytes exceed the micro-batch budget (else: train.max_crops_per_micro_batch).
  bool over_budget() const { return over_budget_; }

 private:
  bool over_budget_;
};

// Plans one step from `waiting` (left over from earlier steps, placed first, in order) and
// `fresh` packs (placed by decreasing cost). Throws ConfigError if a pack cannot fit even an
// empty micro-batch under the caps (it would wait forever).
PlanResult plan_step(const std::vector<Pack>& waiting, const std::vector<Pack>& fresh,
                     const StepPlannerOptions& options);

// Plans step after step from a pack source, keeping the deferred packs between steps.
class StepPlanner {
 public:
  using PackSource = std::function<std::optional<Pack>()>;
  explicit StepPlanner(StepPlannerOptions options);

  // Plans the next step, pulling fresh packs until the step's packs_per_step() candidates are
  // there or the source is dry. nullopt when nothing is left.
  std::optional<StepPlan> next_step(const PackSource& source);
  const std::vector<Pack>& deferred() const { return deferred_; }

  nlohmann::json save_state() const;
  void restore_state(const nlohmann::json& state);

 private:
  StepPlannerOptions options_;
  std::vector<Pack> deferred_;
};

}  // namespace vlm::data
