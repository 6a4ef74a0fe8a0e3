// JPEG decode through TurboJPEG (libjpeg-turbo 2.x API).
#include <turbojpeg.h>

#include <memory>
#include <stdexcept>

#include "core/error.h"
#include "data/image/image_codecs.h"

namespace vlm::data {
namespace {

struct TjHandleDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjHandleDeleter>;

// One decompressor per thread: creating one costs more than decoding a small image. After any
// error or warning it is replaced: libjpeg keeps tables across streams (abbreviated JPEG), so
// a corrupt stream's tables would break the next valid image decoded on that thread ("Bogus
// Huffman table definition"; tests/data/test_image_decode.cpp).
TjHandle& thread_slot() {
  thread_local TjHandle handle;
  return handle;
}

tjhandle thread_decompressor() {
  TjHandle& handle = thread_slot();
  if (!handle) handle.reset(tjInitDecompress());
  if (!handle)
    throw std::runtime_error(std::string("tjInitDecompress: ") + tjGetErrorStr2(nullptr));
  return handle.get();
}

[[noreturn]] void fail(tjhandle tj, const std::string& name) {
  const std::string reason = tjGetErrorStr2(tj);
  thread_slot().reset();
  throw DataError("cannot decode JPEG: " + reason +
                      " (the file is corrupt or truncated; re-encode or remove it)",
                  SourceLocation{name});
}

// libjpeg reports recoverable problems as warnings. Most ("extraneous bytes before marker")
// leave a correct picture and are common in real datasets; a premature end leaves grey rows,
// so it is an error like PIL's "image file is truncated".
bool is_fatal_warning(tjhandle tj) {
  return std::string(tjGetErrorStr2(tj)).find("Premature end") != std::string::npos;
}

// Adobe CMYK JPEGs store inverted CMYK, so R = C * K / 255 etc. on the stored values
// (as PIL does: its "CMYK;I" raw mode followed by CMYK -> RGB).
RgbImage cmyk_to_rgb(const std::vector<uint8_t>& cmyk, int64_t width, int64_t height) {
  RgbImage rgb(width, height);
  const size_t pixels = static_cast<size_t>(width * height);
  for (size_t i = 0; i < pixels; ++i) {
    const unsigned k = cmyk[i * 4 + 3];
    for (int c = 0; c < 3; ++c) {
      rgb.pixels[i * 3 + c] = static_cast<uint8_t>((cmyk[i * 4 + c] * k + 127) / 255);
    }
  }
  return rgb;
}

}  // namespace

RgbImage decode_jpeg_turbo(const uint8_t* data, size_t size, const std::string& name) {
  tjhandle tj = thread_decompressor();
  int width = 0, height = 0, subsampling = 0, colourspace = 0;
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(size), &width, &height, &subsampling,
                          &colourspace) != 0) {
    fail(tj, name);
  }
  if (static_cast<int64_t>(width) * height > kMaxImagePixels) {
    throw DataError("JPEG too large to decode", SourceLocation{name});
  }
  const bool cmyk = colourspace == TJCS_CMYK || colourspace == TJCS_YCCK;
  const int pixel_format = cmyk ? TJPF_CMYK : TJPF_RGB;
  const int channels = tjPixelSize[pixel_format];
  std::vector<uint8_t> cmyk_pixels;
  RgbImage rgb;
  uint8_t* out = nullptr;
  if (cmyk) {
    cmyk_pixels.resize(static_cast<size_t>(width) * height * channels);
    out = cmyk_pixels.data();
  } else {
    rgb = RgbImage(width, height);
    out = rgb.pixels.data();
  }
  if (tjDecompress2(tj, data, static_cast<unsigned long>(size), out, width, width * channels,
                    height, pixel_format, 0) != 0) {
    if (tjGetErrorCode(tj) != TJERR_WARNING || is_fatal_warning(tj)) fail(tj, name);
    thread_slot().reset();  // a warning: the picture stands, the decompressor is replaced
  }
  return cmyk ? cmyk_to_rgb(cmyk_pixels, width, height) : rgb;
}

}  // namespace vlm::data
