#include "data/source/length_stream.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"

namespace vlm::data {

namespace {

bool is_blank(std::string_view text) {
  return text.find_first_not_of(" \t\r") == std::string_view::npos;
}

int64_t read_count(const nlohmann::json& object, const char* key, const SourceLocation& where) {
  auto it = object.find(key);
  if (it == object.end()) {
    throw DataError(std::string("missing field \"") + key +
                        "\"; each line needs tokens, images, crops and supervised",
                    where);
  }
  if (!it->is_number_integer()) {
    throw DataError(std::string("field \"") + key + "\" must be an integer, got " + it->dump(),
                    where);
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) {
    throw DataError(std::string("field \"") + key + "\" is too large: " + it->dump(), where);
  }
  const int64_t value = it->get<int64_t>();
  if (value < 0) {
    throw DataError(std::string("field \"") + key + "\" must be >= 0, got " + it->dump(), where);
  }
  return value;
}

}  // namespace

PackItem parse_length_line(std::string_view text, uint64_t sample_id, const std::string& path,
                           int64_t line) {
  const SourceLocation where{path, line};
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    throw DataError("JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                        " levels; a line is one flat object",
                    where);
  }
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error; out_of_range: a number past double
    throw DataError(std::string("bad JSON: ") + e.what(), where);
  }
  if (!object.is_object()) {
    throw DataError(
        "expected a JSON object like {\"tokens\": 977, \"images\": 1, \"crops\": 13, "
        "\"supervised\": 52}, got " +
            object.dump().substr(0, 80),
        where);
  }
  PackItem item;
  item.sample_id = sample_id;
  item.tokens = read_count(object, "tokens", where);
  item.images = read_count(object, "images", where);
  item.crops = read_count(object, "crops", where);
  item.supervised = read_count(object, "supervised", where);
  if (item.supervised > item.tokens) {
    throw DataError("supervised (" + std::to_string(item.supervised) + ") exceeds tokens (" +
                        std::to_string(item.tokens) + ")",
                    where);
  }
  // Every image has a crop at least, every crop a token at least among the sample's tokens.
  if (item.crops < item.images || (item.images == 0 && item.crops > 0)) {
    throw DataError(std::to_string(item.crops) + " crops for " + std::to_string(item.images) +
                        " images: every image has at least one crop, and crops need an image",
                    where);
  }
  if (item.crops > item.tokens) {
    throw DataError(std::to_string(item.crops) + " crops in " + std::to_string(item.tokens) +
                        " tokens: every crop takes image tokens among the sample's tokens",
                    where);
  }
  return item;
}

LengthStreamReader::LengthStreamReader(std::string path) : path_(std::move(path)), in_(path_) {
  if (!in_) throw DataError("cannot open length stream '" + path_ + "'; check the path");
}

bool LengthStreamReader::read_line(std::string& text) {
  text.clear();
  for (char c; in_.get(c);) {
    if (c == '\n') return true;
    if (text.size() == kMaxLengthLineBytes) {
      throw DataError("line longer than " + std::to_string(kMaxLengthLineBytes / 1024) +
                          " KiB; a length stream has one short JSON object per line",
                      SourceLocation{path_, line_ + 1});
    }
    text.push_back(c);
  }
  return !text.empty();
}

std::optional<PackItem> LengthStreamReader::next() {
  std::string text;
  while (read_line(text)) {
    ++line_;
    if (is_blank(text)) continue;
    return parse_length_line(text, samples_++, path_, line_);
  }
  if (in_.bad()) throw DataError("read error in length stream", SourceLocation{path_, line_});
  return std::nullopt;
}

std::vector<PackItem> read_length_stream(const std::string& path) {
  LengthStreamReader reader(path);
  std::vector<PackItem> items;
  while (auto item = reader.next()) items.push_back(*item);
  return items;
}

}  // namespace vlm::data
