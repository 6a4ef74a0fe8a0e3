// A run's metrics.jsonl as `vlmtrain calibrate-memory` takes it: read_memory_records
// (core/memory_records.h), the fit (memory/calibration.h) and the check of what it would write
// (check_calibration_file). Invariants of accepted records: every step belongs to a run record
// that comes before it, lines increase, and steps with a prediction are counted among the step
// records; a fit its reader accepts is written and read back with the same terms.
#include <string>
#include <string_view>

#include "core/memory_calibration_file.h"
#include "core/memory_records.h"
#include "fuzz_support.h"
#include "memory/calibration.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::fuzz::guard("memory_records", [&] {
    const std::string path = vlm::fuzz::write_scratch("metrics.jsonl", data, size);
    const vlm::MemoryRecords records = vlm::read_memory_records(path);
    int64_t line = 0;
    for (const vlm::StepMemoryRecord& step : records.steps) {
      if (step.run >= records.runs.size() || records.runs[step.run].line >= step.line ||
          step.line <= line) {
        vlm::fuzz::invariant_failed("memory_records", "step at line " + std::to_string(step.line));
      }
      line = step.line;
    }
    if (static_cast<int64_t>(records.steps.size()) > records.step_records) {
      vlm::fuzz::invariant_failed("memory_records", "more predicted steps than step records");
    }
    // calibrate-memory --out: the fit, refused (a vlm::Error) or written and read back whole.
    const vlm::memory::CalibrationFit fit =
        vlm::memory::fit_calibration(records, "run", "2026-11-27");
    const std::string out = vlm::fuzz::write_scratch("calibration.json", std::string_view());
    vlm::write_calibration_file(out, vlm::CalibrationFile{{fit.entry}});
    const vlm::CalibrationFile back = vlm::read_calibration_file(out);
    if (back.entries.size() != 1 || back.entries[0].device != fit.entry.device ||
        back.entries[0].allocated_offset_bytes != fit.entry.allocated_offset_bytes) {
      vlm::fuzz::invariant_failed("memory_records", "a written calibration read back otherwise");
    }
  });
  return 0;
}
