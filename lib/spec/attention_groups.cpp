#include "spec/attention_groups.h"

#include <algorithm>
#include <numeric>

namespace vlm::spec {

std::vector<SegmentGroup> group_segments(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<SegmentGroup> groups;
  for (const int64_t s : order) {
    const int64_t length = lengths[static_cast<size_t>(s)];
    if (groups.empty() || 2 * length * length < groups.back().padded * groups.back().padded) {
      groups.push_back(SegmentGroup{{}, length});
    }
    groups.back().segments.push_back(s);
  }
  return groups;
}

int64_t padded_tokens(const std::vector<int64_t>& lengths) {
  int64_t rows = 0;
  for (const SegmentGroup& g : group_segments(lengths)) {
    rows += static_cast<int64_t>(g.segments.size()) * g.padded;
  }
  return rows;
}

}  // namespace vlm::spec
