// Tokenizer throughput on ~4 MB of generated English-like text with a GPT-2-sized byte-level
// BPE (50,257 tokens, ~50k merges) built here from the same text, saved as tokenizer.json and
// loaded through Tokenizer::from_file. Deterministic: fixed seed, own sampling code.
//
//   ./build/bench/bench_tokenizer [megabytes=4]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/tokenizer_byte_level.h"
#include "data/tokenizer/tokenizer_pretokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using vlm::data::Tokenizer;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Pseudo-words from syllables, with real function words at the top ranks.
std::vector<std::string> make_dictionary(std::mt19937_64& rng, std::size_t size) {
  std::vector<std::string> words = {"the",  "of",   "and", "to",   "a",   "in",  "is",  "it",
                                    "you",  "that", "he",  "was",  "for", "on",  "are", "with",
                                    "as",   "I",    "his", "they", "be",  "at",  "one", "have",
                                    "this", "from", "or",  "had",  "by",  "not", "but", "what"};
  const std::vector<std::string> syllables = {
      "ka",  "ter", "in",   "ing", "re",  "con", "tion", "al",  "de",  "com",
      "pro", "ly",  "ment", "er",  "an",  "ex",  "ble",  "per", "ous", "ness",
      "st",  "ar",  "or",   "ic",  "ver", "sh",  "ow",   "en",  "ti",  "lo",
      "ma",  "ne",  "ri",   "th",  "ch",  "qu",  "ph",   "ge",  "ba",  "mo"};
  const std::vector<std::string> accented = {"caf\xC3\xA9", "na\xC3\xAFve",
                                             "\xC3\xBC"
                                             "ber",
                                             "se\xC3\xB1or", "\xC3\xA9t\xC3\xA9"};
  while (words.size() < size) {
    std::string word;
    const std::size_t count = 1 + rng() % 4;
    for (std::size_t i = 0; i < count; ++i) word += syllables[rng() % syllables.size()];
    if (rng() % 50 == 0) word += accented[rng() % accented.size()];
    words.push_back(word);
  }
  return words;
}

// Zipf(1) ranks over the dictionary, numbers, punctuation, and a little CJK and emoji.
std::string make_corpus(std::size_t target_bytes) {
  std::mt19937_64 rng(20261121);
  const auto dictionary = make_dictionary(rng, 30000);
  std::vector<double> cumulative(dictionary.size());
  double total = 0;
  for (std::size_t rank = 0; rank < dictionary.size(); ++rank) {
    total += 1.0 / static_cast<double>(rank + 1);
    cumulative[rank] = total;
  }
  const auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  const std::vector<std::string> rare = {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",  // 日本語
                                         "\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
                                         "\xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"};
  std::string text;
  text.reserve(target_bytes + 1024);
  while (text.size() < target_bytes) {
    const std::size_t sentence_words = 5 + rng() % 21;
    for (std::size_t i = 0; i < sentence_words; ++i) {
      std::string word;
      const uint64_t kind = rng() % 100;
      if (kind < 3) {
        word = std::to_string(rng() % 100000);
      } else if (kind < 4) {
        word = rare[rng() % rare.size()];
      } else {
        const auto it = std::lower_bound(cumulative.begin(), cumulative.end(), uniform() * total);
        word = dictionary[std::min<std::size_t>(it - cumulative.begin(), dictionary.size() - 1)];
      }
      if (i == 0 && word[0] >= 'a' && word[0] <= 'z') word[0] = static_cast<char>(word[0] - 32);
      text += word;
      if (i + 1 < sentence_words) text += rng() % 12 == 0 ? ", " : " ";
    }
    const uint64_t end = rng() % 10;
    text += end < 7 ? ". " : end < 9 ? "? " : "!\n\n";
    if (rng() % 6 == 0) text += "\n";
  }
  return text;
}

// A 50,257-token vocabulary: the 256 bytes, then for the most frequent pre-tokens (GPT-2 split)
// the chain of merges that builds each one left to right, most frequent first.
nlohmann::json make_tokenizer_json(const std::string& corpus, std::size_t vocab_target) {
  vlm::data::RegexSplitter splitter(vlm::data::kGpt2SplitPattern);
  std::vector<std::string_view> pieces;
  splitter.split(corpus, pieces);
  std::unordered_map<std::string_view, uint64_t> counts;
  for (const auto piece : pieces) ++counts[piece];
  std::vector<std::pair<std::string_view, uint64_t>> by_count(counts.begin(), counts.end());
  std::sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  nlohmann::json vocab = nlohmann::json::object();
  const auto& alphabet = vlm::data::byte_level_alphabet();
  for (int byte = 0; byte < 256; ++byte) vocab[alphabet[byte]] = byte;
  nlohmann::json merges = nlohmann::json::array();
  int32_t next_id = 256;
  for (const auto& [word, count] : by_count) {
    std::string prefix = alphabet[static_cast<unsigned char>(word[0])];
    for (std::size_t i = 1; i < word.size() && next_id < static_cast<int32_t>(vocab_target); ++i) {
      const std::string& next = alphabet[static_cast<unsigned char>(word[i])];
      const std::string merged = prefix + next;
      if (!vocab.contains(merged)) {
        vocab[merged] = next_id++;
        merges.push_back(prefix + " " + next);
      }
      prefix = merged;
    }
    if (next_id >= static_cast<int32_t>(vocab_target)) break;
  }
  nlohmann::json json;
  json["added_tokens"] = {{{"id", next_id}, {"content", "<|endoftext|>"}, {"special", true}}};
  json["normalizer"] = nullptr;
  json["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json["decoder"] = {{"type", "ByteLevel"}};
  json["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  return json;
}

// ~1 KB documents, as a loader would pass samples.
std::vector<std::string_view> split_documents(const std::string& corpus) {
  std::vector<std::string_view> documents;
  std::size_t begin = 0;
  while (begin < corpus.size()) {
    std::size_t end = std::min(corpus.size(), begin + 1024);
    while (end < corpus.size() && corpus[end] != ' ') ++end;
    documents.push_back(std::string_view(corpus).substr(begin, end - begin));
    begin = end;
  }
  return documents;
}

struct Pass {
  double seconds = 0;
  uint64_t tokens = 0;
};

Pass encode_all(const Tokenizer& tokenizer, const std::vector<std::string_view>& documents,
                std::size_t first, std::size_t stride) {
  Pass pass;
  const auto start = Clock::now();
  std::vector<int32_t> ids;
  for (std::size_t i = first; i < documents.size(); i += stride) {
    ids.clear();
    tokenizer.encode_into(documents[i], ids);
    pass.tokens += ids.size();
  }
  pass.seconds = seconds_since(start);
  return pass;
}

void report(const char* name, const Pass& pass, std::size_t bytes) {
  std::printf("%-34s %8.3f s  %6.2f MB/s  %10.0f tokens/s  (%llu tokens)\n", name, pass.seconds,
              bytes / pass.seconds / 1e6, pass.tokens / pass.seconds,
              static_cast<unsigned long long>(pass.tokens));
}

}  // namespace

int main(int argc, char** argv) {
  const double megabytes = argc > 1 ? std::stod(argv[1]) : 4.0;
  auto start = Clock::now();
  const std::string corpus = make_corpus(static_cast<std::size_t>(megabytes * 1e6));
  const auto documents = split_documents(corpus);
  std::printf("corpus: %zu bytes, %zu documents (generated in %.2f s)\n", corpus.size(),
              documents.size(), seconds_since(start));

  start = Clock::now();
  const auto json = make_tokenizer_json(corpus, 50257);
  const auto path = std::filesystem::temp_directory_path() / "bench_tokenizer.json";
  std::ofstream(path) << json.dump();
  std::printf("tokenizer.json: %zu merges, %.1f MB (built in %.2f s)\n",
              json["model"]["merges"].size(), std::filesystem::file_size(path) / 1e6,
              seconds_since(start));

  start = Clock::now();
  const Tokenizer bpe = Tokenizer::from_file(path.string());
  std::printf("from_file: %.3f s, vocab_size %lld\n", seconds_since(start),
              static_cast<long long>(bpe.vocab_size()));
  std::filesystem::remove(path);

  report("bpe encode, cold cache (1 thread)", encode_all(bpe, documents, 0, 1), corpus.size());
  const Pass warm = encode_all(bpe, documents, 0, 1);
  report("bpe encode, warm cache (1 thread)", warm, corpus.size());

  Pass threads[2];
  start = Clock::now();
  std::thread other([&] { threads[1] = encode_all(bpe, documents, 1, 2); });
  threads[0] = encode_all(bpe, documents, 0, 2);
  other.join();
  report("bpe encode, warm cache (2 threads)",
         {seconds_since(start), threads[0].tokens + threads[1].tokens}, corpus.size());

  const Tokenizer bytes = Tokenizer::builtin_bytes();
  report("builtin byte tokenizer encode", encode_all(bytes, documents, 0, 1), corpus.size());

  std::vector<std::vector<int32_t>> encoded;
  for (const auto document : documents) encoded.push_back(bpe.encode(document));
  start = Clock::now();
  std::size_t decoded_bytes = 0, mismatched_documents = 0;
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    const std::string text = bpe.decode(encoded[i]);
    decoded_bytes += text.size();
    mismatched_documents += text != documents[i];
  }
  const double decode_seconds = seconds_since(start);
  std::printf("%-34s %8.3f s  %6.2f MB/s  %10.0f tokens/s  (round trip %s)\n", "bpe decode",
              decode_seconds, decoded_bytes / decode_seconds / 1e6, warm.tokens / decode_seconds,
              mismatched_documents == 0 ? "exact" : "MISMATCH");
  std::printf("bytes per token: %.2f\n", static_cast<double>(corpus.size()) / warm.tokens);
  return 0;
}
