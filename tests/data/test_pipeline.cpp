// The data pipeline end to end on generated data: sample builder, planning pipeline and
// worst-case analysis (the loader and collation: test_loader.cpp).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "core/config_io.h"
#include "data/batch/host_batch.h"
#include "data/batch/loader.h"
#include "data/data_setup.h"
#include "data/demo/demo_data.h"
#include "data/demo_fixture.h"
#include "data/image/image_encode.h"
#include "data/packing/worst_case.h"
#include "spec/image_tokens.h"
#include "support/test_support.h"

using namespace vlm::data;
using vlm::test::DemoFixture;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {

std::vector<uint64_t> ids_of(const StepPlan& plan, int64_t rank) {
  std::vector<uint64_t> ids;
  for (const auto& micro : plan.micro_batches.at(static_cast<size_t>(rank))) {
    for (const auto& pack : micro.packs) {
      for (const auto& item : pack.items) ids.push_back(item.sample_id);
    }
  }
  return ids;
}

}  // namespace

TEST_CASE("nanoVLM's defaults: 1224 crops by arithmetic, far fewer within the token budget") {
  WorstCaseInputs in;
  in.grid.crop_size = 512;
  in.grid.max_img_size = 2048;
  in.grid.resize_to_max = true;
  in.image_tokens_per_crop = 64;
  in.max_seq_len = 4096;
  in.max_images_per_pack = 18;
  in.batch_size = 4;
  const WorstCase w = worst_case(in);
  CHECK(w.max_crops_per_image == 17);
  CHECK(w.naive_crops == 4 * 18 * 17);
  // Every image costs 65 tokens per crop (64 image tokens + its marker), so 63 crops fill
  // 4095 of 4096 tokens: e.g. 7 images of 2x4 tiles + global (9 crops each).
  CHECK(w.crops_per_pack == 63);
  CHECK(w.crops_per_micro_batch == 4 * 63);
  in.max_crops_per_micro_batch = 100;
  CHECK(worst_case(in).crops_per_micro_batch == 100);
}

// Many grids (small crops, large images): the row the knapsack spells out is the row it
// counted (its shape indices once wrapped at 256), and 67 million grids no longer take minutes
// (issue 29, class 2): one grid per tile count that fits stands for the rest.
TEST_CASE("the worst row is spelled as counted, and many grids cost the distinct tile counts") {
  WorstCaseInputs in;
  in.grid.crop_size = 8;
  in.grid.max_img_size = 32 * 8;  // grids up to 32 x 32: some 400 distinct tile counts
  in.image_tokens_per_crop = 1;   // an image of n > 1 tiles: (n + 1) crops, 2 (n + 1) tokens
  in.max_seq_len = 4096;
  in.max_images_per_pack = 3;  // 2048 crops only as a mix (32x32, 31x32 and 29x1 tiles, say)
  const WorstCase w = worst_case(in);
  CHECK(w.crops_per_pack == 2048);
  REQUIRE(w.images_in_that_pack == static_cast<int64_t>(w.grids_in_that_pack.size()));
  CHECK(w.images_in_that_pack <= 3);
  int64_t crops = 0, tokens = 0;
  for (const GridShape& g : w.grids_in_that_pack) {
    crops += vlm::spec::image_crops(g.rows, g.cols);
    tokens += vlm::spec::image_lm_tokens(g.rows, g.cols, in.image_tokens_per_crop);
  }
  CHECK(crops == w.crops_per_pack);
  CHECK(tokens == w.image_tokens_in_that_pack);
  CHECK(tokens <= in.max_seq_len);

  in.grid.max_img_size = 65536;  // 8192 x 8192 grids
  in.max_images_per_pack = 18;
  const WorstCase many = worst_case(in);
  CHECK(many.crops_per_pack == 2048);
  CHECK(many.max_crops_per_image == 8192 * 8192 + 1);
  CHECK(many.image_tokens_in_that_pack <= in.max_seq_len);
}

TEST_CASE("every rank plans the same steps and their union is the stream, without overlap") {
  DemoFixture fixture(120, {"train.batch_size=2", "train.gradient_accumulation_steps=2"});
  const int64_t ranks = 3;
  DataSetup setup(fixture.config, ranks);
  auto a = setup.training_pipeline();
  auto b = setup.training_pipeline();
  std::set<uint64_t> seen;
  int64_t supervised = 0;
  for (int step = 0; step < 4; ++step) {
    const auto pa = a->next_step();
    const auto pb = b->next_step();
    REQUIRE(pa);
    REQUIRE(pb);
    CHECK(pa->cursor_after == pb->cursor_after);
    int64_t step_supervised = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      CHECK(ids_of(pa->plan, r) == ids_of(pb->plan, r));
      for (const uint64_t id : ids_of(pa->plan, r)) CHECK(seen.insert(id).second);
      for (const auto& micro : pa->plan.micro_batches[static_cast<size_t>(r)]) {
        for (const auto& pack : micro.packs) step_supervised += pack.supervised;
      }
    }
    CHECK(step_supervised == pa->plan.supervised_tokens);
    supervised += step_supervised;
    a->release(pa->plan);
    b->release(pb->plan);
  }
  // Ids are assigned in stream order: whatever was planned is a prefix minus what waits in the
  // packer, and no id is ever planned twice (checked above).
  CHECK(seen.size() > 12);
  CHECK(supervised > 0);
}

TEST_CASE("a restored planning cursor continues exactly as the uninterrupted pipeline") {
  DemoFixture fixture;
  DataSetup setup(fixture.config, 2);
  auto reference = setup.training_pipeline();
  std::vector<PlannedStep> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(*reference->next_step());

  auto resumed = setup.training_pipeline();
  resumed->restore(expected[2].cursor_after);
  for (int i = 3; i < 6; ++i) {
    const auto step = resumed->next_step();
    REQUIRE(step);
    CHECK(step->step == expected[i].step);
    for (int64_t r = 0; r < 2; ++r) CHECK(ids_of(step->plan, r) == ids_of(expected[i].plan, r));
    CHECK(step->plan.supervised_tokens == expected[i].plan.supervised_tokens);
    // The samples of restored in-flight packs were rebuilt: tokens are there to collate.
    for (const uint64_t id : ids_of(step->plan, 0)) {
      REQUIRE(resumed->sample(id) != nullptr);
      CHECK(resumed->sample(id)->tokens.ids == reference->sample(id)->tokens.ids);
    }
  }
}

TEST_CASE("a cursor whose packs name a sample the source did not save is refused on restore") {
  // fuzz/corpus/checkpoint_state/in_flight_id_missing.json: the restore went through and the
  // next step failed with std::out_of_range (an internal error) looking the sample up.
  DemoFixture fixture;
  DataSetup setup(fixture.config, 1);
  auto reference = setup.training_pipeline();
  nlohmann::json cursor;
  for (int i = 0; i < 3; ++i) cursor = reference->next_step()->cursor_after;
  REQUIRE(!cursor["source"]["in_flight"].empty());
  const uint64_t renamed = cursor["source"]["in_flight"][0][0].get<uint64_t>();
  cursor["source"]["in_flight"][0][0] = 999999999;
  auto resumed = setup.training_pipeline();
  CHECK_THROWS_WITH(
      resumed->restore(cursor),
      Catch::Contains("the saved data cursor is inconsistent: sample " + std::to_string(renamed)));
}

TEST_CASE("a manifest whose lines were swapped since the checkpoint is refused at the line") {
  // A sample waiting in a pack is rebuilt on restore from its manifest line: another sample
  // there (lines reordered, edited, inserted) must not slip into a pack planned for the old one.
  DemoFixture fixture;
  nlohmann::json cursor;
  {
    DataSetup setup(fixture.config, 1);
    auto reference = setup.training_pipeline();
    for (int i = 0; i < 3; ++i) cursor = reference->next_step()->cursor_after;
  }
  REQUIRE(!cursor["source"]["in_flight"].empty());
  const std::string manifest = (fixture.dir / "demo/train.jsonl").string();
  std::vector<std::string> lines;
  {
    std::istringstream in(vlm::test::read_file(manifest));
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  const auto images_in = [](const std::string& line) {
    size_t n = 0;
    for (size_t at = line.find("images/"); at != std::string::npos;
         at = line.find("images/", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t a = cursor["source"]["in_flight"][0][2].get<size_t>();
  size_t b = 0;
  while (b == a || images_in(lines.at(b)) == images_in(lines.at(a))) ++b;
  std::swap(lines.at(a), lines.at(b));
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  write_file(manifest, text);

  // The same cursor before the swap restores (checked above by the resume test); after it:
  DataSetup setup(fixture.config, 1);
  auto resumed = setup.training_pipeline();
  try {
    resumed->restore(cursor);
    FAIL("the swapped manifest was accepted");
  } catch (const vlm::DataError& e) {
    INFO(e.what());
    CHECK(e.code() == vlm::ExitCode::kData);
    CHECK(e.where().file == manifest);
    const auto line = e.where().line;
    CHECK((line == static_cast<int64_t>(a) + 1 || line == static_cast<int64_t>(b) + 1));
    CHECK_THAT(e.what(), Catch::Contains("the dataset changed since the checkpoint: sample ") &&
                             Catch::Contains("was packed from this line as "));
  }
  // Swapped back, the same cursor restores again.
  std::swap(lines.at(a), lines.at(b));
  text.clear();
  for (const auto& line : lines) text += line + "\n";
  write_file(manifest, text);
  DataSetup again(fixture.config, 1);
  CHECK_NOTHROW(again.training_pipeline()->restore(cursor));
}

TEST_CASE("a cursor whose saved packs break the pack limits is refused on restore") {
  DemoFixture fixture(120, {"train.batch_size=2"});
  DataSetup setup(fixture.config, 1);
  auto reference = setup.training_pipeline();
  nlohmann::json cursor;
  for (int i = 0; i < 3; ++i) cursor = reference->next_step()->cursor_after;
  REQUIRE(!cursor["packer"]["pool"].empty());
  const auto refused = [&](const nlohmann::json& bad) {
    try {
      setup.training_pipeline()->restore(bad);
    } catch (const vlm::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // A waiting sample longer than a row (max_seq_len 512).
  auto bad = cursor;
  bad["packer"]["pool"][0][1] = 100000;
  CHECK_THAT(refused(bad), Catch::Contains("packer state: the pool holds a pack of 1 samples, "
                                           "100000 tokens") &&
                               Catch::Contains("breaks the pack limits (512 tokens"));
  // Negative, float and past-int64 counts, more supervised tokens than tokens.
  for (const auto& value : {nlohmann::json(-3), nlohmann::json(1e300),
                            nlohmann::json(std::numeric_limits<uint64_t>::max())}) {
    bad = cursor;
    bad["packer"]["pool"][0][2] = value;
    CHECK_THAT(refused(bad), Catch::Contains("a saved sample's images is"));
  }
  bad = cursor;
  bad["packer"]["pool"][0][4] = bad["packer"]["pool"][0][1].get<int64_t>() + 1;
  CHECK_THAT(refused(bad), Catch::Contains("supervised tokens of"));
  // A pack waiting for the next step with more tokens than a row.
  bad = cursor;
  auto item = cursor["packer"]["pool"][0];
  bad["packer"]["pool"].erase(0);
  item[1] = 600;
  bad["planner"]["deferred"] = nlohmann::json::array({nlohmann::json::array({item})});
  CHECK_THAT(refused(bad), Catch::Contains("a pack waiting for the next step is a pack of 1 "
                                           "samples, 600 tokens"));
  // The same sample in two packs.
  bad = cursor;
  bad["planner"]["deferred"] =
      nlohmann::json::array({nlohmann::json::array({cursor["packer"]["pool"][0]})});
  CHECK_THAT(refused(bad), Catch::Contains("waits in two packs"));
  CHECK(refused(cursor) == "accepted");
}

TEST_CASE("a missing or corrupt image skips its sample with a reason, the run goes on") {
  TempDir dir;
  const std::string png = (dir / "ok.png").string();
  vlm::data::RgbImage image(80, 60);
  write_png_file(png, image);
  write_file(dir / "bad.png", "not a png at all");
  write_file(dir / "m.jsonl",
             R"({"images": ["ok.png"], "texts": [{"user": "Q", "assistant": "A"}]})"
             "\n"
             R"({"images": ["missing.png"], "texts": [{"user": "Q", "assistant": "A"}]})"
             "\n"
             R"({"images": ["bad.png"], "texts": [{"user": "Q", "assistant": "A"}]})"
             "\n"
             "{broken\n");
  const auto config =
      vlm::load_config("", {"data.train=[{path: " + (dir / "m.jsonl").string() + "}]",
                            "data.max_img_size=128", "data.max_skipped_fraction=1"})
          .config;
  DataSetup setup(config, 1);
  SampleBuilder const& builder = setup.builder();
  DatasetSource source({{(dir / "m.jsonl").string(), 1.0, DatasetFormat::kAuto}}, builder,
                       setup.skip_limits(), 0, false, /*one_pass=*/true);
  int kept = 0;
  while (source.next()) ++kept;
  CHECK(kept == 1);
  const auto reasons = source.skips()->by_reason();
  CHECK(reasons.at("missing_image") == 1);
  CHECK(reasons.at("bad_image") == 1);
  CHECK(reasons.at("malformed_json") == 1);
}

TEST_CASE("limits that no sample can meet stop with the binding limit, not an endless loop") {
  // Every demo sample is longer than 16 tokens: a whole pass is dropped, then an error.
  DemoFixture fixture(40, {"packing.max_seq_len=16", "data.max_sample_length=16"});
  DataSetup setup(fixture.config, 1);
  auto pipeline = setup.training_pipeline();
  try {
    pipeline->next_step();
    FAIL("no error");
  } catch (const vlm::DataError& e) {
    const std::string message = e.what();
    CHECK(message.find("no sample fits the limits") != std::string::npos);
    CHECK(message.find(": 82 samples in a row") != std::string::npos);  // 2 x 40 + 2
    CHECK(message.find("packing.max_seq_len 16") != std::string::npos);
    CHECK(message.find("the smallest has") != std::string::npos);
  }
}

TEST_CASE("a training set whose every sample is skipped stops, even when skips are tolerated") {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 30; ++i) lines += "{\"images\": [\"missing.png\"], \"texts\": 7}\n";
  write_file(dir / "broken.jsonl", lines);
  const vlm::Config config =
      vlm::load_config("", {"data.train=[{path: " + (dir / "broken.jsonl").string() + "}]",
                            "data.max_skipped_fraction=1"})
          .config;
  DataSetup setup(config, 1);
  auto pipeline = setup.training_pipeline();
  CHECK_THROWS_WITH(pipeline->next_step(),
                    Catch::Matchers::Contains("none of the 30 samples of the training data"));
}

namespace {

// Records what spdlog logs while it lives.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string text() const { return text_.str(); }
  size_t count(const std::string& needle) const {
    const std::string all = text();
    size_t n = 0;
    for (size_t at = all.find(needle); at != std::string::npos; at = all.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> previous_;
};

// `fit` short text samples and `too_long` ones over data.max_sample_length (512).
vlm::Config mixed_lengths_config(const TempDir& dir, int fit, int too_long) {
  std::string lines;
  for (int i = 0; i < fit; ++i) {
    lines += R"({"texts": [{"user": "q", "assistant": "a"}]})"
             "\n";
  }
  for (int i = 0; i < too_long; ++i) {
    lines += R"({"texts": [{"user": "q", "assistant": ")" + std::string(600, 'x') + "\"}]}\n";
  }
  const auto path = write_file(dir / "mixed.jsonl", lines);
  return vlm::load_config("", {"data.train=[{path: " + path + "}]", "packing.max_seq_len=512",
                               "data.max_sample_length=512", "packing.buffer_samples=8"})
      .config;
}

}  // namespace

TEST_CASE("most samples dropped by the limits: one warning naming the limit, and the fraction") {
  TempDir dir;
  const vlm::Config config = mixed_lengths_config(dir, 10, 30);  // DataSetup keeps a reference
  DataSetup setup(config, 1);
  auto pipeline = setup.training_pipeline();
  CHECK(pipeline->dropped_fraction() == 0.0);
  LogCapture log;
  for (int step = 0; step < 5; ++step) REQUIRE(pipeline->next_step());
  INFO(log.text());
  // A whole pass (every sample at least once) was seen before the warning.
  CHECK(log.count("% of the samples are dropped by the limits") == 1);
  CHECK(log.count("most by too_long (") == 1);
  CHECK(log.count("data.max_sample_length): raise it or check the data") == 1);
  const int64_t dropped = pipeline->drops().total();
  const int64_t seen = dropped + pipeline->samples_kept();
  CHECK(seen >= 40);
  CHECK(pipeline->dropped_fraction() == Approx(double(dropped) / double(seen)));
  CHECK(pipeline->dropped_fraction() > 0.5);
}

// The warning is said once per DataSetup's validation passes (a run evaluates many times),
// and never by a pipeline told to keep quiet (estimate-memory's candidate configs).
TEST_CASE("the drop warning: once over a run's validation passes, never from a quiet pipeline") {
  TempDir dir;
  const vlm::Config mixed = mixed_lengths_config(dir, 10, 30);
  vlm::Config config = mixed;
  config.data.validation = config.data.train;
  DataSetup setup(config, 1);
  LogCapture log;
  for (int pass = 0; pass < 3; ++pass) {
    auto validation = setup.validation_pipeline();
    while (validation->next_step()) {
    }
    CHECK(validation->dropped_fraction() > 0.5);
  }
  CHECK(log.count("% of the samples are dropped by the limits") == 1);
  auto quiet = setup.training_pipeline();
  quiet->share_drop_warning(std::make_shared<std::atomic<bool>>(true));
  for (int step = 0; step < 5; ++step) REQUIRE(quiet->next_step());
  CHECK(log.count("% of the samples are dropped by the limits") == 1);
  auto loud = setup.training_pipeline();
  for (int step = 0; step < 5; ++step) REQUIRE(loud->next_step());
  CHECK(log.count("% of the samples are dropped by the limits") == 2);
}

TEST_CASE("fewer than half of the samples dropped: no warning") {
  TempDir dir;
  const vlm::Config config = mixed_lengths_config(dir, 30, 10);  // DataSetup keeps a reference
  DataSetup setup(config, 1);
  auto pipeline = setup.training_pipeline();
  LogCapture log;
  for (int step = 0; step < 5; ++step) REQUIRE(pipeline->next_step());
  CHECK(log.count("dropped by the limits") == 0);
  CHECK(pipeline->dropped_fraction() > 0.0);
  CHECK(pipeline->dropped_fraction() < 0.5);
}

TEST_CASE("a heavily weighted dataset that never fits does not hide a light one that does") {
  // 1000:1 weights put long streaks of unusable draws between the usable ones; the progress
  // proof waits until every sample has come, so the light dataset's samples are still found.
  DemoFixture fixture(40);
  std::string too_long, broken;
  for (int i = 0; i < 20; ++i) {
    too_long += R"({"texts": [{"user": "q", "assistant": ")" + std::string(600, 'x') + "\"}]}\n";
    broken += "{\"texts\": 7}\n";
  }
  const auto long_path = write_file(fixture.dir / "long.jsonl", too_long);
  const auto broken_path = write_file(fixture.dir / "broken.jsonl", broken);
  vlm::Config config = fixture.config;
  config.data.max_skipped_fraction = 1;
  config.data.train = {{(fixture.dir / "demo/train.jsonl").string(), 1.0},
                       {long_path, 1000.0},
                       {broken_path, 1000.0}};
  DataSetup setup(config, 1);
  auto pipeline = setup.training_pipeline();
  for (int step = 0; step < 3; ++step) CHECK(pipeline->next_step().has_value());
}
