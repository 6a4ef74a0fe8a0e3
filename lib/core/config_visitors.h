// The visitors that walk the config declarations of core/config.h: YAML reader, YAML and
// JSON writers, and the schema lister. Internal to core (config_io.cpp and tests).
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "core/config.h"
#include "core/config_io.h"

namespace vlm::config_detail {

struct NoConstraint {};

// ---- reading ---------------------------------------------------------------------------

// Where values come from: a config file, or one --set override.
struct Source {
  std::string name;       // "configs/demo.yaml" or "--set train.batch_size=0"
  bool has_lines = true;  // overrides have no meaningful line numbers
  SourceLocation at(const YAML::Node& node) const;
};

class YamlReader {
 public:
  YamlReader(const YAML::Node& map, std::string prefix, const Source& source, LoadedConfig& out);

  void field(int64_t& value, const char* key, const char* doc, const IntRange& range = {});
  void field(double& value, const char* key, const char* doc, const RealRange& range = {});
  void field(bool& value, const char* key, const char* doc, NoConstraint = {});
  void field(std::string& value, const char* key, const char* doc, NoConstraint = {});
  void field(std::string& value, const char* key, const char* doc, const Choices& choices);
  void field(ByteSize& value, const char* key, const char* doc, NoConstraint = {});
  void field(std::vector<double>& value, const char* key, const char* doc, const RealRange& range);

  template <class S>
  void section(S& value, const char* key, const char* doc) {
    declared_.push_back(key);
    const YAML::Node* node = take(key);
    if (!node || node->IsNull()) return;
    if (!node->IsMap()) fail(*node, key, "expected a mapping of keys (a section)");
    before_section(value, *node);
    YamlReader child(*node, path(key) + ".", source_, out_);
    visit_fields(child, value);
    child.finish();
  }

  template <class S>
  void list(std::vector<S>& items, const char* key, const char* doc) {
    declared_.push_back(key);
    const YAML::Node* node = take(key);
    if (!node) return;
    items.clear();
    if (node->IsNull()) return;
    if (!node->IsSequence()) fail(*node, key, "expected a list");
    for (size_t i = 0; i < node->size(); ++i) {
      const YAML::Node element = (*node)[i];
      const std::string element_path = path(key) + "[" + std::to_string(i) + "]";
      if (!element.IsMap())
        fail(element, key, "list element " + std::to_string(i) + " must be a mapping");
      S item{};
      YamlReader child(element, element_path + ".", source_, out_);
      visit_fields(child, item);
      child.finish();
      items.push_back(std::move(item));
    }
  }

  // Rejects keys that no field declared, suggesting the closest declared one.
  void finish();

 private:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
    bool used = false;
  };

  const YAML::Node* take(const char* key);
  std::string path(const char* key) const { return prefix_ + key; }
  [[noreturn]] void fail(const YAML::Node& node, const char* key, const std::string& what) const;
  const YAML::Node* find(const char* key);  // declares `key`; the node if present
  const YAML::Node* scalar(const char* key, const char* expected);
  void record(const char* key, const YAML::Node& node);

  template <class S>
  void before_section(S&, const YAML::Node&) {}
  void before_section(ModelConfig& model, const YAML::Node& node);

  std::vector<Entry> entries_;
  std::vector<std::string> declared_;
  std::string prefix_;
  const Source& source_;
  LoadedConfig& out_;
};

// ---- writing ---------------------------------------------------------------------------

class YamlWriter {
 public:
  YamlWriter(std::string& out, int indent, bool with_docs)
      : out_(out), indent_(indent), with_docs_(with_docs) {}

  template <class T, class C = NoConstraint>
  void field(const T& value, const char* key, const char* doc, const C& constraint = {}) {
    if constexpr (std::is_same_v<C, IntRange>) {
      if (constraint.zero_word && value == 0) return line(key, constraint.zero_word, doc);
    }
    line(key, render(value), doc);
  }

  template <class S>
  void section(S& value, const char* key, const char* doc) {
    comment(doc);
    out_ += std::string(indent_, ' ') + key + ":\n";
    YamlWriter child(out_, indent_ + 2, with_docs_);
    visit_fields(child, value);
  }

  template <class S>
  void list(std::vector<S>& items, const char* key, const char* doc) {
    comment(doc);
    if (items.empty()) {
      out_ += std::string(indent_, ' ') + key + ": []\n";
      return;
    }
    out_ += std::string(indent_, ' ') + key + ":\n";
    for (auto& item : items) {
      std::string text;
      YamlWriter child(text, indent_ + 4, false);
      visit_fields(child, item);
      // The first line of each element carries the "- " marker.
      text.replace(static_cast<size_t>(indent_), 4, "  - ");
      out_ += text;
    }
  }

 private:
  static std::string render(int64_t v) { return std::to_string(v); }
  static std::string render(double v);
  static std::string render(bool v) { return v ? "true" : "false"; }
  static std::string render(const std::string& v);
  static std::string render(const ByteSize& v) { return std::to_string(v.bytes); }
  static std::string render(const std::vector<double>& v);
  void comment(const char* doc);
  void line(const char* key, const std::string& value, const char* doc);

  std::string& out_;
  int indent_;
  bool with_docs_;
};

class JsonWriter {
 public:
  explicit JsonWriter(nlohmann::json& out) : out_(out) {}

  template <class T, class C = NoConstraint>
  void field(const T& value, const char* key, const char*, const C& constraint = {}) {
    if constexpr (std::is_same_v<C, IntRange>) {
      if (constraint.zero_word && value == 0) {
        out_[key] = constraint.zero_word;
        return;
      }
    }
    if constexpr (std::is_same_v<T, ByteSize>) {
      out_[key] = value.bytes;
    } else {
      out_[key] = value;
    }
  }

  template <class S>
  void section(S& value, const char* key, const char*) {
    nlohmann::json child = nlohmann::json::object();
    JsonWriter writer(child);
    visit_fields(writer, value);
    out_[key] = std::move(child);
  }

  template <class S>
  void list(std::vector<S>& items, const char* key, const char*) {
    nlohmann::json array = nlohmann::json::array();
    for (auto& item : items) {
      nlohmann::json child = nlohmann::json::object();
      JsonWriter writer(child);
      visit_fields(writer, item);
      array.push_back(std::move(child));
    }
    out_[key] = std::move(array);
  }

 private:
  nlohmann::json& out_;
};

class SchemaLister {
 public:
  SchemaLister(std::vector<SchemaEntry>& out, std::string prefix)
      : out_(out), prefix_(std::move(prefix)) {}

  void field(const int64_t& v, const char* key, const char* doc, const IntRange& r = {});
  void field(const double& v, const char* key, const char* doc, const RealRange& r = {});
  void field(const bool& v, const char* key, const char* doc, NoConstraint = {});
  void field(const std::string& v, const char* key, const char* doc, NoConstraint = {});
  void field(const std::string& v, const char* key, const char* doc, const Choices& c);
  void field(const ByteSize& v, const char* key, const char* doc, NoConstraint = {});
  void field(const std::vector<double>& v, const char* key, const char* doc, const RealRange& r);

  template <class S>
  void section(S& value, const char* key, const char*) {
    SchemaLister child(out_, prefix_ + key + ".");
    visit_fields(child, value);
  }

  template <class S>
  void list(std::vector<S>&, const char* key, const char* doc) {
    out_.push_back({prefix_ + key, "list", "[]", "", doc});
    S item{};
    SchemaLister child(out_, prefix_ + key + "[].");
    visit_fields(child, item);
  }

 private:
  void add(const char* key, const char* type, std::string value, std::string allowed,
           const char* doc);
  std::vector<SchemaEntry>& out_;
  std::string prefix_;
};

}  // namespace vlm::config_detail
