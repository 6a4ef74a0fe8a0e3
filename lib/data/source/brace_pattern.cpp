#include "data/source/brace_pattern.h"

#include <cctype>
#include <cstdint>

#include "core/error.h"

namespace vlm::data {
namespace {

[[noreturn]] void fail(const std::string& pattern, const std::string& why) {
  throw ConfigError("shard pattern '" + pattern + "': " + why);
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;  // within int64 without overflow
  for (const char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The alternatives of one group's body: "a..b" (numbers) or "x,y,z".
std::vector<std::string> alternatives(const std::string& body, const std::string& pattern) {
  const size_t dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string from = body.substr(0, dots), to = body.substr(dots + 2);
    if (!all_digits(from) || !all_digits(to)) {
      fail(pattern, "range {" + body + "} must be two unsigned numbers of at most 18 digits");
    }
    const int64_t lo = std::stoll(from), hi = std::stoll(to);
    if (hi < lo) fail(pattern, "range {" + body + "} runs backwards");
    if (static_cast<uint64_t>(hi - lo) >= kMaxBraceExpansion) {
      fail(pattern, "range {" + body + "} names more than " + std::to_string(kMaxBraceExpansion) +
                        " shards");
    }
    std::vector<std::string> out;
    for (int64_t i = lo; i <= hi; ++i) {
      std::string number = std::to_string(i);
      if (number.size() < from.size()) number.insert(0, from.size() - number.size(), '0');
      out.push_back(std::move(number));
    }
    return out;
  }
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = body.find(',', start);
    out.push_back(body.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.size() < 2) fail(pattern, "group {" + body + "} is neither a range a..b nor a list a,b");
  return out;
}

}  // namespace

bool has_brace_pattern(const std::string& text) { return text.find('{') != std::string::npos; }

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> names{""};
  size_t pos = 0;
  while (pos < pattern.size()) {
    const size_t open = pattern.find('{', pos);
    const size_t close_before = pattern.find('}', pos);
    if (close_before < open) fail(pattern, "'}' without '{'");
    const std::string literal = pattern.substr(pos, open - pos);
    for (std::string& n : names) n += literal;
    if (open == std::string::npos) break;
    const size_t close = pattern.find('}', open);
    if (close == std::string::npos) fail(pattern, "'{' without '}'");
    const std::string body = pattern.substr(open + 1, close - open - 1);
    if (body.find('{') != std::string::npos) fail(pattern, "nested braces");
    if (body.empty()) fail(pattern, "empty group {}");
    const std::vector<std::string> alts = alternatives(body, pattern);
    if (names.size() * alts.size() > kMaxBraceExpansion) {
      fail(pattern, "names more than " + std::to_string(kMaxBraceExpansion) + " shards");
    }
    std::vector<std::string> next;
    next.reserve(names.size() * alts.size());
    for (const std::string& n : names) {
      for (const std::string& a : alts) next.push_back(n + a);
    }
    names = std::move(next);
    pos = close + 1;
  }
  return names;
}

}  // namespace vlm::data
