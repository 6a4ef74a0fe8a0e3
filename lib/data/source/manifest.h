// Dataset manifests: JSONL files, one sample per line, in one of two styles, with image
// paths relative to the manifest.
//
//   the_cauldron: {"images": ["a.jpg"], "texts": [{"user": "...", "assistant": "..."}]}
//   LLaVA:        {"image": "a.jpg", "conversations": [{"from": "human", "value": "<image>\n..."},
//                                                      {"from": "gpt", "value": "..."}]}
//
// A Manifest indexes line offsets once and reads lines on demand (pread: safe from several
// loader threads), so a million-line manifest costs 8 MB of offsets, not its text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.h"
#include "data/source/sample_reader.h"
#include "data/tokenizer/conversation.h"

namespace vlm::data {

// Limits of a manifest line (docs: the skip reasons in docs/inspect-batches.md):
//  * a sample line longer than kMaxSampleLineBytes is skipped ("line_too_long");
//  * a line longer than kMaxIndexedLineBytes stops the indexing with a DataError: the file is
//    no JSONL manifest (an endless stream such as /dev/zero would otherwise be read forever);
//  * a sample listing more than kMaxImagesPerSample images is skipped ("too_many_image_paths")
//    before any image header is probed.
inline constexpr uint64_t kMaxSampleLineBytes = 4u << 20;
inline constexpr uint64_t kMaxIndexedLineBytes = 64u << 20;
inline constexpr size_t kMaxImagesPerSample = 1024;
// Parses one JSONL line. Never throws for bad content: problems come back as SampleProblem.
ParsedLine parse_manifest_line(std::string_view line, DatasetFormat format,
                               const std::string& manifest_dir, const SourceLocation& where);

class Manifest : public SampleReader {
 public:
  // Indexes the non-blank lines. Throws DataError when the file is missing, unreadable or
  // has no samples.
  Manifest(const std::string& path, DatasetFormat format);
  ~Manifest();
  Manifest(const Manifest&) = delete;
  Manifest& operator=(const Manifest&) = delete;

  const std::string& path() const override { return path_; }
  size_t size() const override { return offsets_.size(); }
  // Sample `index` (0-based among non-blank lines); thread-safe.
  ParsedLine read(size_t index) const override;
  // manifest:line of sample `index`.
  SourceLocation where(size_t index) const override { return {path_, line_numbers_.at(index)}; }
  // 1-based line number of sample `index` in the file.
  int64_t line_number(size_t index) const { return line_numbers_[index]; }

 private:
  std::string path_;
  std::string dir_;
  DatasetFormat format_;
  int fd_ = -1;
  std::vector<uint64_t> offsets_;  // start of each non-blank line
  std::vector<uint32_t> lengths_;
  std::vector<int64_t> line_numbers_;
};

}  // namespace vlm::data
