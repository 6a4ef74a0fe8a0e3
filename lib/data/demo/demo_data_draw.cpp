#include "data/demo/demo_data_draw.h"

#include <algorithm>

namespace vlm::data {

const std::vector<DemoColour>& demo_colours() {
  // Saturated and far apart in RGB, so a 64 px downscale or JPEG keeps them distinct.
  static const std::vector<DemoColour> colours = {
      {"red", {220, 30, 30}},     {"green", {30, 170, 50}},   {"blue", {35, 70, 220}},
      {"yellow", {235, 205, 20}}, {"purple", {140, 40, 170}},
  };
  return colours;
}

const std::vector<std::string>& demo_shape_names() {
  static const std::vector<std::string> names = {"circle", "square", "triangle"};
  return names;
}

const std::string& demo_shape_name(DemoShape shape) {
  return demo_shape_names()[static_cast<size_t>(shape)];
}

RgbImage demo_background(int64_t width, int64_t height, int grey, int noise, DemoRandom& rng) {
  RgbImage image(width, height);
  if (noise <= 0) {
    std::fill(image.pixels.begin(), image.pixels.end(), static_cast<uint8_t>(grey));
    return image;
  }
  // Grey noise (same offset on all three channels), eight pixels per 64-bit draw; the small
  // modulo bias of `byte % span` is harmless for texture.
  const uint64_t span = 2 * static_cast<uint64_t>(noise) + 1;
  const int64_t pixels = width * height;
  uint64_t bits = 0;
  for (int64_t i = 0; i < pixels; ++i) {
    if (i % 8 == 0) bits = rng.next();
    const int64_t offset = static_cast<int64_t>((bits & 0xff) % span) - noise;
    bits >>= 8;
    const auto value = static_cast<uint8_t>(std::clamp<int64_t>(grey + offset, 0, 255));
    std::fill_n(image.pixels.begin() + i * 3, 3, value);
  }
  return image;
}

namespace {

// Inside tests in doubled coordinates (pixel centres at odd numbers) to stay in integers.
bool inside(const DemoShapeSpec& s, int64_t x2, int64_t y2) {
  const int64_t dx = x2 - 2 * s.centre_x, dy = y2 - 2 * s.centre_y;  // doubled offsets
  const int64_t half = s.size;                                       // doubled half size
  switch (s.shape) {
    case DemoShape::kCircle:
      return dx * dx + dy * dy <= half * half;
    case DemoShape::kSquare:
      return dx >= -half && dx <= half && dy >= -half && dy <= half;
    case DemoShape::kTriangle:
      // Apex at the top centre, base along the bottom: |dx| <= (dy + half) / 2 for dy in box.
      return dy >= -half && dy <= half && 2 * std::abs(dx) <= dy + half;
  }
  return false;
}

}  // namespace

void draw_demo_shape(RgbImage& image, const DemoShapeSpec& spec) {
  const auto& rgb = demo_colours()[static_cast<size_t>(spec.colour)].rgb;
  const int64_t x0 = std::max<int64_t>(0, spec.centre_x - spec.size / 2 - 1);
  const int64_t x1 = std::min<int64_t>(image.width - 1, spec.centre_x + spec.size / 2 + 1);
  const int64_t y0 = std::max<int64_t>(0, spec.centre_y - spec.size / 2 - 1);
  const int64_t y1 = std::min<int64_t>(image.height - 1, spec.centre_y + spec.size / 2 + 1);
  for (int64_t y = y0; y <= y1; ++y) {
    for (int64_t x = x0; x <= x1; ++x) {
      if (!inside(spec, 2 * x + 1, 2 * y + 1)) continue;
      uint8_t* p = image.at(x, y);
      p[0] = rgb[0];
      p[1] = rgb[1];
      p[2] = rgb[2];
    }
  }
}

}  // namespace vlm::data
