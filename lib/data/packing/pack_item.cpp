#include "data/packing/pack_item.h"

#include <nlohmann/json.hpp>

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

void from_json(const nlohmann::json& j, PackItem& item) {
  item.sample_id = j.at(0).get<uint64_t>();
  item.tokens = j.at(1).get<int64_t>();
  item.images = j.at(2).get<int64_t>();
  item.crops = j.at(3).get<int64_t>();
  item.supervised = j.at(4).get<int64_t>();
}

void to_json(nlohmann::json& j, const Pack& pack) { j = pack.items; }

void from_json(const nlohmann::json& j, Pack& pack) {
  pack = Pack{};
  for (const auto& item : j) pack.add(item.get<PackItem>());
}

}  // namespace vlm::data
