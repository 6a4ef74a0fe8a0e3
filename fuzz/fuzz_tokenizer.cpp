// tokenizer.json: Tokenizer::from_file plus what DataSetup does next (add_image_tokens, the
// ChatML template's token lookups), then encode and decode (data/tokenizer/tokenizer.h).
// Input: the tokenizer.json text, then optionally a NUL byte and a text to encode (a fixed
// sentence otherwise). Invariants: every encoded id is in [0, vocab_size()); decode always
// returns valid UTF-8; an id outside the vocabulary is a DataError.
#include <string>
#include <vector>

#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/tokenizer_image_tokens.h"
#include "data/tokenizer/utf8.h"
#include "fuzz_support.h"

using namespace vlm::data;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts =
      vlm::fuzz::split_at_nul(std::string_view(reinterpret_cast<const char*>(data), size));
  const std::string_view json_text = parts.first;
  const std::string_view fuzzed_text = parts.second;
  const std::string_view text =
      fuzzed_text.empty() ? std::string_view("Hello world! 12345 <|im_end|>\n\xc3\xa9t\xc3\xa9")
                          : fuzzed_text;
  vlm::fuzz::guard("tokenizer", [&] {
    const std::string path = vlm::fuzz::write_scratch("tokenizer.json", json_text);
    Tokenizer tokenizer = Tokenizer::from_file(path);
    const std::vector<int32_t> ids = tokenizer.encode(text);
    for (const int32_t id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) {
        vlm::fuzz::invariant_failed("tokenizer", "encode produced id " + std::to_string(id));
      }
    }
    const std::string decoded = tokenizer.decode(ids);
    if (!is_valid_utf8(decoded)) vlm::fuzz::invariant_failed("tokenizer", "decode: bad UTF-8");
    try {
      tokenizer.decode({static_cast<int32_t>(tokenizer.vocab_size())});
      vlm::fuzz::invariant_failed("tokenizer", "decode accepted an id past the vocabulary");
    } catch (const vlm::DataError&) {
    }
    add_image_tokens(tokenizer);
    const ChatTemplate chat(tokenizer, 4);
    chat.apply({{ChatRole::kUser, std::string(text)}, {ChatRole::kAssistant, "yes"}}, {});
  });
  return 0;
}
