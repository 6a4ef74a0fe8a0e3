// Reading samples from WebDataset shards against manifests and image files, on ONE thread:
// the training order (a seeded permutation over the whole dataset), each sample read, built
// (tokens, image headers probed) and its images read and decoded, as the planner and the
// loader's workers do. Two datasets, each in both forms: the demo (`make-demo-data`: 1.2
// images of 48-1024 px a sample), and many small files (one 48-96 px JPEG a sample, where one
// file per image hurts most); with the caches warm, and cold (drop_caches below).
//
// Usage: bench_shards [samples] [samples_per_shard] [folder]
//   (defaults 20000, 1000, a temporary folder, removed after; a folder given is kept and its
//   datasets reused; figures are the best of 3 rounds). VLM_BENCH_DATASET=demo|small runs one.
// Through a cluster-like filesystem: write the datasets into FOLDER once, mount it with
// bench/fuse_passthrough.py FOLDER MNT, then bench_shards N 1000 MNT (docs/BENCHMARKS.md).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/config_io.h"
#include "data/data_setup.h"
#include "data/demo/demo_data.h"
#include "data/image/image_decode.h"
#include "data/image/image_encode.h"
#include "data/source/image_ref.h"
#include "data/source/item_source.h"
#include "data/source/open_files.h"
#include "data/source/tar_index.h"
#include "data/source/tar_writer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Every cache of the dataset's files dropped: with root, the kernel's page, dentry and inode
// caches (/proc/sys/vm/drop_caches, what a file's first open on a cluster filesystem pays:
// its metadata read); else each file's pages (posix_fadvise DONTNEED after a sync: the
// metadata stays cached). Returns which.
const char* drop_caches(const fs::path& folder) {
  ::sync();
  if (std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    const bool done = std::fputs("3", f) >= 0;
    if (std::fclose(f) == 0 && done) return "cold (drop_caches: pages, dentries, inodes)";
  }
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    if (!entry.is_regular_file()) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  return "cold (fadvise: pages only)";
}

// Many small files: one 48-96 px JPEG (1-3 KiB) per sample, as in image-text pairs at
// thumbnail size; the same samples as a manifest with files and as shards.
void write_small_dataset(const fs::path& root, int64_t samples, int64_t per_shard) {
  fs::create_directories(root / "files/images");
  fs::create_directories(root / "shards");
  std::ofstream manifest(root / "files/train.jsonl");
  std::optional<vlm::data::TarWriter> shard;
  std::vector<std::string> shards;
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t side = 48 + (i * 7919) % 49;
    vlm::data::RgbImage image(side, side);
    for (size_t p = 0; p < image.pixels.size(); ++p) {
      image.pixels[p] = static_cast<uint8_t>((p * 31 + static_cast<size_t>(i) * 17) % 251);
    }
    const std::vector<uint8_t> jpeg = vlm::data::encode_jpeg(image, 90);
    char key[32];
    std::snprintf(key, sizeof key, "%09lld", static_cast<long long>(i));
    const std::string text = R"("texts": [{"user": "What is in picture )" + std::to_string(i) +
                             R"(?", "assistant": "A pattern."}])";
    vlm::data::write_bytes_file((root / "files/images" / (std::string(key) + ".jpg")).string(),
                                jpeg);
    manifest << R"({"images": ["images/)" << key << R"(.jpg"], )" << text << "}\n";
    if (i % per_shard == 0) {
      if (shard) shard->close();
      char name[32];
      std::snprintf(name, sizeof name, "small-%06lld.tar", static_cast<long long>(i / per_shard));
      shards.push_back((root / "shards" / name).string());
      shard.emplace(shards.back());
    }
    shard->add(std::string(key) + ".json", R"({"images": ["0.jpg"], )" + text + "}");
    shard->add(std::string(key) + ".0.jpg", jpeg.data(), jpeg.size());
  }
  if (shard) shard->close();
  for (const std::string& path : shards) vlm::data::load_tar_index(vlm::data::ReadOnlyFile(path));
}

struct Figure {
  double seconds = 0;
  int64_t samples = 0;
  int64_t images = 0;
};

// One pass over the dataset in training order.
Figure one_pass(const vlm::data::DataSetup& setup, const vlm::data::DatasetSpec& spec,
                bool decode) {
  const auto start = Clock::now();
  vlm::data::DatasetSource source({spec}, setup.builder(), setup.skip_limits(), 1234,
                                  /*shuffle=*/true, /*one_pass=*/true);
  Figure f;
  while (const auto item = source.next()) {
    const auto sample = source.sample(item->sample_id);
    for (const auto& image : sample->images) {
      const std::vector<uint8_t> bytes = vlm::data::read_image_bytes(image);
      if (decode) {
        const auto rgb = vlm::data::decode_image_bytes(bytes, image.name());
        if (rgb.width <= 0) std::abort();
      }
      ++f.images;
    }
    source.release(item->sample_id);
    ++f.samples;
  }
  f.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return f;
}

void compare(const vlm::data::DataSetup& setup, const std::string& title, const fs::path& root,
             const vlm::data::DatasetSpec& files, const vlm::data::DatasetSpec& shards) {
  const bool only_read = std::getenv("VLM_BENCH_ONLY_READ") != nullptr;
  const char* only_form = std::getenv("VLM_BENCH_FORM");
  std::printf("\n%s\n%-8s %-44s %-7s %9s %10s %10s\n", title.c_str(), "form", "cache", "decode",
              "seconds", "samples/s", "images/s");
  for (const bool decode : {false, true}) {
    if (decode && only_read) break;
    for (const bool cold : {false, true}) {
      double rate[2] = {0, 0};
      for (int form = 0; form < 2; ++form) {
        const char* name = form == 0 ? "files" : "shards";
        if (only_form != nullptr && std::string(only_form) != name) continue;
        const auto& spec = form == 0 ? files : shards;
        Figure best;
        const char* cache = "warm";
        for (int round = 0; round < 3; ++round) {
          if (cold) {
            cache = drop_caches(root);
          } else {
            one_pass(setup, spec, false);  // warm: everything read once before
          }
          const Figure f = one_pass(setup, spec, decode);
          if (best.seconds == 0 || f.seconds < best.seconds) best = f;
        }
        rate[form] = best.samples / best.seconds;
        std::printf("%-8s %-44s %-7s %9.2f %10.0f %10.0f\n", name, cache, decode ? "yes" : "no",
                    best.seconds, rate[form], best.images / best.seconds);
      }
      if (rate[0] > 0 && rate[1] > 0) std::printf("  shards / files: %.2fx\n", rate[1] / rate[0]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t samples = argc > 1 ? std::atoll(argv[1]) : 20000;
  const int64_t per_shard = argc > 2 ? std::atoll(argv[2]) : 1000;
  const fs::path root =
      argc > 3 ? fs::path(argv[3])
               : fs::temp_directory_path() / ("bench_shards." + std::to_string(::getpid()));
  const bool keep = argc > 3;
  vlm::data::DemoDataOptions options;
  options.train_samples = samples;
  options.val_samples = 0;
  options.out_dir = (root / "demo/files").string();
  if (!fs::exists(root / "demo/files/train.jsonl")) vlm::data::write_demo_dataset(options);
  options.out_dir = (root / "demo/shards").string();
  options.format = vlm::data::DemoDataFormat::kWebDataset;
  options.samples_per_shard = per_shard;
  if (!fs::exists(root / "demo/shards/train-000000.tar")) vlm::data::write_demo_dataset(options);
  if (!fs::exists(root / "small/files/train.jsonl")) {
    write_small_dataset(root / "small", samples, per_shard);
  }

  const auto config = vlm::load_config("", {"model.preset=tiny", "model.tokenizer=builtin:bytes",
                                            "data.max_img_size=128"})
                          .config;
  const vlm::data::DataSetup setup(config, 1);
  const auto spec = [](const fs::path& path, vlm::data::DatasetFormat format) {
    return vlm::data::DatasetSpec{path.string(), 1.0, format};
  };
  std::printf("%lld samples per dataset, shards of %lld samples, one thread, in %s\n",
              static_cast<long long>(samples), static_cast<long long>(per_shard), root.c_str());
  // VLM_BENCH_DATASET=small (or demo): that dataset alone.
  const char* only = std::getenv("VLM_BENCH_DATASET");
  if (only == nullptr || std::string(only) == "demo")
    compare(setup, "demo: 1.2 PNG / JPEG images of 48-1024 px per sample (27 KiB a sample)",
            root / "demo", spec(root / "demo/files/train.jsonl", vlm::data::DatasetFormat::kAuto),
            spec(root / "demo/shards", vlm::data::DatasetFormat::kWebDataset));
  if (only == nullptr || std::string(only) == "small")
    compare(setup, "small: one 48-96 px JPEG per sample (1-3 KiB)", root / "small",
            spec(root / "small/files/train.jsonl", vlm::data::DatasetFormat::kAuto),
            spec(root / "small/shards", vlm::data::DatasetFormat::kWebDataset));
  if (!keep) fs::remove_all(root);
  return 0;
}
