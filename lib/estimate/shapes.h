// The heaviest micro-batch shapes a config allows (memory::BatchShape), from the data layer's
// limits alone (a planned micro-batch's shape: sampler::batch_shape). Metadata only: no token, no
// pixel.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "data/packing/pack_item.h"
#include "data/packing/worst_case.h"
#include "memory/batch_shape.h"

namespace vlm::estimate {

// The candidates for the heaviest micro-batch of `config`: batch_size rows of max_seq_len
// tokens, each row one sample (one attention segment: the largest sum of squared lengths), with
// c crops for c from 0 to the worst case's crops_per_micro_batch, and every token that is not
// an image's supervised. Crops and supervised tokens trade against each other through the
// rows' tokens (an image's crops cost image_tokens_per_crop tokens each, and image tokens carry
// no label), and the memory model's peak grows with both, so the worst micro-batch is one of
// these; its prediction bounds every micro-batch the config can form. Up to 65 candidates,
// evenly spaced, both ends included.
std::vector<memory::BatchShape> worst_case_shapes(const Config& config,
                                                  const data::WorstCase& worst);
// The same for micro-batches of `rows` rows (the memory-aware sampler's heaviest micro-batch:
// as many of the heaviest packs as its budget admits), with rows x crops_per_pack crops at most
// (train.max_crops_per_micro_batch still applies).
std::vector<memory::BatchShape> worst_case_shapes(const Config& config,
                                                  const data::WorstCase& worst, int64_t rows);

}  // namespace vlm::estimate
