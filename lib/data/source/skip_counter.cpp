#include "data/source/skip_counter.h"

#include <spdlog/spdlog.h>

#include "core/json_integer.h"

namespace vlm::data {

void SkipCounter::count_seen(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  seen_ += n;
}

void SkipCounter::skip(const std::string& reason, const std::string& message,
                       const SourceLocation& where) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t n = ++counts_[reason];
  ++skipped_;
  if (n <= log_first_) {
    spdlog::warn("{}: skipped sample ({}): {}{}", where.str(), reason, message,
                 n == log_first_ ? " (further '" + reason + "' skips are only counted)" : "");
  }
  const int64_t seen = std::max(seen_, skipped_);
  if (skipped_ >= min_count_ &&
      static_cast<double>(skipped_) > max_fraction_ * static_cast<double>(seen)) {
    std::string detail;
    for (const auto& [r, c] : counts_)
      detail += (detail.empty() ? "" : ", ") + r + ": " + std::to_string(c);
    throw DataError("too many malformed samples: " + std::to_string(skipped_) + " of " +
                        std::to_string(seen) + " skipped (" + detail +
                        "), above data.max_skipped_fraction; the last one was here",
                    where);
  }
}

int64_t SkipCounter::seen() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seen_;
}

int64_t SkipCounter::skipped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return skipped_;
}

std::map<std::string, int64_t> SkipCounter::by_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

nlohmann::json SkipCounter::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"seen", seen_}, {"skipped", skipped_}, {"by_reason", counts_}};
}

void SkipCounter::restore(const nlohmann::json& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  seen_ = json_integer<int64_t>(state.at("seen"));
  skipped_ = json_integer<int64_t>(state.at("skipped"));
  counts_ = state.at("by_reason").get<std::map<std::string, int64_t>>();
}

}  // namespace vlm::data
