#include "data/source/tar_index.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/hash.h"
#include "data/source/open_files.h"
#include "data/source/tar_reader.h"

namespace vlm::data {
namespace fs = std::filesystem;
namespace {

// The shard's modification time, in nanoseconds; an index older than it is rebuilt.
int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::optional<std::string> read_small_file(const std::string& path, uint64_t limit,
                                           const std::string& shard_path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return std::nullopt;
  if (size > limit) {
    throw DataError("the index " + path + " does not fit its shard: " + std::to_string(size) +
                        " bytes, more offsets than the shard has 512-byte records; delete the "
                        "index to have it rebuilt",
                    SourceLocation{shard_path});
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  if (!in && !in.eof()) return std::nullopt;
  return out.str();
}

// The index written whole or not at all (several ranks may build it at once); false where it
// cannot be written.
bool write_index(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  return write_file_atomically(path, bytes).empty();
}

std::string cache_root() {
  if (const char* dir = std::getenv("VLMTRAIN_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (fs::path(xdg) / "vlmtrain").string();
  }
  const char* home = std::getenv("HOME");
  return (fs::path(home != nullptr && *home != '\0' ? home : "/tmp") / ".cache" / "vlmtrain")
      .string();
}

// libarchive ends at the first zero record, or where the bytes end on a record boundary; both
// would read a truncated or concatenated shard as a shorter one. A whole archive ends with its
// two zero records, padded with zeros to its writer's block (10 KiB for tar, libarchive and
// Python's tarfile; up to kMaxArchivePadding here).
constexpr uint64_t kMaxArchivePadding = 16u << 20;

void check_archive_end(const ReadOnlyFile& shard, uint64_t end) {
  const uint64_t tail = shard.size() - std::min(end, shard.size());
  if (tail < 1024) {
    throw DataError("the archive ends at byte " + std::to_string(end) +
                        " without its two zero end records: the shard is truncated",
                    SourceLocation{shard.path()});
  }
  if (tail > kMaxArchivePadding) {
    throw DataError("the archive's members end at byte " + std::to_string(end) + " but " +
                        std::to_string(tail) +
                        " bytes follow: a damaged or concatenated shard (tar A B > C reads as "
                        "A alone; use tar --concatenate)",
                    SourceLocation{shard.path()});
  }
  std::string bytes(static_cast<size_t>(tail), '\0');
  shard.read_at(end, bytes.size(), bytes.data(), "the end of the archive");
  const size_t data = bytes.find_first_not_of('\0');
  if (data != std::string::npos) {
    throw DataError("data at byte " + std::to_string(end + data) +
                        " after the archive's end records: a damaged or concatenated shard "
                        "(tar A B > C reads as A alone; use tar --concatenate)",
                    SourceLocation{shard.path()});
  }
}

}  // namespace

TarIndex scan_tar(const ReadOnlyFile& shard, TarScanNotes* notes) {
  TarIndex index;
  if (shard.size() == 0) {  // an empty file: an archive of no member (libarchive refuses it)
    index.starts.push_back(0);
    return index;
  }
  TarReader reader(shard);
  std::set<std::string> finished_keys;
  std::optional<std::string> current;
  TarScanNotes local;
  TarScanNotes& n = notes != nullptr ? *notes : local;
  while (const std::optional<TarMember> member = reader.next()) {
    const std::optional<std::string> key =
        member->regular ? webdataset_key(member->name) : std::nullopt;
    if (!key) {
      if (n.ignored_members++ == 0) {
        n.first_ignored =
            "'" + member->name + "' (" +
            (member->regular ? std::string("no key: no dot in its name") : member->kind) + ")";
      }
      continue;
    }
    if (key == current) continue;
    if (current) finished_keys.insert(*current);
    if (finished_keys.count(*key) != 0) {
      throw DataError("member '" + member->name + "' has the key '" + *key +
                          "' of an earlier sample: a sample's files must be adjacent in the "
                          "shard, and keys unique",
                      SourceLocation{shard.path()});
    }
    current = key;
    index.starts.push_back(member->header);
  }
  index.starts.push_back(reader.end());
  check_archive_end(shard, reader.end());
  return index;
}

std::string serialize_tar_index(const TarIndex& index) {
  std::string bytes;
  bytes.reserve(index.starts.size() * 8);
  for (const uint64_t offset : index.starts) {
    for (int b = 0; b < 8; ++b) bytes.push_back(static_cast<char>((offset >> (8 * b)) & 0xff));
  }
  return bytes;
}

TarIndex parse_tar_index(const std::string& bytes, uint64_t shard_size,
                         const std::string& index_path, const std::string& shard_path) {
  const auto refuse = [&](const std::string& why) -> DataError {
    return DataError("the index " + index_path + " does not fit its shard: " + why +
                         "; delete the index to have it rebuilt",
                     SourceLocation{shard_path});
  };
  if (bytes.size() < 8 || bytes.size() % 8 != 0) {
    throw refuse(std::to_string(bytes.size()) +
                 " bytes are not N + 1 little-endian 64-bit offsets");
  }
  TarIndex index;
  index.starts.resize(bytes.size() / 8);
  for (size_t i = 0; i < index.starts.size(); ++i) {
    uint64_t value = 0;
    for (int b = 0; b < 8; ++b) {
      value |= uint64_t{static_cast<unsigned char>(bytes[i * 8 + static_cast<size_t>(b)])}
               << (8 * b);
    }
    index.starts[i] = value;
    if (value % 512 != 0) {
      throw refuse("offset " + std::to_string(i) + " (" + std::to_string(value) +
                   ") is not on a 512-byte tar record");
    }
    if (i > 0 && value <= index.starts[i - 1]) {
      throw refuse("offset " + std::to_string(i) + " does not come after offset " +
                   std::to_string(i - 1));
    }
  }
  if (index.starts.back() > shard_size) {
    throw refuse("its samples end at byte " + std::to_string(index.starts.back()) +
                 ", past the shard's " + std::to_string(shard_size) + " bytes");
  }
  return index;
}

std::string tar_index_path_beside(const std::string& shard_path) { return shard_path + ".idx"; }

std::string tar_index_path_in_cache(const std::string& shard_path) {
  std::error_code ec;
  fs::path absolute = fs::absolute(shard_path, ec);
  if (ec) absolute = shard_path;
  const std::string hash = hex64(fnv1a64(absolute.lexically_normal().string()));
  return (fs::path(cache_root()) / "tar-index" /
          (hash + "-" + fs::path(shard_path).filename().string() + ".idx"))
      .string();
}

TarIndex load_tar_index(const ReadOnlyFile& shard) {
  const int64_t shard_time = mtime_ns(shard.path());
  const uint64_t limit = 8 * (shard.size() / 512 + 2);  // one offset per record at most
  const std::string beside = tar_index_path_beside(shard.path());
  const std::string cached = tar_index_path_in_cache(shard.path());
  for (const std::string& path : {beside, cached}) {
    const int64_t index_time = mtime_ns(path);
    if (index_time < 0 || index_time < shard_time) continue;  // missing, or older than the shard
    if (const std::optional<std::string> bytes = read_small_file(path, limit, shard.path())) {
      return parse_tar_index(*bytes, shard.size(), path, shard.path());
    }
  }
  TarScanNotes notes;
  const TarIndex index = scan_tar(shard, &notes);
  if (notes.ignored_members > 0) {
    spdlog::warn("{}: {} members belong to no sample and are ignored (the first: {})", shard.path(),
                 notes.ignored_members, notes.first_ignored);
  }
  const std::string bytes = serialize_tar_index(index);
  if (write_index(beside, bytes)) {
    spdlog::info("{}: indexed {} samples into {}", shard.path(), index.samples(), beside);
  } else if (write_index(cached, bytes)) {
    spdlog::info("{}: indexed {} samples into {} (its folder is not writable)", shard.path(),
                 index.samples(), cached);
  } else {
    spdlog::warn(
        "{}: indexed {} samples, but neither {} nor {} can be written: it will be "
        "indexed again next time",
        shard.path(), index.samples(), beside, cached);
  }
  return index;
}

}  // namespace vlm::data
