// Integers read back from JSON this tool wrote (checkpoint cursors and states). nlohmann's
// get<uint64_t>() converts a float with a static_cast, undefined beyond the type's range (the
// checkpoint_state harness found 1e308 in a cursor); json_integer accepts JSON integers within
// the type's range only and throws std::invalid_argument otherwise, which refuses the
// checkpoint like any damaged state.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace vlm {

template <class Int>
Int json_integer(const nlohmann::json& j) {
  static_assert(std::is_integral_v<Int> && sizeof(Int) <= 8);
  using Limits = std::numeric_limits<Int>;
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v <= static_cast<uint64_t>(Limits::max())) return static_cast<Int>(v);
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    const bool in_range =
        std::is_signed_v<Int>
            ? v >= static_cast<int64_t>(Limits::min()) && v <= static_cast<int64_t>(Limits::max())
            : v >= 0 && static_cast<uint64_t>(v) <= static_cast<uint64_t>(Limits::max());
    if (in_range) return static_cast<Int>(v);
  }
  throw std::invalid_argument("expected an integer in [" + std::to_string(Limits::min()) + ", " +
                              std::to_string(Limits::max()) + "], got " + j.dump());
}

}  // namespace vlm
