#include "data/tokenizer/tokenizer_image_tokens.h"

#include "core/error.h"

namespace vlm::data {
namespace {

std::string tile_token(int64_t row, int64_t col) {
  return "<row_" + std::to_string(row) + "_col_" + std::to_string(col) + ">";
}

// Looks every name up with `id_of` and fills the ids in image_token_names() order.
template <typename IdOf>
ImageTokenIds collect(IdOf&& id_of) {
  ImageTokenIds ids;
  ids.image = id_of("<|image|>");
  ids.global_image = id_of("<|global_image|>");
  for (int64_t row = 0; row < kMaxImageGridSide; ++row) {
    for (int64_t col = 0; col < kMaxImageGridSide; ++col) {
      ids.tile[row][col] = id_of(tile_token(row + 1, col + 1));
    }
  }
  return ids;
}

}  // namespace

const std::vector<std::string>& image_token_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list = {"<|image|>", "<|global_image|>"};
    for (int64_t row = 1; row <= kMaxImageGridSide; ++row) {
      for (int64_t col = 1; col <= kMaxImageGridSide; ++col) list.push_back(tile_token(row, col));
    }
    return list;
  }();
  return names;
}

ImageTokenIds add_image_tokens(Tokenizer& tokenizer) {
  return collect([&](const std::string& name) { return tokenizer.add_special_token(name); });
}

ImageTokenIds find_image_tokens(const Tokenizer& tokenizer) {
  return collect([&](const std::string& name) {
    const auto id = tokenizer.token_id(name);
    if (!id) {
      throw DataError("the tokenizer has no image token " + name +
                      "; add nanoVLM's image tokens (add_image_tokens) before building samples");
    }
    return *id;
  });
}

}  // namespace vlm::data
