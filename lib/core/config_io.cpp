#include "core/config_io.h"
#include "core/hash.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include "core/config_visitors.h"
#include "core/strings.h"

namespace vlm {
namespace {

using config_detail::JsonWriter;
using config_detail::SchemaLister;
using config_detail::Source;
using config_detail::YamlReader;
using config_detail::YamlWriter;

constexpr int64_t kMaxConfigBytes = 4 << 20;
// A config has a few hundred nodes; a document that expands to more is an alias bomb
// ("billion laughs") or not a config at all. yaml-cpp shares aliased nodes, so the bomb only
// explodes when walked: we walk with a budget before reading anything.
constexpr int64_t kMaxNodes = 100000;
constexpr int kMaxFlowDepth = 64;

std::string read_config_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ConfigError("config file not found", SourceLocation{path});
  if (fs::is_directory(path, ec)) {
    throw ConfigError("is a directory, expected a YAML file", SourceLocation{path});
  }
  const auto size = fs::file_size(path, ec);
  if (ec) throw ConfigError("cannot read: " + ec.message(), SourceLocation{path});
  if (size > static_cast<uintmax_t>(kMaxConfigBytes)) {
    throw ConfigError("file is " + std::to_string(size) + " bytes; a config is at most 4 MiB",
                      SourceLocation{path});
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot open for reading", SourceLocation{path});
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The offset of the first byte that does not begin a well-formed UTF-8 sequence (Unicode 15,
// table 3-7: no overlong forms, surrogates or code points past U+10FFFF), or npos.
size_t first_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t continuation = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) {
      continuation = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      continuation = 2;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      continuation = 3;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else {
      return i;
    }
    if (text.size() - i <= continuation) return i;
    for (size_t k = 1; k <= continuation; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if (b < (k == 1 ? low : 0x80) || b > (k == 1 ? high : 0xBF)) return i;
    }
    i += continuation + 1;
  }
  return std::string_view::npos;
}

// YAML text is Unicode; a string that is not UTF-8 could not even be printed or hashed as JSON
// (config --json, the config hash of every run).
void reject_invalid_utf8(const std::string& text, const Source& source) {
  const size_t bad = first_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  SourceLocation where{source.name};
  if (source.has_lines) {
    const auto end = text.begin() + static_cast<std::ptrdiff_t>(bad);
    where.line = 1 + std::count(text.begin(), end, '\n');
    const size_t newline = bad == 0 ? std::string::npos : text.rfind('\n', bad - 1);
    const size_t line_start = newline == std::string::npos ? 0 : newline + 1;
    where.column = static_cast<int64_t>(bad - line_start) + 1;
  }
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[bad]));
  throw ConfigError(std::string("not valid UTF-8 (byte ") + byte + "); YAML text must be UTF-8",
                    where);
}

// YAML forbids tabs in indentation; yaml-cpp's own message for them is cryptic.
void reject_tab_indentation(const std::string& text, const std::string& name) {
  int64_t line = 1;
  bool at_line_start = true;
  int64_t column = 0;
  for (const char c : text) {
    if (c == '\n') {
      ++line;
      at_line_start = true;
      column = 0;
      continue;
    }
    ++column;
    if (!at_line_start) continue;
    if (c == '\t') {
      throw ConfigError("tab character in indentation; YAML indents with spaces only",
                        SourceLocation{name, line, column});
    }
    if (c != ' ') at_line_start = false;
  }
}

// yaml-cpp parses flow collections recursively; bound the nesting so a hostile file cannot
// overflow the stack.
void reject_deep_nesting(const std::string& text, const std::string& name) {
  int depth = 0;
  int64_t line = 1;
  for (const char c : text) {
    if (c == '\n') ++line;
    if (c == '[' || c == '{') {
      if (++depth > kMaxFlowDepth) {
        throw ConfigError("nesting deeper than " + std::to_string(kMaxFlowDepth) + " levels",
                          SourceLocation{name, line});
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

// Walks the whole document, with a budget of nodes and of depth, before anything reads it.
// The depth limit also stops an alias that refers to its own anchor (`a: &x [*x]`): yaml-cpp
// makes that a node that contains itself, and every walk of it recurses until the stack ends.
void walk_with_budget(const YAML::Node& node, int64_t& budget, int depth, const Source& source) {
  if (--budget < 0) {
    throw ConfigError("document expands to more than " + std::to_string(kMaxNodes) +
                          " nodes (YAML alias/anchor bomb?)",
                      source.at(node));
  }
  if (depth > kMaxFlowDepth) {
    throw ConfigError("nesting deeper than " + std::to_string(kMaxFlowDepth) +
                          " levels (an alias that refers to its own anchor?)",
                      source.at(node));
  }
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      walk_with_budget(it->first, budget, depth + 1, source);
      walk_with_budget(it->second, budget, depth + 1, source);
    }
  } else if (node.IsSequence()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      walk_with_budget(*it, budget, depth + 1, source);
    }
  }
}

SourceLocation location_of(const Source& source, const YAML::Mark& mark) {
  SourceLocation where{source.name};
  if (source.has_lines && mark.line >= 0) {
    where.line = mark.line + 1;
    where.column = mark.column + 1;
  }
  return where;
}

// Where each document of a YAML stream starts; builds no nodes.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;

  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// A config is one YAML document: yaml-cpp's Load would keep the first of several and drop the
// rest without a word. The documents are counted here, two at most, instead of with LoadAll:
// yaml-cpp 0.7's LoadAll never returns on a stream with a token that cannot start a value at
// the top level (a lone ',', jbeder/yaml-cpp#1040): its parser reports an empty document
// without consuming that token, again and again, growing the list each time. Such a stream
// starts its second document where the first started.
void require_one_document(const std::string& text, const Source& source) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts documents;
  while (documents.starts.size() < 2 && parser.HandleNextDocument(documents)) {
  }
  if (documents.starts.size() < 2) return;
  const YAML::Mark& first = documents.starts[0];
  const YAML::Mark& second = documents.starts[1];
  if (second.pos == first.pos) {
    throw ConfigError(
        "invalid YAML: a character that cannot start a value here (a stray ',', "
        "']' or '}'?)",
        location_of(source, first));
  }
  throw ConfigError(
      "the text holds more than one YAML document (separated by '---'); a config "
      "is one document",
      location_of(source, second));
}

YAML::Node parse_yaml(const std::string& text, const Source& source) {
  reject_invalid_utf8(text, source);
  reject_tab_indentation(text, source.name);
  reject_deep_nesting(text, source.name);
  YAML::Node root;
  try {
    require_one_document(text, source);
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    SourceLocation where{source.name};
    if (source.has_lines && e.mark.line >= 0) {
      where.line = e.mark.line + 1;
      where.column = e.mark.column + 1;
    }
    throw ConfigError("invalid YAML: " + e.msg, where);
  }
  int64_t budget = kMaxNodes;
  walk_with_budget(root, budget, 0, source);
  return root;
}

void read_document(const YAML::Node& root, const Source& source, LoadedConfig& loaded) {
  if (!root.IsMap()) {
    throw ConfigError("the top level must be a mapping of sections (model:, data:, train:, ...)",
                      source.at(root));
  }
  YamlReader reader(root, "", source, loaded);
  visit_fields(reader, loaded.config);
  reader.finish();
}

// "train.lr.vision=1e-4" -> {train: {lr: {vision: 1e-4}}}
YAML::Node override_document(const std::string& assignment, const Source& source) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("expected KEY=VALUE such as train.batch_size=8", SourceLocation{source.name});
  }
  const std::string key = trim(assignment.substr(0, eq));
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) {
      throw ConfigError("malformed key '" + key + "'", SourceLocation{source.name});
    }
    parts.push_back(part);
  }
  YAML::Node value = parse_yaml(assignment.substr(eq + 1), source);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node parent(YAML::NodeType::Map);
    parent[*it] = value;
    value = parent;
  }
  return value;
}

}  // namespace

SourceLocation LoadedConfig::where(const std::string& key) const {
  const auto it = locations.find(key);
  if (it != locations.end()) return it->second;
  return SourceLocation{source.empty() ? "defaults" : source};
}

LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  LoadedConfig loaded;
  loaded.source = path;
  if (!path.empty()) {
    const Source source{path, true};
    const std::string text = read_config_text(path);
    const YAML::Node root = parse_yaml(text, source);
    if (root.IsNull()) throw ConfigError("config file is empty", SourceLocation{path});
    read_document(root, source, loaded);
  }
  for (const auto& assignment : overrides) {
    const Source source{"--set " + assignment, false};
    read_document(override_document(assignment, source), source, loaded);
  }
  validate_config(loaded);
  return loaded;
}

std::string to_yaml(const Config& config, bool with_docs) {
  std::string out;
  YamlWriter writer(out, 0, with_docs);
  visit_fields(writer, const_cast<Config&>(config));  // writers only read
  return out;
}

nlohmann::json to_json(const Config& config) {
  nlohmann::json out = nlohmann::json::object();
  JsonWriter writer(out);
  visit_fields(writer, const_cast<Config&>(config));  // writers only read
  return out;
}

std::string config_hash(const Config& config) {
  // FNV-1a 64 over the canonical JSON text: stable across runs and machines.
  return hex64(fnv1a64(to_json(config).dump()));
}

std::vector<SchemaEntry> config_schema() {
  std::vector<SchemaEntry> entries;
  Config defaults;
  SchemaLister lister(entries, "");
  visit_fields(lister, defaults);
  return entries;
}

}  // namespace vlm
