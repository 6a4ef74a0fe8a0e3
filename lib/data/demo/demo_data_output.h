// Where the demo's samples go: a the_cauldron manifest with one image file per image, or
// WebDataset shards (demo_data.h has both layouts). One output per split.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/demo/demo_data.h"

namespace vlm::data {

struct EncodedImage {
  std::vector<uint8_t> bytes;
  std::string extension;  // "png", "jpg"
};

class DemoSplitOutput {
 public:
  virtual ~DemoSplitOutput() = default;
  // Sample `index`: its conversation (the_cauldron's "texts") and its images, in order.
  virtual void add(int64_t index, const nlohmann::ordered_json& texts,
                   const std::vector<EncodedImage>& images) = 0;
  // Flushes and closes (shards: also writes their indexes). DataError when it cannot.
  virtual void finish() = 0;
};

// `split` is "train" or "val".
std::unique_ptr<DemoSplitOutput> demo_split_output(const DemoDataOptions& options,
                                                   const std::string& split);

}  // namespace vlm::data
