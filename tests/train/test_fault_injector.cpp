// VLMTRAIN_INJECT_FAULT: known kinds fire once at their step; anything else is refused before
// training starts.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "support/test_support.h"
#include "train/fault_injector.h"

using vlm::train::FaultInjector;

namespace {

// The message of the UsageError that `spec` raises, or "" when it is accepted.
std::string refusal(const std::string& spec) {
  try {
    FaultInjector faults(spec);
  } catch (const vlm::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

CATCH_TEST_CASE("fault injector: each known kind fires once, at its step only") {
  FaultInjector faults("oom_forward@2,nan_loss@3,oom_optimizer_update@1");
  CATCH_CHECK(!faults.fire("oom_forward", 1));
  CATCH_CHECK(faults.fire("oom_forward", 2));
  CATCH_CHECK(!faults.fire("oom_forward", 2));
  CATCH_CHECK(!faults.fire("nan_loss", 2));
  CATCH_CHECK(faults.fire("nan_loss", 3));
  CATCH_CHECK(faults.fire("oom_optimizer_update", 1));
  CATCH_CHECK(!faults.fire("oom_backward", 2));
  FaultInjector none("");
  CATCH_CHECK(!none.fire("oom_forward", 1));
}

CATCH_TEST_CASE("fault injector: unknown kinds and malformed items are refused with the kinds") {
  for (const std::string spec : {"bogus@1", "oom_forward@2,bogus@1", "oom_forward", "oom_forward@",
                                 "oom_forward@0", "oom_forward@-1", "oom_forward@x",
                                 "oom_forward@2x", "oom_forward@99999999999999999999", "@3"}) {
    CATCH_INFO(spec);
    const std::string message = refusal(spec);
    CATCH_CHECK(message.find("VLMTRAIN_INJECT_FAULT") != std::string::npos);
    for (const auto& kind : FaultInjector::kinds()) {
      CATCH_CHECK(message.find(kind) != std::string::npos);
    }
  }
  CATCH_CHECK(refusal("bogus@1").find("'bogus'") != std::string::npos);
  CATCH_CHECK(refusal("oom_backward@1,oom_optimizer@2").empty());
}

CATCH_TEST_CASE("vlmtrain train refuses an unknown injected fault at once, before training") {
  vlm::test::TempDir out;
  const auto start = std::chrono::steady_clock::now();
  const auto r = vlm::test::run_with_env(
      "VLMTRAIN_INJECT_FAULT=bogus@1 ",
      "train --config '" + (vlm::test::source_dir() / "configs/demo.yaml").string() +
          "' --set output.dir='" + out.path().string() + "'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CATCH_INFO(r.output);
  CATCH_CHECK(r.exit_code == static_cast<int>(vlm::ExitCode::kUsage));
  CATCH_CHECK(r.output.find("bogus") != std::string::npos);
  CATCH_CHECK(r.output.find("oom_forward") != std::string::npos);
  CATCH_CHECK(!std::filesystem::exists(out / "metrics.jsonl"));
  CATCH_CHECK(seconds < 10);
}
