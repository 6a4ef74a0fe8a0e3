// Pictures for the demo dataset: large flat shapes in saturated colours on a light grey,
// plain or lightly noisy background. Integer geometry only, so output is the same everywhere.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/demo/demo_data_random.h"
#include "data/image/image_types.h"

namespace vlm::data {

enum class DemoShape { kCircle, kSquare, kTriangle };

struct DemoColour {
  const char* name;
  std::array<uint8_t, 3> rgb;
};

// The palettes the questions draw from; answers are these names.
const std::vector<DemoColour>& demo_colours();
const std::vector<std::string>& demo_shape_names();  // indexed by DemoShape
const std::string& demo_shape_name(DemoShape shape);

// One shape: its bounding box is `size` x `size` pixels centred on (centre_x, centre_y).
struct DemoShapeSpec {
  DemoShape shape = DemoShape::kCircle;
  int colour = 0;  // index into demo_colours()
  int64_t centre_x = 0;
  int64_t centre_y = 0;
  int64_t size = 0;
};

// A background of grey level `grey`, with +-noise grey levels per pixel when noise > 0.
RgbImage demo_background(int64_t width, int64_t height, int grey, int noise, DemoRandom& rng);

// Paints `spec` onto `image` (pixels whose centre lies inside the shape).
void draw_demo_shape(RgbImage& image, const DemoShapeSpec& spec);

}  // namespace vlm::data
