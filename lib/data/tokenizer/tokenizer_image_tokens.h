// The image-placement special tokens of nanoVLM (models/config.py `vlm_extra_tokens`):
// <|image|> (one per image-token slot), <|global_image|> (before the global crop's slots) and
// <row_R_col_C> for R, C in 1..8 (before each tile's slots). 66 tokens.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace vlm::data {

// Largest crop grid side nanoVLM names a token for.
constexpr int64_t kMaxImageGridSide = 8;

struct ImageTokenIds {
  int32_t image = -1;
  int32_t global_image = -1;
  // tile[r][c] is <row_{r+1}_col_{c+1}>.
  std::array<std::array<int32_t, kMaxImageGridSide>, kMaxImageGridSide> tile{};
};

// The 66 token strings, in nanoVLM's order (image, global_image, then row-major tiles); the
// built-in tokenizer gives them ids 259..324 in this order.
const std::vector<std::string>& image_token_names();

// Adds the tokens that are missing (as special tokens) and returns all their ids.
ImageTokenIds add_image_tokens(Tokenizer& tokenizer);

// The ids of the tokens; throws vlm::DataError when the tokenizer lacks one (call
// add_image_tokens when building the tokenizer).
ImageTokenIds find_image_tokens(const Tokenizer& tokenizer);

}  // namespace vlm::data
