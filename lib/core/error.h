// Errors and exit codes.
//
// Every failure a user can cause is an vlm::Error carrying the exit code the process ends
// with and, where it applies, the place (file:line of a config or manifest) it came from.
// main() prints `error: <where>: <what>` on one line and exits with the code; no stack traces.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vlm {

// Documented in README.md ("Exit codes"); job scripts rely on these numbers.
enum class ExitCode : int {
  kOk = 0,
  kInternal = 1,          // a bug: an unexpected exception
  kUsage = 2,             // bad command line or config (file:line in the message)
  kData = 3,              // dataset / manifest / image / tokenizer problems beyond the ceiling
  kTrainingFailed = 4,    // unrecoverable training failure (NaN loss streak, rank failure, ...)
  kOutOfMemory = 5,       // out of memory even at the smallest micro-batch split
  kDoesNotFit = 6,        // estimate-memory --check: the predicted peak exceeds the budget
  kSaveFailed = 7,        // a checkpoint or the run's own files (metrics.jsonl, config.yaml)
                          // could not be written (disk full, I/O error)
  kStoppedBySignal = 75,  // SIGTERM/SIGUSR1: checkpoint saved, requeue me (EX_TEMPFAIL)
};

// A position in a text input (config, manifest). line and column are 1-based; 0 = unknown.
struct SourceLocation {
  std::string file;
  int64_t line = 0;
  int64_t column = 0;

  bool known() const { return !file.empty(); }
  // "file:line:column", "file:line" or "file".
  std::string str() const;
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, std::string message, SourceLocation where = {});

  ExitCode code() const { return code_; }
  const SourceLocation& where() const { return where_; }
  const std::string& message() const { return message_; }

 private:
  ExitCode code_;
  std::string message_;
  SourceLocation where_;
};

// Convenience constructors, named for what went wrong.
class UsageError : public Error {
 public:
  explicit UsageError(std::string message, SourceLocation where = {})
      : Error(ExitCode::kUsage, std::move(message), std::move(where)) {}
};

class ConfigError : public Error {
 public:
  explicit ConfigError(std::string message, SourceLocation where = {})
      : Error(ExitCode::kUsage, std::move(message), std::move(where)) {}
};

class DataError : public Error {
 public:
  explicit DataError(std::string message, SourceLocation where = {})
      : Error(ExitCode::kData, std::move(message), std::move(where)) {}
};

}  // namespace vlm
