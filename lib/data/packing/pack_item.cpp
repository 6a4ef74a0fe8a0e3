#include "data/packing/pack_item.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace vlm::data {

bool operator==(const PackItem& a, const PackItem& b) {
  return a.sample_id == b.sample_id && a.tokens == b.tokens && a.images == b.images &&
         a.crops == b.crops && a.supervised == b.supervised;
}

void Pack::add(const PackItem& item) {
  items.push_back(item);
  tokens += item.tokens;
  images += item.images;
  crops += item.crops;
  supervised += item.supervised;
}

bool operator==(const Pack& a, const Pack& b) { return a.items == b.items; }

void to_json(nlohmann::json& j, const PackItem& item) {
  j = nlohmann::json::array(
      {item.sample_id, item.tokens, item.images, item.crops, item.supervised});
}

namespace {

// A saved count: a JSON integer in [0, 2^63). get<int64_t>() alone would wrap a larger
// unsigned to a negative number and cast a float (1e300) with undefined behaviour.
int64_t count_field(const nlohmann::json& j, size_t index, const char* name) {
  const nlohmann::json& value = j.at(index);
  const bool ok = value.is_number_unsigned()
                      ? value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                      : value.is_number_integer() && value.get<int64_t>() >= 0;
  if (!ok) {
    throw std::invalid_argument(std::string("a saved sample's ") + name + " is " + value.dump() +
                                ", expected an integer >= 0");
  }
  return value.get<int64_t>();
}

}  // namespace

void from_json(const nlohmann::json& j, PackItem& item) {
  if (!j.is_array() || j.size() != 5) {
    throw std::invalid_argument(
        "a saved sample is not [sample_id, tokens, images, crops, supervised]");
  }
  item.sample_id = static_cast<uint64_t>(count_field(j, 0, "sample_id"));
  item.tokens = count_field(j, 1, "tokens");
  item.images = count_field(j, 2, "images");
  item.crops = count_field(j, 3, "crops");
  item.supervised = count_field(j, 4, "supervised");
  if (item.supervised > item.tokens) {
    throw std::invalid_argument("saved sample " + std::to_string(item.sample_id) + " has " +
                                std::to_string(item.supervised) + " supervised tokens of " +
                                std::to_string(item.tokens));
  }
}

void to_json(nlohmann::json& j, const Pack& pack) { j = pack.items; }

void from_json(const nlohmann::json& j, Pack& pack) {
  pack = Pack{};
  if (!j.is_array()) throw std::invalid_argument("a saved pack is not an array of samples");
  for (const auto& value : j) {
    const PackItem item = value.get<PackItem>();
    // Totals are recomputed here: they cannot disagree with the items, but must not overflow.
    if (item.tokens > INT64_MAX - pack.tokens || item.images > INT64_MAX - pack.images ||
        item.crops > INT64_MAX - pack.crops) {
      throw std::invalid_argument("a saved pack's totals overflow");
    }
    pack.add(item);
  }
}

}  // namespace vlm::data
