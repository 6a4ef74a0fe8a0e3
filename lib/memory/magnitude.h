// The range of the memory model: the bytes it counts to, and a bound of what a step counts,
// computed without overflow. In-range but huge dimensions (rows of millions of tokens, a
// thousand layers) once gave negative peaks and "fits" (issue 29): the counts are int64 and
// wrapped. A config whose largest micro-batch is beyond the range is refused, naming its keys.
#pragma once

#include "core/config.h"
#include "memory/memory_spec.h"

namespace vlm::memory {

// The most bytes the model counts to: 2^60 (1 EiB), beyond any device by far, and 8x below
// int64's limit, room for every sum the replay forms of terms within step_bytes_bound.
inline constexpr double kMaxModelledBytes = 1152921504606846976.0;

// An upper bound, in double, of the bytes of every tensor a training step of `rows` rows of
// `row_tokens` tokens and `crops` crops could hold at once: every layer's activations saved at
// full width, attention's scores, probabilities and mask at full length for every layer, the
// logits, the input, the parameters with their gradients and moments, the whole taken 4 times.
double step_bytes_bound(const MemorySpec& spec, double rows, double row_tokens, double crops);

// Throws ConfigError when the largest micro-batch `config` allows (train.batch_size rows, or one
// with batch_size auto, of packing.max_seq_len tokens, each crop taking its image tokens) is
// beyond kMaxModelledBytes, naming the keys that size it.
void check_config_in_range(const Config& config, const MemorySpec& spec);

}  // namespace vlm::memory
