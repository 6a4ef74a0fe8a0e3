#include "data/demo/demo_data_output.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "data/image/image_encode.h"
#include "data/source/open_files.h"
#include "data/source/tar_index.h"
#include "data/source/tar_writer.h"

namespace vlm::data {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

std::string numbered(const char* format, const std::string& split, int64_t index) {
  char name[96];
  std::snprintf(name, sizeof name, format, split.c_str(), static_cast<long long>(index));
  return name;
}

void make_folder(const fs::path& folder) {
  std::error_code error;
  fs::create_directories(folder, error);
  if (error) {
    throw DataError("cannot create the demo data folder: " + error.message(),
                    SourceLocation{folder.string()});
  }
}

// split.jsonl and images/split_NNNNNN_K.ext.
class ManifestOutput : public DemoSplitOutput {
 public:
  ManifestOutput(const fs::path& out_dir, const std::string& split)
      : out_dir_(out_dir), split_(split), path_((out_dir / (split + ".jsonl")).string()) {
    make_folder(out_dir / "images");
    manifest_.open(path_, std::ios::binary | std::ios::trunc);
  }
  void add(int64_t index, const ordered_json& texts,
           const std::vector<EncodedImage>& images) override {
    ordered_json line;
    line["images"] = ordered_json::array();
    for (size_t k = 0; k < images.size(); ++k) {
      const std::string name = numbered("images/%s_%06lld_", split_, index) + std::to_string(k) +
                               "." + images[k].extension;
      write_bytes_file((out_dir_ / name).string(), images[k].bytes);
      line["images"].push_back(name);
    }
    line["texts"] = texts;
    manifest_ << line.dump() << '\n';
  }
  void finish() override {
    if (!manifest_.flush()) {
      throw DataError("cannot write the demo manifest (is the disk full?)", SourceLocation{path_});
    }
  }

 private:
  fs::path out_dir_;
  std::string split_;
  std::string path_;
  std::ofstream manifest_;
};

// train-NNNNNN.tar in out_dir, val/val-NNNNNN.tar; sample KEY = split_NNNNNN.
class ShardOutput : public DemoSplitOutput {
 public:
  ShardOutput(const fs::path& out_dir, const std::string& split, int64_t samples_per_shard)
      : folder_(split == "train" ? out_dir : out_dir / split),
        split_(split),
        per_shard_(samples_per_shard) {
    make_folder(folder_);
  }
  void add(int64_t index, const ordered_json& texts,
           const std::vector<EncodedImage>& images) override {
    if (index % per_shard_ == 0) {
      close_shard();
      paths_.push_back((folder_ / numbered("%s-%06lld.tar", split_, index / per_shard_)).string());
      shard_.emplace(paths_.back());
    }
    const std::string key = numbered("%s_%06lld", split_, index);
    ordered_json json;
    json["images"] = ordered_json::array();
    for (size_t k = 0; k < images.size(); ++k) {
      json["images"].push_back(std::to_string(k) + "." + images[k].extension);
    }
    json["texts"] = texts;
    shard_->add(key + ".json", json.dump());
    for (size_t k = 0; k < images.size(); ++k) {
      shard_->add(key + "." + std::to_string(k) + "." + images[k].extension, images[k].bytes.data(),
                  images[k].bytes.size());
    }
  }
  void finish() override {
    close_shard();
    for (const std::string& path : paths_) load_tar_index(ReadOnlyFile(path));
  }

 private:
  void close_shard() {
    if (shard_) shard_->close();
    shard_.reset();
  }
  fs::path folder_;
  std::string split_;
  int64_t per_shard_;
  std::optional<TarWriter> shard_;
  std::vector<std::string> paths_;
};

}  // namespace

std::unique_ptr<DemoSplitOutput> demo_split_output(const DemoDataOptions& options,
                                                   const std::string& split) {
  if (options.format == DemoDataFormat::kWebDataset) {
    return std::make_unique<ShardOutput>(options.out_dir, split, options.samples_per_shard);
  }
  return std::make_unique<ManifestOutput>(options.out_dir, split);
}

}  // namespace vlm::data
