// Test hook: VLMTRAIN_INJECT_FAULT makes `vlmtrain train` fail on purpose at a chosen step, so
// the recovery paths run on any machine (docs/development.md "Fault injection").
//
// The variable holds comma-separated `kind@step` items, step 1-based:
//   oom_forward@2           an out-of-memory error in the forward of that step's first micro-batch
//   oom_backward@3          the same in its backward
//   oom_optimizer@4         too little free memory reported for the optimizer step (before any
//   update) oom_optimizer_update@5  an out-of-memory error inside the optimizer update nan_loss@6
//   that step's loss made NaN
// Each item fires once. An unknown kind or a malformed item is a usage error (exit code 2)
// raised when the injector is built, before training starts.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::train {

class FaultInjector {
 public:
  // Parses `spec` (the variable's value; empty = no faults). Throws UsageError naming the
  // offending item and the accepted kinds.
  explicit FaultInjector(std::string_view spec = {});
  // Reads VLMTRAIN_INJECT_FAULT.
  static FaultInjector from_environment();

  static const std::vector<std::string>& kinds();

  // True once for (kind, step); `kind` must be one of kinds().
  bool fire(const std::string& kind, int64_t step);
  // The first step `kind` is set for, or -1 (for faults set up ahead, as stall_data).
  int64_t first_step(const std::string& kind) const;

 private:
  std::set<std::pair<std::string, int64_t>> faults_;
};

}  // namespace vlm::train
