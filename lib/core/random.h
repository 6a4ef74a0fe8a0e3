// Deterministic random draws that give the same numbers with every standard library.
//
// std::uniform_int_distribution and friends are implementation-defined, so the same seed
// would shuffle differently under libstdc++ and libc++. Everything that must be reproducible
// (data order, packing, demo data) draws through this class instead.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace vlm {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : engine_(seed) {}
  // A seed derived from several numbers (seed, dataset, epoch, ...) by SplitMix64 mixing.
  static uint64_t mix(std::initializer_list<uint64_t> parts);

  uint64_t next() { return engine_(); }
  // Uniform in [0, n), unbiased (Lemire's multiply-shift with rejection); n > 0.
  uint64_t below(uint64_t n);
  // Uniform in [lo, hi] inclusive.
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  template <class T>
  void shuffle(std::vector<T>& items) {
    for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[below(i)]);
  }

  // The engine's full state as text (the standard's portable format), for resumable cursors.
  std::string state() const;
  void set_state(const std::string& state);  // throws std::invalid_argument when malformed

 private:
  std::mt19937_64 engine_;
};

}  // namespace vlm
