// save_training_checkpoint and resume_training_checkpoint in process, on the tiny model: a save
// that a full file system stops (a real EFBIG from RLIMIT_FSIZE, not a simulated throw), and
// trainer states or loss scaler states that no run writes, refused for the checkpoint before.
#include <signal.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/config_io.h"
#include "core/error.h"
#include "support/test_support.h"
#include "train/checkpoint_dir.h"
#include "train/loss_scaler.h"
#include "train/model_setup.h"
#include "train/optimizer.h"
#include "train/training_checkpoint.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;
using namespace vlm::train;

namespace {

// The tiny model, its optimizer and an fp16 loss scaler, checkpointed under a temporary run
// directory with a stand-in data cursor.
struct Run {
  TempDir out{"train-ckpt"};
  vlm::Config config =
      vlm::load_config("", {"model.preset=tiny", "output.keep_checkpoints=5"}).config;
  vlm::model::VisionLanguageModel model = build_model(config.model, 1);
  GroupedAdamW optimizer{named_parameters_of(*model), adam_options()};
  LossScaler scaler;

  static GroupedAdamWOptions adam_options() {
    GroupedAdamWOptions adam;
    adam.peak_lr = {{"vision", 1e-4}, {"projector", 1e-3}, {"language", 1e-4}};
    return adam;
  }
  CheckpointContents contents() { return {model, optimizer, config, &scaler}; }
  TrainerState state(int64_t step) {
    TrainerState s;
    s.run.step = step;
    s.config_hash = vlm::config_hash(config);
    s.data_cursor = {{"position", step}};
    s.loss_scaler = scaler.state();
    return s;
  }
  void save(int64_t step) { save_training_checkpoint(out.path(), state(step), contents()); }
  // The data cursor is accepted unless `refuse` says otherwise.
  std::optional<TrainerState> resume(
      const std::function<bool(const nlohmann::json&)>& refuse = nullptr) {
    return resume_training_checkpoint(out.path(), 1, contents(), [&](const nlohmann::json& c) {
      if (refuse && refuse(c)) throw vlm::DataError("cursor refused by the test");
    });
  }
  fs::path checkpoint(int64_t step) const {
    return checkpoints_dir(out.path()) / checkpoint_dir_name(step);
  }
};

std::vector<int64_t> complete_steps(const fs::path& out) {
  std::vector<int64_t> steps;
  for (const auto& info : list_checkpoints(checkpoints_dir(out))) steps.push_back(info.step);
  return steps;
}

bool has_tmp_dir(const fs::path& out) {
  for (const auto& entry : fs::directory_iterator(checkpoints_dir(out))) {
    if (entry.path().filename().string().find(".tmp") != std::string::npos) return true;
  }
  return false;
}

// RLIMIT_FSIZE for this process while it lives, with SIGXFSZ ignored: a write past the limit
// then fails with EFBIG, as a write to a full disk fails with ENOSPC.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    CATCH_REQUIRE(::getrlimit(RLIMIT_FSIZE, &previous_) == 0);
    previous_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = previous_;
    limited.rlim_cur = bytes;
    CATCH_REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &previous_);
    ::signal(SIGXFSZ, previous_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit previous_{};
  sighandler_t previous_handler_ = SIG_DFL;
};

// Rewrites a checkpoint's trainer_state.json as `text` and re-seals its marker (size and
// CRC-32), as a hand edit or another version would leave it: complete, but wrong inside.
void replace_trainer_state(const fs::path& checkpoint, const std::string& text) {
  const fs::path state_path = checkpoint / "trainer_state.json";
  vlm::test::write_file(state_path, text);
  const fs::path marker_path = checkpoint / kCheckpointMarker;
  nlohmann::json marker = nlohmann::json::parse(vlm::test::read_file(marker_path));
  marker["files"]["trainer_state.json"]["bytes"] = fs::file_size(state_path);
  marker["files"]["trainer_state.json"]["crc32"] = file_crc32(state_path);
  vlm::test::write_file(marker_path, marker.dump());
}

template <typename Edit>
void edit_trainer_state(const fs::path& checkpoint, Edit edit) {
  nlohmann::json state =
      nlohmann::json::parse(vlm::test::read_file(checkpoint / "trainer_state.json"));
  edit(state);
  replace_trainer_state(checkpoint, state.dump());
}

}  // namespace

CATCH_TEST_CASE("a save stopped by a full file system fails with the save code, keeping the last",
                "[checkpoint]") {
  Run run;
  run.save(1);
  const auto size = [&](const char* name) {
    return static_cast<rlim_t>(fs::file_size(run.checkpoint(1) / name));
  };
  const rlim_t model_bytes = size("model.safetensors");
  CATCH_REQUIRE(model_bytes > (rlim_t{256} << 10));

  // Which file the limit stops: the weights (the largest file, written first), or the
  // trainer state, made the largest by a big data cursor while every other file fits.
  std::string file;
  rlim_t cap = 0;
  TrainerState state = run.state(2);
  CATCH_SECTION("writing the weights") {
    file = "model.safetensors";
    cap = rlim_t{256} << 10;
  }
  CATCH_SECTION("writing the trainer state") {
    file = "trainer_state.json";
    cap = std::max({model_bytes, size("optimizer.pt"), size("config.yaml")}) + 4096;
    state.data_cursor["padding"] = std::string(cap + 4096, 'x');
  }
  {
    FileSizeLimit limit(cap);
    try {
      save_training_checkpoint(run.out.path(), state, run.contents());
      CATCH_FAIL("the save succeeded");
    } catch (const vlm::Error& e) {
      CATCH_INFO(e.what());
      CATCH_CHECK(e.code() == vlm::ExitCode::kSaveFailed);
      CATCH_CHECK_THAT(e.what(), Catch::Contains("checkpoint of step 2 not saved: ") &&
                                     Catch::Contains("/" + file) &&
                                     Catch::Contains(std::strerror(EFBIG)) &&
                                     Catch::Contains("the partial checkpoint was removed"));
    }
  }
  // No partial directory is left; the checkpoint before is complete (CRC-checked), listed and
  // resumed from.
  CATCH_CHECK_FALSE(has_tmp_dir(run.out.path()));
  CATCH_CHECK_FALSE(fs::exists(run.checkpoint(2)));
  CATCH_CHECK(complete_steps(run.out.path()) == std::vector<int64_t>{1});
  const auto resumed = run.resume();
  CATCH_REQUIRE(resumed.has_value());
  CATCH_CHECK(resumed->run.step == 1);
  // With room again the next save goes through.
  run.save(2);
  CATCH_CHECK(complete_steps(run.out.path()) == std::vector<int64_t>{1, 2});
}

CATCH_TEST_CASE("a trainer state nested 100,000 levels deep is refused like a damaged one",
                "[checkpoint]") {
  Run run;
  run.save(1);
  run.save(2);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string text = vlm::test::read_file(run.checkpoint(2) / "trainer_state.json");
  const auto replace_cursor = [&](std::string state_text) {
    nlohmann::json state = nlohmann::json::parse(state_text);
    state["data_cursor"] = "@CURSOR@";
    std::string out = state.dump();
    out.replace(out.find("\"@CURSOR@\""), 10, deep);
    return out;
  };
  replace_trainer_state(run.checkpoint(2), replace_cursor(text));
  const auto resumed = run.resume();
  CATCH_REQUIRE(resumed.has_value());
  CATCH_CHECK(resumed->run.step == 1);

  // Every checkpoint refused: a usage error naming the newest one's reason.
  text = vlm::test::read_file(run.checkpoint(1) / "trainer_state.json");
  replace_trainer_state(run.checkpoint(1), replace_cursor(text));
  try {
    run.resume();
    CATCH_FAIL("resumed");
  } catch (const vlm::UsageError& e) {
    CATCH_CHECK_THAT(e.what(), Catch::Contains("no usable checkpoint") &&
                                   Catch::Contains("step-00000002") &&
                                   Catch::Contains("nests deeper than 64 levels"));
  }
}

CATCH_TEST_CASE("a loss scaler state out of range refuses its checkpoint, not the run",
                "[checkpoint]") {
  Run run;
  run.scaler.load_state({{"scale", 1024.0}, {"growth_tracker", 5}, {"skipped_steps", 1}});
  run.save(1);
  run.scaler.load_state({{"scale", 2048.0}, {"growth_tracker", 0}, {"skipped_steps", 1}});
  run.save(2);
  run.save(3);
  // Step 3: a scale beyond a float (no run writes one); step 2: fine, but its data cursor is
  // refused after the scaler state was read.
  edit_trainer_state(run.checkpoint(3),
                     [](nlohmann::json& s) { s["loss_scaler"]["scale"] = 1e39; });
  run.scaler = LossScaler();
  const auto resumed =
      run.resume([](const nlohmann::json& cursor) { return cursor["position"] == 2; });
  CATCH_REQUIRE(resumed.has_value());
  CATCH_CHECK(resumed->run.step == 1);
  // The scaler is step 1's: neither the refused step 3's nor the half-loaded step 2's.
  CATCH_CHECK(run.scaler.scale() == 1024.0);
  CATCH_CHECK(run.scaler.growth_tracker() == 5);

  edit_trainer_state(run.checkpoint(1), [](nlohmann::json& s) { s["loss_scaler"]["scale"] = 0; });
  edit_trainer_state(run.checkpoint(2), [](nlohmann::json& s) { s["loss_scaler"]["scale"] = -1; });
  run.scaler = LossScaler();
  CATCH_CHECK_THROWS_WITH(run.resume(), Catch::Contains("no usable checkpoint") &&
                                            Catch::Contains("loss scaler state is out of range"));
  CATCH_CHECK(run.scaler.scale() == 65536.0);
}
