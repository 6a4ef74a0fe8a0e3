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
  sample.images = raw.images;
  for (const ImageRef& image : raw.images) {
    try {
      if (image.in_shard()) {
        // The member lies inside the sample's bytes (the shard's reader checked it).
        const auto* data = reinterpret_cast<const uint8_t*>(raw.bytes.data.get()) +
                           (image.offset - raw.bytes.offset);
        sample.grids.push_back(plan_image_grid(
            probe_image_bytes(data, static_cast<size_t>(image.size), image.name()), grid_options_));
        continue;
      }
      std::error_code ec;
      if (!std::filesystem::is_regular_file(image.path, ec)) {
        return SampleProblem{"missing_image", "image not found: " + image.path, {}};
      }
      sample.grids.push_back(plan_image_grid(probe_image(image.path), grid_options_));
    } catch (const Error& e) {
      return SampleProblem{"bad_image", e.what(), {}};
    }
  }
  try {
    sample.tokens = chat_.apply(raw.turns, sample.grids);
  } catch (const Error& e) {
    return SampleProblem{"template_error", e.message(), {}};
  }
  return sample;
}

}  // namespace vlm::data
