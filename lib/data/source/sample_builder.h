// Turns a dataset's sample into what the packer and the collator need: token ids with the loss
// mask (chat template, image tokens per crop) and each image's crop grid, planned from the
// image's header alone. No pixel is decoded here, so planning runs far ahead of the loader.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "data/image/image_grid.h"
#include "data/packing/pack_item.h"
#include "data/source/sample_reader.h"
#include "data/tokenizer/chat_template.h"

namespace vlm::data {

struct BuiltSample {
  TokenizedSample tokens;
  std::vector<ImageRef> images;  // where the collator reads them
  std::vector<ImageGrid> grids;  // one per image, in order
  SourceLocation where;          // manifest:line or shard:key

  // The packer's view, under the given id.
  PackItem item(uint64_t sample_id) const;
};

using BuildResult = std::variant<BuiltSample, SampleProblem>;

class SampleBuilder {
 public:
  // `chat` must outlive the builder.
  SampleBuilder(const ChatTemplate& chat, ImageGridOptions grid_options);

  // Never throws for bad samples: a missing or unreadable image ("missing_image",
  // "bad_image") or a template problem ("template_error") comes back as a SampleProblem. A
  // shard's images are probed in the sample's bytes (`RawSample::bytes`), a file's on disk.
  BuildResult build(const RawSample& raw) const;

  const ImageGridOptions& grid_options() const { return grid_options_; }

 private:
  const ChatTemplate& chat_;
  ImageGridOptions grid_options_;
};

}  // namespace vlm::data
