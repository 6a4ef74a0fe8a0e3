// Training from WebDataset tar shards (docs/data.md): the demo written as shards trains exactly
// as the demo as manifest and files (the same sample ledger, the same losses bit for bit), a run
// on shards resumes, and a shard rewritten since the checkpoint is refused at resume by name.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "train/training_runs.h"

namespace fs = std::filesystem;
using vlm::test::records;
using vlm::test::require_ok;
using vlm::test::run_args;
using vlm::test::run_vlmtrain;
using vlm::test::TempDir;

namespace {

// The suite's demo dataset (160 training samples, seed 5) written as shards of 50 samples.
fs::path demo_shards(const TempDir& dir, int seed = 5) {
  const fs::path out = dir / "shards";
  require_ok(run_vlmtrain("make-demo-data --format webdataset --samples-per-shard 50 --out '" +
                          out.string() + "' --samples 160 --val-samples 8 --seed " +
                          std::to_string(seed)));
  return out;
}

std::string on_shards(const fs::path& shards) {
  return " --set 'data.train=[{path: " + shards.string() + ", format: webdataset}]'";
}

}  // namespace

CATCH_TEST_CASE("the demo as shards trains as the demo as files: same ledger, same losses") {
  TempDir data, files, shards;
  const fs::path shard_dir = demo_shards(data);
  CATCH_REQUIRE(fs::exists(shard_dir / "train-000003.tar"));
  const std::string ledger = " --set output.sample_ledger=true";
  require_ok(run_vlmtrain(run_args(files.path(), ledger)));
  require_ok(run_vlmtrain(run_args(shards.path(), ledger + on_shards(shard_dir))));
  const auto a = records(files.path(), "step"), b = records(shards.path(), "step");
  CATCH_REQUIRE(a.size() == 6);
  CATCH_REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CATCH_CHECK(b[i]["loss"].get<double>() == a[i]["loss"].get<double>());
    CATCH_CHECK(b[i]["supervised_tokens"] == a[i]["supervised_tokens"]);
  }
  auto ledger_a = records(files.path() / "samples.jsonl", "samples");
  auto ledger_b = records(shards.path() / "samples.jsonl", "samples");
  CATCH_REQUIRE(ledger_a.size() == 6);
  CATCH_REQUIRE(ledger_b.size() == 6);
  for (size_t i = 0; i < 6; ++i) {
    CATCH_CHECK(ledger_a[i]["sample_ids"] == ledger_b[i]["sample_ids"]);
    CATCH_CHECK(ledger_a[i]["step"] == ledger_b[i]["step"]);
  }
}

CATCH_TEST_CASE("inspect-batches and estimate-memory --data read shards as they read files") {
  TempDir data;
  const fs::path shard_dir = demo_shards(data);
  const std::string common =
      "--config '" + (vlm::test::source_dir() / "configs/demo.yaml").string() +
      "' --log-level error --set model.preset=tiny --set data.max_img_size=128 --set packing.max_seq_len=256 "
      "--set data.max_sample_length=256 --set packing.max_images_per_knapsack=8 "
      "--set train.batch_size=2 --set train.seed=3 ";
  const std::string files =
      " --set 'data.train=[{path: " + (vlm::test::demo_dir() / "train.jsonl").string() + "}]'";
  for (const std::string command :
       {"inspect-batches --steps 3 --json", "estimate-memory --data --gpu H100-80GB --json"}) {
    CATCH_INFO(command);
    const auto a = run_vlmtrain(common + command + files);
    const auto b = run_vlmtrain(common + command + on_shards(shard_dir));
    require_ok(a);
    require_ok(b);
    nlohmann::json ja = nlohmann::json::parse(a.output.substr(a.output.find("\n{") + 1));
    nlohmann::json jb = nlohmann::json::parse(b.output.substr(b.output.find("\n{") + 1));
    for (nlohmann::json* j : {&ja, &jb}) {  // the paths and the timings differ, nothing else
      for (const char* key : {"config", "source", "throughput"}) j->erase(key);
    }
    CATCH_CHECK(ja == jb);
  }
}

CATCH_TEST_CASE("a run on shards resumes, and a shard rewritten since its checkpoint is refused") {
  TempDir data, out;
  const fs::path shard_dir = demo_shards(data);
  const std::string args = on_shards(shard_dir) + " --set output.checkpoint_every=2";
  require_ok(run_vlmtrain(run_args(out.path(), args + " --set train.max_steps=4")));
  require_ok(run_vlmtrain(run_args(out.path(), args + " --set train.max_steps=6")));
  const auto steps = records(out.path(), "step");
  CATCH_REQUIRE(steps.size() == 6);
  CATCH_CHECK(steps.back()["step"] == 6);

  // Shard 1 rewritten (other samples, same name): every checkpoint's cursor refuses it.
  TempDir other;
  const fs::path rewritten = demo_shards(other, 9);
  fs::copy_file(rewritten / "train-000001.tar", shard_dir / "train-000001.tar",
                fs::copy_options::overwrite_existing);
  const auto r = run_vlmtrain(run_args(out.path(), args + " --set train.max_steps=8"));
  CATCH_INFO(r.output);
  CATCH_CHECK(r.exit_code == 2);
  CATCH_CHECK(r.output.find("train-000001.tar") != std::string::npos);
  CATCH_CHECK(r.output.find("not the one the checkpoint's data cursor was saved with") !=
              std::string::npos);
  CATCH_CHECK(records(out.path(), "step").size() == 6);  // nothing trained, nothing lost
}
