// Counts samples skipped as malformed, by reason, and enforces the configured ceiling.
//
// A corrupt line or image never stops a run by itself: it is counted, the first few of each
// reason are logged with their file:line, and the run goes on. Only when more than
// `max_fraction` of the samples seen are skipped (and at least `min_count`) does the run stop
// with a DataError, because then the data, not a sample, is broken.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace vlm::data {

class SkipCounter {
 public:
  SkipCounter(double max_fraction, int64_t min_count, int log_first = 3)
      : max_fraction_(max_fraction), min_count_(min_count), log_first_(log_first) {}
  // A fresh counter with the same limits.
  SkipCounter(const SkipCounter& limits)
      : SkipCounter(limits.max_fraction_, limits.min_count_, limits.log_first_) {}
  SkipCounter& operator=(const SkipCounter&) = delete;

  void count_seen(int64_t n = 1);
  // Counts one skipped sample; logs it if it is among the first of its reason; throws
  // DataError when the ceiling is crossed.
  void skip(const std::string& reason, const std::string& message, const SourceLocation& where);

  int64_t seen() const;
  int64_t skipped() const;
  std::map<std::string, int64_t> by_reason() const;
  nlohmann::json to_json() const;
  void restore(const nlohmann::json& state);

 private:
  mutable std::mutex mutex_;
  double max_fraction_;
  int64_t min_count_;
  int log_first_;
  int64_t seen_ = 0;
  int64_t skipped_ = 0;
  std::map<std::string, int64_t> counts_;
};

}  // namespace vlm::data
