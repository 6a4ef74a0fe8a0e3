// The chat template: ChatTemplate::apply (data/tokenizer/chat_template.h) over fuzzed turns and
// image grids, with the tokenizer DataSetup builds for builtin:bytes (image tokens added).
// Input, read with FuzzedDataProvider: image tokens per crop (1-16), image grids (rows, cols:
// 0-9 so that out-of-range grids are tried), then turns (a role and a text each). Invariants of
// an accepted sample: ids and the supervision mask have the same length, every id is in the
// vocabulary, the counts match the mask and the grids, and supervised tokens are never image
// tokens.
#include <fuzzer/FuzzedDataProvider.h>

#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/tokenizer_image_tokens.h"
#include "fuzz_support.h"

using namespace vlm::data;

namespace {
std::unique_ptr<Tokenizer> g_tokenizer;
ImageTokenIds g_ids;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  g_tokenizer = std::make_unique<Tokenizer>(Tokenizer::builtin_bytes());
  g_ids = add_image_tokens(*g_tokenizer);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int64_t per_crop = in.ConsumeIntegralInRange<int64_t>(1, 16);
  std::vector<ImageGrid> grids(in.ConsumeIntegralInRange<size_t>(0, 6));
  for (ImageGrid& grid : grids) {
    grid.rows = in.ConsumeIntegralInRange<int64_t>(0, 9);
    grid.cols = in.ConsumeIntegralInRange<int64_t>(0, 9);
    grid.resized_width = grid.cols * 64;
    grid.resized_height = grid.rows * 64;
  }
  std::vector<ChatTurn> turns;
  while (in.remaining_bytes() > 0 && turns.size() < 16) {
    ChatTurn turn;
    turn.role = in.ConsumeBool() ? ChatRole::kAssistant : ChatRole::kUser;
    turn.text = in.ConsumeRandomLengthString(4096);
    turns.push_back(std::move(turn));
  }
  vlm::fuzz::guard("chat_template", [&] {
    const ChatTemplate chat(*g_tokenizer, per_crop);
    const TokenizedSample s = chat.apply(turns, grids);
    int64_t supervised = 0;
    int64_t image_slots = 0;
    if (s.supervised.size() != s.ids.size()) {
      vlm::fuzz::invariant_failed("chat_template", "mask and ids differ in length");
    }
    for (size_t i = 0; i < s.ids.size(); ++i) {
      if (s.ids[i] < 0 || s.ids[i] >= g_tokenizer->vocab_size()) {
        vlm::fuzz::invariant_failed("chat_template", "id out of the vocabulary");
      }
      supervised += s.supervised[i];
      if (s.ids[i] == g_ids.image) {
        ++image_slots;
        if (s.supervised[i]) vlm::fuzz::invariant_failed("chat_template", "supervised image");
      }
    }
    int64_t crops = 0;
    for (const ImageGrid& grid : grids) crops += grid.crops();
    if (supervised != s.supervised_tokens || image_slots != s.image_tokens ||
        s.images != static_cast<int64_t>(grids.size()) || s.crops != crops ||
        s.image_tokens != crops * per_crop) {
      vlm::fuzz::invariant_failed("chat_template", "counts disagree with the ids");
    }
  });
  return 0;
}
