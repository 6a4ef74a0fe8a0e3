// WebDataset tar shards (lib/data/source/shard_dataset.h): the input is a shard. ShardDataset
// indexes it with libarchive (tar_index.h: member headers, keys, the data offsets), then every
// sample is read as training reads it (one positioned read, parse_shard_sample: the members,
// the JSON, the images placed in the shard) and each image's bytes read back through its
// ImageRef. Invariants: reading a sample never throws but a vlm::Error; an accepted sample has
// a user turn first and an assistant turn, at most kMaxImagesPerSample images, each within the
// shard and within the sample's bytes.
#include <string>

#include "data/source/shard_dataset.h"
#include "data/source/tar_index.h"
#include "fuzz_sample_check.h"
#include "fuzz_support.h"

using namespace vlm::data;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A name of its own per input: the open-file cache (open_files.h) keeps shards open by path.
  static uint64_t inputs = 0;
  const std::string path =
      vlm::fuzz::write_scratch("shard-" + std::to_string(inputs++) + ".tar", data, size);
  vlm::fuzz::guard("shard", [&] {
    const ShardDataset dataset(path);
    for (size_t i = 0; i < dataset.size(); ++i) {
      const ParsedLine parsed = dataset.read(i);
      const RawSample* sample = vlm::fuzz::check_sample("shard", parsed);
      if (sample == nullptr) continue;
      for (const ImageRef& image : sample->images) {
        if (image.offset < sample->bytes.offset ||
            image.offset + image.size > sample->bytes.offset + sample->bytes.size ||
            image.offset + image.size > size) {
          vlm::fuzz::invariant_failed("shard", "an image outside its sample's bytes");
        }
        if (read_image_bytes(image).size() != image.size) {
          vlm::fuzz::invariant_failed("shard", "an image read back at another size");
        }
      }
    }
  });
  std::filesystem::remove(path);
  std::filesystem::remove(tar_index_path_beside(path));
  return 0;
}
