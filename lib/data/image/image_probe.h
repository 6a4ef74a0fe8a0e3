// Image header probe: format, size and EXIF orientation from the first bytes of a file.
//
// Planning (image grids, crop counts, packing) needs only the size of every image, so this
// reads the PNG IHDR chunk or the JPEG markers up to the frame header (SOFn) and never touches
// pixel data. Every length and offset is bounds-checked; a truncated, garbage or unsupported
// file is a vlm::DataError naming the file and the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "data/image/image_types.h"

namespace vlm::data {

// Reads only as much of the file as the headers need (64 KiB first; more only when large
// APPn segments come before the JPEG frame header).
ImageHeader probe_image(const std::string& path);

// The same from a memory buffer; `name` is used in error messages.
ImageHeader probe_image_bytes(const uint8_t* data, size_t size, const std::string& name);

}  // namespace vlm::data
