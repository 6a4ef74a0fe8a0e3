#include "data/image_encode.h"

#include <stb_image_write.h>
#include <turbojpeg.h>

#include <fstream>
#include <memory>
#include <stdexcept>

#include "core/error.h"

namespace vlm::data {
namespace {

void append_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  const auto* bytes = static_cast<const uint8_t*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

void check_encodable(const RgbImage& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width * image.height * 3)) {
    throw std::invalid_argument("encode: image has no pixels or an inconsistent size");
  }
}

struct TjHandleDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};

}  // namespace

std::vector<uint8_t> encode_png(const RgbImage& image) {
  check_encodable(image);
  std::vector<uint8_t> out;
  if (!stbi_write_png_to_func(append_bytes, &out, static_cast<int>(image.width),
                              static_cast<int>(image.height), 3, image.pixels.data(),
                              static_cast<int>(image.row_bytes()))) {
    throw std::runtime_error("stbi_write_png_to_func failed");
  }
  return out;
}

std::vector<uint8_t> encode_jpeg(const RgbImage& image, int quality) {
  check_encodable(image);
  if (quality < 1 || quality > 100) throw std::invalid_argument("JPEG quality must be 1-100");
  thread_local std::unique_ptr<void, TjHandleDeleter> handle(tjInitCompress());
  if (!handle) throw std::runtime_error(std::string("tjInitCompress: ") + tjGetErrorStr2(nullptr));
  unsigned char* jpeg = nullptr;
  unsigned long jpeg_size = 0;
  if (tjCompress2(handle.get(), image.pixels.data(), static_cast<int>(image.width),
                  static_cast<int>(image.row_bytes()), static_cast<int>(image.height), TJPF_RGB,
                  &jpeg, &jpeg_size, TJSAMP_420, quality, 0) != 0) {
    tjFree(jpeg);
    throw std::runtime_error(std::string("tjCompress2: ") + tjGetErrorStr2(handle.get()));
  }
  std::vector<uint8_t> out(jpeg, jpeg + jpeg_size);
  tjFree(jpeg);
  return out;
}

void write_bytes_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  if (!file.flush()) {
    throw DataError("cannot write file (is the directory writable and the disk not full?)",
                    SourceLocation{path});
  }
}

void write_png_file(const std::string& path, const RgbImage& image) {
  write_bytes_file(path, encode_png(image));
}

void write_jpeg_file(const std::string& path, const RgbImage& image, int quality) {
  write_bytes_file(path, encode_jpeg(image, quality));
}

}  // namespace vlm::data
