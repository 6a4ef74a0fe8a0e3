// Portable random draws for the demo dataset. std::uniform_*_distribution differ between
// standard libraries, so every draw here is built from raw std::mt19937_64 output (whose
// sequence the C++ standard fixes) with integer arithmetic only: the same seed gives the
// same bytes everywhere.
#pragma once

#include <cstdint>
#include <random>

namespace vlm::data {

class DemoRandom {
 public:
  explicit DemoRandom(uint64_t seed) : engine_(seed) {}

  // SplitMix64 finaliser (Steele et al., 2014): decorrelates seeds built from small integers
  // (seed, split, sample index) before they seed the Mersenne Twister.
  static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  uint64_t next() { return engine_(); }

  // Uniform in [0, n), n >= 1, without modulo bias (rejection of the top partial range).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x = 0;
    do {
      x = engine_();
    } while (x >= limit);
    return x % n;
  }

  // Uniform integer in [lo, hi], lo <= hi.
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }

  // True with probability percent / 100.
  bool percent(int percent) { return below(100) < static_cast<uint64_t>(percent); }

 private:
  std::mt19937_64 engine_;
};

}  // namespace vlm::data
