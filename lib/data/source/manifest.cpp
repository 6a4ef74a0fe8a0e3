#include "data/source/manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/json_depth.h"

namespace vlm::data {
namespace {

using nlohmann::json;

SampleProblem problem(std::string reason, std::string message) {
  return SampleProblem{std::move(reason), std::move(message), {}};
}

ImageRef resolve(const std::string& image, const std::string& dir) {
  if (image.empty() || image.front() == '/' || dir.empty()) return ImageRef{image, {}, 0, 0};
  return ImageRef{(std::filesystem::path(dir) / image).string(), {}, 0, 0};
}

// The value of `key` in the object `j`, or null when it is absent. (A const json's operator[]
// must not be asked for a missing key: nlohmann::json leaves that undefined, and it reads freed
// memory.)
const json& field(const json& j, const char* key) {
  static const json kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// the_cauldron: "images": [paths] (optional), "texts": [{"user", "assistant"}, ...]
ParsedLine parse_cauldron(const json& j, const std::string& dir, RawSample sample) {
  if (j.contains("images") && !j["images"].is_null()) {
    if (!j["images"].is_array()) return problem("bad_schema", "\"images\" must be a list of paths");
    for (const auto& image : j["images"]) {
      if (!image.is_string()) return problem("bad_schema", "\"images\" entries must be strings");
      sample.images.push_back(resolve(image.get<std::string>(), dir));
    }
  }
  const json& texts = field(j, "texts");
  if (!texts.is_array() || texts.empty()) {
    return problem("bad_schema", "\"texts\" must be a non-empty list of {user, assistant}");
  }
  for (const auto& exchange : texts) {
    if (!exchange.is_object() || !exchange.contains("user") || !exchange["user"].is_string() ||
        !exchange.contains("assistant") || !exchange["assistant"].is_string()) {
      return problem("bad_schema", "each \"texts\" entry needs string \"user\" and \"assistant\"");
    }
    sample.turns.push_back({ChatRole::kUser, exchange["user"].get<std::string>()});
    sample.turns.push_back({ChatRole::kAssistant, exchange["assistant"].get<std::string>()});
  }
  return sample;
}

// LLaVA: "image": path or [paths] (optional), "conversations": [{"from", "value"}, ...]
ParsedLine parse_llava(const json& j, const std::string& dir, RawSample sample) {
  if (j.contains("image") && !j["image"].is_null()) {
    const auto& image = j["image"];
    if (image.is_string()) {
      sample.images.push_back(resolve(image.get<std::string>(), dir));
    } else if (image.is_array()) {
      for (const auto& i : image) {
        if (!i.is_string()) return problem("bad_schema", "\"image\" entries must be strings");
        sample.images.push_back(resolve(i.get<std::string>(), dir));
      }
    } else {
      return problem("bad_schema", "\"image\" must be a path or a list of paths");
    }
  }
  const json& conversations = field(j, "conversations");
  if (!conversations.is_array() || conversations.empty()) {
    return problem("bad_schema", "\"conversations\" must be a non-empty list");
  }
  for (const auto& message : conversations) {
    if (!message.is_object() || !message.contains("from") || !message["from"].is_string() ||
        !message.contains("value") || !message["value"].is_string()) {
      return problem("bad_schema", "each conversation entry needs string \"from\" and \"value\"");
    }
    const std::string from = message["from"].get<std::string>();
    ChatRole role;
    if (from == "human" || from == "user") {
      role = ChatRole::kUser;
    } else if (from == "gpt" || from == "assistant") {
      role = ChatRole::kAssistant;
    } else {
      return problem("unsupported_role",
                     "conversation role \"" + from + "\" (supported: human/user, gpt/assistant)");
    }
    sample.turns.push_back({role, message["value"].get<std::string>()});
  }
  return sample;
}

}  // namespace

ParsedLine parse_manifest_line(std::string_view line, DatasetFormat format,
                               const std::string& manifest_dir, const SourceLocation& where) {
  if (json_nesting_depth(line) > kMaxJsonDepth) {
    return problem("malformed_json",
                   "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return problem("malformed_json", "not a valid JSON object");
  if (!j.is_object()) return problem("malformed_json", "a line must be a JSON object");
  if (format == DatasetFormat::kAuto || format == DatasetFormat::kWebDataset) {
    if (j.contains("texts")) {
      format = DatasetFormat::kCauldron;
    } else if (j.contains("conversations")) {
      format = DatasetFormat::kLlava;
    } else {
      return problem("bad_schema",
                     "neither \"texts\" (the_cauldron) nor \"conversations\" (LLaVA)");
    }
  }
  RawSample sample;
  sample.where = where;
  ParsedLine parsed = format == DatasetFormat::kCauldron ? parse_cauldron(j, manifest_dir, sample)
                                                         : parse_llava(j, manifest_dir, sample);
  if (auto* s = std::get_if<RawSample>(&parsed)) {
    if (s->images.size() > kMaxImagesPerSample) {
      return problem("too_many_image_paths", std::to_string(s->images.size()) +
                                                 " images listed; a sample may list at most " +
                                                 std::to_string(kMaxImagesPerSample));
    }
    if (s->turns.front().role != ChatRole::kUser) {
      return problem("bad_schema", "the conversation must start with a user turn");
    }
    bool any_assistant = false;
    for (const auto& t : s->turns)
      any_assistant |= t.role == ChatRole::kAssistant && !t.text.empty();
    if (!any_assistant)
      return problem("no_assistant_turn", "no non-empty assistant turn to learn from");
  }
  return parsed;
}

Manifest::Manifest(const std::string& path, DatasetFormat format) : path_(path), format_(format) {
  dir_ = std::filesystem::path(path).parent_path().string();
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw DataError(std::string("cannot open manifest: ") + std::strerror(errno),
                    SourceLocation{path});
  }
  // One sequential pass to index lines.
  std::vector<char> buffer(1 << 20);
  uint64_t offset = 0;
  uint64_t line_start = 0;
  int64_t line = 1;
  bool blank = true;
  auto end_line = [&](uint64_t end) {
    if (!blank) {
      offsets_.push_back(line_start);
      lengths_.push_back(static_cast<uint32_t>(std::min<uint64_t>(end - line_start, UINT32_MAX)));
      line_numbers_.push_back(line);
    }
    ++line;
    line_start = end + 1;
    blank = true;
  };
  for (;;) {
    const ssize_t n = ::read(fd_, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError(std::string("cannot read manifest: ") + std::strerror(errno),
                      SourceLocation{path});
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      const char c = buffer[static_cast<size_t>(i)];
      if (c == '\n') {
        end_line(offset + static_cast<uint64_t>(i));
      } else if (c != ' ' && c != '\t' && c != '\r') {
        blank = false;
      }
    }
    offset += static_cast<uint64_t>(n);
    if (offset - line_start > kMaxIndexedLineBytes) {
      throw DataError("line " + std::to_string(line) + " runs past " +
                          std::to_string(kMaxIndexedLineBytes >> 20) +
                          " MiB without a newline: not a JSONL manifest",
                      SourceLocation{path, line});
    }
  }
  end_line(offset);
  if (offsets_.empty()) throw DataError("manifest has no samples", SourceLocation{path});
}

Manifest::~Manifest() {
  if (fd_ >= 0) ::close(fd_);
}

ParsedLine Manifest::read(size_t index) const {
  const SourceLocation where{path_, line_numbers_.at(index)};
  if (lengths_[index] > kMaxSampleLineBytes) {
    return problem("line_too_long",
                   "line is longer than " + std::to_string(kMaxSampleLineBytes >> 20) + " MiB");
  }
  std::string line(lengths_[index], '\0');
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::pread(fd_, line.data() + done, line.size() - done,
                              static_cast<off_t>(offsets_[index] + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return problem("read_error", "cannot read line: " + std::string(std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return parse_manifest_line(line, format_, dir_, where);
}

}  // namespace vlm::data
