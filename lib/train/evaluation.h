// Evaluation on the held-out split: the validation loss (summed token losses / supervised
// tokens over every rank), and greedy answers to validation questions with their exact-match
// accuracy against the dataset's answers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "data/data_setup.h"
#include "model/vision_language_model.h"
#include "runtime/distributed.h"
#include "train/precision.h"

namespace vlm::train {

struct GeneratedAnswer {
  std::string question;
  std::string expected;
  std::string answer;
  bool correct = false;
};

struct EvalResult {
  double loss = 0;
  int64_t supervised_tokens = 0;
  int64_t samples = 0;
  int64_t answered = 0;                   // questions answered by generation
  int64_t correct = 0;                    // exact matches (trimmed, case-insensitive)
  int64_t unanswered_for_time = 0;        // questions left when a rank hit the time limit
  bool interrupted = false;               // some rank was asked to stop: the figures are partial
  std::vector<GeneratedAnswer> examples;  // this rank's first few, for the log

  double accuracy() const { return answered ? static_cast<double>(correct) / answered : 0.0; }
};

struct EvalOptions {
  int64_t generate = 16;  // questions to answer (0: none; -1: all)
  int64_t max_new_tokens = 16;
  Precision precision = Precision::kFp32;
  int64_t examples = 3;
  double time_limit_s = 0;  // a rank starts no new answer after this long; 0 = no limit
  // Polled before each validation batch and each answer: true ends this rank's share there
  // (a stop signal). The ranks still meet at the one reduction at the end, whatever each did.
  std::function<bool()> stop;
};

// Every rank evaluates its share of the validation pipeline (the same plan everywhere) and
// answers the first questions of its share, `generate` split evenly over the ranks (-1: all of
// them), by greedy decoding with a KV cache; losses and counts are all-reduced.
EvalResult evaluate(model::VisionLanguageModel& model, const data::DataSetup& setup,
                    data::PlanningPipeline& validation, runtime::Communicator& comm,
                    const torch::Device& device, const EvalOptions& options);

// Greedy decoding after `prompt` (a built sample cut before its first answer) until
// <|im_end|> or max_new_tokens. Returns the generated ids (without <|im_end|>).
std::vector<int32_t> generate_greedy(model::VisionLanguageModel& model,
                                     const data::HostBatch& prompt, int32_t stop_id,
                                     int64_t max_new_tokens, const torch::Device& device,
                                     Precision precision);

}  // namespace vlm::train
