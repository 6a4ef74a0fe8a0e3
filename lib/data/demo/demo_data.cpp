#include "data/demo/demo_data.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/error.h"
#include "data/demo/demo_data_draw.h"
#include "data/demo/demo_data_output.h"
#include "data/demo/demo_data_random.h"
#include "data/image/image_encode.h"

namespace vlm::data {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

constexpr int kJpegQuality = 90;

struct Turn {
  std::string kind;
  std::string user;
  std::string assistant;
};

struct DemoSample {
  std::vector<RgbImage> images;
  std::vector<bool> as_jpeg;
  std::vector<Turn> turns;
};

// A shape alone in one quadrant, so "left/right" and "top/bottom" have one answer.
struct PlacedShape {
  DemoShapeSpec spec;
  bool right = false;
  bool bottom = false;
};

// Long side 64-1024 px (65% up to 320, 25% up to 512, 10% above 512, which split into
// crops), an aspect ratio from a fixed list, landscape or portrait. Small on average so the
// whole set is written in seconds.
std::pair<int64_t, int64_t> draw_image_size(DemoRandom& rng) {
  const uint64_t bucket = rng.below(100);
  const int64_t long_side = bucket < 65   ? rng.range(64, 320)
                            : bucket < 90 ? rng.range(321, 512)
                                          : rng.range(513, 1024);
  static const int64_t kRatios[][2] = {{1, 1}, {4, 3}, {3, 2}, {16, 9}, {2, 1}};  // long:short
  const auto& ratio = kRatios[rng.below(5)];
  const int64_t short_side = std::max<int64_t>(48, long_side * ratio[1] / ratio[0]);
  if (rng.percent(50)) return {long_side, short_side};
  return {short_side, long_side};
}

RgbImage draw_background(int64_t width, int64_t height, DemoRandom& rng) {
  const int grey = static_cast<int>(rng.range(200, 245));
  const int noise = rng.percent(25) ? static_cast<int>(rng.range(4, 10)) : 0;
  return demo_background(width, height, grey, noise, rng);
}

DemoShapeSpec random_shape(int64_t size, DemoRandom& rng) {
  DemoShapeSpec spec;
  spec.shape = static_cast<DemoShape>(rng.below(demo_shape_names().size()));
  spec.colour = static_cast<int>(rng.below(demo_colours().size()));
  spec.size = size;
  return spec;
}

// Centre of a cell [x0, x0 + cell_w) x [y0, y0 + cell_h) jittered so a `size` shape stays in it.
void place_in_cell(DemoShapeSpec& spec, int64_t x0, int64_t y0, int64_t cell_w, int64_t cell_h,
                   DemoRandom& rng) {
  const int64_t slack_x = std::max<int64_t>(0, (cell_w - spec.size) / 2 - 1);
  const int64_t slack_y = std::max<int64_t>(0, (cell_h - spec.size) / 2 - 1);
  spec.centre_x = x0 + cell_w / 2 + rng.range(-slack_x, slack_x);
  spec.centre_y = y0 + cell_h / 2 + rng.range(-slack_y, slack_y);
}

// One shape, 36-46% of the short side, in a random quadrant.
PlacedShape draw_single_shape_image(RgbImage* image, DemoRandom& rng) {
  const auto [width, height] = draw_image_size(rng);
  *image = draw_background(width, height, rng);
  PlacedShape placed;
  placed.spec = random_shape(std::min(width, height) * rng.range(36, 46) / 100, rng);
  placed.right = rng.percent(50);
  placed.bottom = rng.percent(50);
  place_in_cell(placed.spec, placed.right ? width / 2 : 0, placed.bottom ? height / 2 : 0,
                width / 2, height / 2, rng);
  draw_demo_shape(*image, placed.spec);
  return placed;
}

// 1-4 shapes, 34-44% of the short side, in distinct cells of a 2x2 grid.
int64_t draw_count_image(RgbImage* image, DemoRandom& rng) {
  const auto [width, height] = draw_image_size(rng);
  *image = draw_background(width, height, rng);
  const int64_t count = rng.range(1, 4);
  int cells[4] = {0, 1, 2, 3};
  for (int i = 0; i < 3; ++i) std::swap(cells[i], cells[i + rng.below(4 - i)]);  // shuffle
  const int64_t size = std::min(width, height) * rng.range(34, 44) / 100;
  for (int64_t i = 0; i < count; ++i) {
    DemoShapeSpec spec = random_shape(size, rng);
    place_in_cell(spec, (cells[i] % 2) * (width / 2), (cells[i] / 2) * (height / 2), width / 2,
                  height / 2, rng);
    draw_demo_shape(*image, spec);
  }
  return count;
}

Turn ask_about_shape(const std::string& kind, const PlacedShape& shape) {
  if (kind == "colour") {
    return {kind, "What colour is the shape?", demo_colours()[shape.spec.colour].name};
  }
  if (kind == "shape") return {kind, "What shape is this?", demo_shape_name(shape.spec.shape)};
  if (kind == "horizontal") {
    return {kind, "Is the shape on the left or the right?", shape.right ? "right" : "left"};
  }
  return {kind, "Is the shape at the top or the bottom?", shape.bottom ? "bottom" : "top"};
}

void add_image(DemoSample& sample, RgbImage image, DemoRandom& rng) {
  sample.images.push_back(std::move(image));
  sample.as_jpeg.push_back(rng.percent(50));
}

DemoSample draw_sample(DemoRandom& rng) {
  DemoSample sample;
  const uint64_t kind = rng.below(100);
  if (kind < 10) {  // no image: arithmetic
    const int64_t a = rng.range(0, 9), b = rng.range(0, 9);
    sample.turns.push_back({"arithmetic",
                            "What is " + std::to_string(a) + " plus " + std::to_string(b) + "?",
                            std::to_string(a + b)});
  } else if (kind < 25) {  // 2-4 images, questions about image k
    const int64_t images = rng.range(2, 4);
    std::vector<PlacedShape> shapes;
    for (int64_t i = 0; i < images; ++i) {
      RgbImage image;
      shapes.push_back(draw_single_shape_image(&image, rng));
      add_image(sample, std::move(image), rng);
    }
    const int turns = rng.percent(30) ? 2 : 1;
    for (int t = 0; t < turns; ++t) {
      const int64_t k = rng.range(1, images);
      const PlacedShape& shape = shapes[k - 1];
      if (rng.percent(50)) {
        sample.turns.push_back({"image_colour",
                                "What colour is the shape in image " + std::to_string(k) + "?",
                                demo_colours()[shape.spec.colour].name});
      } else {
        sample.turns.push_back({"image_shape", "What shape is in image " + std::to_string(k) + "?",
                                demo_shape_name(shape.spec.shape)});
      }
    }
  } else if (kind < 40) {  // counting
    RgbImage image;
    const int64_t count = draw_count_image(&image, rng);
    add_image(sample, std::move(image), rng);
    sample.turns.push_back({"count", "How many shapes are there?", std::to_string(count)});
  } else {  // one shape: one or two of colour / shape / position
    static const char* kKinds[] = {"colour", "shape", "horizontal", "vertical"};
    RgbImage image;
    const PlacedShape shape = draw_single_shape_image(&image, rng);
    add_image(sample, std::move(image), rng);
    const uint64_t first = rng.below(4);
    sample.turns.push_back(ask_about_shape(kKinds[first], shape));
    if (rng.percent(25)) {
      sample.turns.push_back(ask_about_shape(kKinds[(first + rng.range(1, 3)) % 4], shape));
    }
  }
  return sample;
}

std::map<std::string, DemoQuestionKind> question_kinds() {
  std::vector<std::string> colours, counts = {"1", "2", "3", "4"}, sums;
  for (const auto& colour : demo_colours()) colours.push_back(colour.name);
  for (int sum = 0; sum <= 18; ++sum) sums.push_back(std::to_string(sum));
  std::map<std::string, DemoQuestionKind> kinds;
  kinds["colour"].answers = colours;
  kinds["shape"].answers = demo_shape_names();
  kinds["horizontal"].answers = {"left", "right"};
  kinds["vertical"].answers = {"top", "bottom"};
  kinds["count"].answers = counts;
  kinds["image_colour"].answers = colours;
  kinds["image_shape"].answers = demo_shape_names();
  kinds["arithmetic"].answers = sums;
  return kinds;
}

// Writes one split's samples; counts into `counts` and `kinds`.
void write_split(const DemoDataOptions& options, const std::string& split, uint64_t stream,
                 int64_t samples, DemoSplitCounts& counts,
                 std::map<std::string, DemoQuestionKind>& kinds) {
  const std::unique_ptr<DemoSplitOutput> output = demo_split_output(options, split);
  const uint64_t split_seed = DemoRandom::mix(DemoRandom::mix(options.seed) + stream);
  for (int64_t index = 0; index < samples; ++index) {
    DemoRandom rng(DemoRandom::mix(split_seed + static_cast<uint64_t>(index)));
    const DemoSample sample = draw_sample(rng);
    std::vector<EncodedImage> images;
    for (size_t k = 0; k < sample.images.size(); ++k) {
      images.push_back(sample.as_jpeg[k]
                           ? EncodedImage{encode_jpeg(sample.images[k], kJpegQuality), "jpg"}
                           : EncodedImage{encode_png(sample.images[k]), "png"});
      ++(sample.as_jpeg[k] ? counts.jpeg : counts.png);
      counts.images_over_512px +=
          std::max(sample.images[k].width, sample.images[k].height) > 512 ? 1 : 0;
    }
    ordered_json texts = ordered_json::array();
    for (const Turn& turn : sample.turns) {
      texts.push_back({{"user", turn.user}, {"assistant", turn.assistant}});
      DemoQuestionKind& kind = kinds.at(turn.kind);
      ++(split == "train" ? kind.train_questions : kind.val_questions);
    }
    output->add(index, texts, images);
    ++counts.samples;
    counts.images += static_cast<int64_t>(sample.images.size());
    counts.multi_turn += sample.turns.size() > 1 ? 1 : 0;
    counts.without_images += sample.images.empty() ? 1 : 0;
    counts.multi_image += sample.images.size() > 1 ? 1 : 0;
  }
  output->finish();
}

ordered_json counts_json(const DemoSplitCounts& c) {
  return {{"samples", c.samples},
          {"images", c.images},
          {"png", c.png},
          {"jpeg", c.jpeg},
          {"multi_turn", c.multi_turn},
          {"without_images", c.without_images},
          {"multi_image", c.multi_image},
          {"images_over_512px", c.images_over_512px}};
}

}  // namespace

double DemoDataSummary::val_chance_accuracy() const {
  double expected_correct = 0.0;
  int64_t questions = 0;
  for (const auto& [name, kind] : kinds) {
    expected_correct += kind.chance_accuracy() * static_cast<double>(kind.val_questions);
    questions += kind.val_questions;
  }
  return questions == 0 ? 0.0 : expected_correct / static_cast<double>(questions);
}

std::string DemoDataSummary::to_json() const {
  ordered_json out;
  out["train"] = counts_json(train);
  out["val"] = counts_json(val);
  for (const auto& [name, kind] : kinds) {
    out["question_kinds"][name] = {{"train_questions", kind.train_questions},
                                   {"val_questions", kind.val_questions},
                                   {"answers", kind.answers},
                                   {"chance_accuracy", kind.chance_accuracy()}};
  }
  out["val_chance_accuracy"] = val_chance_accuracy();
  return out.dump(2);
}

DemoDataSummary write_demo_dataset(const DemoDataOptions& options) {
  if (options.out_dir.empty()) throw std::invalid_argument("demo data: out_dir is empty");
  if (options.train_samples < 0 || options.val_samples < 0) {
    throw std::invalid_argument("demo data: sample counts must be >= 0");
  }
  if (options.samples_per_shard < 1) {
    throw std::invalid_argument("demo data: a shard holds at least one sample");
  }
  DemoDataSummary summary;
  summary.kinds = question_kinds();
  write_split(options, "train", 1, options.train_samples, summary.train, summary.kinds);
  write_split(options, "val", 2, options.val_samples, summary.val, summary.kinds);
  const std::string summary_path = (fs::path(options.out_dir) / "demo_summary.json").string();
  std::ofstream file(summary_path, std::ios::binary | std::ios::trunc);
  file << summary.to_json() << '\n';
  if (!file.flush()) throw DataError("cannot write the demo summary", SourceLocation{summary_path});
  return summary;
}

}  // namespace vlm::data
