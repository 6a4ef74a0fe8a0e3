// Benchmark length streams: read_length_stream, the reader behind `vlmtrain inspect-batches
// --lengths FILE` (data/source/length_stream.h). Invariant of an accepted stream: every sample
// has non-negative counts, supervised <= tokens, and ids 0, 1, 2, ... in file order.
#include <string>

#include "data/source/length_stream.h"
#include "fuzz_support.h"

using namespace vlm::data;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::fuzz::guard("length_stream", [&] {
    const std::string path = vlm::fuzz::write_scratch("lengths.jsonl", data, size);
    const std::vector<PackItem> items = read_length_stream(path);
    for (size_t i = 0; i < items.size(); ++i) {
      const PackItem& item = items[i];
      if (item.sample_id != i || item.tokens < 0 || item.images < 0 || item.crops < 0 ||
          item.supervised < 0 || item.supervised > item.tokens) {
        vlm::fuzz::invariant_failed("length_stream", "sample " + std::to_string(i));
      }
    }
  });
  return 0;
}
