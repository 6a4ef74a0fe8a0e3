// Per-library decoders behind decode_image(). Exposed so the benchmark can compare them and
// tests can check they agree; everything else should call decode_image().
//
// All return 8-bit RGB in the orientation stored in the file (no EXIF handling) and throw
// vlm::DataError (naming `name`) for corrupt data; none of them crashes on garbage.
// Alpha is dropped, not composited (what PIL's Image.convert("RGB") does, hence nanoVLM);
// 16-bit samples keep their high byte; palette and grey are expanded to RGB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "data/image/image_types.h"

namespace vlm::data {

// libjpeg-turbo's TurboJPEG API (tjDecompress2). Grey and CMYK/YCCK JPEGs become RGB.
RgbImage decode_jpeg_turbo(const uint8_t* data, size_t size, const std::string& name);

// libpng (png_read_row with expand / strip transforms).
RgbImage decode_png_libpng(const uint8_t* data, size_t size, const std::string& name);

// libwebp (WebPDecodeRGBInto), lossy or lossless; alpha dropped.
RgbImage decode_webp(const uint8_t* data, size_t size, const std::string& name);

// stb_image (stbi_load_from_memory forcing 3 channels), for PNG or baseline/progressive JPEG.
RgbImage decode_stb(const uint8_t* data, size_t size, const std::string& name);

}  // namespace vlm::data
