// Reading samples from WebDataset shards against manifests and image files, on ONE thread:
// the training order (a seeded permutation over the whole dataset), each sample read, built
// (tokens, image headers probed) and its images read and decoded, as the planner and the
// loader's workers do. The same demo dataset in both forms (`make-demo-data`, many small
// images of a few KiB: the case where one file per image hurts), with the page cache warm, and
// cold: every file of the dataset dropped from the page cache first (posix_fadvise
// DONTNEED after a sync, which needs no root; it drops the clean pages of each file).
//
// Usage: bench_shards [samples] [samples_per_shard] [folder]
//   (defaults 20000, 1000, a temporary folder; figures are the best of 3 rounds)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/config_io.h"
#include "data/data_setup.h"
#include "data/demo/demo_data.h"
#include "data/image/image_decode.h"
#include "data/source/image_ref.h"
#include "data/source/item_source.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void drop_from_page_cache(const fs::path& folder) {
  ::sync();
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    if (!entry.is_regular_file()) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
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
  options.out_dir = (root / "files").string();
  if (!fs::exists(root / "files/train.jsonl")) vlm::data::write_demo_dataset(options);
  options.out_dir = (root / "shards").string();
  options.format = vlm::data::DemoDataFormat::kWebDataset;
  options.samples_per_shard = per_shard;
  if (!fs::exists(root / "shards/train-000000.tar")) vlm::data::write_demo_dataset(options);

  const auto config = vlm::load_config("", {"model.preset=tiny", "model.tokenizer=builtin:bytes",
                                            "data.max_img_size=128"})
                          .config;
  const vlm::data::DataSetup setup(config, 1);
  const vlm::data::DatasetSpec files{(root / "files/train.jsonl").string(), 1.0,
                                     vlm::data::DatasetFormat::kAuto};
  const vlm::data::DatasetSpec shards{(root / "shards").string(), 1.0,
                                      vlm::data::DatasetFormat::kWebDataset};
  std::printf("%lld samples; files: %s, shards of %lld samples\n", static_cast<long long>(samples),
              (root / "files").c_str(), static_cast<long long>(per_shard));
  std::printf("%-8s %-6s %-7s %10s %12s %12s\n", "form", "cache", "decode", "seconds", "samples/s",
              "images/s");
  for (const bool decode : {false, true}) {
    for (const bool cold : {false, true}) {
      double rate[2] = {0, 0};
      for (int form = 0; form < 2; ++form) {
        const auto& spec = form == 0 ? files : shards;
        const fs::path folder = root / (form == 0 ? "files" : "shards");
        Figure best;
        for (int round = 0; round < 3; ++round) {
          if (cold)
            drop_from_page_cache(folder);
          else
            one_pass(setup, spec, false);  // warm: everything read once before
          const Figure f = one_pass(setup, spec, decode);
          if (best.seconds == 0 || f.seconds < best.seconds) best = f;
        }
        rate[form] = best.samples / best.seconds;
        std::printf("%-8s %-6s %-7s %10.2f %12.0f %12.0f\n", form == 0 ? "files" : "shards",
                    cold ? "cold" : "warm", decode ? "yes" : "no", best.seconds, rate[form],
                    best.images / best.seconds);
      }
      std::printf("  shards / files: %.2fx\n", rate[1] / rate[0]);
    }
  }
  if (!keep) fs::remove_all(root);
  return 0;
}
