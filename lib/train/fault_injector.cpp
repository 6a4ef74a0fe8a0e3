#include "train/fault_injector.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace vlm::train {
namespace {

constexpr const char* kVariable = "VLMTRAIN_INJECT_FAULT";

std::string accepted_kinds() {
  std::string out;
  for (const auto& kind : FaultInjector::kinds()) out += (out.empty() ? "" : ", ") + kind;
  return out;
}

[[noreturn]] void refuse(const std::string& item, const std::string& why) {
  throw UsageError(
      std::string(kVariable) + ": '" + item + "' " + why +
      "; expected kind@step items separated by commas (step >= 1), kinds: " + accepted_kinds());
}

}  // namespace

const std::vector<std::string>& FaultInjector::kinds() {
  static const std::vector<std::string> kinds = {
      "oom_forward", "oom_backward", "oom_optimizer", "oom_optimizer_update",
      "nan_loss",    "sigterm_eval", "stall_data"};
  return kinds;
}

FaultInjector::FaultInjector(std::string_view spec) {
  std::stringstream items{std::string(spec)};
  for (std::string item; std::getline(items, item, ',');) {
    const auto at = item.find('@');
    if (at == std::string::npos) refuse(item, "has no '@'");
    const std::string kind = item.substr(0, at);
    const std::string step_text = item.substr(at + 1);
    if (std::find(kinds().begin(), kinds().end(), kind) == kinds().end()) {
      refuse(item, "names an unknown kind '" + kind + "'");
    }
    const bool digits = !step_text.empty() && step_text.size() <= 18 &&
                        std::all_of(step_text.begin(), step_text.end(),
                                    [](char c) { return c >= '0' && c <= '9'; });
    const int64_t step = digits ? std::stoll(step_text) : 0;
    if (step < 1) refuse(item, "has no step number >= 1 after '@'");
    faults_.emplace(kind, step);
  }
}

FaultInjector FaultInjector::from_environment() {
  const char* spec = std::getenv(kVariable);
  return FaultInjector(spec ? spec : "");
}

bool FaultInjector::fire(const std::string& kind, int64_t step) {
  return faults_.erase({kind, step}) > 0;
}

int64_t FaultInjector::first_step(const std::string& kind) const {
  const auto it = faults_.lower_bound({kind, 0});
  return it != faults_.end() && it->first == kind ? it->second : -1;
}

}  // namespace vlm::train
