// The members of an uncompressed tar archive, read with libarchive, with where each one's
// bytes lie: a tar stores a member as header records (ustar, PAX extended headers, GNU long
// names) followed by its data padded to 512 bytes, so a member's data start where the next
// member's headers start, less its padded size. A WebDataset shard's index and samples are
// built from these offsets (tar_index.h, shard_sample.h), and the loader reads an image's
// bytes with one positioned read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

struct archive;  // libarchive's handle

namespace vlm::data {

class ReadOnlyFile;

// A member too large for any shard this tool reads (a damaged or hostile size field).
inline constexpr uint64_t kMaxTarMemberBytes = uint64_t{1} << 40;

struct TarMember {
  std::string name;     // as stored (PAX and GNU long names resolved)
  uint64_t header = 0;  // first byte of its header records
  uint64_t data = 0;    // first byte of its data (plain files only)
  uint64_t size = 0;    // of its data
  // A plain file: not a folder, link, device, FIFO or sparse file.
  bool regular = false;
  std::string kind;  // what it is otherwise ("a folder", "a symbolic link", ...), for messages
};

class TarReader {
 public:
  // Reads `file` from its start; `file` must outlive the reader.
  explicit TarReader(const ReadOnlyFile& file);
  // Reads `size` bytes of memory that start at byte `base` of the shard `name`; offsets are
  // reported in the shard's terms.
  TarReader(const char* data, size_t size, uint64_t base, std::string name);
  ~TarReader();
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // The next member, or nullopt after the last. DataError naming the archive and the member
  // it reached for a truncated archive, a damaged header or a file that is no tar.
  std::optional<TarMember> next();
  // Where the members end (the end-of-archive records, or the end of the bytes); valid once
  // next() has returned nullopt.
  uint64_t end() const { return end_; }

 private:
  struct Source;
  std::optional<TarMember> read_header();  // the following member, data offset still unknown
  [[noreturn]] void fail(const std::string& what) const;
  [[noreturn]] void fail_in_constructor();

  std::string name_;
  uint64_t base_ = 0;
  std::unique_ptr<Source> source_;
  archive* archive_ = nullptr;
  std::optional<TarMember> pending_;  // read, waiting for the next header to place its data
  bool started_ = false;
  bool done_ = false;
  uint64_t end_ = 0;
};

// WebDataset's sample key of a member: its path up to the first dot of its basename
// ("a/b.0.jpg" -> "a/b"); nullopt when the basename has no dot or starts with one.
std::optional<std::string> webdataset_key(const std::string& member_name);

}  // namespace vlm::data
