// How deeply a JSON text nests, found without parsing it. Readers check it before they parse:
// nlohmann::json copies, compares and walks documents recursively, so a document nested tens
// of thousands of levels deep (crafted or damaged) would overflow the stack instead of being
// refused with a message.
#pragma once

#include <cstdint>
#include <string_view>

namespace vlm {

// The files we read nest a handful of levels; anything past this is refused.
inline constexpr int64_t kMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in `text` (brackets inside strings do not count).
int64_t json_nesting_depth(std::string_view text);

}  // namespace vlm
