#include "data/source/tar_reader.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "core/error.h"
#include "data/source/open_files.h"

namespace vlm::data {
namespace {

constexpr uint64_t kRecord = 512;
constexpr size_t kReadBlock = 64 * 1024;

uint64_t padded(uint64_t size) { return (size + kRecord - 1) / kRecord * kRecord; }

const char* kind_of(archive_entry* entry) {
  switch (archive_entry_filetype(entry)) {
    case AE_IFDIR:
      return "a folder";
    case AE_IFLNK:
      return "a symbolic link";
    case AE_IFCHR:
    case AE_IFBLK:
      return "a device";
    case AE_IFIFO:
      return "a FIFO";
    case AE_IFSOCK:
      return "a socket";
    default:
      return "not a plain file";
  }
}

}  // namespace

// libarchive's client callbacks over a ReadOnlyFile: reads by pread, skips without reading (no
// further than the file's end, so a size field past it reads as the truncation it is).
// Exceptions must not cross libarchive's C frames: a failed read is kept and rethrown.
struct TarReader::Source {
  const ReadOnlyFile* file = nullptr;
  uint64_t position = 0;
  std::vector<char> block;
  std::exception_ptr error;

  static la_ssize_t read(archive*, void* self, const void** buffer) {
    auto* s = static_cast<Source*>(self);
    const uint64_t left = s->file->size() - std::min(s->position, s->file->size());
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kReadBlock, left));
    if (n == 0) return 0;
    try {
      s->file->read_at(s->position, n, s->block.data(), "the tar archive");
    } catch (...) {
      s->error = std::current_exception();
      return ARCHIVE_FATAL;
    }
    s->position += n;
    *buffer = s->block.data();
    return static_cast<la_ssize_t>(n);
  }
  static la_int64_t skip(archive*, void* self, la_int64_t request) {
    auto* s = static_cast<Source*>(self);
    const uint64_t left = s->file->size() - std::min(s->position, s->file->size());
    const uint64_t n = std::min(static_cast<uint64_t>(std::max<la_int64_t>(request, 0)), left);
    s->position += n;
    return static_cast<la_int64_t>(n);
  }
};

TarReader::TarReader(const ReadOnlyFile& file) : name_(file.path()) {
  source_ = std::make_unique<Source>();
  source_->file = &file;
  source_->block.resize(kReadBlock);
  archive_ = archive_read_new();
  archive_read_support_format_tar(archive_);
  archive_read_set_read_callback(archive_, &Source::read);
  archive_read_set_skip_callback(archive_, &Source::skip);
  archive_read_set_callback_data(archive_, source_.get());
  if (archive_read_open1(archive_) != ARCHIVE_OK) fail_in_constructor();
}

TarReader::TarReader(const char* data, size_t size, uint64_t base, std::string name)
    : name_(std::move(name)), base_(base) {
  archive_ = archive_read_new();
  archive_read_support_format_tar(archive_);
  if (archive_read_open_memory(archive_, data, size) != ARCHIVE_OK) fail_in_constructor();
}

// The destructor does not run for a constructor that throws: the handle is freed here.
void TarReader::fail_in_constructor() {
  try {
    fail("cannot read the tar archive");
  } catch (...) {
    archive_read_free(archive_);
    archive_ = nullptr;
    throw;
  }
}

TarReader::~TarReader() {
  if (archive_ != nullptr) archive_read_free(archive_);
}

void TarReader::fail(const std::string& what) const {
  if (source_ && source_->error) std::rethrow_exception(source_->error);
  const char* reason = archive_error_string(archive_);
  std::string where = pending_ ? " after member '" + pending_->name + "'" : " at its start";
  throw DataError(what + where + ": " + (reason ? reason : "unknown libarchive error") +
                      " (is it a complete, uncompressed tar file?)",
                  SourceLocation{name_});
}

std::optional<TarMember> TarReader::read_header() {
  archive_entry* entry = nullptr;
  const int status = archive_read_next_header(archive_, &entry);
  const uint64_t position = base_ + static_cast<uint64_t>(archive_read_header_position(archive_));
  if (status == ARCHIVE_EOF) {
    end_ = position;
    return std::nullopt;
  }
  // A warning leaves the entry usable only when its type and size were read (libarchive warns,
  // for one, after too many special headers, with the entry half filled).
  const bool usable =
      status == ARCHIVE_OK || (status == ARCHIVE_WARN && archive_entry_filetype(entry) != 0 &&
                               archive_entry_size_is_set(entry));
  if (!usable) fail("cannot read the tar archive");
  TarMember member;
  // The name as stored (no charset conversion: a conversion per member cost 7% of reading a
  // sample), or as UTF-8 where only that form exists (PAX names outside the locale's charset).
  const char* name = archive_entry_pathname(entry);
  if (name == nullptr) name = archive_entry_pathname_utf8(entry);
  member.name = name != nullptr ? name : "";
  member.header = position;
  const la_int64_t size = archive_entry_size(entry);
  member.size = archive_entry_size_is_set(entry) && size > 0 ? static_cast<uint64_t>(size) : 0;
  if (member.size > kMaxTarMemberBytes) {
    throw DataError("member '" + member.name + "' claims " + std::to_string(member.size) +
                        " bytes, more than any shard member may have: the archive is damaged",
                    SourceLocation{name_});
  }
  const bool hardlink = archive_entry_hardlink(entry) != nullptr;
  const bool sparse = archive_entry_sparse_count(entry) > 0;
  member.regular = archive_entry_filetype(entry) == AE_IFREG && !hardlink && !sparse;
  if (!member.regular)
    member.kind = hardlink ? "a hard link" : sparse ? "a sparse file" : kind_of(entry);
  return member;
}

std::optional<TarMember> TarReader::next() {
  if (done_) return std::nullopt;
  if (!started_) {
    started_ = true;
    pending_ = read_header();
    if (!pending_) {
      done_ = true;
      return std::nullopt;
    }
  }
  // The member after the pending one (or the end) places the pending one's data.
  std::optional<TarMember> following = read_header();
  TarMember member = std::move(*pending_);
  // A plain file's data end where the next member's headers start. (The others' data are not
  // read, and a sparse file's size is its expanded size, not what is stored.)
  if (member.regular) {
    const uint64_t next_start = following ? following->header : end_;
    const uint64_t span = padded(member.size);
    if (next_start < member.header + kRecord + span) {
      pending_ = member;
      fail("cannot place the data of a member");
    }
    member.data = next_start - span;
  }
  pending_ = std::move(following);
  if (!pending_) done_ = true;
  return member;
}

std::optional<std::string> webdataset_key(const std::string& member_name) {
  const size_t slash = member_name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = member_name.find('.', base);
  if (dot == std::string::npos || dot == base) return std::nullopt;
  return member_name.substr(0, dot);
}

}  // namespace vlm::data
