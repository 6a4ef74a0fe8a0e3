// The ChatML chat template (SmolLM2-Instruct, as nanoVLM uses it) with nanoVLM's image token
// layout, producing token ids and the loss mask of one sample:
//
//   <|im_start|>user\n{user text}<|im_end|>\n<|im_start|>assistant\n{assistant text}<|im_end|>\n
//
// Only the assistant's content tokens and its closing <|im_end|> are supervised; role headers,
// user turns, the newline after <|im_end|> and every image token are not.
//
// Images go where a user turn contains `<image>` (LLaVA style; the number of markers must equal
// the number of images), else all of them at the start of the first user turn's text (nanoVLM).
// Each image is laid out as nanoVLM's get_image_string (data/processors.py) does:
//   "<image: k>" as text, only when the sample has more than one image (k from 0), then
//   <|global_image|> + N x <|image|>, then for a rows x cols grid with more than one tile,
//   for each tile in row-major order <row_r_col_c> + N x <|image|>,
// where N = image_tokens_per_crop. This matches the crop order of the image pipeline: the global
// crop first, then the tiles row-major (a 1x1 grid has the global crop only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/image/image_grid.h"
#include "data/tokenizer/conversation.h"
#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/tokenizer_image_tokens.h"

namespace vlm::data {

struct TokenizedSample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> supervised;  // 1 where the token's loss counts; same length as ids
  int64_t supervised_tokens = 0;
  int64_t image_tokens = 0;  // <|image|> slots: crops * image_tokens_per_crop
  int64_t images = 0;
  int64_t crops = 0;
};

class ChatTemplate {
 public:
  static constexpr std::string_view kImageMarker = "<image>";

  // `tokenizer` must outlive the template. Throws vlm::DataError when it lacks <|im_start|>,
  // <|im_end|> or the image tokens (see add_image_tokens), and std::invalid_argument when
  // image_tokens_per_crop < 1 (it comes from the model spec: (image_size / patch_size)^2 /
  // pixel_shuffle^2).
  ChatTemplate(const Tokenizer& tokenizer, int64_t image_tokens_per_crop);

  // Throws vlm::DataError when the number of <image> markers is neither 0 nor images.size(),
  // when a marker is in an assistant turn, when there are images but no user turn, when a
  // grid side is outside 1..8, or when a turn's text itself encodes to one of the 66 image
  // tokens (e.g. a literal "<|image|>"): only the template places them, and the model fills
  // every <|image|> slot with a crop's features, so a stray one would break that count.
  TokenizedSample apply(const std::vector<ChatTurn>& turns,
                        const std::vector<ImageGrid>& images) const;

  int64_t image_tokens_per_crop() const { return image_tokens_per_crop_; }

 private:
  class Builder;

  const Tokenizer& tokenizer_;
  int64_t image_tokens_per_crop_;
  int32_t im_start_id_;
  int32_t im_end_id_;
  ImageTokenIds image_ids_;
  std::vector<int32_t> newline_ids_;
  std::vector<int32_t> image_token_ids_;  // all 66, sorted
  std::size_t user_header_tokens_;        // tokens of "user\n" encoded alone
  std::size_t assistant_header_tokens_;   // tokens of "assistant\n" encoded alone
};

}  // namespace vlm::data
