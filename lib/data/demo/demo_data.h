// A small, learnable VQA dataset with real image files, for trying vlmtrain end to end
// without downloads (`vlmtrain demo-data` writes it; the tiny configs train on it).
//
// Layout under out_dir: train.jsonl, val.jsonl (the_cauldron style, image paths relative to
// the manifest), images/{train,val}_NNNNNN_K.{png,jpg}, and demo_summary.json.
//   {"images": ["images/train_000123_0.png"], "texts": [{"user": "...", "assistant": "..."}]}
// As WebDataset shards (`format` kWebDataset): train-NNNNNN.tar in out_dir and
// val/val-NNNNNN.tar, with their indexes; sample `train_000123` is the members
// train_000123.json ({"images": ["0.png"], "texts": [...]}) and train_000123.0.png, the same
// samples in the same order with the same image bytes, so both forms train alike.
// Pictures: 1-4 large flat shapes (circle, square, triangle; side >= 1/3 of the short image
// side) in saturated colours on light grey, plain or lightly noisy; sizes 48-1024 px in
// several aspect ratios (about one in ten above 512 px, so they split into crops); PNG or
// JPEG. Questions come from a small fixed set and their one-word answers are fixed by the
// picture, so exact-match accuracy is meaningful and a tiny model can beat chance:
//   colour, shape, count, horizontal / vertical position, colour / shape of the shape in
//   image k (2-4 images), and image-free arithmetic ("What is 3 plus 4?" -> "7").
// About a quarter of the single-image samples have a second turn.
// Deterministic: the same options give byte-identical files on every platform; every sample
// has its own random stream from (seed, split, index), and validation uses other streams
// than training (disjoint draws from the same distribution).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vlm::data {

enum class DemoDataFormat { kFiles, kWebDataset };

struct DemoDataOptions {
  std::string out_dir;
  int64_t train_samples = 2000;
  int64_t val_samples = 200;
  uint64_t seed = 0;
  DemoDataFormat format = DemoDataFormat::kFiles;
  int64_t samples_per_shard = 500;  // kWebDataset
};

// One kind of question: how often it was asked and every answer it can have, so chance
// accuracy (uniform guessing) is 1 / answers.size().
struct DemoQuestionKind {
  int64_t train_questions = 0;
  int64_t val_questions = 0;
  std::vector<std::string> answers;
  double chance_accuracy() const { return answers.empty() ? 0.0 : 1.0 / answers.size(); }
};

struct DemoSplitCounts {
  int64_t samples = 0;
  int64_t images = 0;
  int64_t png = 0;
  int64_t jpeg = 0;
  int64_t multi_turn = 0;         // samples with two question turns
  int64_t without_images = 0;     // arithmetic samples
  int64_t multi_image = 0;        // samples with 2-4 images
  int64_t images_over_512px = 0;  // long side above 512 px
};

struct DemoDataSummary {
  DemoSplitCounts train;
  DemoSplitCounts val;
  std::map<std::string, DemoQuestionKind> kinds;  // by question kind name

  // Chance accuracy of uniform guessing over all validation questions (weighted by kind).
  double val_chance_accuracy() const;
  // The summary as a JSON object (also written to out_dir/demo_summary.json).
  std::string to_json() const;
};

// Writes the dataset; creates out_dir (and images/ or val/) when missing. DataError when a file
// cannot be written; std::invalid_argument for negative sample counts, an empty out_dir or
// fewer than one sample per shard.
DemoDataSummary write_demo_dataset(const DemoDataOptions& options);

}  // namespace vlm::data
