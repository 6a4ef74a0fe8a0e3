#include "core/config_visitors.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/strings.h"
#include "core/units.h"

namespace vlm::config_detail {

SourceLocation Source::at(const YAML::Node& node) const {
  if (!has_lines) return SourceLocation{name, 0, 0};
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0) return SourceLocation{name, 0, 0};
  return SourceLocation{name, mark.line + 1, mark.column + 1};
}

// ---- YamlReader ------------------------------------------------------------------------

YamlReader::YamlReader(const YAML::Node& map, std::string prefix, const Source& source,
                       LoadedConfig& out)
    : prefix_(std::move(prefix)), source_(source), out_(out) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) {
      throw ConfigError("keys must be plain names, found a " +
                            std::string(it->first.IsMap() ? "mapping" : "list") + " as a key",
                        source_.at(it->first));
    }
    const std::string key = it->first.Scalar();
    for (const auto& e : entries_) {
      if (e.key == key) {
        throw ConfigError("duplicate key '" + prefix_ + key + "' (first at line " +
                              std::to_string(e.key_node.Mark().line + 1) + ")",
                          source_.at(it->first));
      }
    }
    entries_.push_back(Entry{key, it->first, it->second, false});
  }
}

const YAML::Node* YamlReader::take(const char* key) {
  for (auto& e : entries_) {
    if (e.key == key) {
      e.used = true;
      return &e.value;
    }
  }
  return nullptr;
}

void YamlReader::fail(const YAML::Node& node, const char* key, const std::string& what) const {
  throw ConfigError(prefix_ + key + ": " + what, source_.at(node));
}

void YamlReader::record(const char* key, const YAML::Node& node) {
  out_.locations[path(key)] = source_.at(node);
}

const YAML::Node* YamlReader::find(const char* key) {
  declared_.push_back(key);
  const YAML::Node* node = take(key);
  if (node) record(key, *node);
  return node;
}

const YAML::Node* YamlReader::scalar(const char* key, const char* expected) {
  const YAML::Node* node = find(key);
  if (node && !node->IsScalar()) {
    fail(*node, key,
         std::string("expected ") + expected + ", got a " +
             (node->IsMap()        ? "mapping"
              : node->IsSequence() ? "list"
                                   : "null value"));
  }
  return node;
}

namespace {

std::optional<int64_t> parse_int(const std::string& text) {
  std::string_view s = text;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t value = 0;
  const auto result = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || result.ec != std::errc() || result.ptr != s.data() + s.size()) {
    return std::nullopt;
  }
  return value;
}

std::optional<double> parse_real(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end != begin + text.size() || std::isnan(value)) return std::nullopt;
  return value;
}

std::optional<bool> parse_bool(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (text == "true" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "no" || text == "off") return false;
  return std::nullopt;
}

std::string shown(const std::string& text) {
  return "'" + (text.size() > 60 ? text.substr(0, 57) + "..." : text) + "'";
}

bool in_range(double v, const RealRange& r) {
  return (r.min_exclusive ? v > r.min : v >= r.min) && v <= r.max;
}

}  // namespace

void YamlReader::field(int64_t& value, const char* key, const char*, const IntRange& range) {
  const std::string expected =
      range.zero_word ? std::string("an integer or ") + range.zero_word : "an integer";
  const YAML::Node* node = scalar(key, expected.c_str());
  if (!node) return;
  if (range.zero_word && node->Scalar() == range.zero_word) {
    value = 0;
    return;
  }
  const auto parsed = parse_int(node->Scalar());
  if (!parsed) {
    fail(*node, key,
         std::string("expected an integer") +
             (range.zero_word ? std::string(" or ") + range.zero_word : "") + ", got " +
             shown(node->Scalar()));
  }
  if (*parsed < range.min || *parsed > range.max) {
    fail(*node, key, std::to_string(*parsed) + " is out of range: allowed " + describe(range));
  }
  value = *parsed;
}

void YamlReader::field(double& value, const char* key, const char*, const RealRange& range) {
  const YAML::Node* node = scalar(key, "a number");
  if (!node) return;
  const auto parsed = parse_real(node->Scalar());
  if (!parsed) fail(*node, key, "expected a number, got " + shown(node->Scalar()));
  if (!in_range(*parsed, range)) {
    fail(*node, key, node->Scalar() + " is out of range: allowed " + describe(range));
  }
  value = *parsed;
}

void YamlReader::field(bool& value, const char* key, const char*, NoConstraint) {
  const YAML::Node* node = scalar(key, "true or false");
  if (!node) return;
  const auto parsed = parse_bool(node->Scalar());
  if (!parsed) fail(*node, key, "expected true or false, got " + shown(node->Scalar()));
  value = *parsed;
}

void YamlReader::field(std::string& value, const char* key, const char*, NoConstraint) {
  const YAML::Node* node = find(key);
  if (!node) return;
  if (node->IsNull()) {  // `weights:` with nothing after it means "none"
    value.clear();
    return;
  }
  if (!node->IsScalar()) fail(*node, key, "expected a string");
  value = node->Scalar();
}

void YamlReader::field(std::string& value, const char* key, const char*, const Choices& choices) {
  const YAML::Node* node = scalar(key, "a string");
  if (!node) return;
  const std::string text = node->Scalar();
  if (std::find(choices.values.begin(), choices.values.end(), text) == choices.values.end()) {
    const std::string near = closest_match(text, choices.values);
    fail(*node, key,
         shown(text) + " is not allowed: " + describe(choices) +
             (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  }
  value = text;
}

void YamlReader::field(ByteSize& value, const char* key, const char*, NoConstraint) {
  const YAML::Node* node = scalar(key, "a byte size");
  if (!node) return;
  const auto parsed = parse_bytes(node->Scalar());
  if (!parsed) {
    fail(*node, key,
         "expected a byte size such as 0, 1073741824, \"512MiB\" or \"80GiB\", got " +
             shown(node->Scalar()));
  }
  value.bytes = *parsed;
}

void YamlReader::field(std::vector<double>& value, const char* key, const char*,
                       const RealRange& range) {
  const YAML::Node* node = find(key);
  if (!node) return;
  if (!node->IsSequence()) fail(*node, key, "expected a list of numbers such as [0.5, 0.5, 0.5]");
  std::vector<double> parsed;
  for (size_t i = 0; i < node->size(); ++i) {
    const YAML::Node element = (*node)[i];
    const auto v = element.IsScalar() ? parse_real(element.Scalar()) : std::nullopt;
    if (!v) fail(element, key, "element " + std::to_string(i) + " is not a number");
    if (!in_range(*v, range)) {
      fail(element, key,
           "element " + std::to_string(i) + " = " + element.Scalar() +
               " is out of range: allowed " + describe(range));
    }
    parsed.push_back(*v);
  }
  value = std::move(parsed);
}

void YamlReader::before_section(ModelConfig& model, const YAML::Node& node) {
  // A preset sets every dimension; the same source's explicit dims then apply on top.
  const YAML::Node preset = node["preset"];
  if (!preset || !preset.IsScalar()) return;
  const auto& names = spec::preset_names();
  if (std::find(names.begin(), names.end(), preset.Scalar()) == names.end())
    return;  // reported by field()
  model.dims = spec::preset(preset.Scalar());
}

void YamlReader::finish() {
  for (const auto& e : entries_) {
    if (e.used) continue;
    const std::string near = closest_match(e.key, declared_);
    std::string message = "unknown key '" + prefix_ + e.key + "'";
    if (!near.empty()) {
      message += " (did you mean '" + prefix_ + near + "'?)";
    } else {
      message += "; valid keys here: " + join(declared_, ", ");
    }
    throw ConfigError(message, source_.at(e.key_node));
  }
}

// ---- YamlWriter ------------------------------------------------------------------------

std::string YamlWriter::render(double v) { return format_real(v); }

std::string YamlWriter::render(const std::string& v) { return double_quoted(v); }

std::string YamlWriter::render(const std::vector<double>& v) {
  std::vector<std::string> parts;
  for (double x : v) parts.push_back(format_real(x));
  return "[" + join(parts, ", ") + "]";
}

void YamlWriter::comment(const char* doc) {
  if (with_docs_ && doc && *doc) out_ += std::string(indent_, ' ') + "# " + doc + "\n";
}

void YamlWriter::line(const char* key, const std::string& value, const char* doc) {
  comment(doc);
  out_ += std::string(indent_, ' ') + key + ": " + value + "\n";
}

// ---- SchemaLister ----------------------------------------------------------------------

void SchemaLister::add(const char* key, const char* type, std::string value, std::string allowed,
                       const char* doc) {
  out_.push_back({prefix_ + key, type, std::move(value), std::move(allowed), doc});
}

void SchemaLister::field(const int64_t& v, const char* key, const char* doc, const IntRange& r) {
  add(key, "int", r.zero_word && v == 0 ? r.zero_word : std::to_string(v), describe(r), doc);
}
void SchemaLister::field(const double& v, const char* key, const char* doc, const RealRange& r) {
  add(key, "real", format_real(v), describe(r), doc);
}
void SchemaLister::field(const bool& v, const char* key, const char* doc, NoConstraint) {
  add(key, "bool", v ? "true" : "false", "", doc);
}
void SchemaLister::field(const std::string& v, const char* key, const char* doc, NoConstraint) {
  add(key, "string", double_quoted(v), "", doc);
}
void SchemaLister::field(const std::string& v, const char* key, const char* doc, const Choices& c) {
  add(key, "enum", double_quoted(v), describe(c), doc);
}
void SchemaLister::field(const ByteSize& v, const char* key, const char* doc, NoConstraint) {
  add(key, "bytes", std::to_string(v.bytes), "integer or \"512MiB\", \"80GiB\", ...", doc);
}
void SchemaLister::field(const std::vector<double>& v, const char* key, const char* doc,
                         const RealRange& r) {
  std::vector<std::string> parts;
  for (double x : v) parts.push_back(format_real(x));
  add(key, "list<real>", "[" + join(parts, ", ") + "]", describe(r), doc);
}

}  // namespace vlm::config_detail
