#include "data/image/image_orientation.h"

#include <cstring>

namespace vlm::data {
namespace {

// For displayed pixel (x, y), the stored pixel it shows. W, H are the stored sizes.
//   2: mirror left-right      3: rotate 180           4: mirror top-bottom
//   5: transpose              6: rotate 90 clockwise  7: transverse   8: rotate 90 anticlockwise
struct SourceOf {
  int orientation;
  int64_t w, h;
  void operator()(int64_t x, int64_t y, int64_t* sx, int64_t* sy) const {
    switch (orientation) {
      case 2:
        *sx = w - 1 - x;
        *sy = y;
        return;
      case 3:
        *sx = w - 1 - x;
        *sy = h - 1 - y;
        return;
      case 4:
        *sx = x;
        *sy = h - 1 - y;
        return;
      case 5:
        *sx = y;
        *sy = x;
        return;
      case 6:
        *sx = y;
        *sy = h - 1 - x;
        return;
      case 7:
        *sx = w - 1 - y;
        *sy = h - 1 - x;
        return;
      case 8:
        *sx = w - 1 - y;
        *sy = x;
        return;
      default:
        *sx = x;
        *sy = y;
        return;
    }
  }
};

}  // namespace

RgbImage apply_exif_orientation(RgbImage stored, int orientation) {
  if (orientation < 2 || orientation > 8) return stored;
  const bool swap = orientation >= 5;
  RgbImage shown(swap ? stored.height : stored.width, swap ? stored.width : stored.height);
  const SourceOf source_of{orientation, stored.width, stored.height};
  for (int64_t y = 0; y < shown.height; ++y) {
    uint8_t* out = shown.row(y);
    for (int64_t x = 0; x < shown.width; ++x, out += 3) {
      int64_t sx = 0, sy = 0;
      source_of(x, y, &sx, &sy);
      std::memcpy(out, stored.at(sx, sy), 3);
    }
  }
  return shown;
}

}  // namespace vlm::data
