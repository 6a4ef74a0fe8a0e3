#include "data/image/image_resize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace vlm::data {
namespace {

float bilinear(float x) {
  x = std::fabs(x);
  return x < 1.0f ? 1.0f - x : 0.0f;
}

// Keys (1981) cubic convolution kernel with a = -0.5, as PIL's bicubic_filter.
float bicubic(float x) {
  constexpr float a = -0.5f;
  x = std::fabs(x);
  if (x < 1.0f) return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f;
  if (x < 2.0f) return (((x - 5.0f) * x + 8.0f) * x - 4.0f) * a;
  return 0.0f;
}

// Filter taps of one axis: output i reads inputs first[i] .. first[i] + count[i] - 1 with
// weights[i * stride ...], which sum to 1.
struct AxisTaps {
  std::vector<int64_t> first;
  std::vector<int64_t> count;
  std::vector<float> weights;
  int64_t stride = 0;
};

AxisTaps compute_taps(int64_t in_size, int64_t out_size, ResampleFilter filter) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);  // stretch the filter when shrinking
  const double base_support = filter == ResampleFilter::kBicubic ? 2.0 : 1.0;
  const double support = base_support * filter_scale;
  auto kernel = filter == ResampleFilter::kBicubic ? bicubic : bilinear;

  AxisTaps taps;
  taps.stride = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size * taps.stride), 0.0f);
  for (int64_t i = 0; i < out_size; ++i) {
    const double centre = (static_cast<double>(i) + 0.5) * scale;  // in input pixel units
    const int64_t lo =
        std::max<int64_t>(0, static_cast<int64_t>(std::floor(centre - support + 0.5)));
    const int64_t hi =
        std::min<int64_t>(in_size, static_cast<int64_t>(std::floor(centre + support + 0.5)));
    const int64_t n = std::min(hi - lo, taps.stride);
    float* w = &taps.weights[static_cast<size_t>(i * taps.stride)];
    double sum = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      // Distance from the output centre to the input pixel's centre, in filter units.
      w[k] =
          kernel(static_cast<float>((static_cast<double>(lo + k) + 0.5 - centre) / filter_scale));
      sum += w[k];
    }
    if (sum != 0.0) {
      for (int64_t k = 0; k < n; ++k) w[k] = static_cast<float>(w[k] / sum);
    }
    taps.first[i] = lo;
    taps.count[i] = n;
  }
  return taps;
}

// Rows of `in` (channels interleaved, `in_width` pixels) resampled horizontally into `out`.
template <typename In>
void resample_rows(const In* in, int64_t in_width, int64_t rows, const AxisTaps& taps,
                   int64_t out_width, float* out) {
  for (int64_t y = 0; y < rows; ++y) {
    const In* src = in + y * in_width * 3;
    float* dst = out + y * out_width * 3;
    for (int64_t x = 0; x < out_width; ++x) {
      const float* w = &taps.weights[static_cast<size_t>(x * taps.stride)];
      const In* p = src + taps.first[x] * 3;
      float r = 0.0f, g = 0.0f, b = 0.0f;
      for (int64_t k = 0; k < taps.count[x]; ++k, p += 3) {
        r += w[k] * static_cast<float>(p[0]);
        g += w[k] * static_cast<float>(p[1]);
        b += w[k] * static_cast<float>(p[2]);
      }
      dst[x * 3 + 0] = r;
      dst[x * 3 + 1] = g;
      dst[x * 3 + 2] = b;
    }
  }
}

uint8_t to_byte(float v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); }

// Vertical pass over float rows (`width` pixels each) into 8-bit output rows.
void resample_columns(const float* in, int64_t width, const AxisTaps& taps, int64_t out_height,
                      RgbImage* out) {
  const int64_t row_floats = width * 3;
  std::vector<float> acc(static_cast<size_t>(row_floats));
  for (int64_t y = 0; y < out_height; ++y) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const float* w = &taps.weights[static_cast<size_t>(y * taps.stride)];
    for (int64_t k = 0; k < taps.count[y]; ++k) {
      const float* src = in + (taps.first[y] + k) * row_floats;
      const float wk = w[k];
      for (int64_t i = 0; i < row_floats; ++i) acc[i] += wk * src[i];
    }
    uint8_t* dst = out->row(y);
    for (int64_t i = 0; i < row_floats; ++i) dst[i] = to_byte(acc[i]);
  }
}

}  // namespace

RgbImage resize_image(const RgbImage& image, int64_t out_width, int64_t out_height,
                      ResampleFilter filter) {
  if (out_width < 1 || out_height < 1 || image.width < 1 || image.height < 1) {
    throw std::invalid_argument("resize_image: sizes must be positive");
  }
  if (out_width == image.width && out_height == image.height) return image;
  RgbImage out(out_width, out_height);
  std::vector<float> rows;  // image.height rows of out_width pixels, after the horizontal pass
  if (out_width == image.width) {
    rows.assign(image.pixels.begin(), image.pixels.end());
  } else {
    rows.resize(static_cast<size_t>(image.height * out_width * 3));
    resample_rows(image.pixels.data(), image.width, image.height,
                  compute_taps(image.width, out_width, filter), out_width, rows.data());
  }
  if (out_height == image.height) {
    for (size_t i = 0; i < out.pixels.size(); ++i) out.pixels[i] = to_byte(rows[i]);
  } else {
    resample_columns(rows.data(), out_width, compute_taps(image.height, out_height, filter),
                     out_height, &out);
  }
  return out;
}

}  // namespace vlm::data
