// A run's metrics.jsonl as `vlmtrain calibrate-memory` reads it: read_memory_records
// (core/memory_records.h). Invariants of accepted records: every step belongs to a run record
// that comes before it, lines increase, and steps with a prediction are counted among the step
// records.
#include <string>

#include "core/memory_records.h"
#include "fuzz_support.h"

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
  });
  return 0;
}
