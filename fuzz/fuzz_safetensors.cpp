// safetensors: the torch-free half of model::load_weights / SafetensorsFile (lib/model): the
// file mapped as the loader maps it (MappedFile) and its header parsed and validated
// (parse_safetensors_header). Turning the checked entries into tensors needs LibTorch and is not
// fuzzed; it only views the byte spans this parser has bounded. Invariants of an accepted header:
// every span lies inside the data region, spans are sorted and disjoint, and each span's size is
// the element count times the dtype size.
#include <cstdint>

#include "fuzz_support.h"
#include "model/safetensors_file.h"
#include "model/safetensors_header.h"

using namespace vlm::model;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

namespace {

void check(const SafetensorsHeader& header) {
  uint64_t previous_end = 0;
  for (const TensorEntry& t : header.tensors) {
    if (t.begin > t.end || t.end > header.data_size_bytes || t.begin < previous_end) {
      vlm::fuzz::invariant_failed("safetensors", "span of " + t.name + " out of bounds");
    }
    previous_end = t.end;
    const auto elements = checked_element_count(t.shape);
    if (!elements ||
        static_cast<uint64_t>(*elements) * static_cast<uint64_t>(dtype_size_bytes(t.dtype)) !=
            t.size_bytes()) {
      vlm::fuzz::invariant_failed("safetensors", "size of " + t.name + " != shape x dtype");
    }
  }
  if (header.data_start + header.data_size_bytes < header.data_start) {
    vlm::fuzz::invariant_failed("safetensors", "data region overflows");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::fuzz::guard("safetensors", [&] {
    const std::string path = vlm::fuzz::write_scratch("model.safetensors", data, size);
    const MappedFile file(path);
    check(parse_safetensors_header(file.data(), file.size_bytes(), path));
  });
  return 0;
}
