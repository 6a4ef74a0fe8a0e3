// Tests that hold on one LibTorch version only say so by name and by tag, both or neither:
// a name ending in " (LibTorch 1.13)" carries the tag [libtorch1.13], and the other way round.
// The tag keeps such a test out of a 2.x build's CTest (tests/CMakeLists.txt); the name is what
// scripts/test-libtorch-1.13.sh selects in the 1.13 build. One without the other would be a
// test that runs nowhere, or one that fails on 2.x.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

const std::string kSuffix = " (LibTorch 1.13)";
const std::string kTag = "[libtorch1.13]";

struct Declared {
  std::string file;
  int line = 0;
  std::string name, tags;
};

// Reads the adjacent string literals at `at` (skipping white space), concatenated; moves `at`
// past them. Empty when none is there.
std::string string_literals(const std::string& text, size_t& at) {
  std::string out;
  for (;;) {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
    if (at >= text.size() || text[at] != '"') return out;
    for (++at; at < text.size() && text[at] != '"'; ++at) {
      if (text[at] == '\\' && at + 1 < text.size()) ++at;
      out += text[at];
    }
    ++at;  // the closing quote
  }
}

// Every TEST_CASE / CATCH_TEST_CASE of a file: its name and its tags.
std::vector<Declared> test_cases_of(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<Declared> out;
  const std::string macro = "TEST_CASE(";
  for (size_t at = text.find(macro); at != std::string::npos; at = text.find(macro, at)) {
    size_t start = at;
    if (start >= 6 && text.compare(start - 6, 6, "CATCH_") == 0) start -= 6;
    const bool own_word =
        start == 0 ||
        !(std::isalnum(static_cast<unsigned char>(text[start - 1])) || text[start - 1] == '_');
    at += macro.size();
    if (!own_word) continue;
    Declared d;
    d.file = file.filename().string();
    d.line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + start, '\n'));
    d.name = string_literals(text, at);
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
    if (at < text.size() && text[at] == ',') {
      ++at;
      d.tags = string_literals(text, at);
    }
    if (!d.name.empty()) out.push_back(d);
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

TEST_CASE("tests that hold on LibTorch 1.13 only say so by name and by tag, both or neither") {
  const fs::path tests = vlm::test::source_dir() / "tests";
  int declared = 0, version_specific = 0;
  for (const auto& entry : fs::recursive_directory_iterator(tests)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".cpp") continue;
    if (entry.path().filename() == "test_version_tags.cpp") continue;  // its own strings
    for (const Declared& d : test_cases_of(entry.path())) {
      ++declared;
      const bool named = ends_with(d.name, kSuffix);
      const bool tagged = d.tags.find(kTag) != std::string::npos;
      INFO(d.file << ":" << d.line << ": \"" << d.name << "\" tags \"" << d.tags << "\"");
      CHECK(named == tagged);
      version_specific += named && tagged;
    }
  }
  // The scan read the suite: a parser that found nothing would pass vacuously.
  CHECK(declared > 300);
  INFO(version_specific << " tests hold on LibTorch 1.13 only");
}

TEST_CASE("the test-case scanner reads names split over lines and their tags") {
  TempDir dir("version-tags");
  const fs::path file = dir / "sample.cpp";
  std::ofstream(file) << "CATCH_TEST_CASE(\"a split \"\n    \"name (LibTorch 1.13)\",\n"
                         "                \"[x][libtorch1.13]\") {}\n"
                         "TEST_CASE(\"plain \\\"quoted\\\"\") {}\n"
                         "MY_TEST_CASE(\"not one\") {}\n";
  const auto found = test_cases_of(file);
  REQUIRE(found.size() == 2);
  CHECK(found[0].name == "a split name (LibTorch 1.13)");
  CHECK(found[0].tags == "[x][libtorch1.13]");
  CHECK(found[0].line == 1);
  CHECK(found[1].name == "plain \"quoted\"");
  CHECK(found[1].tags.empty());
  CHECK(found[1].line == 4);
}
