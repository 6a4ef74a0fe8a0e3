// Relative training compute of micro-batches (the cost model behind estimate-memory's
// relative_throughput): the forward FLOPs of each module (spec/derived.h, PaLM's counting)
// times the passes the step runs over it. A trained module runs 3 (its forward, and a backward
// of twice the forward); a frozen one that a gradient crosses to a trained module before it, 2
// (the input gradients only); a frozen one with nothing trained before it, 1. Checkpointing a
// tower adds one forward of it, and a chunked loss one forward of the head. Memory levers that
// move no FLOPs (chunking the ViT, the frozen modules' dtype, the micro-batch split) cost 1.0:
// kernel-size effects on a GPU are not in the model (docs/estimate-memory.md).
#pragma once

#include <vector>

#include "memory/batch_shape.h"
#include "memory/memory_spec.h"

namespace vlm::estimate {

// Training FLOPs of one micro-batch of `shape` (padding included: it is computed).
double micro_batch_flops(const memory::MemorySpec& spec, const memory::BatchShape& shape);

// Training FLOPs per row over `shapes` (rows are what a global batch fixes).
double flops_per_row(const memory::MemorySpec& spec, const std::vector<memory::BatchShape>& shapes);

}  // namespace vlm::estimate
