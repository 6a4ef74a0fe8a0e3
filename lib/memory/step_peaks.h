// The transient peaks of one training step (forward, backward, optimizer), in bytes above what
// is live right before the step's forward.
//
// Each phase is replayed allocation by allocation in the order LibTorch 1.13 runs it (the
// statements of lib/model, autograd's backward nodes in sequence_nr order, AdamW's per-
// parameter loop), keeping the bytes live at every moment and their maximum (memory/replay.h;
// one replay per tower). The peaks are held to the tracking allocator, to the byte, by
// tests/memory_accuracy/test_step_peaks.cpp (whole steps, and the image path on its own);
// docs/memory.md derives the terms.
//
// What is modelled (else `modelled` is false and `why_not` says what is missing; the numbers
// are then 0, never an estimate):
//   - fp32 compute and bf16 autocast; every module trained, or frozen in fp32 or bf16 storage
//     (model.frozen_dtype), never all three frozen; a frozen decoder with no trained module
//     before it (a text-only batch) runs without a graph and without a backward;
//   - either tower checkpointed or not, the ViT in chunks of any vision_chunk_crops, the loss
//     chunked (loss_chunk_tokens) or not, a tied head or an untied one;
//   - at least one supervised token, and the segment lengths in cu_seqlens order
//     (BatchShape::segment_lengths, filled by BatchShape::from_segments);
//   - MemorySpec::threads, the intra-op threads (LayerNorm's backward buffer, oneDNN's
//     scratchpads).
// The backward is the trainer's (train/step_runner.cpp): the forward's count dropped, the loss
// held, `objective = loss_sum * inv_n` run backward; the optimizer phase is GroupedAdamW::step
// alone, without the trainer's clip_grad_norm.
#pragma once

#include <cstdint>
#include <string>

#include "memory/batch_shape.h"
#include "memory/memory_spec.h"

namespace vlm::memory {

// The towers this step's backward reaches for the first time in the process: it allocates
// their gradients (AccumulateGrad steals each first gradient), and AdamW then creates their
// moments. Both at the process's first step; the image path (ViT and projector) alone at the
// first step with crops when every micro-batch before was text-only.
struct FirstBackward {
  bool language = false;
  bool image = false;
  static FirstBackward both(bool first) { return {first, first}; }
};

struct PhasePeaks {
  bool modelled = false;
  std::string why_not;  // the first unmodelled feature, when !modelled

  // Highest live bytes, above the live bytes before the forward, during:
  int64_t forward = 0;    // model->forward(batch) (the loss included)
  int64_t backward = 0;   // (loss_sum * inv_n).backward(), the loss still held
  int64_t optimizer = 0;  // GroupedAdamW::step() after that backward (outputs released)
};

// `first_step`: the first step of the process (no preflight backward before it). Gradients
// are then allocated during its backward (AccumulateGrad steals each first gradient) and
// AdamW's moments during its step; from the second step on both are static (live before the
// forward: LibTorch 1.13's zero_grad zeroes them in place) and every incoming gradient is a
// transient added in place. A later step assumes every trained module has had a gradient (a
// step with crops has run), so AdamW steps the image path's parameters even on a text-only
// batch.
PhasePeaks step_peaks(const MemorySpec& spec, const BatchShape& shape, bool first_step);
// The same with the towers' first backwards apart (a text-only batch leaves the image path's
// for later: `first.image` then changes nothing but which parameters AdamW steps).
PhasePeaks step_peaks(const MemorySpec& spec, const BatchShape& shape, FirstBackward first);

// Whether the CPU replay follows the kernels of `spec.torch` for this run: "" when it does (every
// run on 1.13; fp32 products on 2.x), else why not. On 2.x bf16 products (train.precision
// bf16, a module frozen in bf16 storage) run in LibTorch's bundled oneDNN, whose scratchpads
// the replay does not know yet: the step is then replayed as 1.13 runs it (docs/memory.md).
std::string cpu_unreplayed(const MemorySpec& spec);

// The bytes by which a measured peak may fall short of step_peaks' on LibTorch 2.x with more
// than one intra-op thread: the flash attention's backward gives each thread that gets work a
// `dsum` buffer (4 bytes per query of a block) when the thread starts, so whether they are
// alive at the same moment depends on timing. The replay counts all of them (the most there
// can be); this is one block's worth for each thread but the first, of the step's largest
// query block. 0 on 1.13 and with one thread.
int64_t racy_bytes(const MemorySpec& spec, const BatchShape& shape);

// Communicator::all_reduce_gradients's peak above the live bytes before it (ranks > 1; 0 for one
// rank): the gradients in AdamW's order, cut by take_tensors into buckets that close once they
// reach kGradientBucketBytes; a bucket of several tensors is flattened by cat (its bytes, until
// its reduction is done), one of a single tensor is a view; at most two are in flight.
// `image_gradients`: the image path's trained parameters have gradients (a backward with
// crops has run).
int64_t allreduce_peak(const MemorySpec& spec, bool image_gradients);

// GroupedAdamW::step's peak above the live bytes before it (the gradients live): the moments
// created one by one where they do not exist yet, and each update's temporaries. AdamW steps
// the decoder's trained parameters and, with `image_gradients`, the image path's; their
// moments exist with `language_moments` and `image_moments`.
int64_t optimizer_step_peak(const MemorySpec& spec, bool image_gradients, bool language_moments,
                            bool image_moments);

}  // namespace vlm::memory
