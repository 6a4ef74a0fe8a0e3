// The CUDA caching allocator's model (memory/cuda_caching_allocator.h): its rules one by one,
// then every recorded GPU trace of bench/gpu/ replayed through it. With the addresses the
// trace recorded for new segments, the model must make every choice the allocator made: each
// step's allocated and reserved peaks, the bytes at its end and the end state block for block.
// With addresses of its own (as a prediction has), the peaks stay within the memory model's
// bounds for GPU predictions (docs/memory.md): 1% allocated, 3% reserved.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "memory/cuda_caching_allocator.h"
#include "memory/recorded_trace.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using vlm::memory::CudaCachingAllocatorModel;

namespace {

constexpr int64_t MiB = 1 << 20;

std::vector<fs::path> recorded_traces() {
  std::vector<fs::path> out;
  for (const auto& entry :
       fs::recursive_directory_iterator(fs::path(VLM_SOURCE_DIR) / "bench" / "gpu")) {
    if (entry.path().filename().string().find(".trace.xz") != std::string::npos) {
      out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("requests are rounded to 512 bytes and served from 2 MiB, 20 MiB or rounded segments",
          "[cuda_allocator]") {
  CudaCachingAllocatorModel m;
  m.allocate(1);  // a 512-byte block of a new 2 MiB small segment, the rest split off
  CHECK(m.allocated_bytes() == 512);
  CHECK(m.reserved_bytes() == 2 * MiB);
  m.allocate(MiB);  // the largest small block: from the same segment's remainder
  CHECK(m.allocated_bytes() == 512 + MiB);
  CHECK(m.reserved_bytes() == 2 * MiB);
  m.allocate(MiB + 1);  // large pool, below 10 MiB: a 20 MiB segment
  CHECK(m.reserved_bytes() == 22 * MiB);
  // 10 MiB and more, when no cached block fits (the 20 MiB segment's 19 MiB rest does not): a
  // segment of its size rounded up to 2 MiB.
  m.allocate(29 * MiB + 1);
  CHECK(m.reserved_bytes() == 52 * MiB);
  CHECK(m.peak_allocated_bytes() == m.allocated_bytes());
}

TEST_CASE("at its cap the allocator returns its cached whole segments, then takes the new one",
          "[cuda_allocator]") {
  const auto run = [](int64_t capacity) {
    CudaCachingAllocatorModel m;
    m.set_capacity(capacity);
    const uint64_t a = m.allocate(30 * MiB);  // a 30 MiB segment
    m.allocate(20 * MiB);                     // a 20 MiB one
    m.allocate(1);                            // a 2 MiB small segment, split: it stays
    CHECK(m.free(a));                         // cached, one free block: it may go back
    m.allocate(40 * MiB);                     // no cached block fits: a new segment
    return m;
  };
  const CudaCachingAllocatorModel uncapped = run(0);
  CHECK(uncapped.reserved_bytes() == 92 * MiB);
  CudaCachingAllocatorModel capped = run(64 * MiB);
  CHECK(capped.reserved_bytes() == 62 * MiB);  // 52 + 40 > 64: the 30 MiB went back first
  CHECK(capped.peak_reserved_bytes() == 62 * MiB);
  CHECK(capped.refused() == 0);
  // Nothing left to return (every segment holds an allocated block): an OOM, counted; the
  // model takes the segment so that a replay goes on.
  capped.allocate(20 * MiB);
  CHECK(capped.refused() == 1);
  CHECK(capped.reserved_bytes() == 82 * MiB);
}

TEST_CASE("a large block keeps a remainder of 1 MiB or less, which then counts as allocated",
          "[cuda_allocator]") {
  CudaCachingAllocatorModel m;
  const uint64_t big = m.allocate(20 * MiB);
  CHECK(m.free(big));
  // 19 MiB + 512 B from the cached 20 MiB block: the remainder (1 MiB - 512 B) is not split.
  m.allocate(19 * MiB + 512);
  CHECK(m.allocated_bytes() == 20 * MiB);
  CHECK(m.segments().front().blocks.size() == 1);
  // In the small pool any remainder of 512 B or more is split off, 1 MiB included.
  CudaCachingAllocatorModel s;
  s.allocate(MiB);
  CHECK(s.allocated_bytes() == MiB);
  CHECK(s.segments().front().blocks.size() == 2);
}

TEST_CASE("the best fit is the smallest cached block, and freed neighbours merge",
          "[cuda_allocator]") {
  CudaCachingAllocatorModel m;
  const uint64_t a = m.allocate(4 * MiB);
  const uint64_t b = m.allocate(4 * MiB);  // both from one 20 MiB segment
  const uint64_t c = m.allocate(4 * MiB);
  CHECK(m.reserved_bytes() == 20 * MiB);
  CHECK(m.free(a));
  CHECK(m.free(c));  // c merges with the 8 MiB remainder: free blocks of 4 and 12 MiB
  CHECK(m.allocate(3 * MiB) == a);  // the 4 MiB block, not the 12 MiB one
  CHECK(m.free(b));
  CHECK_FALSE(m.free(b));  // no longer allocated
  const auto segments = m.segments();
  REQUIRE(segments.size() == 1);
  // 3 MiB allocated (its 1 MiB remainder not split), then b merged with the 12 MiB block.
  CHECK(segments.front().blocks ==
        std::vector<std::pair<int64_t, bool>>{{4 * MiB, true}, {16 * MiB, false}});
  CHECK(m.peak_allocated_bytes() == 12 * MiB);
}

TEST_CASE("among cached blocks of one size the lowest address wins, in both pools",
          "[cuda_allocator]") {
  CudaCachingAllocatorModel m;
  // Large: three 12 MiB requests, a segment each, freed last first.
  const uint64_t a = m.allocate(12 * MiB), b = m.allocate(12 * MiB), c = m.allocate(12 * MiB);
  CHECK(m.free(c));
  CHECK(m.free(a));
  CHECK(m.free(b));
  CHECK(m.allocate(12 * MiB) == a);
  CHECK(m.allocate(12 * MiB) == b);
  // Small: 512-byte blocks of one segment with live ones between them, freed last first.
  std::vector<uint64_t> blocks;
  for (int k = 0; k < 6; ++k) blocks.push_back(m.allocate(512));
  for (int k : {4, 2, 0}) CHECK(m.free(blocks[static_cast<size_t>(k)]));
  CHECK(m.allocate(512) == blocks[0]);
  CHECK(m.allocate(512) == blocks[2]);
}

// The step replay empties one model per thread between predictions (clear()): what it then
// does must not depend on what it did before.
TEST_CASE("an emptied allocator model replays a stream as a new one does", "[cuda_allocator]") {
  const auto replay = [](CudaCachingAllocatorModel& m, uint32_t seed) {
    uint32_t state = seed;
    const auto next = [&state] { return state = state * 1664525u + 1013904223u; };
    std::vector<const void*> live;
    for (int k = 0; k < 4000; ++k) {
      if (!live.empty() && next() % 3 == 0) {
        const size_t at = next() % live.size();
        m.release(live[at]);
        live[at] = live.back();
        live.pop_back();
      } else {
        // Sizes across both pools: small blocks, 1-10 MiB (20 MiB segments) and larger.
        const uint32_t kind = next() % 3;
        const int64_t bytes = kind == 0   ? 1 + next() % MiB
                              : kind == 1 ? MiB + 1 + next() % (9 * MiB)
                                          : 10 * MiB + next() % (40 * MiB);
        live.push_back(m.acquire(bytes));
      }
    }
  };
  for (const uint32_t seed : {1u, 7u, 12345u}) {
    CudaCachingAllocatorModel fresh, reused;
    replay(reused, seed + 99);  // another stream first, then emptied
    reused.clear();
    replay(fresh, seed);
    replay(reused, seed);
    CHECK(reused.segments() == fresh.segments());
    CHECK(reused.allocated_bytes() == fresh.allocated_bytes());
    CHECK(reused.reserved_bytes() == fresh.reserved_bytes());
    CHECK(reused.peak_allocated_bytes() == fresh.peak_allocated_bytes());
    CHECK(reused.peak_reserved_bytes() == fresh.peak_reserved_bytes());
    CHECK(fresh.reserved_bytes() > fresh.allocated_bytes());  // the stream left a cache
  }
}

TEST_CASE("a malformed memory trace is refused with its line", "[cuda_allocator]") {
  std::istringstream in("# vlmtrain memory trace 1\n# x\nS 1 0 0\nX 0 a\nA 12 zz 0 0\n");
  CHECK_THROWS_WITH(vlm::memory::read_memory_trace(in),
                    Catch::Contains("line 5") && Catch::Contains("hex address"));
  // A huge context id sizes no table; contexts, blocks and events must be the writer's.
  for (const char* bad :
       {"S 1 0 0\nX 999999999999999 a;b\n", "S 1 0 0\nX 1 a\n", "S 1 0 0\nA 512 7f 0 0\n",
        "S 1 0 0\nX 0 a\nA -5 7f 0 0\n", "S 1 0 0\nG 7f 1024 1 0\nB 0 1\n", "E 1 0 0 0 0\n",
        "S 1 0 0\nE 2 0 0 0 0\n", "Q 1\n"}) {
    CAPTURE(bad);
    std::istringstream trace(bad);
    CHECK_THROWS_AS(vlm::memory::read_memory_trace(trace), std::runtime_error);
  }
}

TEST_CASE("every recorded GPU trace replays on the allocator model, choice for choice",
          "[cuda_allocator]") {
  const auto traces = recorded_traces();
  REQUIRE(traces.size() >= 43);
  int replayed = 0;
  for (const fs::path& file : traces) {
    CAPTURE(file.string());
    std::istringstream in(vlm::test::read_xz_file(file));
    const auto trace = vlm::memory::read_memory_trace(in);
    REQUIRE(trace.cuda);
    REQUIRE_FALSE(trace.steps.empty());
    for (const auto& step : trace.steps) {
      // Every trace: the segments taken during the step give its reserved peak.
      int64_t reserved = step.reserved_at_start, peak = reserved;
      for (const auto& e : step.events) {
        if (e.kind == 'M') peak = std::max(peak, reserved += e.bytes);
        if (e.kind == 'U') reserved -= e.bytes;
      }
      CHECK(peak == step.peak_reserved);
    }
    if (trace.steps.front().start_state.empty()) continue;  // recorded before states were
    ++replayed;
    const auto exact = vlm::memory::replay_on_allocator_model(trace, true);
    const auto predicted = vlm::memory::replay_on_allocator_model(trace, false);
    for (size_t i = 0; i < trace.steps.size(); ++i) {
      const auto& s = trace.steps[i];
      CAPTURE(s.step);
      CHECK(exact[i].diverged == 0);
      CHECK(exact[i].peak_allocated == s.peak_allocated);
      CHECK(exact[i].peak_reserved == s.peak_reserved);
      CHECK(exact[i].allocated_at_end == s.allocated_at_end);
      CHECK(exact[i].reserved_at_end == s.reserved_at_end);
      CHECK(exact[i].end_state_equal);
      const double allocated_error =
          static_cast<double>(predicted[i].peak_allocated - s.peak_allocated) /
          static_cast<double>(s.peak_allocated);
      const double reserved_error =
          static_cast<double>(predicted[i].peak_reserved - s.peak_reserved) /
          static_cast<double>(s.peak_reserved);
      CHECK(std::abs(allocated_error) <= 0.01);
      CHECK(std::abs(reserved_error) <= 0.03);
    }
  }
  CHECK(replayed >= 26);  // H200: record-2, varlen-1; H100: the 2026-11-28 recordings
}
