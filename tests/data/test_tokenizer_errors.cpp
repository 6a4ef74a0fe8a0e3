// Every malformed or unsupported tokenizer.json gives a vlm::DataError naming the file and
// what is wrong.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "data/tokenizer/tokenizer.h"
#include "tokenizer_test_files.h"

using vlm::data::Tokenizer;
using vlm::test::added_token;
using vlm::test::byte_level_tokenizer_json;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {

// Loads `text` as dir/tokenizer.json; returns the DataError's message ("" if none was thrown).
std::string load_error(const TempDir& dir, const std::string& text) {
  const std::string path = write_file(dir / "tokenizer.json", text);
  try {
    Tokenizer::from_file(path);
  } catch (const vlm::DataError& error) {
    CHECK(error.where().file == path);
    CHECK(error.code() == vlm::ExitCode::kData);
    return error.what();
  }
  return "";
}

std::string load_error(const TempDir& dir, const nlohmann::json& json) {
  return load_error(dir, json.dump());
}

nlohmann::json valid_json() { return byte_level_tokenizer_json({"ab"}, {"a b"}); }

}  // namespace

using Catch::Matchers::Contains;

TEST_CASE("the valid base file loads (the error cases below differ from it in one place)") {
  TempDir dir;
  CHECK(load_error(dir, valid_json()).empty());
}

TEST_CASE("a missing file is a DataError naming it") {
  TempDir dir;
  const std::string path = (dir / "absent.json").string();
  CHECK_THROWS_WITH(Tokenizer::from_file(path), Contains(path) && Contains("cannot open"));
}

TEST_CASE("file structure errors") {
  TempDir dir;
  CHECK_THAT(load_error(dir, std::string("{\"model\": ")), Contains("not valid JSON"));
  CHECK_THAT(load_error(dir, std::string("[1, 2]")), Contains("top level must be a JSON object"));
  // A number beyond a double (fuzz/corpus/tokenizer/number_past_double).
  CHECK_THAT(load_error(dir, std::string("{\"version\": 41e308}")), Contains("not valid JSON"));
  auto json = valid_json();
  json.erase("model");
  CHECK_THAT(load_error(dir, json), Contains("no \"model\""));
  json = valid_json();
  json["model"]["type"] = "WordPiece";
  CHECK_THAT(load_error(dir, json), Contains("model type \"WordPiece\" is not supported"));
  // A type that is neither a string nor null is no BPE, merges or not (HF's tokenizers refuses
  // it too; null it reads as no type, and so does this reader).
  for (const auto& type : {nlohmann::json(5), nlohmann::json(true), nlohmann::json::array()}) {
    json = valid_json();
    json["model"]["type"] = type;
    CHECK_THAT(load_error(dir, json), Contains("model.type is " + type.dump() + ": it must be"));
  }
  json = valid_json();
  json["model"]["type"] = nullptr;
  CHECK(load_error(dir, json).empty());
  json = valid_json();
  json["model"].erase("vocab");
  CHECK_THAT(load_error(dir, json), Contains("model.vocab is missing"));
  json = valid_json();
  json["model"]["vocab"]["x"] = "seven";
  CHECK_THAT(load_error(dir, json), Contains("model.vocab[\"x\"]"));
  // A sparse id would size the decoder table: 32 GiB for 2^30 - 1 (fuzz/corpus/tokenizer/
  // sparse_id, a 70-byte file).
  json = valid_json();
  json["model"]["vocab"]["x"] = (1 << 30) - 1;
  CHECK_THAT(load_error(dir, json),
             Contains("token id 1073741823 leaves more than 65536 ids unused"));
  json = valid_json();
  json["added_tokens"] = {{{"id", 900000}, {"content", "<x>"}, {"special", true}}};
  CHECK_THAT(load_error(dir, json), Contains("token id 900000 leaves more than 65536 ids unused"));
  json = valid_json();
  json["model"]["vocab"]["x"] = 60000;  // a few unused ids are fine
  CHECK(load_error(dir, json).empty());
  json = valid_json();
  json["model"]["vocab"]["x"] = 3;  // id 3 is byte 3's
  CHECK_THAT(load_error(dir, json), Contains("gives id 3 to both"));
  json = valid_json();
  json["added_tokens"] = {{{"content", "<x>"}}};  // no id
  CHECK_THAT(load_error(dir, json), Contains("unexpected structure"));
}

TEST_CASE("token ids past 2^30, past int64 or written as floats are refused, not truncated") {
  // get<int32_t>() truncated 2^32 + 300 to 300 in added_tokens; a float id was undefined.
  TempDir dir;
  const auto with_id = [](nlohmann::json json, const std::string& id_text) {
    std::string text = json.dump();
    const std::string placeholder = "\"@ID@\"";
    text.replace(text.find(placeholder), placeholder.size(), id_text);
    return text;
  };
  for (const std::string id :
       {"4294967596", "1e20", "18446744073709551616", "18446744073709551615", "-1", "300.5"}) {
    INFO(id);
    auto json = valid_json();
    json["model"]["vocab"]["x"] = "@ID@";
    CHECK_THAT(load_error(dir, with_id(json, id)),
               Contains("model.vocab[\"x\"] is ") && Contains("expected an id in [0, 2^30)"));
    json = valid_json();
    json["added_tokens"] = {added_token("<a>", 300), added_token("<x>", 301)};
    json["added_tokens"][1]["id"] = "@ID@";
    CHECK_THAT(load_error(dir, with_id(json, id)),
               Contains("added_tokens[1].id is ") && Contains("expected an id in [0, 2^30)"));
  }
  auto json = valid_json();
  json["added_tokens"] = {added_token("<x>", 301)};
  CHECK(load_error(dir, json).empty());
}

TEST_CASE("merge errors") {
  TempDir dir;
  auto json = valid_json();
  json["model"]["merges"] = {"a b", "q z"};
  json["model"]["vocab"].erase("q");
  CHECK_THAT(load_error(dir, json), Contains("merge #1") && Contains("\"q\", not in the vocab"));
  json = valid_json();
  json["model"]["merges"] = {"a c"};
  CHECK_THAT(load_error(dir, json), Contains("makes \"ac\", not in the vocab"));
  json = valid_json();
  json["model"]["merges"] = {"ab"};
  CHECK_THAT(load_error(dir, json), Contains("model.merges[0]"));
  json["model"]["merges"] = {"a b c"};
  CHECK_THAT(load_error(dir, json), Contains("model.merges[0]"));
  json["model"]["merges"] = {{1, 2}};
  CHECK_THAT(load_error(dir, json), Contains("model.merges[0]"));
  json["model"]["merges"] = "a b";
  CHECK_THAT(load_error(dir, json), Contains("model.merges must be an array"));
}

TEST_CASE("unsupported model options") {
  TempDir dir;
  auto json = valid_json();
  json["model"]["dropout"] = 0.1;
  CHECK_THAT(load_error(dir, json), Contains("model.dropout"));
  json = valid_json();
  json["model"]["continuing_subword_prefix"] = "##";
  CHECK_THAT(load_error(dir, json), Contains("continuing_subword_prefix"));
  json = valid_json();
  json["model"]["unk_token"] = "<unk>";
  CHECK_THAT(load_error(dir, json), Contains("unk_token \"<unk>\" is not in the vocab"));
}

TEST_CASE("unsupported normalizer, pre-tokenizer and decoder components") {
  TempDir dir;
  auto json = valid_json();
  json["normalizer"] = {{"type", "NFKC"}};
  CHECK_THAT(load_error(dir, json), Contains("unsupported normalizer \"NFKC\""));
  json = valid_json();
  json["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  CHECK_THAT(load_error(dir, json), Contains("unsupported pre-tokenizer \"Metaspace\""));
  json = valid_json();
  json["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Removed"}};
  CHECK_THAT(load_error(dir, json), Contains("behavior \"Removed\" is not supported"));
  json["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
  CHECK_THAT(load_error(dir, json), Contains("does not compile"));
  json = valid_json();
  json["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}};
  CHECK_THAT(load_error(dir, json), Contains("\"Digits\" after ByteLevel"));
  json = valid_json();
  json["decoder"] = {{"type", "WordPiece"}};
  CHECK_THAT(load_error(dir, json), Contains("unsupported decoder \"WordPiece\""));
}

TEST_CASE("added token errors") {
  TempDir dir;
  auto json = valid_json();
  json["added_tokens"] = {added_token("<x>", 5)};  // id 5 is byte 5's
  CHECK_THAT(load_error(dir, json), Contains("\"<x>\" has id 5"));
  json["added_tokens"] = {added_token("<x>", 300), added_token("<x>", 301)};
  CHECK_THAT(load_error(dir, json), Contains("listed twice"));
  json["added_tokens"] = {added_token("", 300)};
  CHECK_THAT(load_error(dir, json), Contains("non-empty content"));
  json["added_tokens"] = {added_token("<x>", 300)};
  json["added_tokens"][0]["single_word"] = true;
  CHECK_THAT(load_error(dir, json), Contains("single_word"));
}

TEST_CASE("a pre-tokenizer or decoder Sequence nested very deeply is refused, not a crash") {
  TempDir dir;
  // 100,000 levels: any recursive walk of it (ours or a JSON copy) would overflow the stack.
  auto nested = [](const std::string& type, const std::string& key, const std::string& leaf) {
    std::string open, close;
    for (int i = 0; i < 100000; ++i) {
      open += "{\"type\": \"" + type + "\", \"" + key + "\": [";
      close += "]}";
    }
    return open + leaf + close;
  };
  for (const auto& [field, text] :
       {std::pair<std::string, std::string>{
            "pre_tokenizer", nested("Sequence", "pretokenizers", "{\"type\": \"ByteLevel\"}")},
        {"decoder", nested("Sequence", "decoders", "{\"type\": \"ByteLevel\"}")}}) {
    nlohmann::json base = valid_json();
    base[field] = "PLACEHOLDER";
    std::string document = base.dump();
    document.replace(document.find("\"PLACEHOLDER\""), 13, text);
    CHECK_THAT(load_error(dir, document), Contains("nested deeper than 64 levels"));
  }
}
