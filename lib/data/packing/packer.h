// Multi-constraint streaming packer: samples in, packs (rows of <= max_seq_len tokens) out.
//
// Per pack: tokens <= max_seq_len, images <= max_images_per_pack, crops <= max_crops_per_pack
// (0 = no cap). Samples that alone break a limit must be removed first (SampleFilter); push()
// rejects them.
//
// How it packs (docs/architecture.md "Packing"; measured figures in the bench_packer report):
//  * A bounded pool of buffer_samples waiting samples. Each time the pool is full a round
//    runs: it first offers the pool to the packs carried from earlier rounds, then builds new
//    packs until the pool has room for round_samples() new samples. A new pack starts from
//    the sample that has waited longest (so every sample leaves within a bounded time and
//    the pool keeps the stream's mix) and is completed from the pool by PackPool::complete.
//  * Carry-over with bounded deferral: a pack that is not full after completion (more than
//    max_seq_len/256 tokens free, images and crops below their caps) is carried into the
//    next round, where new arrivals may close it; a pack is carried at most max_deferrals
//    rounds, then emitted as it is.
//  * Final flush (finish()): carried packs get first pick of what is left, the rest is
//    packed the same way, then under-filled packs are merged where they fit together.
//  * Emission window: finished packs wait in a window of emission_window packs and leave in
//    a random order, so the stream of packs is not sorted by length. Randomness comes only
//    from std::mt19937_64 words (reduced by rejection sampling, never a std distribution,
//    whose output differs between standard libraries), so a seed fixes the output.
//  * save_state() / restore_state(): pool, carried packs, window, ready packs and RNG; a
//    restored packer continues exactly as the uninterrupted one would.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/packing/pack_item.h"
#include "data/packing/pack_pool.h"

namespace vlm::data {

struct PackerOptions {
  int64_t max_seq_len = 4096;        // LM tokens per pack
  int64_t max_images_per_pack = 18;  // the config's max_images_per_knapsack
  int64_t max_crops_per_pack = 0;    // ViT crops per pack; 0 = no cap
  int64_t buffer_samples = 1024;     // samples waiting in the pool before packing starts
  int64_t max_deferrals = 2;         // rounds an under-filled pack may be carried
  int64_t emission_window = 64;      // finished packs shuffled before emission; 0 = in order
  uint64_t seed = 0;

  // Samples a round makes room for: buffer_samples / 16 (at least 1). Small rounds keep the
  // pool near full (more choice for every pack); the simulation lost nothing vs. 1.
  int64_t round_samples() const;
  PackLimits limits() const;
  void validate() const;  // throws ConfigError naming the bad option
  bool operator==(const PackerOptions& other) const;
};

nlohmann::json to_json(const PackerOptions& options);

class Packer {
 public:
  explicit Packer(PackerOptions options);

  // Adds the next sample of the stream. Throws std::invalid_argument if the sample alone
  // breaks a pack limit (filter first) or arrives after finish().
  void push(const PackItem& item);
  // End of stream: packs everything that is left; pop() then drains all packs.
  void finish();
  // The next finished pack, if one is ready.
  std::optional<Pack> pop();
  // True after finish() once every pack has been popped.
  bool done() const;

  nlohmann::json save_state() const;
  // Restores a state saved by a packer with the same options (else throws ConfigError).
  void restore_state(const nlohmann::json& state);

  const PackerOptions& options() const { return options_; }
  // Samples inside the packer (pool, carried packs, window, ready packs).
  int64_t samples_inside() const;
  // Their sample ids (pool, carried packs, window, ready packs).
  std::vector<uint64_t> sample_ids() const;
  // The samples themselves, in the same order.
  std::vector<PackItem> items() const;

 private:
  struct CarriedPack {
    Pack pack;
    int64_t deferrals = 0;
  };

  void run_round();
  void retry_carried();
  Pack build_pack();
  void flush();
  void emit(Pack pack);
  void release_one();
  uint64_t uniform_below(uint64_t n);

  PackerOptions options_;
  PackLimits limits_;
  PackPool pool_;
  std::vector<CarriedPack> carried_;
  std::vector<Pack> window_;
  std::deque<Pack> ready_;
  std::mt19937_64 rng_;
  bool finished_ = false;
};

// What is wrong with a pack read back from a saved state, against the limits every pack
// respects ("" when nothing): no samples, or more tokens, images or crops than a pack holds.
std::string pack_limit_problem(const Pack& pack, const PackLimits& limits);

// Merges under-filled packs that fit together (first fit, fullest first); returns the packs
// in a deterministic order. Used by the final flush; exposed for tests.
std::vector<Pack> merge_underfilled(std::vector<Pack> packs, const PackLimits& limits);

}  // namespace vlm::data
