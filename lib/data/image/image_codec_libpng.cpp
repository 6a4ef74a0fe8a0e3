// PNG decode through libpng's progressive row API. libpng reports errors by longjmp, so every
// C++ object that must be destroyed lives outside the setjmp scope (in decode_png_libpng).
#include <png.h>

#include <csetjmp>
#include <cstring>

#include "core/error.h"
#include "data/image/image_codecs.h"

namespace vlm::data {
namespace {

struct MemoryReader {
  const uint8_t* data;
  size_t size;
  size_t offset;
};

void read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* reader = static_cast<MemoryReader*>(png_get_io_ptr(png));
  if (length > reader->size - reader->offset) png_error(png, "unexpected end of file");
  std::memcpy(out, reader->data + reader->offset, length);
  reader->offset += length;
}

void on_error(png_structp png, png_const_charp message) {
  auto* text = static_cast<char*>(png_get_error_ptr(png));
  std::strncpy(text, message, 255);
  text[255] = '\0';
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}

// Walks the chunk list of a PNG held in memory: a chunk whose length runs past the end of the
// data is a corrupt or truncated file. libpng would first allocate and zero a buffer of the
// claimed length (up to 2 GiB, seconds of work for a 100-byte file), then fail to read it.
// Returns the problem, or nullptr.
const char* chunk_problem(const uint8_t* data, size_t size) {
  constexpr size_t kSignatureBytes = 8, kChunkOverheadBytes = 12;  // length, type, CRC
  size_t pos = kSignatureBytes;
  while (pos + kChunkOverheadBytes <= size) {
    const size_t length = (size_t{data[pos]} << 24) | (size_t{data[pos + 1]} << 16) |
                          (size_t{data[pos + 2]} << 8) | size_t{data[pos + 3]};
    if (length > size - pos - kChunkOverheadBytes) return "a chunk runs past the end of the file";
    if (std::memcmp(data + pos + 4, "IEND", 4) == 0) return nullptr;
    pos += kChunkOverheadBytes + length;
  }
  return "the file ends before its IEND chunk";
}

// Sets up transforms so every row comes out as 8-bit RGB, sizes `out` and reads the rows;
// returns false on a libpng error. No automatic C++ object lives across setjmp here (`out` is
// the caller's), so longjmp skips no destructor.
bool read_png(png_structp png, png_infop info, MemoryReader* reader, RgbImage* out) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, reader, read_from_memory);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  if (static_cast<int64_t>(width) * height > kMaxImagePixels) png_error(png, "image too large");
  const int colour_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  if (bit_depth == 16) png_set_strip_16(png);  // high byte, as stb_image
  if (colour_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (colour_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (colour_type == PNG_COLOR_TYPE_GRAY || colour_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(png);
  }
  if (colour_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(width) * 3) {
    png_error(png, "unexpected row layout after transforms");
  }
  out->width = width;
  out->height = height;
  out->pixels.resize(static_cast<size_t>(width) * height * 3);
  for (int pass = 0; pass < passes; ++pass) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, out->row(y), nullptr);
  }
  png_read_end(png, nullptr);
  return true;
}

}  // namespace

RgbImage decode_png_libpng(const uint8_t* data, size_t size, const std::string& name) {
  if (const char* problem = chunk_problem(data, size)) {
    throw DataError(std::string("cannot decode PNG: ") + problem +
                        " (the file is corrupt or truncated; re-encode or remove it)",
                    SourceLocation{name});
  }
  char message[256] = "corrupt PNG";
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, message, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    throw std::bad_alloc();
  }
  MemoryReader reader{data, size, 0};
  RgbImage rgb;
  const bool ok = read_png(png, info, &reader, &rgb);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!ok) {
    throw DataError(std::string("cannot decode PNG: ") + message +
                        " (the file is corrupt or truncated; re-encode or remove it)",
                    SourceLocation{name});
  }
  return rgb;
}

}  // namespace vlm::data
