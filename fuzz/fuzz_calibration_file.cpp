// The memory calibration file: read_calibration_file (core/memory_calibration_file.h), what
// `memory.calibration` and `vlmtrain calibrate-memory --out` read. Invariant: an accepted file
// written back with calibration_json reads back to the same text (the writer and the strict
// reader agree on every value they let through).
#include <string>

#include "core/memory_calibration_file.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::fuzz::guard("calibration_file", [&] {
    const std::string path = vlm::fuzz::write_scratch("calibration.json", data, size);
    const vlm::CalibrationFile file = vlm::read_calibration_file(path);
    const std::string text = vlm::calibration_json(file);
    const std::string again = vlm::fuzz::write_scratch("calibration2.json", text);
    if (vlm::calibration_json(vlm::read_calibration_file(again)) != text) {
      vlm::fuzz::invariant_failed("calibration_file", "write and read disagree");
    }
  });
  return 0;
}
