// The architecture as documented is the architecture as built:
//  * every header under lib/ is named in docs/architecture.md (the map of lib/);
//  * each layer includes only itself and the layers below it, and the torch-free layers
//    (spec, core, data, memory, sampler, estimate, report) include no torch, ATen, c10 or caffe2
//    header;
//  * every document a source file under lib/ or apps/ cites exists in the repository.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

// What each layer may include (itself included), bottom-up.
const std::map<std::string, std::set<std::string>>& allowed_includes() {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"spec", {"spec"}},
      {"core", {"core", "spec"}},
      {"data", {"data", "core", "spec"}},
      {"memory", {"memory", "core", "spec"}},
      {"sampler", {"sampler", "memory", "data", "core", "spec"}},
      {"estimate", {"estimate", "sampler", "memory", "data", "core", "spec"}},
      {"report", {"report", "core", "spec"}},
      {"runtime", {"runtime", "core", "spec"}},
      {"model", {"model", "runtime", "data", "core", "spec"}},
      {"train",
       {"train", "model", "runtime", "data", "memory", "sampler", "estimate", "report", "core",
        "spec"}},
  };
  return allowed;
}

const std::set<std::string> kTorchFree = {"spec",    "core",     "data",  "memory",
                                          "sampler", "estimate", "report"};

bool is_source(const fs::path& p) {
  const auto ext = p.extension().string();
  return ext == ".h" || ext == ".cpp" || p.filename().string().find(".h.in") != std::string::npos;
}

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && is_source(entry.path())) out.push_back(entry.path());
  }
  return out;
}

// True when `name` occurs in `text` not preceded by a character of a file name, so that
// "types.h" is not found inside "image_types.h".
bool names_file(const std::string& text, const std::string& name) {
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const char before = at == 0 ? ' ' : text[at - 1];
    if (!(std::isalnum(static_cast<unsigned char>(before)) || before == '_')) return true;
  }
  return false;
}

// The include directives of a file: (line number, what is included, <> or "").
struct Include {
  int line;
  std::string target;
  bool angled;
};

std::vector<Include> includes_of(const fs::path& file) {
  static const std::regex directive(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  std::vector<Include> out;
  std::ifstream in(file);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    std::smatch m;
    if (std::regex_search(line, m, directive)) out.push_back({number, m[2], m[1] == "<"});
  }
  return out;
}

std::string layer_of(const fs::path& file, const fs::path& lib) {
  return fs::relative(file, lib).begin()->string();
}

}  // namespace

TEST_CASE("architecture: every header under lib/ is named in docs/architecture.md") {
  const fs::path root = vlm::test::source_dir();
  const std::string map = vlm::test::read_file(root / "docs/architecture.md");
  int headers = 0;
  for (const auto& file : files_under(root / "lib")) {
    const std::string name = file.filename().string();
    if (file.extension() != ".h" && name.find(".h.in") == std::string::npos) continue;
    ++headers;
    INFO("lib/" << fs::relative(file, root / "lib").string()
                << " is not named in docs/architecture.md: add a line for it");
    CHECK(names_file(map, name));
  }
  CHECK(headers > 50);  // the walk found the tree
}

TEST_CASE("architecture: each layer includes only itself and the layers below it") {
  const fs::path lib = vlm::test::source_dir() / "lib";
  const std::regex torch_header(R"(^(torch|ATen|c10|caffe2)/)");
  int checked = 0;
  for (const auto& file : files_under(lib)) {
    const std::string layer = layer_of(file, lib);
    REQUIRE(allowed_includes().count(layer) == 1);  // a new layer needs a line above
    const auto& allowed = allowed_includes().at(layer);
    for (const auto& inc : includes_of(file)) {
      const std::string where = fs::relative(file, lib.parent_path()).string() + ":" +
                                std::to_string(inc.line) + ": #include " + inc.target;
      INFO(where);
      if (kTorchFree.count(layer)) CHECK_FALSE(std::regex_search(inc.target, torch_header));
      const auto slash = inc.target.find('/');
      if (inc.angled || slash == std::string::npos) continue;
      const std::string target_layer = inc.target.substr(0, slash);
      if (allowed_includes().count(target_layer)) {
        CHECK(allowed.count(target_layer) == 1);
        ++checked;
      }
    }
  }
  CHECK(checked > 100);
}

TEST_CASE("architecture: documents cited in lib/ and apps/ exist in the repository") {
  const fs::path root = vlm::test::source_dir();
  const std::regex cited(R"(([A-Za-z0-9_./-]+)\.md\b)");
  std::vector<fs::path> files = files_under(root / "lib");
  for (const auto& f : files_under(root / "apps")) files.push_back(f);
  int citations = 0;
  for (const auto& file : files) {
    const std::string text = vlm::test::read_file(file);
    INFO(fs::relative(file, root).string());
    CHECK(text.find("DESIGN") == std::string::npos);  // the outside brief is not in the repo
    for (std::sregex_iterator it(text.begin(), text.end(), cited), end; it != end; ++it) {
      const std::string doc = (*it)[1].str() + ".md";
      INFO("cites " << doc);
      CHECK((fs::exists(root / doc) || fs::exists(root / "docs" / doc)));
      ++citations;
    }
  }
  CHECK(citations > 3);
}
