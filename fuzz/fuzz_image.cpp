// Images: probe_image_bytes (PNG IHDR / JPEG markers and EXIF orientation, what planning reads)
// and decode_image_bytes (libpng / TurboJPEG, then the EXIF orientation applied), the two entry
// points of data/image. Invariant: an image that probes and decodes has the size the probe
// reported (planning and collation must agree on every image's grid), and a decoded image
// never exceeds kMaxImagePixels. Decoding runs only for images of at most kDecodePixels:
// larger legal images (up to 89.5 MP) decode correctly but cost seconds each, which would only
// measure the codecs' speed and trip the per-input timeout.
#include <string>

#include "data/image/image_decode.h"
#include "data/image/image_probe.h"
#include "fuzz_support.h"

using namespace vlm::data;

namespace {
constexpr int64_t kDecodePixels = 4'000'000;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::fuzz::guard("image", [&] {
    const ImageHeader header = probe_image_bytes(data, size, "fuzz.img");
    if (header.width < 1 || header.height < 1 || header.width * header.height > kMaxImagePixels ||
        header.exif_orientation < 1 || header.exif_orientation > 8) {
      vlm::fuzz::invariant_failed("image", "probe accepted an impossible header");
    }
    if (header.width * header.height > kDecodePixels) return;
    const RgbImage image = decode_image_bytes(data, size, "fuzz.img");
    if (image.width != header.width || image.height != header.height ||
        image.pixels.size() != static_cast<size_t>(image.width * image.height * 3)) {
      vlm::fuzz::invariant_failed("image", "decoded " + std::to_string(image.width) + "x" +
                                               std::to_string(image.height) + ", probed " +
                                               std::to_string(header.width) + "x" +
                                               std::to_string(header.height));
    }
  });
  return 0;
}
