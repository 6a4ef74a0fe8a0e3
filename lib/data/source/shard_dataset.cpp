#include "data/source/shard_dataset.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/hash.h"
#include "core/strings.h"
#include "data/source/brace_pattern.h"
#include "data/source/open_files.h"
#include "data/source/shard_sample.h"

namespace vlm::data {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> shards_in_folder(const std::string& folder) {
  std::vector<std::string> shards;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && ends_with(it->path().filename().string(), ".tar")) {
      shards.push_back(it->path().string());
    }
  }
  if (ec) throw DataError("cannot list the shard folder: " + ec.message(), SourceLocation{folder});
  std::sort(shards.begin(), shards.end());
  if (shards.empty()) {
    throw DataError("the folder holds no .tar shard (a WebDataset folder holds NAME.tar files)",
                    SourceLocation{folder});
  }
  return shards;
}

std::vector<std::string> shards_in_list(const std::string& list) {
  std::ifstream in(list);
  if (!in) throw DataError("cannot open the shard list", SourceLocation{list});
  const fs::path dir = fs::path(list).parent_path();
  std::vector<std::string> shards;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t last = line.find_last_not_of(" \t\r");
    const std::string name = line.substr(first, last - first + 1);
    const std::string shard = name.front() == '/' ? name : (dir / name).string();
    std::error_code ec;
    if (!fs::is_regular_file(shard, ec)) {
      throw DataError("the shard " + shard + " does not exist", SourceLocation{list, number});
    }
    shards.push_back(shard);
  }
  if (shards.empty()) throw DataError("the shard list names no shard", SourceLocation{list});
  return shards;
}

}  // namespace

std::vector<std::string> resolve_shard_paths(const std::string& path) {
  if (path.empty()) throw ConfigError("a WebDataset path is empty");
  if (has_brace_pattern(path)) {
    std::vector<std::string> shards = expand_braces(path);
    for (const std::string& shard : shards) {
      std::error_code ec;
      if (!fs::is_regular_file(shard, ec)) {
        throw DataError("the shard " + shard + " of the pattern does not exist (" +
                            std::to_string(shards.size()) + " shards named)",
                        SourceLocation{path});
      }
    }
    return shards;
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) return shards_in_folder(path);
  if (!fs::is_regular_file(path, ec)) {
    throw DataError("no such shard, folder or shard list", SourceLocation{path});
  }
  if (ends_with(path, ".tar")) return {path};
  return shards_in_list(path);
}

ShardDataset::ShardDataset(const std::string& path) : path_(path) {
  const std::vector<std::string> paths = resolve_shard_paths(path);
  shards_.resize(paths.size());
  // Indexes are read (or built) by a few threads: on a cluster's filesystem each is a round trip.
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (size_t s; (s = next.fetch_add(1)) < paths.size();) {
      try {
        const ReadOnlyFile file(paths[s]);
        shards_[s] = Shard{paths[s], file.size(), load_tar_index(file)};
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = paths.size();
      }
    }
  };
  const size_t threads =
      std::min<size_t>({paths.size(), 8, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);

  first_.push_back(0);
  for (const Shard& shard : shards_) {
    first_.push_back(first_.back() + shard.index.samples());
    const std::string name_and_size =
        fs::path(shard.path).filename().string() + ":" + std::to_string(shard.size);
    fingerprint_ += hex64(fnv1a64(serialize_tar_index(shard.index), fnv1a64(name_and_size)));
  }
  if (first_.back() == 0) {
    throw DataError("the " + std::to_string(shards_.size()) +
                        " shards hold no sample (a sample is a KEY.json member and its images)",
                    SourceLocation{path});
  }
}

std::pair<size_t, size_t> ShardDataset::locate(size_t index) const {
  const auto after = std::upper_bound(first_.begin(), first_.end(), uint64_t{index});
  const size_t shard = static_cast<size_t>(after - first_.begin()) - 1;
  return {shard, index - static_cast<size_t>(first_[shard])};
}

SourceLocation ShardDataset::where(size_t index) const {
  const auto [shard, local] = locate(index);
  return SourceLocation{shards_.at(shard).path + ":sample " + std::to_string(local)};
}

ParsedLine ShardDataset::read(size_t index) const {
  const auto [s, local] = locate(index);
  const Shard& shard = shards_.at(s);
  const uint64_t begin = shard.index.starts.at(local), end = shard.index.starts.at(local + 1);
  if (end - begin > kMaxShardSampleBytes) {
    return SampleProblem{"sample_too_large",
                         "the sample's members take " + std::to_string(end - begin) +
                             " bytes, more than " + std::to_string(kMaxShardSampleBytes >> 20) +
                             " MiB",
                         where(index)};
  }
  const std::shared_ptr<const ReadOnlyFile> file = open_shared(shard.path);
  if (file->size() != shard.size) {
    throw DataError("the shard is " + std::to_string(file->size()) + " bytes now, " +
                        std::to_string(shard.size) +
                        " when it was indexed: it was replaced while training",
                    SourceLocation{shard.path});
  }
  FileBytes bytes = FileBytes::allocate(static_cast<size_t>(end - begin), begin);
  file->read_at(begin, bytes.size, bytes.data.get(), "sample " + std::to_string(local));
  return parse_shard_sample(std::move(bytes), shard.path, local);
}

void ShardDataset::check_fingerprint(const std::string& saved) const {
  if (saved == fingerprint_) return;
  const size_t saved_shards = saved.size() / 16;
  for (size_t s = 0; s < shards_.size() && s < saved_shards; ++s) {
    if (saved.compare(16 * s, 16, fingerprint_, 16 * s, 16) != 0) {
      throw DataError("shard " + std::to_string(s) +
                          " is not the one the checkpoint's data cursor was saved with (its "
                          "name, size or samples changed since); resume with the data as it "
                          "was, or start a new output.dir",
                      SourceLocation{shards_[s].path});
    }
  }
  throw DataError("the dataset has " + std::to_string(shards_.size()) +
                      " shards where the checkpoint's data cursor was saved with " +
                      std::to_string(saved_shards) +
                      "; resume with the data as it was, or start a new output.dir",
                  SourceLocation{path_});
}

}  // namespace vlm::data
