#include <catch2/catch.hpp>

#include <limits>
#include <set>

#include "data/source/manifest.h"
#include "data/source/sample_stream.h"
#include "data/source/skip_counter.h"
#include "support/test_support.h"

using namespace vlm::data;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {
std::vector<std::string> paths(const std::vector<ImageRef>& images) {
  std::vector<std::string> out;
  for (const ImageRef& image : images) {
    CHECK_FALSE(image.in_shard());
    out.push_back(image.path);
  }
  return out;
}
}  // namespace

TEST_CASE("the_cauldron and LLaVA lines parse, image paths resolve against the manifest") {
  TempDir dir;
  const auto path = write_file(
      dir / "sub/m.jsonl",
      R"({"images": ["img/a.png", "/abs/b.jpg"], "texts": [{"user": "Q1", "assistant": "A1"}, {"user": "Q2", "assistant": "A2"}]})"
      "\n\n"
      R"({"image": "c.jpg", "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "This."}]})"
      "\n");
  Manifest m(path, DatasetFormat::kAuto);
  REQUIRE(m.size() == 2);
  CHECK(m.line_number(1) == 3);
  const auto first = std::get<RawSample>(m.read(0));
  CHECK(paths(first.images) ==
        std::vector<std::string>{(dir / "sub/img/a.png").string(), "/abs/b.jpg"});
  REQUIRE(first.turns.size() == 4);
  CHECK(first.turns[3].role == ChatRole::kAssistant);
  CHECK(first.turns[3].text == "A2");
  CHECK(first.where.str() == path + ":1");
  const auto second = std::get<RawSample>(m.read(1));
  CHECK(paths(second.images) == std::vector<std::string>{(dir / "sub/c.jpg").string()});
  CHECK(second.turns[0].text == "<image>\nWhat?");
  CHECK(second.where.line == 3);
}

TEST_CASE("malformed lines come back as problems with a stable reason") {
  const vlm::SourceLocation at{"m.jsonl", 7};
  auto reason = [&](const char* line, DatasetFormat f = DatasetFormat::kAuto) {
    const auto parsed = parse_manifest_line(line, f, "", at);
    return std::holds_alternative<SampleProblem>(parsed) ? std::get<SampleProblem>(parsed).reason
                                                         : std::string("ok");
  };
  CHECK(reason("{not json") == "malformed_json");
  CHECK(reason("[1, 2]") == "malformed_json");
  CHECK(reason(R"({"foo": 1})") == "bad_schema");
  CHECK(reason(R"({"texts": []})") == "bad_schema");
  CHECK(reason(R"({"texts": [{"user": "q"}]})") == "bad_schema");
  CHECK(reason(R"({"images": "a.png", "texts": [{"user": "q", "assistant": "a"}]})") ==
        "bad_schema");
  CHECK(reason(R"({"texts": [{"user": "q", "assistant": ""}]})") == "no_assistant_turn");
  CHECK(reason(R"({"conversations": [{"from": "gpt", "value": "a"}]})") == "bad_schema");
  CHECK(reason(R"({"conversations": [{"from": "robot", "value": "a"}]})") == "unsupported_role");
  // A format named in the config whose main key is missing (this once read freed memory:
  // fuzz/corpus/manifest/llava_without_conversations).
  CHECK(reason(R"({"texts": [{"user": "q", "assistant": "a"}]})", DatasetFormat::kLlava) ==
        "bad_schema");
  CHECK(reason(R"({"image": "a.jpg", "d": 0})", DatasetFormat::kLlava) == "bad_schema");
  CHECK(reason(R"({"conversations": [{"from": "human", "value": "q"}]})",
               DatasetFormat::kCauldron) == "bad_schema");
  CHECK(reason(R"({"texts": [{"user": "q", "assistant": "a"}]})") == "ok");
}

TEST_CASE("oversized and hostile lines are skipped with a reason, quickly") {
  const vlm::SourceLocation at{"m.jsonl", 3};
  auto reason = [&](const std::string& line) {
    const auto parsed = parse_manifest_line(line, DatasetFormat::kAuto, "", at);
    return std::holds_alternative<SampleProblem>(parsed) ? std::get<SampleProblem>(parsed).reason
                                                         : std::string("ok");
  };
  std::string images = "[";
  for (int i = 0; i < 100000; ++i) images += std::string(i ? "," : "") + "\"a.png\"";
  CHECK(reason("{\"images\": " + images +
               "], \"texts\": [{\"user\": \"q\", "
               "\"assistant\": \"a\"}]}") == "too_many_image_paths");
  CHECK(reason(std::string(100000, '[') + std::string(100000, ']')) == "malformed_json");

  TempDir dir;
  const std::string good = "{\"texts\": [{\"user\": \"q\", \"assistant\": \"a\"}]}\n";
  const auto path = write_file(
      dir / "long.jsonl", good + "{\"texts\": \"" + std::string(10 << 20, 'x') + "\"}\n" + good);
  Manifest manifest(path, DatasetFormat::kAuto);
  REQUIRE(manifest.size() == 3);
  CHECK(std::holds_alternative<RawSample>(manifest.read(0)));
  CHECK(std::get<SampleProblem>(manifest.read(1)).reason == "line_too_long");
}

TEST_CASE("an endless stream without newlines is no manifest: a data error, not a hang") {
  CHECK_THROWS_WITH(Manifest("/dev/zero", DatasetFormat::kAuto),
                    Catch::Matchers::Contains("without a newline: not a JSONL manifest"));
}

TEST_CASE("missing and empty manifests are data errors naming the file") {
  TempDir dir;
  CHECK_THROWS_AS(Manifest((dir / "none.jsonl").string(), DatasetFormat::kAuto), vlm::DataError);
  const auto empty = write_file(dir / "empty.jsonl", "\n  \n");
  CHECK_THROWS_WITH(Manifest(empty, DatasetFormat::kAuto), empty + ": manifest has no samples");
}

TEST_CASE("the skip counter tolerates a few bad samples and stops at the ceiling") {
  SkipCounter counter(0.1, 5);
  counter.count_seen(100);
  for (int i = 0; i < 10; ++i) counter.skip("malformed_json", "x", {"m.jsonl", i + 1});
  CHECK(counter.skipped() == 10);
  CHECK_THROWS_AS(counter.skip("missing_image", "y", {"m.jsonl", 99}), vlm::DataError);
  CHECK(counter.by_reason().at("malformed_json") == 10);

  SkipCounter early(0.0, 3);  // never errors before min_count skips
  early.skip("a", "", {});
  early.skip("a", "", {});
  CHECK_THROWS_AS(early.skip("a", "", {}), vlm::DataError);
}

TEST_CASE("the sample stream mixes by weight, covers each epoch once, and resumes exactly") {
  SampleStream stream({10, 30}, {1.0, 3.0}, 7);
  std::vector<SampleRef> refs;
  for (int i = 0; i < 40; ++i) refs.push_back(stream.next());
  std::set<uint64_t> seen[2];
  for (const auto& r : refs) {
    CHECK(r.epoch == 0);
    CHECK(seen[r.dataset].insert(r.index).second);  // no repeats inside an epoch
  }
  CHECK(seen[0].size() == 10);  // exact proportions: 1:3 of 40
  CHECK(seen[1].size() == 30);
  CHECK(stream.next().epoch == 1);

  SampleStream a({5, 7}, {2.0, 1.0}, 3);
  for (int i = 0; i < 11; ++i) a.next();
  const auto saved = a.state();
  SampleStream b({5, 7}, {2.0, 1.0}, 3);
  b.restore(saved);
  for (int i = 0; i < 50; ++i) CHECK(a.next() == b.next());

  SampleStream other_seed({5, 7}, {2.0, 1.0}, 4);
  CHECK_THROWS_AS(other_seed.restore(saved), vlm::DataError);
}

TEST_CASE("a sample stream refuses a saved cursor that is out of range, before using it") {
  SampleStream a({5, 7}, {2.0, 1.0}, 3);
  for (int i = 0; i < 4; ++i) a.next();
  const auto saved = a.state();
  const auto refused = [&](const char* field, const nlohmann::json& value) {
    auto bad = saved;
    bad["datasets"][1][field] = value;
    SampleStream b({5, 7}, {2.0, 1.0}, 3);
    CHECK_THROWS_WITH(b.restore(bad), Catch::Contains("out of range"));
  };
  refused("position", 8);  // past the 7 samples: an out-of-bounds read before the check
  refused("position", uint64_t{1} << 62);
  refused("current", std::numeric_limits<double>::quiet_NaN());
  refused("current", std::numeric_limits<double>::infinity());
  refused("epoch", uint64_t{1} << 40);
  // A negative weight credit is a normal state of the weighted round-robin.
  auto negative = saved;
  negative["datasets"][1]["current"] = -1.0;
  SampleStream c({5, 7}, {2.0, 1.0}, 3);
  CHECK_NOTHROW(c.restore(negative));
  // Exactly at the end is a legal position (the epoch's last sample was drawn).
  auto at_end = saved;
  at_end["datasets"][1]["position"] = 7;
  SampleStream d({5, 7}, {2.0, 1.0}, 3);
  CHECK_NOTHROW(d.restore(at_end));
}

TEST_CASE("an unshuffled stream reads in file order") {
  SampleStream s({3}, {1.0}, 0, /*shuffle=*/false);
  CHECK(s.next().index == 0);
  CHECK(s.next().index == 1);
  CHECK(s.next().index == 2);
  const auto wrapped = s.next();
  CHECK(wrapped.index == 0);
  CHECK(wrapped.epoch == 1);
}
