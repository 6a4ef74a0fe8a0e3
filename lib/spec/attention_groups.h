// How the decoder's grouped causal attention (model/packed_attention.cpp, the CPU's and older
// GPUs' kernel on LibTorch 2.x) batches the segments of a packed micro-batch: one fused call per
// group of segments of similar length, each padded to the group's longest. The model runs it and
// the memory model (memory/replay_language_2x.cpp) counts its tensors; one definition for both.
#pragma once

#include <cstdint>
#include <vector>

namespace vlm::spec {

// Segment indices (longest first) padded to `padded` tokens, the group's longest. A segment
// joins the open group while len^2 >= padded^2 / 2, so padding at most doubles a segment's
// attention work.
struct SegmentGroup {
  std::vector<int64_t> segments;
  int64_t padded = 0;
};
std::vector<SegmentGroup> group_segments(const std::vector<int64_t>& lengths);
// What a group is to the memory model: `segments` segments padded to `padded` tokens, of
// `tokens` real ones, in group_segments' order. Computed from the sorted lengths alone (no
// segment lists): the memory model asks for it millions of times.
struct GroupShape {
  int64_t segments = 0, padded = 0, tokens = 0;
};
std::vector<GroupShape> group_shapes(std::vector<int64_t> lengths);
// The rows the grouped calls attend over: each group's segments times its padded length.
int64_t padded_tokens(const std::vector<int64_t>& lengths);

}  // namespace vlm::spec
