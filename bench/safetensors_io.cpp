// safetensors IO throughput on a full-size canonical state dict.
//
//   ./build/safetensors_io [preset=nanovlm-460m] [dir=/tmp]
//
// Saves the preset's tensors (float32 zeros) as nanoVLM writes them (atomic, fsynced), then
// reads them back three ways: read_safetensors (validated header + owning copies), views over
// the mapping (zero-copy), and load_weights (read + layout detection + name check). Reads run
// right after the write, so the file is in the page cache: they measure parsing and copying,
// not the disk.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "model/weight_map.h"
#include "model/weight_map_hf.h"
#include "spec/model_spec.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void print_figure(const char* what, double seconds, double bytes) {
  std::printf("%-34s %8.3f s  %7.2f GB/s\n", what, seconds, bytes / seconds / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "nanovlm-460m";
  const std::string dir = argc > 2 ? argv[2] : "/tmp";
  const auto spec = vlm::spec::preset(preset);
  vlm::model::TensorMap weights;
  for (const auto& e : vlm::model::expected_tensors(spec)) weights[e.name] = torch::zeros(e.shape);
  const std::string path = dir + "/vlmtrain-bench-" + preset + ".safetensors";

  auto start = std::chrono::steady_clock::now();
  vlm::model::save_nanovlm_weights(path, weights, spec);
  const double save_s = seconds_since(start);
  const double bytes = static_cast<double>(std::filesystem::file_size(path));
  std::printf("%s: %zu tensors, %.1f MB file\n", preset.c_str(), weights.size(), bytes / 1e6);
  print_figure("save_nanovlm_weights (fsync)", save_s, bytes);

  start = std::chrono::steady_clock::now();
  {
    // Baseline: plain read(2) of the whole file into fresh memory.
    std::FILE* f = std::fopen(path.c_str(), "rb");
    std::vector<char> buffer(static_cast<size_t>(bytes));
    const size_t got = std::fread(buffer.data(), 1, buffer.size(), f);
    std::fclose(f);
    if (got != buffer.size()) std::printf("short read\n");
  }
  print_figure("baseline: fread whole file", seconds_since(start), bytes);

  start = std::chrono::steady_clock::now();
  vlm::model::read_safetensors(path);  // copies freed at once: one copy in memory at a time
  print_figure("read_safetensors (copies)", seconds_since(start), bytes);

  start = std::chrono::steady_clock::now();
  {
    const vlm::model::SafetensorsFile file(path);
    double checksum = 0;
    for (const auto& entry : file.header().tensors) checksum += file.view(entry).numel();
    if (checksum <= 0) std::printf("no elements viewed\n");
  }
  print_figure("SafetensorsFile views (zero-copy)", seconds_since(start), bytes);

  start = std::chrono::steady_clock::now();
  const auto loaded = vlm::model::load_weights(path, spec, 0);
  print_figure("load_weights (read + map + check)", seconds_since(start), bytes);

  std::filesystem::remove(path);
  return loaded.tensors.size() == weights.size() ? 0 : 1;
}
