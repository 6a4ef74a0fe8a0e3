// What batches really contain: the statistics `vlmtrain inspect-batches` prints (a table on a
// terminal, JSON otherwise; the JSON schema is in docs/inspect-batches.md).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/packing/step_planner.h"
#include "data/packing/worst_case.h"

namespace vlm::data {

struct MicroBatchStats {
  int64_t step = 0;
  int64_t rank = 0;
  int64_t micro_step = 0;
  int64_t packs = 0;
  int64_t samples = 0;
  std::vector<int64_t> samples_per_pack;
  std::vector<std::vector<int64_t>> sample_tokens;  // per pack, each sample's tokens in order
  int64_t tokens = 0;          // sample tokens
  int64_t row_length = 0;      // collated row length (longest pack, rounded up to 8)
  int64_t padding_tokens = 0;  // packs * row_length - tokens
  int64_t images = 0;
  int64_t crops = 0;
  int64_t vit_tokens = 0;  // crops * patches per crop
  int64_t supervised = 0;
  int64_t predicted_bytes = 0;
  double cost = 0;

  double padding_pct() const;
  nlohmann::json to_json() const;
};

struct ReportContext {
  int64_t max_seq_len = 4096;
  int64_t patches_per_crop = 1024;
  int64_t ranks = 1;
  WorstCase worst;
  // Every micro-batch's predicted peak is in its predicted_bytes (the memory model covers the
  // config), and the memory budget it is held to (0: none).
  bool predicted = false;
  int64_t budget_bytes = 0;
};

class BatchReport {
 public:
  explicit BatchReport(ReportContext context) : context_(context) {}

  void add_step(int64_t step, const StepPlan& plan);

  // Summary and (optionally) every micro-batch. `extra` (drops, throughput, ...) is merged in.
  nlohmann::json to_json(bool with_micro_batches, const nlohmann::json& extra) const;
  // A human report for a terminal: totals, histograms, the worst micro-batch against the
  // config's theoretical worst case.
  std::string to_text(const nlohmann::json& extra, bool unicode) const;

  int64_t packs() const { return packs_; }
  int64_t steps() const { return steps_; }
  const std::vector<MicroBatchStats>& micro_batches() const { return micro_; }

 private:
  nlohmann::json memory_json() const;  // "memory": predicted peaks against the budget

  ReportContext context_;
  std::vector<MicroBatchStats> micro_;
  std::vector<double> step_imbalance_;
  int64_t steps_ = 0;
  int64_t packs_ = 0;
};

// A histogram drawn with bars, one line per bin: "  61-80 | ######## 12".
std::string draw_histogram(const std::vector<int64_t>& values, int bins, bool unicode);

}  // namespace vlm::data
