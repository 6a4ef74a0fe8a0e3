#include "data/image/image_decode.h"

#include <fstream>

#include "core/error.h"
#include "data/image/image_codecs.h"
#include "data/image/image_orientation.h"
#include "data/image/image_probe.h"

namespace vlm::data {

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kPng:
      break;
  }
  return "PNG";
}

std::vector<uint8_t> read_image_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw DataError("cannot open image file (does it exist?)", SourceLocation{path});
  std::vector<uint8_t> bytes(static_cast<size_t>(file.tellg()));
  file.seekg(0);
  if (!file.read(reinterpret_cast<char*>(bytes.data()),
                 static_cast<std::streamsize>(bytes.size()))) {
    throw DataError("cannot read image file", SourceLocation{path});
  }
  return bytes;
}

// Codecs by measurement (bench_images, one thread, CPU time, 2026-11-21, 2-core Debian VM):
//   2048x2048 JPEG q90: TurboJPEG 28.4 ms, stb_image 49.0 ms  -> TurboJPEG.
//   2048x2048 PNG: libpng 95.5 ms, stb_image 97.6 ms; 1536x2048: 67.2 vs 62.7 ms -> a tie
//   within noise; libpng kept (zlib's inflate, and it gives the same pixels as stb: tested).
RgbImage decode_image_bytes(const uint8_t* data, size_t size, const std::string& name) {
  // The probe validates the header (and the pixel limit) before any codec allocates.
  const ImageHeader header = probe_image_bytes(data, size, name);
  RgbImage stored = header.format == ImageFormat::kJpeg   ? decode_jpeg_turbo(data, size, name)
                    : header.format == ImageFormat::kWebp ? decode_webp(data, size, name)
                                                          : decode_png_libpng(data, size, name);
  if (stored.width != header.stored_width || stored.height != header.stored_height) {
    throw DataError("decoded size differs from the header's; the file is corrupt",
                    SourceLocation{name});
  }
  return apply_exif_orientation(std::move(stored), header.exif_orientation);
}

RgbImage decode_image(const std::string& path) {
  const std::vector<uint8_t> bytes = read_image_file(path);
  return decode_image_bytes(bytes.data(), bytes.size(), path);
}

}  // namespace vlm::data
