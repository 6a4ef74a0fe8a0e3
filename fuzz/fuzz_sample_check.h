// The invariants of a sample as a dataset reader returns it (fuzz_manifest, fuzz_shard): a
// problem has a reason; an accepted sample has at most kMaxImagesPerSample images, starts with
// a user turn and holds an assistant turn. Returns the sample, or nullptr for a problem.
#pragma once

#include <variant>

#include "data/source/manifest.h"
#include "fuzz_support.h"

namespace vlm::fuzz {

inline const data::RawSample* check_sample(const char* harness, const data::ParsedLine& parsed) {
  const auto* sample = std::get_if<data::RawSample>(&parsed);
  if (sample == nullptr) {
    if (std::get<data::SampleProblem>(parsed).reason.empty()) {
      invariant_failed(harness, "a problem without a reason");
    }
    return nullptr;
  }
  if (sample->images.size() > data::kMaxImagesPerSample) {
    invariant_failed(harness, "more images than kMaxImagesPerSample");
  }
  bool assistant = false;
  for (const data::ChatTurn& turn : sample->turns) {
    assistant |= turn.role == data::ChatRole::kAssistant;
  }
  if (sample->turns.empty() || sample->turns.front().role != data::ChatRole::kUser || !assistant) {
    invariant_failed(harness, "a sample without user-first turns and an answer");
  }
  return sample;
}

}  // namespace vlm::fuzz
