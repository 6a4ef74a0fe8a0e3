// Length stream reader: values, blank lines, and errors with file:line.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "data/source/item_source.h"
#include "data/source/length_stream.h"
#include "support/test_support.h"

using namespace vlm::data;

namespace {
std::string error_of(const std::string& path) {
  try {
    read_length_stream(path);
  } catch (const vlm::DataError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("length stream: reads samples in order, skipping blank lines") {
  vlm::test::TempDir dir;
  const auto path = vlm::test::write_file(
      dir / "s.jsonl",
      "{\"tokens\": 977, \"images\": 1, \"crops\": 13, \"supervised\": 52}\n\n"
      "{\"supervised\": 0, \"crops\": 0, \"images\": 0, \"tokens\": 26, \"note\": \"x\"}\n");
  const auto items = read_length_stream(path);
  REQUIRE(items.size() == 2);
  REQUIRE(items[0] == PackItem{0, 977, 1, 13, 52});
  REQUIRE(items[1] == PackItem{1, 26, 0, 0, 0});
}

TEST_CASE("length stream: malformed lines name file:line and the problem") {
  vlm::test::TempDir dir;
  const std::string good = "{\"tokens\": 5, \"images\": 0, \"crops\": 0, \"supervised\": 1}\n";
  auto check = [&](const std::string& bad_line, const std::string& what) {
    const auto path = vlm::test::write_file(dir / "bad.jsonl", good + "\n" + bad_line + "\n");
    const std::string message = error_of(path);
    INFO(message);
    REQUIRE(message.find(path + ":3") != std::string::npos);
    REQUIRE(message.find(what) != std::string::npos);
  };
  check("{\"tokens\": 5, \"images\": 0,", "bad JSON");
  check("{\"images\": 0, \"crops\": 0, \"supervised\": 1}", "missing field \"tokens\"");
  check("{\"tokens\": -5, \"images\": 0, \"crops\": 0, \"supervised\": 0}", "must be >= 0");
  check("{\"tokens\": 5.5, \"images\": 0, \"crops\": 0, \"supervised\": 0}", "must be an integer");
  check("{\"tokens\": \"5\", \"images\": 0, \"crops\": 0, \"supervised\": 0}",
        "must be an integer");
  check("[5, 0, 0, 0]", "expected a JSON object");
  check("{\"tokens\": 5, \"images\": 0, \"crops\": 0, \"supervised\": 9}", "exceeds tokens");
  // Shapes no sample has: 100,000 crops in 100 tokens, more images than crops, crops without
  // an image.
  check("{\"tokens\": 100, \"images\": 1, \"crops\": 100000, \"supervised\": 1}",
        "100000 crops in 100 tokens");
  check("{\"tokens\": 900, \"images\": 3, \"crops\": 2, \"supervised\": 1}",
        "2 crops for 3 images");
  check("{\"tokens\": 900, \"images\": 0, \"crops\": 2, \"supervised\": 1}",
        "2 crops for 0 images");
  // nlohmann's out_of_range, which escaped as an internal error
  // (fuzz/corpus/length_stream/number_past_double).
  check("{\"tokens\": 91e30877, \"images\": 0, \"crops\": 0, \"supervised\": 0}", "bad JSON");
  // Printing the value in the message would recurse once per level.
  check(std::string(30000, '[') + std::string(30000, ']'), "nested deeper than 64");
}

TEST_CASE("length stream: a line without an end (an endless stream) is refused, not read") {
  vlm::test::TempDir dir;
  const auto path = vlm::test::write_file(
      dir / "s.jsonl", "{\"tokens\": 5, \"images\": 0, \"crops\": 0, \"supervised\": 1}\n" +
                           std::string(kMaxLengthLineBytes + 1, '0'));
  const std::string message = error_of(path);
  INFO(message);
  REQUIRE(message.find(path + ":2: line longer than 64 KiB") == 0);
  // A last line without a newline is read.
  const auto last = vlm::test::write_file(
      dir / "t.jsonl", "{\"tokens\": 5, \"images\": 0, \"crops\": 0, \"supervised\": 1}");
  REQUIRE(read_length_stream(last).size() == 1);
}

TEST_CASE("length stream: a source without a single sample is a DataError naming the file") {
  vlm::test::TempDir dir;
  for (const std::string text : {"", "\n\n"}) {
    const auto path = vlm::test::write_file(dir / "empty.jsonl", text);
    LengthSource source(path);
    try {
      source.next();
      FAIL("an empty stream gave no error");
    } catch (const vlm::DataError& e) {
      CHECK(std::string(e.what()).find(path) == 0);
      CHECK(std::string(e.what()).find("no sample in the length stream") != std::string::npos);
    }
  }
  // The end of a stream that had samples is just its end.
  const auto one = vlm::test::write_file(
      dir / "one.jsonl", "{\"tokens\": 5, \"images\": 0, \"crops\": 0, \"supervised\": 1}\n");
  LengthSource source(one);
  CHECK(source.next());
  CHECK_FALSE(source.next());
  CHECK_FALSE(source.next());
}

TEST_CASE("length stream: a missing file is a DataError naming it") {
  const std::string message = error_of("/nonexistent/stream.jsonl");
  REQUIRE(message.find("/nonexistent/stream.jsonl") != std::string::npos);
}
