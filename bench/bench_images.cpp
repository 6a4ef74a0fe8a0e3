// Image pipeline throughput on ONE thread: decode per codec, and the whole path
// probe -> decode -> resize -> split -> normalise into 512 px crops, for 2048x2048 and
// 1536x2048 JPEGs (and a PNG). Reference: nanoVLM's processor (PIL + torchvision) does about
// 1.85 images/s on one core of a 2-core Debian VM.
//
// Usage: bench_images [seconds_per_figure]   (default 2; each figure is the best of 5 rounds)
// Figures are thread CPU time, so a busy shared machine does not inflate them much.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <stb_image_write.h>

#include "data/demo/demo_data.h"
#include "data/image/image_codecs.h"
#include "data/image/image_crops.h"
#include "data/image/image_decode.h"
#include "data/image/image_encode.h"
#include "data/image/image_grid.h"
#include "data/image/image_probe.h"

namespace {

using vlm::data::RgbImage;
using Clock = std::chrono::steady_clock;

// A photo-like test picture: smooth colour gradients, a few discs and mild noise, so the
// encoders neither see flat colour (too easy) nor white noise (unrealistically hard).
RgbImage synthetic_photo(int64_t width, int64_t height) {
  RgbImage image(width, height);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const int noise = static_cast<int>((state >> 59) & 7) - 4;
      const double u = static_cast<double>(x) / width, v = static_cast<double>(y) / height;
      double r = 120 + 100 * std::sin(6.0 * u + 1.0), g = 110 + 90 * std::cos(5.0 * v),
             b = 128 + 80 * std::sin(4.0 * (u + v));
      for (int disc = 0; disc < 5; ++disc) {
        const double cx = 0.15 + 0.17 * disc, cy = 0.2 + 0.13 * disc, radius = 0.08 + 0.02 * disc;
        if ((u - cx) * (u - cx) + (v - cy) * (v - cy) < radius * radius) {
          r = 40 * disc;
          g = 230 - 40 * disc;
          b = 90;
        }
      }
      uint8_t* p = image.at(x, y);
      p[0] = static_cast<uint8_t>(std::clamp(static_cast<int>(r) + noise, 0, 255));
      p[1] = static_cast<uint8_t>(std::clamp(static_cast<int>(g) + noise, 0, 255));
      p[2] = static_cast<uint8_t>(std::clamp(static_cast<int>(b) + noise, 0, 255));
    }
  }
  return image;
}

// CPU seconds used by this thread: on a shared machine, wall time also counts the time other
// processes hold the core; thread CPU time is what one dedicated core would take.
double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// CPU ms per run of `work`: the best of five rounds of about seconds / 5 each (after one
// warm-up run), so that cache interference from other processes inflates it as little as
// possible.
double time_ms(double seconds, const std::function<void()>& work) {
  work();
  double best_ms = 1e300;
  for (int round = 0; round < 5; ++round) {
    int64_t runs = 0;
    const double start = thread_cpu_seconds();
    double elapsed = 0.0;
    do {
      work();
      ++runs;
      elapsed = thread_cpu_seconds() - start;
    } while (elapsed < seconds / 5);
    best_ms = std::min(best_ms, 1000.0 * elapsed / static_cast<double>(runs));
  }
  return best_ms;
}

void report(const std::string& what, double ms) {
  std::printf("%-58s %9.2f ms  %8.2f /s\n", what.c_str(), ms, 1000.0 / ms);
}

void bench_decoders(const std::string& label, const std::vector<uint8_t>& jpeg,
                    const std::vector<uint8_t>& png, double seconds) {
  report("decode " + label + " JPEG q90, TurboJPEG", time_ms(seconds, [&] {
           vlm::data::decode_jpeg_turbo(jpeg.data(), jpeg.size(), "bench.jpg");
         }));
  report("decode " + label + " JPEG q90, stb_image",
         time_ms(seconds, [&] { vlm::data::decode_stb(jpeg.data(), jpeg.size(), "bench.jpg"); }));
  report("decode " + label + " PNG, libpng", time_ms(seconds, [&] {
           vlm::data::decode_png_libpng(png.data(), png.size(), "bench.png");
         }));
  report("decode " + label + " PNG, stb_image",
         time_ms(seconds, [&] { vlm::data::decode_stb(png.data(), png.size(), "bench.png"); }));
}

std::vector<uint8_t> encode_png_stb(const RgbImage& image) {
  std::vector<uint8_t> out;
  stbi_write_png_to_func(
      [](void* context, void* data, int size) {
        auto* bytes = static_cast<std::vector<uint8_t>*>(context);
        bytes->insert(bytes->end(), static_cast<uint8_t*>(data),
                      static_cast<uint8_t*>(data) + size);
      },
      &out, static_cast<int>(image.width), static_cast<int>(image.height), 3, image.pixels.data(),
      static_cast<int>(image.row_bytes()));
  return out;
}

// PNG encoders on a demo-like flat picture and on the photo: why encode_png uses libpng.
void bench_png_encoders(const std::string& label, const RgbImage& image, double seconds) {
  size_t libpng_bytes = 0, stb_bytes = 0;
  const double libpng_ms =
      time_ms(seconds, [&] { libpng_bytes = vlm::data::encode_png(image).size(); });
  const double stb_ms = time_ms(seconds, [&] { stb_bytes = encode_png_stb(image).size(); });
  report("encode " + label + " PNG, libpng SUB+RLE (" + std::to_string(libpng_bytes) + " B)",
         libpng_ms);
  report("encode " + label + " PNG, stb_image_write (" + std::to_string(stb_bytes) + " B)", stb_ms);
}

// probe + decode + plan + resize/split/normalise, from a file, as a loader worker does it.
void bench_pipeline(const std::string& label, const std::string& path, double seconds) {
  const vlm::data::ImageGridOptions grid_options;  // crop 512, max 2048
  const vlm::data::NormalizeOptions norm;
  const auto grid = vlm::data::plan_image_grid(vlm::data::probe_image(path), grid_options);
  std::vector<float> crops(vlm::data::crops_float_count(grid));
  const double ms = time_ms(seconds, [&] {
    const auto header = vlm::data::probe_image(path);
    const auto planned = vlm::data::plan_image_grid(header, grid_options);
    const auto image = vlm::data::decode_image(path);
    vlm::data::image_to_crops(image, planned, norm, crops.data());
  });
  char what[160];
  std::snprintf(what, sizeof what, "pipeline %s -> %lldx%lld grid, %lld crops of 512",
                label.c_str(), static_cast<long long>(grid.rows), static_cast<long long>(grid.cols),
                static_cast<long long>(grid.crops()));
  report(what, ms);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const auto dir = std::filesystem::temp_directory_path() / "vlm_bench_images";
  std::filesystem::create_directories(dir);
  std::printf("one thread, CPU time, best of 5 rounds of %.1f s in all per figure\n", seconds);

  for (const auto& [width, height] : {std::pair<int64_t, int64_t>{2048, 2048}, {1536, 2048}}) {
    const std::string label = std::to_string(width) + "x" + std::to_string(height);
    const RgbImage photo = synthetic_photo(width, height);
    const auto jpeg = vlm::data::encode_jpeg(photo, 90);
    const auto png = vlm::data::encode_png(photo);
    const std::string jpeg_path = (dir / (label + ".jpg")).string();
    const std::string png_path = (dir / (label + ".png")).string();
    vlm::data::write_bytes_file(jpeg_path, jpeg);
    vlm::data::write_bytes_file(png_path, png);
    std::printf("%s: JPEG %zu bytes, PNG %zu bytes\n", label.c_str(), jpeg.size(), png.size());
    bench_decoders(label, jpeg, png, seconds);
    bench_pipeline(label + " JPEG", jpeg_path, seconds);
    bench_pipeline(label + " PNG", png_path, seconds);
  }
  RgbImage flat(512, 384);
  std::fill(flat.pixels.begin(), flat.pixels.end(), uint8_t{220});
  for (int64_t y = 100; y < 260; ++y) {
    for (int64_t x = 50; x < 210; ++x) flat.at(x, y)[0] = 30;
  }
  bench_png_encoders("512x384 flat", flat, seconds);
  bench_png_encoders("2048x2048 photo", synthetic_photo(2048, 2048), seconds);

  vlm::data::DemoDataOptions demo;
  demo.out_dir = (dir / "demo").string();
  const auto start = Clock::now();
  const double start_cpu = thread_cpu_seconds();
  const auto summary = vlm::data::write_demo_dataset(demo);
  const double demo_cpu_s = thread_cpu_seconds() - start_cpu;
  const double demo_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "demo dataset: %lld + %lld samples, %lld images: %.2f s CPU, %.2f s wall\n",
      static_cast<long long>(summary.train.samples), static_cast<long long>(summary.val.samples),
      static_cast<long long>(summary.train.images + summary.val.images), demo_cpu_s, demo_s);
  std::filesystem::remove_all(dir);
  return 0;
}
