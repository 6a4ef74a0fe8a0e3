#include "data/tokenizer/tokenizer_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include "core/error.h"
#include "data/tokenizer/utf8.h"

namespace vlm::data {

const char* const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

std::string pcre2_message(int error_code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Per-thread match state: match data with room for the whole-match offsets and a JIT stack
// large enough for long runs of whitespace or letters (PCRE2's default is 32 KiB).
class ThreadMatchState {
 public:
  ThreadMatchState()
      : match_data_(pcre2_match_data_create(1, nullptr)),
        context_(pcre2_match_context_create(nullptr)),
        jit_stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(match_data_);
  }
  pcre2_match_data* match_data() { return match_data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* match_data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* jit_stack_;
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

RegexSplitter::RegexSplitter(const std::string& pattern) : pattern_(pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: text with invalid UTF-8 is matched (invalid bytes never match) instead
  // of being rejected, so no input bytes can make encoding fail.
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    throw std::invalid_argument("regex does not compile at offset " + std::to_string(error_offset) +
                                ": " + pcre2_message(error_code));
  }
  code_ = code;
  jit_compiled_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& state = thread_match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t gap_begin = 0;
  std::size_t search_from = 0;
  while (search_from <= text.size()) {
    const int rc = jit_compiled_ ? pcre2_jit_match(code, subject, text.size(), search_from, 0,
                                                   state.match_data(), state.context())
                                 : pcre2_match(code, subject, text.size(), search_from, 0,
                                               state.match_data(), state.context());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw DataError("tokenizer pre-tokenizer regex failed on the input text: " +
                      pcre2_message(rc) + " (pattern " + pattern_ + ")");
    }
    const PCRE2_SIZE* offsets = pcre2_get_ovector_pointer(state.match_data());
    const std::size_t match_begin = offsets[0], match_end = offsets[1];
    if (match_end == match_begin) {
      // An empty match splits nothing (HF drops empty pieces); step over one character.
      if (match_begin >= text.size()) break;
      const std::size_t step = utf8_sequence_length(text, match_begin);
      search_from = match_begin + (step == 0 ? 1 : step);
      continue;
    }
    if (match_begin > gap_begin) pieces.push_back(text.substr(gap_begin, match_begin - gap_begin));
    pieces.push_back(text.substr(match_begin, match_end - match_begin));
    gap_begin = search_from = match_end;
  }
  if (gap_begin < text.size()) pieces.push_back(text.substr(gap_begin));
}

void PreTokenizer::add_split(std::shared_ptr<const RegexSplitter> splitter) {
  steps_.push_back(std::move(splitter));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces,
                         std::deque<std::string>& scratch) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (std::size_t step = 0; step < steps_.size(); ++step) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (step == prefix_space_at_step_ && piece.front() != ' ') {
        scratch.push_back(" " + std::string(piece));
        piece = scratch.back();
      }
      steps_[step]->split(piece, next);
    }
    pieces.swap(next);
  }
  if (prefix_space_at_step_ == steps_.size()) {  // ByteLevel without its own regex split
    for (std::string_view& piece : pieces) {
      if (piece.front() == ' ') continue;
      scratch.push_back(" " + std::string(piece));
      piece = scratch.back();
    }
  }
}

}  // namespace vlm::data
