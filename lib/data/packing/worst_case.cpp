#include "data/packing/worst_case.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "spec/image_tokens.h"

namespace vlm::data {

std::string crop_limit_key(CropLimit limit) {
  switch (limit) {
    case CropLimit::kTokens: return "packing.max_seq_len";
    case CropLimit::kImagesPerPack: return "packing.max_images_per_knapsack";
    case CropLimit::kCropsPerPack: return "packing.max_crops_per_pack";
    case CropLimit::kCropsPerMicroBatch: return "train.max_crops_per_micro_batch";
  }
  return "";
}

namespace {

struct Shape {
  GridShape grid;
  int64_t tokens, crops;
};

// The most crops k images can bring into at most T tokens, for every k up to K: best[k][t] is
// the most crops with exactly k images in at most t tokens (an unbounded knapsack per image
// count), and choice[k][t] the shape of the k-th image of that optimum, so the row can be
// spelled out. Sizes are small: images <= T / (cheapest image's tokens), tokens <= max_seq_len,
// shapes: one per crop count that fits T (worst_case keeps no two of the same).
class RowKnapsack {
 public:
  RowKnapsack(const std::vector<Shape>& shapes, int64_t K, int64_t T)
      : shapes_(shapes),
        T_(T),
        best_(static_cast<size_t>(K + 1), std::vector<int64_t>(T + 1, -1)),
        choice_(static_cast<size_t>(K + 1), std::vector<uint32_t>(T + 1, 0)) {
    std::fill(best_[0].begin(), best_[0].end(), 0);
    for (int64_t k = 1; k <= K; ++k) {
      for (int64_t t = 0; t <= T; ++t) {
        for (size_t s = 0; s < shapes_.size(); ++s) {
          const Shape& shape = shapes_[s];
          if (shape.tokens > t) continue;
          const int64_t before = best_[k - 1][t - shape.tokens];
          if (before >= 0 && before + shape.crops > best_[k][t]) {
            best_[k][t] = before + shape.crops;
            choice_[k][t] = static_cast<uint32_t>(s);
          }
        }
      }
    }
  }
  int64_t images() const { return static_cast<int64_t>(best_.size()) - 1; }
  int64_t crops(int64_t k) const { return best_[k][T_]; }  // -1: k images never fit
  std::vector<Shape> row(int64_t k) const {
    std::vector<Shape> out;
    for (int64_t t = T_; k > 0; --k) {
      const Shape& s = shapes_[choice_[k][t]];
      out.push_back(s);
      t -= s.tokens;
    }
    std::sort(out.begin(), out.end(), [](const Shape& a, const Shape& b) {
      return a.crops != b.crops ? a.crops > b.crops : a.grid.rows > b.grid.rows;
    });
    return out;
  }

 private:
  const std::vector<Shape>& shapes_;
  int64_t T_;
  std::vector<std::vector<int64_t>> best_;
  std::vector<std::vector<uint32_t>> choice_;
};

// The knapsack's table stays below this many (images, tokens) cells (12 bytes each), and its
// work (cells x shapes) below kMaxKnapsackWork steps (0.05 s; seconds in a fuzzing build, whose
// 10 s timeout this keeps); beyond either the rows are bounded instead (bound_rows).
constexpr int64_t kMaxKnapsackCells = int64_t{1} << 22;
constexpr int64_t kMaxKnapsackWork = int64_t{1} << 25;

void exact_rows(const std::vector<Shape>& shapes, const WorstCaseInputs& in, int64_t K,
                int64_t knapsack_images, WorstCase& w);
void bound_rows(const WorstCaseInputs& in, int64_t K, WorstCase& w);

}  // namespace

WorstCase worst_case(const WorstCaseInputs& in) {
  // Every grid an image can get: with resize_to_max the long side is always max_img_size.
  const int64_t max_side = std::max<int64_t>(1, in.grid.max_img_size / in.grid.crop_size);
  const int64_t T = in.max_seq_len;
  const int64_t per_crop = in.image_tokens_per_crop;
  WorstCase w;
  // An image's tokens and crops depend on its tiles (rows x cols) alone and grow with them, so
  // the largest grid is max_side x max_side and the cheapest the one of fewest tiles.
  w.largest_grid = {max_side, max_side};
  w.max_crops_per_image = spec::image_crops(max_side, max_side);
  w.min_image_tokens = in.grid.resize_to_max ? spec::image_lm_tokens(1, max_side, per_crop)
                                             : spec::image_lm_tokens(1, 1, per_crop);
  w.naive_crops = in.batch_size * in.max_images_per_pack * w.max_crops_per_image;
  w.max_images_by_tokens = w.min_image_tokens > 0 ? T / w.min_image_tokens : 0;

  // Images beyond what the tokens allow never fit, so the knapsack stops there; one more
  // image than the cap tells whether the cap binds.
  const int64_t K = std::min(in.max_images_per_pack, w.max_images_by_tokens);
  const int64_t knapsack_images = std::min(K + 1, w.max_images_by_tokens);
  const int64_t cells = (knapsack_images + 1) * (T + 1);
  // The shapes a row can hold: one grid per tile count (the first, fewest rows) stands for all
  // of its count, and none beyond T tokens fits. The knapsack's work is then the distinct tile
  // counts that fit, where every grid once entered it: (max_img_size / crop side)^2 of them, 67
  // million at 65536 px in 8-px crops, which ran for minutes. The walk stops as soon as the
  // knapsack would be beyond its bounds: the rows are bounded instead.
  const int64_t max_shapes = cells > kMaxKnapsackCells ? 0 : kMaxKnapsackWork / cells;
  std::vector<Shape> shapes;
  std::vector<bool> tiles_seen;
  bool too_many = max_shapes == 0;
  for (int64_t rows = 1; rows <= max_side && !too_many; ++rows) {
    // With resize_to_max the long side is max_img_size: cols = max_side, or any when rows is.
    const int64_t first_col = in.grid.resize_to_max && rows < max_side ? max_side : 1;
    for (int64_t cols = first_col; cols <= max_side; ++cols) {
      const int64_t tokens = spec::image_lm_tokens(rows, cols, per_crop);
      if (tokens > T) break;  // more columns only cost more
      const auto tiles = static_cast<size_t>(rows * cols);
      if (tiles >= tiles_seen.size()) tiles_seen.resize(tiles + 1, false);
      if (tiles_seen[tiles]) continue;
      tiles_seen[tiles] = true;
      shapes.push_back({{rows, cols}, tokens, spec::image_crops(rows, cols)});
      if (static_cast<int64_t>(shapes.size()) > max_shapes) {
        too_many = true;
        break;
      }
    }
  }
  if (too_many) {
    bound_rows(in, K, w);
  } else {
    exact_rows(shapes, in, K, knapsack_images, w);
  }
  w.crops_per_micro_batch = in.batch_size * w.crops_per_pack;
  if (in.max_crops_per_micro_batch > 0 && in.max_crops_per_micro_batch < w.crops_per_micro_batch) {
    w.crops_per_micro_batch = in.max_crops_per_micro_batch;
    w.binding = CropLimit::kCropsPerMicroBatch;
  }
  return w;
}

namespace {

void apply_pack_cap(const WorstCaseInputs& in, WorstCase& w) {
  if (in.max_crops_per_pack > 0 && in.max_crops_per_pack < w.crops_per_pack) {
    w.crops_per_pack = in.max_crops_per_pack;
    // The pack cap may be the micro-batch cap itself (a pack never holds more crops than a
    // micro-batch may: data_setup.cpp).
    const bool from_micro_batch_cap = in.max_crops_per_micro_batch > 0 &&
                                      in.max_crops_per_pack >= in.max_crops_per_micro_batch;
    w.binding = from_micro_batch_cap ? CropLimit::kCropsPerMicroBatch : CropLimit::kCropsPerPack;
  }
}

void exact_rows(const std::vector<Shape>& shapes, const WorstCaseInputs& in, int64_t K,
                int64_t knapsack_images, WorstCase& w) {
  const int64_t T = in.max_seq_len;
  const RowKnapsack knapsack(shapes, knapsack_images, T);
  int64_t uncapped = 0;  // the most crops of one row under the tokens alone
  for (int64_t k = 0; k <= knapsack.images(); ++k) {
    const int64_t crops = knapsack.crops(k);
    if (k <= K && crops > w.crops_per_pack) {
      w.crops_per_pack = crops;
      w.images_in_that_pack = k;
    }
    uncapped = std::max(uncapped, crops);
  }
  // The row spelled out: one grid repeated when that reaches the same crops (easier to read),
  // else the knapsack's own mix.
  std::vector<Shape> row = knapsack.row(w.images_in_that_pack);
  for (const Shape& s : shapes) {
    if (s.crops == 0 || w.crops_per_pack % s.crops != 0) continue;
    const int64_t k = w.crops_per_pack / s.crops;
    if (k >= 1 && k <= K && k * s.tokens <= T) {
      row.assign(static_cast<size_t>(k), s);
      w.images_in_that_pack = k;
      break;
    }
  }
  for (const Shape& s : row) {
    w.grids_in_that_pack.push_back(s.grid);
    w.image_tokens_in_that_pack += s.tokens;
  }
  w.binding = uncapped > w.crops_per_pack ? CropLimit::kImagesPerPack : CropLimit::kTokens;
  apply_pack_cap(in, w);
}

// Rows too long for the knapsack's table (kMaxKnapsackCells) or work (kMaxKnapsackWork): every
// image costs exactly (image_tokens_per_crop + 1) tokens per crop (spec/image_tokens.h: its
// crops' tokens plus one marker per crop), so a row holds at most max_seq_len / that many
// crops, and at most K images of the largest grid. The smaller of the two bounds the row (it may
// not be reachable exactly: a bound, on the side of memory), spelled as copies of the largest grid.
void bound_rows(const WorstCaseInputs& in, int64_t K, WorstCase& w) {
  const int64_t by_tokens = in.max_seq_len / (in.image_tokens_per_crop + 1);
  const int64_t by_images = K * w.max_crops_per_image;
  w.crops_per_pack = std::min(by_tokens, by_images);
  w.binding = by_images < by_tokens ? CropLimit::kImagesPerPack : CropLimit::kTokens;
  const int64_t copies = w.max_crops_per_image > 0 ? w.crops_per_pack / w.max_crops_per_image : 0;
  w.images_in_that_pack = copies;
  w.grids_in_that_pack.assign(static_cast<size_t>(copies), w.largest_grid);
  w.image_tokens_in_that_pack =
      copies *
      spec::image_lm_tokens(w.largest_grid.rows, w.largest_grid.cols, in.image_tokens_per_crop);
  apply_pack_cap(in, w);
}

}  // namespace

}  // namespace vlm::data
