#include "spec/attention_groups.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace vlm::spec {
namespace {

// A segment of `length` tokens (the lengths taken longest first) joins the open group padded to
// `padded` while padding at most doubles its attention work.
bool joins_group(int64_t length, int64_t padded) { return 2 * length * length >= padded * padded; }

}  // namespace

std::vector<SegmentGroup> group_segments(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<SegmentGroup> groups;
  for (const int64_t s : order) {
    const int64_t length = lengths[static_cast<size_t>(s)];
    if (groups.empty() || !joins_group(length, groups.back().padded)) {
      groups.push_back(SegmentGroup{{}, length});
    }
    groups.back().segments.push_back(s);
  }
  return groups;
}

std::vector<GroupShape> group_shapes(std::vector<int64_t> lengths) {
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  std::vector<GroupShape> groups;
  for (const int64_t length : lengths) {
    // group_segments' groups: equal lengths are interchangeable, so sorting the lengths gives
    // their shapes.
    if (groups.empty() || !joins_group(length, groups.back().padded)) {
      groups.push_back(GroupShape{0, length, 0});
    }
    ++groups.back().segments;
    groups.back().tokens += length;
  }
  return groups;
}

int64_t padded_tokens(const std::vector<int64_t>& lengths) {
  int64_t rows = 0;
  for (const GroupShape& g : group_shapes(lengths)) rows += g.segments * g.padded;
  return rows;
}

}  // namespace vlm::spec
