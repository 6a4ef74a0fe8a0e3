// The order in which samples are drawn from several datasets mixed by weight.
//
// Each dataset is read in a fresh seeded permutation every epoch; datasets are interleaved by
// smooth weighted round-robin, so any window of the stream holds them in proportion to their
// weights (no sampling noise) and the stream is infinite (training is bounded by max_steps).
// The whole state is a few numbers per dataset and serialises to JSON: a resumed stream
// continues exactly where it stopped.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace vlm::data {

// Identifies one draw: which dataset, which sample of it, in which pass over it.
struct SampleRef {
  uint32_t dataset = 0;
  uint64_t index = 0;
  uint64_t epoch = 0;
  bool operator==(const SampleRef& o) const {
    return dataset == o.dataset && index == o.index && epoch == o.epoch;
  }
};

class SampleStream {
 public:
  // sizes[d] samples in dataset d, drawn with weights[d] > 0. `shuffle` false keeps file order
  // (evaluation).
  SampleStream(std::vector<uint64_t> sizes, std::vector<double> weights, uint64_t seed,
               bool shuffle = true);

  SampleRef next();

  // Draws after which every sample of every dataset has been drawn at least once, from any
  // position of the stream: 2 x size draws of a dataset cover one whole epoch's permutation
  // wherever they start, and smooth weighted round-robin gives a dataset its weight's share of
  // any window within a draw or two. Bounds a consumer's wait for a usable sample.
  uint64_t draws_to_cover_every_sample() const;

  nlohmann::json state() const;
  void restore(const nlohmann::json& state);  // throws DataError on a mismatching state

 private:
  struct Dataset {
    uint64_t size = 0;
    double weight = 0;
    double current = 0;  // smooth weighted round-robin credit
    uint64_t epoch = 0;
    uint64_t position = 0;
    std::vector<uint64_t> order;  // permutation of this epoch (empty when not shuffling)
  };
  void start_epoch(uint32_t d);

  std::vector<Dataset> datasets_;
  double total_weight_ = 0;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace vlm::data
