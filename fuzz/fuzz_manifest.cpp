// JSONL manifests (lib/data/source/manifest.h), both entry points the data source uses: the
// Manifest index over a file (line offsets, the line-length limits) and Manifest::read, which
// hands every line to parse_manifest_line. The first input byte picks the format (auto,
// cauldron, llava) for the file; the file is the rest. Invariants: reading never throws (a bad
// line is a SampleProblem with a reason), an accepted sample has at most kMaxImagesPerSample
// images and starts with a user turn and contains an assistant turn.
#include <string>

#include "data/source/manifest.h"
#include "fuzz_sample_check.h"
#include "fuzz_support.h"

using namespace vlm::data;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const DatasetFormat kFormats[] = {DatasetFormat::kAuto, DatasetFormat::kCauldron,
                                           DatasetFormat::kLlava};
  const DatasetFormat format = kFormats[data[0] % 3];
  vlm::fuzz::guard("manifest", [&] {
    const std::string path = vlm::fuzz::write_scratch("train.jsonl", data + 1, size - 1);
    const Manifest manifest(path, format);
    for (size_t i = 0; i < manifest.size(); ++i) {
      if (manifest.line_number(i) < 1) vlm::fuzz::invariant_failed("manifest", "line number");
      vlm::fuzz::check_sample("manifest", manifest.read(i));
    }
  });
  return 0;
}
