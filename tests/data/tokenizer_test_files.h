// Builds small tokenizer.json files for the tokenizer tests.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/tokenizer_byte_level.h"
#include "support/test_support.h"

namespace vlm::test {

// A byte-level BPE tokenizer.json: ids 0..255 are the bytes (GPT-2 alphabet), then `extra`
// tokens (byte-level text, e.g. "Ġthe") from 256 on, in order. Merges in "a b" form.
// pre_tokenizer defaults to GPT-2's (ByteLevel with use_regex).
inline nlohmann::json byte_level_tokenizer_json(const std::vector<std::string>& extra,
                                                const std::vector<std::string>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& alphabet = data::byte_level_alphabet();
  for (int byte = 0; byte < 256; ++byte) vocab[alphabet[byte]] = byte;
  int next = 256;
  for (const std::string& token : extra) vocab[token] = next++;
  nlohmann::json json;
  json["version"] = "1.0";
  json["added_tokens"] = nlohmann::json::array();
  json["normalizer"] = nullptr;
  json["pre_tokenizer"] = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  json["post_processor"] = nullptr;
  json["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  json["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", ""},
                   {"end_of_word_suffix", ""},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"vocab", vocab},
                   {"merges", merges}};
  return json;
}

inline nlohmann::json added_token(const std::string& content, int id, bool special = true) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// Writes `json` to dir/name and loads it.
inline data::Tokenizer load_tokenizer(const TempDir& dir, const nlohmann::json& json,
                                      const std::string& name = "tokenizer.json") {
  return data::Tokenizer::from_file(write_file(dir / name, json.dump(2)));
}

}  // namespace vlm::test
