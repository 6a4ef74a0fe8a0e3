// WebP decode through libwebp (Debian's libwebp-dev): lossy (VP8) and lossless (VP8L) stills.
#include <webp/decode.h>

#include "core/error.h"
#include "data/image/image_codecs.h"

namespace vlm::data {

RgbImage decode_webp(const uint8_t* data, size_t size, const std::string& name) {
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(data, size, &features) != VP8_STATUS_OK || features.has_animation ||
      features.width <= 0 || features.height <= 0 ||
      int64_t{features.width} * features.height > kMaxImagePixels) {
    throw DataError("cannot decode WebP: not a still WebP image within the pixel limit",
                    SourceLocation{name});
  }
  RgbImage rgb(features.width, features.height);
  // MODE_RGB drops alpha without premultiplying, as PIL's convert("RGB") does.
  if (WebPDecodeRGBInto(data, size, rgb.pixels.data(), rgb.pixels.size(),
                        static_cast<int>(rgb.row_bytes())) == nullptr) {
    throw DataError("cannot decode WebP: the file is corrupt or truncated; re-encode or remove it",
                    SourceLocation{name});
  }
  return rgb;
}

}  // namespace vlm::data
