// Tokenizer::from_file: reads a Hugging Face tokenizer.json (format of tokenizers >= 0.13,
// including the [a, b] merge form of 0.20+) and checks every component is one we implement.
#include <algorithm>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/json_depth.h"
#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/tokenizer_bpe.h"
#include "data/tokenizer/tokenizer_byte_level.h"
#include "data/tokenizer/tokenizer_pretokenizer.h"

namespace vlm::data {
namespace {

using nlohmann::json;

// Every error names the file; the message says what is wrong and, where useful, what to do.
[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError("tokenizer: " + what, SourceLocation{path});
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file (check the tokenizer path in the config)");
  std::stringstream text;
  text << in.rdbuf();
  const std::string content = text.str();
  if (json_nesting_depth(content) > kMaxJsonDepth) {
    fail(path, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                   " levels; a tokenizer.json nests a few (a damaged or crafted file?)");
  }
  try {
    return json::parse(content);
  } catch (const json::exception& error) {  // parse_error, or out_of_range: a number past double
    fail(path, std::string("not valid JSON: ") + error.what());
  }
}

std::string type_of(const json& component) {
  if (!component.is_object() || !component.contains("type") || !component["type"].is_string()) {
    return "";
  }
  return component["type"].get<std::string>();
}

bool flag(const json& object, const char* key, bool fallback) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  return object[key].get<bool>();
}

// A string option that we only support unset or empty (subword prefixes / suffixes).
void require_unset_string(const std::string& path, const json& model, const char* key) {
  if (!model.contains(key) || model[key].is_null()) return;
  if (model[key].get<std::string>().empty()) return;
  fail(path, std::string("model.") + key + " is not supported (byte-level BPE has none)");
}

void check_normalizer(const std::string& path, const json& normalizer) {
  if (normalizer.is_null()) return;
  const std::string type = type_of(normalizer);
  if (type == "Sequence" && normalizer.value("normalizers", json::array()).empty()) return;
  if (type == "NFC") {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      spdlog::warn(
          "{}: tokenizer normalizer NFC is not applied; input text is assumed to be NFC "
          "already (true of almost all web text)",
          path);
    });
    return;
  }
  fail(path, "unsupported normalizer \"" + (type.empty() ? normalizer.dump() : type) +
                 "\" (supported: null, NFC)");
}

// Adds the component's splits to `pre_tokenizer`; sets byte_level_seen at a ByteLevel, which
// must come last (later splits would see byte-level text, which we do not model).
void add_pre_tokenizer(const std::string& path, const json& component, PreTokenizer& pre_tokenizer,
                       bool& byte_level_seen) {
  const std::string type = type_of(component);
  if (byte_level_seen)
    fail(path, "pre-tokenizer \"" + type + "\" after ByteLevel is not supported");
  const auto add_regex = [&](const std::string& pattern) {
    try {
      pre_tokenizer.add_split(std::make_shared<const RegexSplitter>(pattern));
    } catch (const std::invalid_argument& error) {
      fail(path, "pre-tokenizer " + type + ": " + error.what() + " (pattern " + pattern + ")");
    }
  };
  if (type == "Sequence") {
    for (const json& step : component.at("pretokenizers")) {
      add_pre_tokenizer(path, step, pre_tokenizer, byte_level_seen);
    }
  } else if (type == "ByteLevel") {
    byte_level_seen = true;
    if (flag(component, "add_prefix_space", false))
      pre_tokenizer.add_prefix_space_before_next_split();
    if (flag(component, "use_regex", true)) add_regex(kGpt2SplitPattern);
  } else if (type == "Split") {
    const std::string behavior = component.value("behavior", "");
    if (behavior != "Isolated") {
      fail(path, "pre-tokenizer Split with behavior \"" + behavior +
                     "\" is not supported (supported: Isolated)");
    }
    if (flag(component, "invert", false))
      fail(path, "pre-tokenizer Split with invert is not supported");
    const json& pattern = component.at("pattern");
    if (pattern.contains("Regex")) {
      add_regex(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      // A literal string: quote it for PCRE2 (\Q...\E).
      add_regex("\\Q" + pattern["String"].get<std::string>() + "\\E");
    } else {
      fail(path, "pre-tokenizer Split needs a pattern with \"Regex\" or \"String\"");
    }
  } else if (type == "Digits") {
    // HF Digits splits on char::is_numeric, i.e. Unicode N: one digit each, or digit runs.
    add_regex(flag(component, "individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else {
    fail(path, "unsupported pre-tokenizer \"" + (type.empty() ? component.dump() : type) +
                   "\" (supported: ByteLevel, Split (Isolated), Digits, Sequence)");
  }
}

void check_decoder(const std::string& path, const json& decoder) {
  if (decoder.is_null()) return;
  const std::string type = type_of(decoder);
  if (type == "Sequence") {
    for (const json& step : decoder.at("decoders")) check_decoder(path, step);
    return;
  }
  // Each of these decodes to the raw bytes of the tokens, which is what decode() produces.
  if (type == "ByteLevel" || type == "ByteFallback" || type == "Fuse") return;
  fail(path, "unsupported decoder \"" + (type.empty() ? decoder.dump() : type) +
                 "\" (supported: ByteLevel, ByteFallback, Fuse, Sequence)");
}

BpeModel::Merge parse_merge(const std::string& path, const json& merge, std::size_t rank) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  if (merge.is_string()) {
    // "a b": exactly one space (HF rejects anything else; byte-level tokens never hold one).
    const std::string text = merge.get<std::string>();
    const std::size_t space = text.find(' ');
    if (space != std::string::npos && space > 0 && space + 1 < text.size() &&
        text.find(' ', space + 1) == std::string::npos) {
      return {text.substr(0, space), text.substr(space + 1)};
    }
  }
  fail(path, "model.merges[" + std::to_string(rank) + "] is " + merge.dump() +
                 ", expected \"left right\" or [\"left\", \"right\"]");
}

// A token id: a JSON integer in [0, 2^30). A float (1e20), a number past int64 (parsed as a
// float or as an unsigned that get<int64_t> would wrap) or a larger one (2^32 + 300, which
// get<int32_t> would truncate to 300) is refused, naming `what` (the entry's place).
int32_t token_id(const std::string& path, const std::string& what, const json& id_json) {
  const bool in_range =
      (id_json.is_number_unsigned() && id_json.get<uint64_t>() < (uint64_t{1} << 30)) ||
      (id_json.is_number_integer() && !id_json.is_number_unsigned() &&
       id_json.get<int64_t>() >= 0 && id_json.get<int64_t>() < (int64_t{1} << 30));
  if (!in_range) fail(path, what + " is " + id_json.dump() + ", expected an id in [0, 2^30)");
  return static_cast<int32_t>(id_json.get<int64_t>());
}

std::unordered_map<std::string, int32_t> parse_vocab(const std::string& path, const json& model) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    fail(path, "model.vocab is missing or not an object of token -> id");
  }
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<int32_t, std::string> owner;
  for (const auto& [token, id_json] : model["vocab"].items()) {
    const int32_t id = token_id(path, "model.vocab[\"" + token + "\"]", id_json);
    const auto [it, fresh] = owner.emplace(id, token);
    if (!fresh) {
      fail(path, "model.vocab gives id " + std::to_string(id) + " to both \"" + it->second +
                     "\" and \"" + token + "\"");
    }
    vocab.emplace(token, id);
  }
  return vocab;
}

BpeOptions parse_options(const std::string& path, const json& model,
                         const std::unordered_map<std::string, int32_t>& vocab, bool byte_level) {
  BpeOptions options;
  options.byte_level = byte_level;
  options.byte_fallback = flag(model, "byte_fallback", false);
  options.ignore_merges = flag(model, "ignore_merges", false);
  options.fuse_unk = flag(model, "fuse_unk", false);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    const std::string unk = model["unk_token"].get<std::string>();
    const auto found = vocab.find(unk);
    if (found == vocab.end()) fail(path, "model.unk_token \"" + unk + "\" is not in the vocab");
    options.unk_id = found->second;
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() != 0.0) {
    fail(path,
         "model.dropout is not supported (tokenisation here is deterministic); set it to null");
  }
  require_unset_string(path, model, "continuing_subword_prefix");
  require_unset_string(path, model, "end_of_word_suffix");
  return options;
}

// <0xNN> -> the byte NN.
std::optional<char> byte_fallback_byte(const std::string& token) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  const int high = hex(token[3]), low = hex(token[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<char>(high * 16 + low);
}

// What a vocabulary entry decodes to.
std::string token_bytes(const std::string& token, const BpeOptions& options) {
  if (options.byte_fallback) {
    if (const auto byte = byte_fallback_byte(token)) return std::string(1, *byte);
  }
  if (options.byte_level) {
    if (auto bytes = from_byte_level(token)) return *bytes;
  }
  return token;
}

std::vector<AddedToken> parse_added_tokens(const std::string& path, const json& root) {
  std::vector<AddedToken> tokens;
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return tokens;
  if (!root["added_tokens"].is_array()) fail(path, "added_tokens must be an array");
  for (std::size_t i = 0; i < root["added_tokens"].size(); ++i) {
    const json& entry = root["added_tokens"][i];
    AddedToken token;
    token.id = token_id(path, "added_tokens[" + std::to_string(i) + "].id", entry.at("id"));
    token.content = entry.at("content").get<std::string>();
    token.special = flag(entry, "special", false);
    token.lstrip = flag(entry, "lstrip", false);
    token.rstrip = flag(entry, "rstrip", false);
    if (token.content.empty()) {
      fail(path, "added_tokens entry " + entry.dump() +
                     " needs a non-empty content and an id in [0, 2^30)");
    }
    if (flag(entry, "single_word", false)) {
      fail(path, "added token \"" + token.content + "\" uses single_word, which is not supported");
    }
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  const json root = read_json(path);
  try {
    if (!root.is_object()) fail(path, "the top level must be a JSON object");
    if (!root.contains("model") || !root["model"].is_object()) {
      fail(path, "no \"model\" object: this is not a tokenizer.json");
    }
    const json& model_json = root["model"];
    // Without "type" (or with null) HF's tokenizers tries each model in turn (BPE when there
    // are merges); a "type" that is neither a string nor null is refused there, as here.
    if (model_json.contains("type") && !model_json["type"].is_string() &&
        !model_json["type"].is_null()) {
      fail(path, "model.type is " + model_json["type"].dump().substr(0, 80) +
                     ": it must be a string (only \"BPE\" is supported)");
    }
    const std::string model_type = type_of(model_json);
    if (model_type != "BPE" && !(model_type.empty() && model_json.contains("merges"))) {
      fail(path, "model type \"" + model_type + "\" is not supported (only BPE)");
    }
    check_normalizer(path, root.value("normalizer", json()));
    auto pre_tokenizer = std::make_shared<PreTokenizer>();
    bool byte_level = false;
    if (!root.value("pre_tokenizer", json()).is_null()) {
      add_pre_tokenizer(path, root["pre_tokenizer"], *pre_tokenizer, byte_level);
    }
    check_decoder(path, root.value("decoder", json()));

    auto vocab = parse_vocab(path, model_json);
    const BpeOptions options = parse_options(path, model_json, vocab, byte_level);
    std::vector<BpeModel::Merge> merges;
    const json merges_json = model_json.value("merges", json::array());
    if (!merges_json.is_array()) fail(path, "model.merges must be an array");
    merges.reserve(merges_json.size());
    for (std::size_t rank = 0; rank < merges_json.size(); ++rank) {
      merges.push_back(parse_merge(path, merges_json[rank], rank));
    }
    const auto added_tokens = parse_added_tokens(path, root);
    // The decoder table has one entry per id up to the largest, so ids must be about dense:
    // a 70-byte file naming id 2^30 - 1 would otherwise allocate 32 GiB.
    int64_t max_id = -1;
    for (const auto& entry : vocab) max_id = std::max<int64_t>(max_id, entry.second);
    for (const AddedToken& token : added_tokens) max_id = std::max<int64_t>(max_id, token.id);
    const int64_t tokens = static_cast<int64_t>(vocab.size() + added_tokens.size());
    if (max_id >= tokens + kMaxUnusedTokenIds) {
      fail(path, "token id " + std::to_string(max_id) + " leaves more than " +
                     std::to_string(kMaxUnusedTokenIds) + " ids unused (the file has " +
                     std::to_string(tokens) + " tokens); a tokenizer's ids are dense");
    }

    Tokenizer tokenizer;
    for (const auto& [token, id] : vocab)
      tokenizer.set_token_bytes(id, token_bytes(token, options));
    try {
      tokenizer.model_ = std::make_shared<const BpeModel>(std::move(vocab), merges, options);
    } catch (const std::invalid_argument& error) {
      fail(path, std::string("model.merges: ") + error.what());
    }
    tokenizer.pre_tokenizer_ = std::move(pre_tokenizer);
    for (const AddedToken& token : added_tokens) {
      if (tokenizer.added_.find(token.content) != nullptr) {
        fail(path, "added token \"" + token.content + "\" is listed twice");
      }
      const auto in_vocab = tokenizer.model_->vocab().find(token.content);
      const bool id_taken = static_cast<std::size_t>(token.id) < tokenizer.id_to_bytes_.size() &&
                            !tokenizer.id_to_bytes_[token.id].empty();
      const bool same_entry =
          in_vocab != tokenizer.model_->vocab().end() && in_vocab->second == token.id;
      if (id_taken && !same_entry) {
        fail(path, "added token \"" + token.content + "\" has id " + std::to_string(token.id) +
                       ", which the vocab already gives to another token");
      }
      tokenizer.add_added_token(token);
    }
    return tokenizer;
  } catch (const json::exception& error) {
    fail(path, std::string("unexpected structure: ") + error.what());
  }
}

}  // namespace vlm::data
