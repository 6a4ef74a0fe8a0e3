// The memory model's range (memory/magnitude.h): a config whose micro-batches could hold more
// than it counts to is a config error naming its keys, where huge in-range dimensions once
// wrapped int64 into negative peaks that "fit" (issue 29, class 1).
#include <catch2/catch.hpp>

#include "core/config_io.h"
#include "core/error.h"
#include "memory/magnitude.h"
#include "memory/step_peaks.h"

using namespace vlm;

namespace {

Config demo(std::vector<std::string> sets) {
  return load_config(VLM_SOURCE_DIR "/configs/demo.yaml", std::move(sets)).config;
}

std::string refusal(const Config& config) {
  try {
    memory::memory_spec(config);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("the shipped configs are far inside the range") {
  for (const char* file : {"/configs/demo.yaml", "/configs/nanovlm.yaml"}) {
    CAPTURE(file);
    const Config config = load_config(std::string(VLM_SOURCE_DIR) + file, {}).config;
    const memory::MemorySpec spec = memory::memory_spec(config);  // does not throw
    const double bound =
        memory::step_bytes_bound(spec, static_cast<double>(config.train.rows_by_limits()),
                                 static_cast<double>(config.packing.max_seq_len), 1024.0);
    CHECK(bound < memory::kMaxModelledBytes / 1024);
  }
}

TEST_CASE("rows of millions of tokens by the thousand are refused, naming the keys") {
  // estimate-memory gave "needs -7373.04 PiB, fits" for this one.
  const std::string why =
      refusal(demo({"packing.max_seq_len=16777216", "model.language.max_position=16777216",
                    "data.max_sample_length=16777216", "train.batch_size=65536"}));
  CHECK_THAT(why, Catch::Contains("1 EiB"));
  CHECK_THAT(why, Catch::Contains("train.batch_size = 65536"));
  CHECK_THAT(why, Catch::Contains("packing.max_seq_len = 16777216"));
  // One row of them the model still counts (tens of PiB for the tiny model's attention: a
  // verdict, not a wrapped count).
  CHECK(refusal(demo({"packing.max_seq_len=16777216", "model.language.max_position=16777216",
                      "data.max_sample_length=16777216", "train.batch_size=1"})) == "accepted");
  // A long but sane row is not.
  CHECK(refusal(demo({"packing.max_seq_len=65536", "model.language.max_position=65536",
                      "data.max_sample_length=65536", "train.batch_size=8"})) == "accepted");
}

TEST_CASE("a thousand wide decoder layers are refused, naming the model's dimensions") {
  const std::string why =
      refusal(demo({"model.language.num_layers=1024", "model.language.hidden_size=131072",
                    "model.language.num_heads=1024", "model.language.num_kv_heads=1024",
                    "model.language.mlp_size=1048576", "train.batch_size=65536"}));
  CHECK_THAT(why, Catch::Contains("num_layers = 1024"));
  CHECK_THAT(why, Catch::Contains("hidden_size = 131072"));
}

TEST_CASE("a shape beyond the range is not modelled, whatever its config") {
  const Config config = demo({});
  const memory::MemorySpec spec = memory::memory_spec(config);
  memory::BatchShape huge;
  huge.rows = 65536;
  huge.row_tokens = 16777216;
  huge.supervised_tokens = 1;
  huge.segment_lengths.assign(static_cast<size_t>(huge.rows), huge.row_tokens);
  huge.segments = huge.rows;
  huge.max_segment_len = huge.row_tokens;
  const memory::PhasePeaks p = memory::step_peaks(spec, huge, true);
  CHECK_FALSE(p.modelled);
  CHECK_THAT(p.why_not, Catch::Contains("range"));
}
