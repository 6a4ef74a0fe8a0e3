#include "data/source/sample_builder.h"

#include <filesystem>

#include "data/image/image_probe.h"

namespace vlm::data {

PackItem BuiltSample::item(uint64_t sample_id) const {
  return PackItem{sample_id, static_cast<int64_t>(tokens.ids.size()), tokens.images, tokens.crops,
                  tokens.supervised_tokens};
}

SampleBuilder::SampleBuilder(const ChatTemplate& chat, ImageGridOptions grid_options)
    : chat_(chat), grid_options_(grid_options) {
  validate_grid_options(grid_options_);
}

BuildResult SampleBuilder::build(const RawSample& raw) const {
  BuiltSample sample;
  sample.where = raw.where;
  sample.image_paths = raw.images;
  for (const auto& path : raw.images) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return SampleProblem{"missing_image", "image not found: " + path};
    }
    try {
      sample.grids.push_back(plan_image_grid(probe_image(path), grid_options_));
    } catch (const Error& e) {
      return SampleProblem{"bad_image", e.what()};
    }
  }
  try {
    sample.tokens = chat_.apply(raw.turns, sample.grids);
  } catch (const Error& e) {
    return SampleProblem{"template_error", e.message()};
  }
  return sample;
}

}  // namespace vlm::data
