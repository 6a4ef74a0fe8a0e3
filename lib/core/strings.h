// Small string utilities shared across layers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vlm {

// Levenshtein distance (insert, delete, substitute all cost 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` by edit distance, or "" when none is plausibly meant
// (distance more than about a third of the word's length).
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& parts, std::string_view separator);
std::string trim(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);

// Shortest decimal text that reads back to exactly `value` ("0.1", "2e-05", "4").
std::string format_real(double value);

// JSON-style double-quoted string (valid YAML too).
std::string double_quoted(std::string_view s);

}  // namespace vlm
