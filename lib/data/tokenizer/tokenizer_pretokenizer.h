// Pre-tokenisation: splits text into the pieces ("words") that BPE merges within, as the
// Hugging Face `Split` (behaviour Isolated), `Digits` and `ByteLevel` (use_regex) components do.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::data {

// GPT-2's split pattern, used by ByteLevel with use_regex (tokenizers/src/pre_tokenizers/
// byte_level.rs).
extern const char* const kGpt2SplitPattern;

// One PCRE2 pattern (UTF + Unicode properties, JIT compiled) applied with the Isolated
// behaviour: every match is a piece and so is every gap between matches. Immutable and safe to
// share between threads.
class RegexSplitter {
 public:
  // Throws std::invalid_argument with PCRE2's message when the pattern does not compile.
  explicit RegexSplitter(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the non-empty pieces of `text` to `pieces`, in order; they tile `text` exactly.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8 (kept opaque so users need not include pcre2.h)
  bool jit_compiled_ = false;
};

// The pre-tokenizer of a tokenizer.json, flattened: regex splits applied one after the other to
// every piece, then (for ByteLevel with add_prefix_space) a leading space added to each piece
// that lacks one before the last split.
class PreTokenizer {
 public:
  void add_split(std::shared_ptr<const RegexSplitter> splitter);
  // ByteLevel's add_prefix_space: applies to the pieces entering the next added split (or to
  // the final pieces when no split follows).
  void add_prefix_space_before_next_split() { prefix_space_at_step_ = steps_.size(); }

  bool empty() const {
    return steps_.empty() && prefix_space_at_step_ == static_cast<std::size_t>(-1);
  }

  // Splits `text` into `pieces`; pieces that gained a prefix space live in `scratch`.
  void split(std::string_view text, std::vector<std::string_view>& pieces,
             std::deque<std::string>& scratch) const;

 private:
  std::vector<std::shared_ptr<const RegexSplitter>> steps_;
  std::size_t prefix_space_at_step_ = static_cast<std::size_t>(-1);
};

}  // namespace vlm::data
