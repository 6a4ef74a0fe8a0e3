// Brace patterns naming WebDataset shards, as the webdataset library and img2dataset write
// them: `train-{000000..000127}.tar` (a numeric range; the first bound's width is the padding),
// `{train,extra}-{0..3}.tar` (a list), several groups multiplied out left to right.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vlm::data {

// More names than this is a mistake (a range typed with one digit too many), not a dataset.
inline constexpr size_t kMaxBraceExpansion = 1'000'000;

bool has_brace_pattern(const std::string& text);

// The names in order. ConfigError naming the pattern for an unclosed brace, an empty group, a
// descending or malformed range, or more than kMaxBraceExpansion names.
std::vector<std::string> expand_braces(const std::string& pattern);

}  // namespace vlm::data
