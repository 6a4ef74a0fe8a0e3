// EXIF orientation: turns stored pixels into the picture as it is meant to be displayed.
#pragma once

#include "data/image/image_types.h"

namespace vlm::data {

// Applies EXIF orientation `orientation` (1-8, TIFF 6.0 / EXIF 2.3 tag 0x0112: where row 0
// and column 0 of the stored image lie on the displayed picture). 5-8 swap width and height.
// Orientation 1 (or an out-of-range value) returns the image unchanged.
RgbImage apply_exif_orientation(RgbImage stored, int orientation);

}  // namespace vlm::data
