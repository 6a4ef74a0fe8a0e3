// bench_packer: our packer + step planner vs a faithful C++ port of nanoVLM's packer, on the
// same length stream with the same settings (nanoVLM's: max_seq_len 4096,
// max_images_per_knapsack 18, max_images_per_example 4, max_sample_length 4096, no crop cap).
//
//   ./build/bench/bench_packer [STREAM.jsonl] [--ranks 8] [--micro-steps 4] [--batch-size 4]
//                              [--repeat 20]
// STREAM defaults to ../shared/bench/stream-public-seed1234.jsonl (run from the repo root).
//
// The nanoVLM port follows data/advanced_datasets.py (ConstantLengthDataset._producer and
// _balanced_greedy_knapsack, github.com/huggingface/nanoVLM) line by line:
//  * drop a sample if len(input_ids) >= max_sample_length, else if it has more than
//    max_images_per_example images; append one pad token to every kept sample;
//  * fill a buffer until its tokens reach seq_length * num_of_sequences, where train.py
//    passes num_of_sequences = batch_size * 4 and TrainConfig.batch_size = 2 (so 8 rows);
//  * sort the buffer by length (stable, longest first), open ceil(sum/L) + delta(5)
//    knapsacks and put each sample into the least-loaded knapsack (ties: lowest index) that
//    fits both the length and the image cap, else a new knapsack;
//  * random.shuffle the knapsacks (Python's Mersenne Twister seeded 42 at import, ported
//    below bit for bit) and drop the empty ones.
// For the rank-balance comparison each nanoVLM rank packs its own contiguous shard of the
// stream (train.py shards the dataset per rank) and takes batch_size packs per micro-step.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/packing/packer.h"
#include "data/packing/step_planner.h"
#include "data/source/length_stream.h"
#include "data/source/sample_filter.h"

namespace {

using vlm::data::Pack;
using vlm::data::PackItem;

// ---------------------------------------------------------------- CPython's random module
// MT19937 seeded like random.seed(42) (init_by_array with key [42]); getrandbits and
// _randbelow / shuffle as in Lib/random.py.
class PythonRandom {
 public:
  explicit PythonRandom(uint32_t seed) {
    init_genrand(19650218u);
    const uint32_t key[1] = {seed};
    uint32_t i = 1, j = 0;
    for (int k = kN; k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + j;
      ++i;
      ++j;
      if (i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
      if (j >= 1) j = 0;
    }
    for (int k = kN - 1; k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - i;
      ++i;
      if (i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
    }
    mt_[0] = 0x80000000u;
    index_ = kN;
  }

  uint32_t genrand_uint32() {
    if (index_ >= kN) twist();
    uint32_t y = mt_[index_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }

  // random._randbelow_with_getrandbits for n < 2^32.
  uint32_t randbelow(uint32_t n) {
    int k = 0;
    while ((uint64_t{1} << k) <= n) ++k;  // n.bit_length()
    uint32_t r = genrand_uint32() >> (32 - k);
    while (r >= n) r = genrand_uint32() >> (32 - k);
    return r;
  }

  template <typename T>
  void shuffle(std::vector<T>& x) {
    for (size_t i = x.size(); i-- > 1;) {
      const size_t j = randbelow(static_cast<uint32_t>(i + 1));
      std::swap(x[i], x[j]);
    }
  }

 private:
  static constexpr int kN = 624, kM = 397;
  void init_genrand(uint32_t s) {
    mt_[0] = s;
    for (uint32_t i = 1; i < kN; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
  }
  void twist() {
    for (int i = 0; i < kN; ++i) {
      const uint32_t y = (mt_[i] & 0x80000000u) | (mt_[(i + 1) % kN] & 0x7fffffffu);
      mt_[i] = mt_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    index_ = 0;
  }
  std::array<uint32_t, kN> mt_{};
  int index_ = kN;
};

// ---------------------------------------------------------------- nanoVLM's packer, ported
struct NanoVlmSettings {
  int64_t seq_length = 4096;
  int64_t num_of_sequences = 8;  // train.py: batch_size * 4, TrainConfig.batch_size = 2
  int64_t max_sample_length = 4096;
  int64_t max_images_per_example = 4;
  int64_t max_images_per_knapsack = 18;
  int64_t delta = 5;
};

struct NanoVlmResult {
  std::vector<Pack> packs;  // items carry the stream's tokens (without the appended pad)
  int64_t dropped_too_long = 0, dropped_too_many_images = 0, pad_tokens = 0;
};

std::vector<std::vector<size_t>> balanced_greedy_knapsack(const std::vector<PackItem>& buffer,
                                                          const NanoVlmSettings& s,
                                                          PythonRandom& random) {
  std::vector<size_t> order(buffer.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // lengths include the appended pad token
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffer[a].tokens > buffer[b].tokens; });
  int64_t total = 0;
  for (const PackItem& item : buffer) total += item.tokens + 1;
  const int64_t L = s.seq_length;
  const size_t min_knapsacks = static_cast<size_t>((total + L - 1) / L + s.delta);
  std::vector<int64_t> load(min_knapsacks, 0), images(min_knapsacks, 0);
  std::vector<std::vector<size_t>> groups(min_knapsacks);
  for (size_t idx : order) {
    const int64_t len = buffer[idx].tokens + 1, imgs = buffer[idx].images;
    // sorted(range(K), key=load) then the first that fits == the fitting knapsack with the
    // least load, ties to the lowest index (Python's sort is stable).
    size_t chosen = load.size();
    for (size_t k = 0; k < load.size(); ++k) {
      if (load[k] + len <= L && images[k] + imgs <= s.max_images_per_knapsack &&
          (chosen == load.size() || load[k] < load[chosen])) {
        chosen = k;
      }
    }
    if (chosen == load.size()) {
      load.push_back(0);
      images.push_back(0);
      groups.emplace_back();
    }
    groups[chosen].push_back(idx);
    load[chosen] += len;
    images[chosen] += imgs;
  }
  random.shuffle(groups);
  std::vector<std::vector<size_t>> non_empty;
  for (auto& g : groups) {
    if (!g.empty()) non_empty.push_back(std::move(g));
  }
  return non_empty;
}

NanoVlmResult run_nanovlm(const std::vector<PackItem>& stream, const NanoVlmSettings& s) {
  NanoVlmResult result;
  PythonRandom random(42);  // random.seed(42) at the top of advanced_datasets.py
  const int64_t max_length = s.seq_length * s.num_of_sequences;
  size_t next = 0;
  bool more = true;
  while (more) {
    std::vector<PackItem> buffer;
    int64_t buffer_len = 0;
    while (buffer_len < max_length) {
      if (next == stream.size()) {
        more = false;
        break;
      }
      const PackItem& sample = stream[next++];
      if (sample.tokens >= s.max_sample_length) {
        ++result.dropped_too_long;
        continue;
      }
      if (sample.images > s.max_images_per_example) {
        ++result.dropped_too_many_images;
        continue;
      }
      buffer.push_back(sample);
      buffer_len += sample.tokens + 1;
    }
    if (buffer.empty()) break;
    for (const auto& group : balanced_greedy_knapsack(buffer, s, random)) {
      Pack pack;
      for (size_t i : group) pack.add(buffer[i]);
      result.pad_tokens += static_cast<int64_t>(group.size());
      result.packs.push_back(std::move(pack));
    }
  }
  return result;
}

// ---------------------------------------------------------------- ours
struct OursResult {
  std::vector<Pack> packs;
  vlm::data::DropCounts drops;
};

OursResult run_ours(const std::vector<PackItem>& stream, const vlm::data::SampleLimits& limits,
                    const vlm::data::PackerOptions& options) {
  OursResult result;
  vlm::data::SampleFilter filter(limits);
  vlm::data::Packer packer(options);
  result.packs.reserve(stream.size() / 2);
  for (const PackItem& item : stream) {
    if (!filter.keep(item)) continue;
    packer.push(item);
    while (auto pack = packer.pop()) result.packs.push_back(std::move(*pack));
  }
  packer.finish();
  while (auto pack = packer.pop()) result.packs.push_back(std::move(*pack));
  result.drops = filter.drops();
  return result;
}

// ---------------------------------------------------------------- metrics
struct FillFigures {
  int64_t packs = 0, tokens = 0, images = 0, lower_bound = 0;
  double fill = 0, ratio = 0;
};

FillFigures fill_figures(const std::vector<Pack>& packs, int64_t seq_len, int64_t images_cap) {
  FillFigures f;
  f.packs = static_cast<int64_t>(packs.size());
  for (const Pack& p : packs) {
    f.tokens += p.tokens;
    f.images += p.images;
  }
  f.lower_bound =
      std::max((f.tokens + seq_len - 1) / seq_len, (f.images + images_cap - 1) / images_cap);
  f.fill = double(f.tokens) / (double(f.packs) * double(seq_len));
  f.ratio = double(f.packs) / double(f.lower_bound);
  return f;
}

struct Balance {
  int64_t steps = 0;
  double mean = 0, worst = 0;
};

Balance our_balance(const std::vector<Pack>& packs, const vlm::data::StepPlannerOptions& o) {
  vlm::data::StepPlanner planner(o);
  size_t next = 0;
  Balance b;
  auto source = [&]() -> std::optional<Pack> {
    if (next == packs.size()) return std::nullopt;
    return packs[next++];
  };
  while (auto plan = planner.next_step(source)) {
    if (plan->packs < o.packs_per_step()) break;  // the last, partial step
    const double imbalance = plan->rank_imbalance();
    b.mean += imbalance;
    b.worst = std::max(b.worst, imbalance);
    ++b.steps;
  }
  if (b.steps > 0) b.mean /= double(b.steps);
  return b;
}

Balance nanovlm_balance(const std::vector<PackItem>& stream, const NanoVlmSettings& s,
                        const vlm::data::StepPlannerOptions& o) {
  std::vector<std::vector<Pack>> rank_packs;
  const size_t shard = (stream.size() + o.ranks - 1) / o.ranks;
  for (int64_t r = 0; r < o.ranks; ++r) {
    const size_t begin = std::min(stream.size(), r * shard);
    const size_t end = std::min(stream.size(), begin + shard);
    rank_packs.push_back(
        run_nanovlm(std::vector<PackItem>(stream.begin() + begin, stream.begin() + end), s).packs);
  }
  const size_t per_step = static_cast<size_t>(o.micro_steps * o.batch_size);
  size_t steps = SIZE_MAX;
  for (const auto& packs : rank_packs) steps = std::min(steps, packs.size() / per_step);
  Balance b;
  for (size_t step = 0; step < steps; ++step) {
    double max_cost = 0, sum = 0;
    for (const auto& packs : rank_packs) {
      double cost = 0;
      for (size_t i = step * per_step; i < (step + 1) * per_step; ++i)
        cost += o.cost.cost(packs[i]);
      max_cost = std::max(max_cost, cost);
      sum += cost;
    }
    const double imbalance = max_cost / (sum / double(o.ranks)) - 1.0;
    b.mean += imbalance;
    b.worst = std::max(b.worst, imbalance);
    ++b.steps;
  }
  if (b.steps > 0) b.mean /= double(b.steps);
  return b;
}

template <typename F>
double best_seconds(int repeat, F&& run) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "../shared/bench/stream-public-seed1234.jsonl";
  vlm::data::StepPlannerOptions planner;
  planner.ranks = 8;
  planner.micro_steps = 4;
  planner.batch_size = 4;
  int repeat = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (arg == "--ranks") {
      planner.ranks = value();
    } else if (arg == "--micro-steps") {
      planner.micro_steps = value();
    } else if (arg == "--batch-size") {
      planner.batch_size = value();
    } else if (arg == "--repeat") {
      repeat = static_cast<int>(value());
    } else if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: bench_packer [STREAM.jsonl] [--ranks R] [--micro-steps G] "
          "[--batch-size B] [--repeat N]\n");
      return 0;
    } else {
      path = arg;
    }
  }
  std::vector<PackItem> stream;
  try {
    stream = vlm::data::read_length_stream(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }

  const NanoVlmSettings nano;
  vlm::data::SampleLimits limits;    // nanoVLM's: 4096 / 4 / 4096 / 18 / no crop cap
  vlm::data::PackerOptions options;  // 4096 / 18 / no crop cap / 1024 / 2 / 64 / seed 0

  const OursResult ours = run_ours(stream, limits, options);
  const NanoVlmResult theirs = run_nanovlm(stream, nano);
  const FillFigures f_ours =
      fill_figures(ours.packs, options.max_seq_len, options.max_images_per_pack);
  const FillFigures f_nano =
      fill_figures(theirs.packs, nano.seq_length, nano.max_images_per_knapsack);

  const double t_ours = best_seconds(repeat, [&] { run_ours(stream, limits, options); });
  const double t_nano = best_seconds(std::max(1, repeat / 4), [&] { run_nanovlm(stream, nano); });
  const double t_plan = best_seconds(repeat, [&] { our_balance(ours.packs, planner); });
  const Balance b_ours = our_balance(ours.packs, planner);
  const Balance b_nano = nanovlm_balance(stream, nano, planner);

  std::printf("stream: %s (%zu samples)\n", path.c_str(), stream.size());
  std::printf(
      "settings: max_seq_len 4096, max_images_per_knapsack 18, max_images_per_example 4, "
      "max_sample_length 4096, no crop cap\n");
  std::printf("ours: buffer_samples %lld, max_deferrals %lld, emission_window %lld, seed %llu\n",
              (long long)options.buffer_samples, (long long)options.max_deferrals,
              (long long)options.emission_window, (unsigned long long)options.seed);
  std::printf(
      "nanoVLM: num_of_sequences %lld (buffer %lld tokens), delta %lld, random.seed(42)\n\n",
      (long long)nano.num_of_sequences, (long long)(nano.seq_length * nano.num_of_sequences),
      (long long)nano.delta);
  std::printf("%-34s %14s %14s %10s\n", "figure", "ours", "nanoVLM", "ratio");
  auto row = [](const char* name, double a, double b, const char* fmt) {
    char sa[32], sb[32];
    std::snprintf(sa, sizeof sa, fmt, a);
    std::snprintf(sb, sizeof sb, fmt, b);
    std::printf("%-34s %14s %14s %9.3fx\n", name, sa, sb, b != 0 ? a / b : 0.0);
  };
  row("token fill (sample tokens)", 100.0 * f_ours.fill, 100.0 * f_nano.fill, "%.2f%%");
  std::printf("%-34s %14s %13.2f%%\n", "  nanoVLM fill incl. its pad tokens", "-",
              100.0 * double(f_nano.tokens + theirs.pad_tokens) /
                  (double(f_nano.packs) * double(nano.seq_length)));
  row("packs", double(f_ours.packs), double(f_nano.packs), "%.0f");
  row("lower bound (tokens, images)", double(f_ours.lower_bound), double(f_nano.lower_bound),
      "%.0f");
  row("packs / lower bound", f_ours.ratio, f_nano.ratio, "%.4f");
  row("kept samples", double(stream.size() - ours.drops.total()),
      double(stream.size() - theirs.dropped_too_long - theirs.dropped_too_many_images), "%.0f");
  row("dropped: too_long", double(ours.drops.count(vlm::data::DropReason::kTooLong)),
      double(theirs.dropped_too_long), "%.0f");
  row("dropped: too_many_images", double(ours.drops.count(vlm::data::DropReason::kTooManyImages)),
      double(theirs.dropped_too_many_images), "%.0f");
  row("dropped: total", double(ours.drops.total()),
      double(theirs.dropped_too_long + theirs.dropped_too_many_images), "%.0f");
  row("packs/s (filter+pack, 1 core)", double(f_ours.packs) / t_ours, double(f_nano.packs) / t_nano,
      "%.0f");
  std::printf(
      "\nrank balance, %lld ranks x %lld micro-steps x %lld packs, cost = tokens + %.1e "
      "len^2 + %.0f crops\n",
      (long long)planner.ranks, (long long)planner.micro_steps, (long long)planner.batch_size,
      planner.cost.per_len_sq, planner.cost.per_crop);
  std::printf("  (ours: LPT step planner; nanoVLM: each rank packs its own contiguous shard)\n");
  row("full steps", double(b_ours.steps), double(b_nano.steps), "%.0f");
  row("mean imbalance (max/mean - 1)", 100.0 * b_ours.mean, 100.0 * b_nano.mean, "%.2f%%");
  row("worst step imbalance", 100.0 * b_ours.worst, 100.0 * b_nano.worst, "%.2f%%");
  std::printf("%-34s %14.0f\n", "planner steps/s (1 core)", double(b_ours.steps) / t_plan);
  std::printf("\ndrops (ours, JSON): %s\n", ours.drops.to_json().dump().c_str());
  return 0;
}
