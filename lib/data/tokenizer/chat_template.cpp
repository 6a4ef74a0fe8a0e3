#include "data/tokenizer/chat_template.h"

#include <algorithm>
#include <stdexcept>

#include "core/error.h"

namespace vlm::data {
namespace {

int32_t require_token(const Tokenizer& tokenizer, const std::string& token) {
  const auto id = tokenizer.token_id(token);
  if (!id) {
    throw DataError("the tokenizer has no " + token +
                    " token, which the ChatML template needs; use a ChatML tokenizer (e.g. "
                    "SmolLM2-Instruct's) or the built-in one");
  }
  return *id;
}

const char* role_name(ChatRole role) { return role == ChatRole::kUser ? "user" : "assistant"; }

std::size_t count_markers(std::string_view text) {
  std::size_t count = 0;
  for (std::size_t pos = text.find(ChatTemplate::kImageMarker); pos != std::string_view::npos;
       pos = text.find(ChatTemplate::kImageMarker, pos + ChatTemplate::kImageMarker.size())) {
    ++count;
  }
  return count;
}

}  // namespace

std::optional<ChatRole> parse_chat_role(std::string_view name) {
  if (name == "user") return ChatRole::kUser;
  if (name == "assistant") return ChatRole::kAssistant;
  return std::nullopt;
}

ChatTemplate::ChatTemplate(const Tokenizer& tokenizer, int64_t image_tokens_per_crop)
    : tokenizer_(tokenizer),
      image_tokens_per_crop_(image_tokens_per_crop),
      im_start_id_(require_token(tokenizer, "<|im_start|>")),
      im_end_id_(require_token(tokenizer, "<|im_end|>")),
      image_ids_(find_image_tokens(tokenizer)),
      newline_ids_(tokenizer.encode("\n")),
      user_header_tokens_(tokenizer.encode("user\n").size()),
      assistant_header_tokens_(tokenizer.encode("assistant\n").size()) {
  if (image_tokens_per_crop < 1) {
    throw std::invalid_argument("image_tokens_per_crop must be at least 1, got " +
                                std::to_string(image_tokens_per_crop));
  }
  image_token_ids_ = {image_ids_.image, image_ids_.global_image};
  for (const auto& row : image_ids_.tile) {
    image_token_ids_.insert(image_token_ids_.end(), row.begin(), row.end());
  }
  std::sort(image_token_ids_.begin(), image_token_ids_.end());
}

// Appends one sample's tokens. Text is buffered until a special token comes, then encoded in
// one piece: HF tokenizes the whole rendered conversation, where added tokens are the only
// boundaries, so text between two special tokens must be encoded together.
class ChatTemplate::Builder {
 public:
  Builder(const ChatTemplate& chat, const std::vector<ImageGrid>& images)
      : chat_(chat), images_(images) {}

  void start_turn(ChatRole role) {
    role_ = role;
    special(chat_.im_start_id_, false);
    text_ = std::string(role_name(role)) + "\n";
    header_tokens_ =
        role == ChatRole::kUser ? chat_.user_header_tokens_ : chat_.assistant_header_tokens_;
  }

  void text(std::string_view text) { text_ += text; }

  void image(std::size_t index) {
    if (images_.size() > 1) text_ += "<image: " + std::to_string(index) + ">";
    const ImageGrid& grid = images_[index];
    special(chat_.image_ids_.global_image, false);
    image_slots();
    if (grid.rows * grid.cols > 1) {
      for (int64_t row = 0; row < grid.rows; ++row) {
        for (int64_t col = 0; col < grid.cols; ++col) {
          special(chat_.image_ids_.tile[row][col], false);
          image_slots();
        }
      }
    }
    sample_.crops += grid.crops();
  }

  void end_turn() {
    const bool assistant = role_ == ChatRole::kAssistant;
    special(chat_.im_end_id_, assistant);
    for (const int32_t id : chat_.newline_ids_) push(id, false);
  }

  TokenizedSample finish() {
    sample_.images = static_cast<int64_t>(images_.size());
    return std::move(sample_);
  }

 private:
  void push(int32_t id, bool supervised) {
    sample_.ids.push_back(id);
    sample_.supervised.push_back(supervised ? 1 : 0);
    sample_.supervised_tokens += supervised ? 1 : 0;
  }

  // Encodes the buffered text; its first header_tokens_ tokens are the role header.
  void flush_text() {
    if (text_.empty()) return;
    const bool assistant = role_ == ChatRole::kAssistant;
    encoded_.clear();
    chat_.tokenizer_.encode_into(text_, encoded_);
    for (const int32_t id : encoded_) {
      if (std::binary_search(chat_.image_token_ids_.begin(), chat_.image_token_ids_.end(), id)) {
        throw DataError("the text contains the image token \"" + chat_.tokenizer_.decode({id}) +
                        "\", which only the chat template places (one per slot of an image's "
                        "features); write <image> where the image goes");
      }
    }
    for (std::size_t i = 0; i < encoded_.size(); ++i) {
      push(encoded_[i], assistant && i >= header_tokens_);
    }
    text_.clear();
    header_tokens_ = 0;
  }

  void special(int32_t id, bool supervised) {
    flush_text();
    push(id, supervised);
  }

  void image_slots() {
    for (int64_t slot = 0; slot < chat_.image_tokens_per_crop_; ++slot) {
      push(chat_.image_ids_.image, false);
    }
    sample_.image_tokens += chat_.image_tokens_per_crop_;
  }

  const ChatTemplate& chat_;
  const std::vector<ImageGrid>& images_;
  TokenizedSample sample_;
  ChatRole role_ = ChatRole::kUser;
  std::string text_;
  std::size_t header_tokens_ = 0;
  std::vector<int32_t> encoded_;
};

TokenizedSample ChatTemplate::apply(const std::vector<ChatTurn>& turns,
                                    const std::vector<ImageGrid>& images) const {
  for (const ImageGrid& grid : images) {
    if (grid.rows < 1 || grid.cols < 1 || grid.rows > kMaxImageGridSide ||
        grid.cols > kMaxImageGridSide) {
      throw DataError("image grid " + std::to_string(grid.rows) + "x" + std::to_string(grid.cols) +
                      " is outside 1x1..8x8 (nanoVLM names tile tokens up to row 8, col 8); "
                      "lower max_img_size or raise the crop size");
    }
  }
  std::size_t markers = 0;
  std::optional<std::size_t> first_user;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const std::size_t in_turn = count_markers(turns[i].text);
    if (turns[i].role == ChatRole::kAssistant && in_turn > 0) {
      throw DataError(
          "an assistant turn contains <image>; images can only be placed in user "
          "turns");
    }
    markers += in_turn;
    if (turns[i].role == ChatRole::kUser && !first_user) first_user = i;
  }
  if (markers > 0 && markers != images.size()) {
    throw DataError("the sample's text has " + std::to_string(markers) + " <image> markers but " +
                    std::to_string(images.size()) +
                    " images; each image needs exactly one marker (or use none to put all "
                    "images before the first user text)");
  }
  if (markers == 0 && !images.empty() && !first_user) {
    throw DataError("the sample has " + std::to_string(images.size()) +
                    " images but no user turn to place them in");
  }

  Builder builder(*this, images);
  std::size_t next_image = 0;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    builder.start_turn(turns[i].role);
    if (markers == 0 && first_user == i) {
      for (; next_image < images.size(); ++next_image) builder.image(next_image);
    }
    std::string_view text = turns[i].text;
    for (std::size_t marker = text.find(kImageMarker); marker != std::string_view::npos;
         marker = text.find(kImageMarker)) {
      builder.text(text.substr(0, marker));
      builder.image(next_image++);
      text.remove_prefix(marker + kImageMarker.size());
    }
    builder.text(text);
    builder.end_turn();
  }
  return builder.finish();
}

}  // namespace vlm::data
