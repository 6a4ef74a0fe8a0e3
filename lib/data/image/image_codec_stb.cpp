// PNG / JPEG decode through stb_image (Debian's libstb provides the implementation).
#include <stb_image.h>

#include <cstring>
#include <limits>
#include <memory>

#include "core/error.h"
#include "data/image/image_codecs.h"

namespace vlm::data {

RgbImage decode_stb(const uint8_t* data, size_t size, const std::string& name) {
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw DataError("image file too large for stb_image", SourceLocation{name});
  }
  int width = 0, height = 0, channels_in_file = 0;
  constexpr int kRgb = 3;  // stb converts grey/palette/alpha/16-bit to 8-bit RGB, dropping alpha
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(data, static_cast<int>(size), &width, &height, &channels_in_file, kRgb),
      stbi_image_free);
  if (!pixels) {
    throw DataError(std::string("cannot decode image: ") + stbi_failure_reason() +
                        " (the file is corrupt or truncated; re-encode or remove it)",
                    SourceLocation{name});
  }
  RgbImage rgb(width, height);
  std::memcpy(rgb.pixels.data(), pixels.get(), rgb.pixels.size());
  return rgb;
}

}  // namespace vlm::data
