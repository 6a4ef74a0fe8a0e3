// Byte quantities: parsing "80GiB" / "1.5GB" / "512MiB" / "1024", and printing them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vlm {

// Accepts a plain integer (bytes) or a number with a unit: B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB (powers of 1024); case-insensitive, optional space. nullopt when malformed,
// negative or too large for int64.
std::optional<int64_t> parse_bytes(std::string_view text);

// "1.50 GiB", "512.00 MiB", "17 B": binary units, two decimals.
std::string format_bytes(int64_t bytes);

}  // namespace vlm
