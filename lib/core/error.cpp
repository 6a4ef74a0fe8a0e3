#include "core/error.h"

namespace vlm {

std::string SourceLocation::str() const {
  std::string s = file;
  if (line > 0) {
    s += ":" + std::to_string(line);
    if (column > 0) s += ":" + std::to_string(column);
  }
  return s;
}

namespace {
std::string compose(const std::string& message, const SourceLocation& where) {
  return where.known() ? where.str() + ": " + message : message;
}
}  // namespace

Error::Error(ExitCode code, std::string message, SourceLocation where)
    : std::runtime_error(compose(message, where)),
      code_(code),
      message_(std::move(message)),
      where_(std::move(where)) {}

}  // namespace vlm
