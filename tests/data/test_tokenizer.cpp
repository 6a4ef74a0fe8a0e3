// Golden encodings of the BPE tokenizer on small tokenizer.json files built here. Expected ids
// are worked out by hand from the merge ranks (comments show the steps).
#include <catch2/catch.hpp>

#include <thread>

#include "core/error.h"
#include "data/tokenizer/tokenizer.h"
#include "tokenizer_test_files.h"

using vlm::data::Tokenizer;
using vlm::test::added_token;
using vlm::test::byte_level_tokenizer_json;
using vlm::test::load_tokenizer;
using vlm::test::TempDir;
using Ids = std::vector<int32_t>;

namespace {

// ids 256.. in order; merges ranked in list order.
nlohmann::json priority_tokenizer_json() {
  return byte_level_tokenizer_json(
      {"ll", "he", "hell", "hello", "el", "aa", "\xC3\x83\xC2\xA9" /* "Ã©" = byte-level é */},
      {"l l", "h e", "he ll", "hell o", "e l", "a a", "\xC3\x83 \xC2\xA9"});
}

constexpr int32_t kLL = 256, kHE = 257, kHELLO = 259, kAA = 261, kE_ACUTE = 262;

}  // namespace

TEST_CASE("BPE applies merges by rank, not by position") {
  TempDir dir;
  const Tokenizer tokenizer = load_tokenizer(dir, priority_tokenizer_json());
  // h e l l o: "l l" (rank 0) before "h e" (1), then "he ll" (2), "hell o" (3).
  CHECK(tokenizer.encode("hello") == Ids{kHELLO});
  // e l l e: "e l" is leftmost but rank 4, so "l l" wins and "el" never forms.
  CHECK(tokenizer.encode("elle") == Ids{'e', kLL, 'e'});
  // h e l p: "h e" (1) beats "e l" (4); "he l" is no merge.
  CHECK(tokenizer.encode("help") == Ids{kHE, 'l', 'p'});
  // " help" is its own pre-token (GPT-2 regex), Ġ (byte 32) merges with nothing.
  CHECK(tokenizer.encode("hello help") == Ids{kHELLO, ' ', kHE, 'l', 'p'});
}

TEST_CASE("BPE resolves equal-rank pairs left to right") {
  TempDir dir;
  const Tokenizer tokenizer = load_tokenizer(dir, priority_tokenizer_json());
  CHECK(tokenizer.encode("aaa") == Ids{kAA, 'a'});
  CHECK(tokenizer.encode("aaaaa") == Ids{kAA, kAA, 'a'});
  // Longer than the cache's word limit (256 bytes): same result through the uncached path.
  Ids expected(500, kAA);
  expected.push_back('a');
  CHECK(tokenizer.encode(std::string(1001, 'a')) == expected);
  CHECK(tokenizer.encode(std::string(1001, 'a')) == expected);  // a second time
}

TEST_CASE("byte-level BPE handles multi-byte characters and emoji") {
  TempDir dir;
  const Tokenizer tokenizer = load_tokenizer(dir, priority_tokenizer_json());
  // é is C3 A9: the byte-level pair "Ã ©" merges into one token.
  CHECK(tokenizer.encode("caf\xC3\xA9") == Ids{'c', 'a', 'f', kE_ACUTE});
  // 😀 is F0 9F 98 80, four byte tokens.
  CHECK(tokenizer.encode("\xF0\x9F\x98\x80") == Ids{0xF0, 0x9F, 0x98, 0x80});
  CHECK(tokenizer.decode({'c', 'a', 'f', kE_ACUTE, ' ', 0xF0, 0x9F, 0x98, 0x80}) ==
        "caf\xC3\xA9 \xF0\x9F\x98\x80");
}

TEST_CASE("decode(encode(x)) == x for mixed text") {
  TempDir dir;
  const Tokenizer bpe = load_tokenizer(dir, priority_tokenizer_json());
  const Tokenizer bytes = Tokenizer::builtin_bytes();
  const std::string text =
      "Hello, world! \xC3\x87"
      "a va? \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \t\n\n  x 12345 it's   hello\r\n";
  CHECK(bpe.decode(bpe.encode(text)) == text);
  CHECK(bytes.decode(bytes.encode(text)) == text);
  CHECK(bpe.encode(text).size() < text.size());  // merges did happen
}

TEST_CASE("invalid UTF-8 input encodes and decodes to replacement characters") {
  TempDir dir;
  const Tokenizer tokenizer = load_tokenizer(dir, priority_tokenizer_json());
  const std::string text = "ok \xFF\xC3 end";
  const Ids ids = tokenizer.encode(text);
  CHECK(ids.size() == text.size());  // nothing merges here: one token per byte
  CHECK(tokenizer.decode(ids) == "ok \xEF\xBF\xBD\xEF\xBF\xBD end");
}

TEST_CASE("ignore_merges maps a word in the vocab to its token directly") {
  TempDir dir;
  auto json = byte_level_tokenizer_json({"ab", "abc"}, {"a b"});
  CHECK(load_tokenizer(dir, json, "plain.json").encode("abc") == Ids{256, 'c'});
  json["model"]["ignore_merges"] = true;
  const Tokenizer tokenizer = load_tokenizer(dir, json, "ignore.json");
  CHECK(tokenizer.encode("abc") == Ids{257});
  CHECK(tokenizer.encode("abcd") == Ids{256, 'c', 'd'});  // not in the vocab: merges apply
}

TEST_CASE("byte_fallback turns unknown characters into <0xNN> tokens") {
  TempDir dir;
  nlohmann::json vocab = nlohmann::json::object();
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    vocab[name] = byte;
  }
  vocab["a"] = 256;
  vocab["b"] = 257;
  vocab["ab"] = 258;
  vocab["\xC3\xA9"] = 259;  // é, a plain UTF-8 vocabulary entry
  auto json = byte_level_tokenizer_json({}, {});
  json["pre_tokenizer"] = nullptr;
  json["decoder"] = {{"type", "Sequence"},
                     {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  json["model"]["vocab"] = vocab;
  json["model"]["merges"] = {"a b"};
  json["model"]["byte_fallback"] = true;
  const Tokenizer tokenizer = load_tokenizer(dir, json);
  const std::string text = "ab\xC3\xA9\xF0\x9F\x98\x80";  // abé😀
  const Ids ids = tokenizer.encode(text);
  CHECK(ids == Ids{258, 259, 0xF0, 0x9F, 0x98, 0x80});
  CHECK(tokenizer.decode(ids) == text);
}

TEST_CASE("unknown characters become unk, fused when fuse_unk") {
  TempDir dir;
  auto json = byte_level_tokenizer_json({}, {});
  json["pre_tokenizer"] = nullptr;
  json["model"]["vocab"] = {{"<unk>", 0}, {"a", 1}, {"b", 2}};
  json["model"]["unk_token"] = "<unk>";
  const std::string text =
      "a\xF0\x9F\x98\x80\xF0\x9F\x98\x80"
      "b";
  CHECK(load_tokenizer(dir, json, "unfused.json").encode(text) == Ids{1, 0, 0, 2});
  json["model"]["fuse_unk"] = true;
  CHECK(load_tokenizer(dir, json, "fused.json").encode(text) == Ids{1, 0, 2});
}

TEST_CASE("added tokens are matched in raw text, longest first") {
  TempDir dir;
  auto json = byte_level_tokenizer_json({}, {});
  json["added_tokens"] = {added_token("<|im_start|>", 256), added_token("<|im_end|>", 257),
                          added_token("<|im", 258, /*special=*/false)};
  const Tokenizer tokenizer = load_tokenizer(dir, json);
  CHECK(tokenizer.vocab_size() == 259);
  CHECK(tokenizer.encode("x<|im_start|>y<|imz<|im_end|>") == Ids{'x', 256, 'y', 258, 'z', 257});
  CHECK(tokenizer.encode("<|im_end") == Ids{258, '_', 'e', 'n', 'd'});
  CHECK(tokenizer.decode({'x', 256, 257}) == "x<|im_start|><|im_end|>");
  CHECK(tokenizer.token_id("<|im_end|>") == 257);
  CHECK(tokenizer.token_id("\xC4\xA0") == 32);  // "Ġ": vocabulary entries as the file writes them
  CHECK_FALSE(tokenizer.token_id("<|nope|>").has_value());
}

TEST_CASE("added tokens with lstrip/rstrip absorb the whitespace around them") {
  TempDir dir;
  auto json = byte_level_tokenizer_json({}, {});
  json["added_tokens"] = {added_token("<|x|>", 256)};
  CHECK(load_tokenizer(dir, json, "plain.json").encode("a  <|x|>  b") ==
        Ids{'a', ' ', ' ', 256, ' ', ' ', 'b'});
  json["added_tokens"][0]["lstrip"] = true;
  json["added_tokens"][0]["rstrip"] = true;
  CHECK(load_tokenizer(dir, json, "strip.json").encode("a  <|x|>  b") == Ids{'a', 256, 'b'});
}

TEST_CASE("Split pre-tokenizer with Llama 3's pattern isolates its matches") {
  TempDir dir;
  // "3 4" has the best rank: it would merge if "12345" were one word.
  auto json = byte_level_tokenizer_json({"12", "123", "45", "34"}, {"3 4", "1 2", "12 3", "4 5"});
  const std::string llama3_pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", llama3_pattern}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const Tokenizer tokenizer = load_tokenizer(dir, json);
  // Pieces: "I", "'M" (case-insensitive), " ", "123", "45", " ok".
  CHECK(tokenizer.encode("I'M 12345 ok") == Ids{'I', '\'', 'M', ' ', 257, 258, ' ', 'o', 'k'});
  // Without the split the digits are one word: 1 2 34 5 -> 12 34 5.
  json["pre_tokenizer"] = nullptr;
  CHECK(load_tokenizer(dir, json, "nosplit.json").encode("12345") == Ids{256, 259, '5'});
}

TEST_CASE("Split with a String pattern splits on the literal") {
  TempDir dir;
  auto json = byte_level_tokenizer_json({"a-", "a.", "a.b"}, {"a -", "a .", "a. b"});
  json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const Tokenizer tokenizer = load_tokenizer(dir, json);
  CHECK(tokenizer.encode("a-b") == Ids{'a', '-', 'b'});
  CHECK(tokenizer.encode("a.b") == Ids{258});  // "." is literal, not "any character"
}

TEST_CASE("Digits pre-tokenizer: individual digits or digit runs") {
  TempDir dir;
  auto json = byte_level_tokenizer_json({"20", "24"}, {"2 0", "2 4"});
  auto digits = nlohmann::json{{"type", "Digits"}, {"individual_digits", true}};
  const auto with_digits = [&](const nlohmann::json& step) {
    json["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {step, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
    return json;
  };
  CHECK(load_tokenizer(dir, with_digits(digits), "individual.json").encode("x 2024!") ==
        Ids{'x', ' ', '2', '0', '2', '4', '!'});
  digits["individual_digits"] = false;
  CHECK(load_tokenizer(dir, with_digits(digits), "runs.json").encode("x 2024!") ==
        Ids{'x', ' ', 256, 257, '!'});
}

TEST_CASE("ByteLevel add_prefix_space adds a space before each piece") {
  TempDir dir;
  auto json = byte_level_tokenizer_json({"\xC4\xA0"
                                         "a"},
                                        {"\xC4\xA0 a"});
  json["pre_tokenizer"]["add_prefix_space"] = true;
  CHECK(load_tokenizer(dir, json).encode("a a") == Ids{256, 256});
}

TEST_CASE("merges in the [left, right] array form equal the string form") {
  TempDir dir;
  auto json = priority_tokenizer_json();
  nlohmann::json array_merges = nlohmann::json::array();
  for (const auto& merge : json["model"]["merges"]) {
    const std::string text = merge.get<std::string>();
    const auto space = text.find(' ');
    array_merges.push_back({text.substr(0, space), text.substr(space + 1)});
  }
  json["model"]["merges"] = array_merges;
  const Tokenizer tokenizer = load_tokenizer(dir, json);
  CHECK(tokenizer.encode("hello elle") == Ids{kHELLO, ' ', 'e', kLL, 'e'});
}

TEST_CASE("the NFC normalizer is accepted (input assumed NFC)") {
  TempDir dir;
  auto json = priority_tokenizer_json();
  json["normalizer"] = {{"type", "NFC"}};
  CHECK(load_tokenizer(dir, json).encode("hello") == Ids{kHELLO});
}

TEST_CASE("built-in byte tokenizer") {
  Tokenizer tokenizer = Tokenizer::builtin_bytes();
  CHECK(tokenizer.vocab_size() == 259);
  CHECK(tokenizer.token_id("<|endoftext|>") == 256);
  CHECK(tokenizer.token_id("<|im_start|>") == 257);
  CHECK(tokenizer.token_id("<|im_end|>") == 258);
  CHECK(tokenizer.encode("Hi <|im_end|>\n") == Ids{'H', 'i', ' ', 258, '\n'});
  CHECK(tokenizer.encode("\xC3\xA9") == Ids{0xC3, 0xA9});
  CHECK(tokenizer.decode({'o', 'k', 256}) == "ok<|endoftext|>");
}

TEST_CASE("add_special_token returns existing ids and grows the vocabulary otherwise") {
  Tokenizer tokenizer = Tokenizer::builtin_bytes();
  CHECK(tokenizer.add_special_token("<|im_start|>") == 257);
  CHECK(tokenizer.add_special_token("!") == '!');  // a vocabulary entry keeps its id
  CHECK(tokenizer.vocab_size() == 259);
  CHECK(tokenizer.add_special_token("<|new|>") == 259);
  CHECK(tokenizer.add_special_token("<|new|>") == 259);
  CHECK(tokenizer.vocab_size() == 260);
  CHECK(tokenizer.encode("a<|new|>!") == Ids{'a', 259, '!'});
  CHECK(tokenizer.decode({259}) == "<|new|>");
  // A copy is independent.
  Tokenizer copy = tokenizer;
  CHECK(copy.add_special_token("<|other|>") == 260);
  CHECK(tokenizer.vocab_size() == 260);
}

TEST_CASE("decode rejects ids outside the vocabulary") {
  const Tokenizer tokenizer = Tokenizer::builtin_bytes();
  CHECK_THROWS_AS(tokenizer.decode({259}), vlm::DataError);
  CHECK_THROWS_AS(tokenizer.decode({-1}), vlm::DataError);
}

TEST_CASE("concurrent encodes agree with a single-threaded encode") {
  TempDir dir;
  const Tokenizer tokenizer = load_tokenizer(dir, priority_tokenizer_json());
  std::vector<std::string> lines;
  for (int i = 0; i < 300; ++i) {
    lines.push_back("hello help " + std::to_string(i * 7919) + " elle aaaa caf\xC3\xA9 " +
                    std::string(static_cast<std::size_t>(i % 40), 'a'));
  }
  std::vector<Ids> expected;
  for (const auto& line : lines) expected.push_back(Tokenizer(tokenizer).encode(line));
  const Tokenizer shared = load_tokenizer(dir, priority_tokenizer_json(), "shared.json");
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (std::size_t i = 0; i < lines.size(); ++i) {
          mismatches[t] += shared.encode(lines[(i + t * 17) % lines.size()]) !=
                           expected[(i + t * 17) % lines.size()];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(mismatches == std::vector<int>{0, 0});
}
