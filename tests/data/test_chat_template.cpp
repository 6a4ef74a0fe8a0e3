// ChatML layout, nanoVLM image token layout and the loss mask, on the built-in byte tokenizer
// (ids: bytes, 257 <|im_start|>, 258 <|im_end|>, 259 <|image|>, 260 <|global_image|>,
// 261 + 8*(r-1) + (c-1) <row_r_col_c>).
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/error.h"
#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/tokenizer_image_tokens.h"

using namespace vlm::data;
using Ids = std::vector<int32_t>;

namespace {

// A grid of rows x cols tiles of 64 px (the chat template reads rows and cols only).
ImageGrid grid(int64_t rows, int64_t cols) { return ImageGrid{cols * 64, rows * 64, rows, cols}; }

}  // namespace

namespace {

constexpr int32_t kStart = 257, kEnd = 258, kImage = 259, kGlobal = 260;
constexpr int32_t tile(int row, int col) { return 261 + 8 * (row - 1) + (col - 1); }

Tokenizer chat_tokenizer() {
  Tokenizer tokenizer = Tokenizer::builtin_bytes();
  add_image_tokens(tokenizer);
  return tokenizer;
}

void append_text(Ids& ids, const std::string& text) {
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
}

// The decoded text of the supervised tokens.
std::string supervised_text(const Tokenizer& tokenizer, const TokenizedSample& sample) {
  Ids ids;
  for (std::size_t i = 0; i < sample.ids.size(); ++i) {
    if (sample.supervised[i]) ids.push_back(sample.ids[i]);
  }
  return tokenizer.decode(ids);
}

std::vector<ChatTurn> qa(const std::string& question, const std::string& answer) {
  return {{ChatRole::kUser, question}, {ChatRole::kAssistant, answer}};
}

}  // namespace

TEST_CASE("image tokens use nanoVLM's names and ids 259..324 on the built-in tokenizer") {
  Tokenizer tokenizer = Tokenizer::builtin_bytes();
  const ImageTokenIds ids = add_image_tokens(tokenizer);
  CHECK(image_token_names().size() == 66);
  CHECK(tokenizer.vocab_size() == 325);
  CHECK(ids.image == 259);
  CHECK(ids.global_image == 260);
  CHECK(ids.tile[0][0] == 261);
  CHECK(ids.tile[7][7] == 324);
  CHECK(tokenizer.token_id("<row_2_col_3>") == tile(2, 3));
  CHECK(tokenizer.token_id("<|global_image|>") == 260);
  // Adding them again changes nothing.
  add_image_tokens(tokenizer);
  CHECK(tokenizer.vocab_size() == 325);
}

TEST_CASE("one 1x1 image: global token and N image tokens before the user text") {
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 2);
  const TokenizedSample sample = chat.apply(qa("Hi", "Yo"), {grid(1, 1)});
  Ids expected = {kStart};
  append_text(expected, "user\n");
  expected.insert(expected.end(), {kGlobal, kImage, kImage});
  append_text(expected, "Hi");
  expected.insert(expected.end(), {kEnd, '\n', kStart});
  append_text(expected, "assistant\nYo");
  expected.insert(expected.end(), {kEnd, '\n'});
  CHECK(sample.ids == expected);
  CHECK(sample.supervised.size() == sample.ids.size());
  CHECK(supervised_text(tokenizer, sample) == "Yo<|im_end|>");
  CHECK(sample.supervised_tokens == 3);
  CHECK(sample.images == 1);
  CHECK(sample.crops == 1);
  CHECK(sample.image_tokens == 2);
}

TEST_CASE("a 2x2 grid: global crop, then each tile row-major") {
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 1);
  const TokenizedSample sample = chat.apply(qa("Q", "A"), {grid(2, 2)});
  Ids expected = {kStart};
  append_text(expected, "user\n");
  expected.insert(expected.end(), {kGlobal, kImage, tile(1, 1), kImage, tile(1, 2), kImage,
                                   tile(2, 1), kImage, tile(2, 2), kImage});
  append_text(expected, "Q");
  expected.insert(expected.end(), {kEnd, '\n', kStart});
  append_text(expected, "assistant\nA");
  expected.insert(expected.end(), {kEnd, '\n'});
  CHECK(sample.ids == expected);
  CHECK(sample.crops == 5);
  CHECK(sample.image_tokens == 5);
  CHECK(supervised_text(tokenizer, sample) == "A<|im_end|>");
}

TEST_CASE("multi-turn: every assistant turn and its <|im_end|> are supervised, nothing else") {
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 4);
  const std::vector<ChatTurn> turns = {{ChatRole::kUser, "What?"},
                                       {ChatRole::kAssistant, "A cat."},
                                       {ChatRole::kUser, "Sure?"},
                                       {ChatRole::kAssistant, "Yes"}};
  const TokenizedSample sample = chat.apply(turns, {});
  CHECK(tokenizer.decode(sample.ids) ==
        "<|im_start|>user\nWhat?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n"
        "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\nYes<|im_end|>\n");
  CHECK(supervised_text(tokenizer, sample) == "A cat.<|im_end|>Yes<|im_end|>");
  CHECK(sample.supervised_tokens == 6 + 1 + 3 + 1);
  CHECK(sample.images == 0);
  CHECK(sample.image_tokens == 0);
  // The mask is contiguous per assistant turn: header and trailing newline are excluded.
  const auto first = std::find(sample.supervised.begin(), sample.supervised.end(), 1);
  const auto at = static_cast<std::size_t>(first - sample.supervised.begin());
  CHECK(sample.ids[at - 1] == '\n');  // the end of "assistant\n"
  CHECK(sample.ids[at] == 'A');
}

TEST_CASE("<image> markers place each image where it appears, numbered when several") {
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 1);
  const TokenizedSample sample =
      chat.apply(qa("<image>x<image>\ny", "z"), {grid(1, 1), grid(1, 2)});
  Ids expected = {kStart};
  append_text(expected, "user\n<image: 0>");
  expected.insert(expected.end(), {kGlobal, kImage});
  append_text(expected, "x<image: 1>");
  expected.insert(expected.end(), {kGlobal, kImage, tile(1, 1), kImage, tile(1, 2), kImage});
  append_text(expected, "\ny");
  expected.insert(expected.end(), {kEnd, '\n', kStart});
  append_text(expected, "assistant\nz");
  expected.insert(expected.end(), {kEnd, '\n'});
  CHECK(sample.ids == expected);
  CHECK(sample.images == 2);
  CHECK(sample.crops == 1 + 3);
}

TEST_CASE("without markers, all images go before the first user turn's text") {
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 1);
  const std::vector<ChatTurn> turns = {
      {ChatRole::kAssistant, "hello"}, {ChatRole::kUser, "look"}, {ChatRole::kAssistant, "ok"}};
  const TokenizedSample sample = chat.apply(turns, {grid(1, 1), grid(1, 1)});
  CHECK(tokenizer.decode(sample.ids) ==
        "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\n<image: 0><|global_image|>"
        "<|image|><image: 1><|global_image|><|image|>look<|im_end|>\n<|im_start|>assistant\nok"
        "<|im_end|>\n");
  CHECK(supervised_text(tokenizer, sample) == "hello<|im_end|>ok<|im_end|>");
}

TEST_CASE("image token count is crops x image_tokens_per_crop, none supervised") {
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 64);  // (512/16)^2 / 4^2
  const TokenizedSample sample =
      chat.apply(qa("<image> and <image>", "two"), {grid(1, 1), grid(2, 3)});
  CHECK(sample.crops == 1 + 7);
  CHECK(sample.image_tokens == 8 * 64);
  const auto image_slots = std::count(sample.ids.begin(), sample.ids.end(), kImage);
  CHECK(image_slots == 8 * 64);
  for (std::size_t i = 0; i < sample.ids.size(); ++i) {
    if (sample.ids[i] >= kImage) CHECK(sample.supervised[i] == 0);
  }
  CHECK(supervised_text(tokenizer, sample) == "two<|im_end|>");
}

TEST_CASE("chat template errors") {
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 4);
  CHECK_THROWS_WITH(chat.apply(qa("<image>", "a"), {grid(1, 1), grid(1, 1)}),
                    Catch::Contains("1 <image> markers but 2 images"));
  CHECK_THROWS_WITH(chat.apply(qa("<image><image>", "a"), {grid(1, 1)}),
                    Catch::Contains("2 <image> markers but 1 images"));
  CHECK_THROWS_WITH(chat.apply(qa("<image>", "a"), {}),
                    Catch::Contains("1 <image> markers but 0 images"));
  CHECK_THROWS_AS(chat.apply(qa("q", "<image>"), {grid(1, 1)}), vlm::DataError);
  CHECK_THROWS_WITH(chat.apply({{ChatRole::kAssistant, "a"}}, {grid(1, 1)}),
                    Catch::Contains("no user turn"));
  CHECK_THROWS_WITH(chat.apply(qa("q", "a"), {grid(9, 1)}), Catch::Contains("9x1"));
  CHECK_THROWS_AS(chat.apply(qa("q", "a"), {grid(0, 2)}), vlm::DataError);
  CHECK_THROWS_AS(ChatTemplate(tokenizer, 0), std::invalid_argument);
  // A tokenizer without the image tokens cannot build the template.
  const Tokenizer bare = Tokenizer::builtin_bytes();
  CHECK_THROWS_WITH(ChatTemplate(bare, 4), Catch::Contains("<|image|>"));
}

TEST_CASE("a text that spells an image token is refused: the image slots stay crops x N") {
  // fuzz/corpus/chat_template/literal_image_token: "<|image|>" in a user's text became one
  // more image slot than the sample has crop features for.
  const Tokenizer tokenizer = chat_tokenizer();
  const ChatTemplate chat(tokenizer, 4);
  CHECK_THROWS_WITH(chat.apply(qa("what is <|image|> here?", "a"), {grid(1, 1)}),
                    Catch::Contains("the text contains the image token \"<|image|>\""));
  CHECK_THROWS_WITH(chat.apply(qa("q", "<|global_image|>"), {}),
                    Catch::Contains("<|global_image|>"));
  CHECK_THROWS_WITH(chat.apply(qa("<row_8_col_8>", "a"), {}), Catch::Contains("<row_8_col_8>"));
  // The marker and look-alikes are text.
  CHECK(chat.apply(qa("<image> and <|image| > and <image: 3>", "a"), {grid(1, 1)}).image_tokens ==
        4);
}

TEST_CASE("chat roles parse from manifest names") {
  CHECK(parse_chat_role("user") == ChatRole::kUser);
  CHECK(parse_chat_role("assistant") == ChatRole::kAssistant);
  CHECK_FALSE(parse_chat_role("system").has_value());
}
