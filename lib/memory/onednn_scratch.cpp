// oneDNN's scratchpad for a bf16 matrix product on the CPU (memory/replay.h,
// bf16_matmul_scratch): oneDNN v2.6.3 as Debian's LibTorch 1.13.1 links it, the brgemm matmul
// for avx512_core_bf16 (no AMX). Sources, at tag v2.6.3 of oneapi-src/oneDNN:
// src/cpu/x64/matmul/brgemm_matmul_utils.cpp (init_brgemm_matmul_conf, the blocking search
// compute_blocking_heuristic_avx512, init_scratchpad) and src/common/memory_tracking.hpp
// (registry_t::book pads every buffer by its 128-byte alignment). ideep hands oneDNN a
// scratchpad tensor of exactly that size from LibTorch's allocator. Checked against the
// tracking allocator over 17,436 shapes (mm, bmm, transposed operands, 1 to 16 threads).
#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "memory/replay.h"

namespace vlm::memory::replay {
namespace {

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return div_up(a, b) * b; }
bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// calculate_spatial_disbalance: the idle share of the last round of `work` over `threads`.
float spatial_imbalance(int64_t work, int64_t threads) {
  const int64_t mod = work % threads;
  const int64_t idle = work < threads ? threads - mod : std::min(threads - mod, mod);
  return static_cast<float>(idle) / static_cast<float>(threads);
}

// The scratchpad of one brgemm matmul primitive: `ndims` 2 (mm) or 3 (bmm), `src_transposed`
// when the left operand is a transposed view (oneDNN's ba / acb layouts).
int64_t brgemm_scratch(int ndims, int64_t batch, int64_t M, int64_t K, int64_t N,
                       bool src_transposed, int64_t threads) {
  constexpr int64_t kPad = 128;  // registry_t::book: every buffer + its alignment
  // The left operand is copied into blocks when transposed, or when its leading dimension is
  // a large power of two (lda_is_big_2pow).
  const bool copy_a = src_transposed || (is_pow2(K) && K >= 4096 && M >= 1024);
  const int64_t k_blk = std::min(K, K > 1024 && !src_transposed ? int64_t{1024} : int64_t{512});
  int64_t n_blk = std::min<int64_t>(64, N);
  const int64_t n_chunks = div_up(N, n_blk);
  const int64_t first_n_chunk = std::min<int64_t>(copy_a ? 16 : 1, n_chunks);
  const int64_t max_m_blk = std::min<int64_t>(256, M);
  int64_t min_m_blk = std::min<int64_t>(32, M);
  int64_t first_nthr_k = 1;
  if (threads > batch * n_chunks) {  // little parallel work
    min_m_blk = std::min<int64_t>(16, M);
    // Plain 2-D weights fix the block; in 3-D it halves for small M.
    if ((M <= 40 || (src_transposed && M <= 512)) && ndims == 3) n_blk = std::min<int64_t>(N, 32);
    if (src_transposed && is_pow2(K) && K >= 2048) first_nthr_k = std::min<int64_t>(threads, 4);
  }
  // The exhaustive search over (threads on K, N chunk, M block) for the least mean of five
  // imbalances; ties keep the first found (a strict <, in float as oneDNN computes it).
  float best = 1.f;
  int64_t m_blk = 1, n_chunk = 1, nthr_k = 1;
  for (int64_t tk = first_nthr_k; tk >= 1; --tk) {
    for (int64_t nc = first_n_chunk; nc >= 1; --nc) {
      for (int64_t mb = max_m_blk; mb >= min_m_blk; --mb) {
        const int64_t parallel = threads / tk;
        const int64_t work = div_up(M, mb) * div_up(N, n_blk * nc) * batch;
        const float work_imbalance = spatial_imbalance(work, parallel);
        const float m_imbalance =
            static_cast<float>((mb * div_up(M, mb)) % M) / static_cast<float>(M);
        const int64_t n_blocks = div_up(N, n_blk);
        const float n_imbalance =
            static_cast<float>(div_up(n_blocks, nc) * nc - n_blocks) / static_cast<float>(n_blocks);
        const float k_imbalance = spatial_imbalance(K, tk * k_blk);
        const float thread_imbalance =
            parallel * tk != threads
                ? static_cast<float>(threads - parallel * tk) / static_cast<float>(threads)
                : 0.f;
        const float score =
            (work_imbalance + m_imbalance + n_imbalance + thread_imbalance + k_imbalance) / 5;
        if (score < best) {
          best = score;
          m_blk = mb;
          n_chunk = nc;
          nthr_k = tk;
        }
      }
    }
  }
  const bool accumulate = K > k_blk;  // an fp32 accumulator across K blocks
  int64_t lda = K;
  if (copy_a) {
    lda = round_up(k_blk, 32);
    if (lda >= 512 && is_pow2(lda)) lda += 32;  // get_actual_lda
  }
  int64_t weight_n_blk = 64;
  if (weight_n_blk > n_blk && (N != n_blk || N >= weight_n_blk)) weight_n_blk = n_blk;
  const int64_t ldc = accumulate && nthr_k <= 1 ? n_blk : N;
  int64_t bytes = threads * 16 * 32 + kPad;  // the brgemm batch elements
  if (copy_a) bytes += threads * 2 * m_blk * lda + kPad;
  bytes += threads * 2 * weight_n_blk * round_up(k_blk, 32) + kPad;  // B in 32-row bf16 blocks
  if (accumulate) bytes += threads * 4 * (nthr_k > 1 ? ldc * M : ldc * m_blk * n_chunk) + kPad;
  return bytes;
}

// The search costs up to 256 x 16 x 4 candidates; a replay asks for the same few shapes in
// every block, so each thread keeps the answers it has computed.
struct ShapeKey {
  int64_t threads, batch, M, K, N;
  bool a_transposed, b_transposed;
  bool operator==(const ShapeKey& o) const {
    return std::tie(threads, batch, M, K, N, a_transposed, b_transposed) ==
           std::tie(o.threads, o.batch, o.M, o.K, o.N, o.a_transposed, o.b_transposed);
  }
};
struct ShapeHash {
  size_t operator()(const ShapeKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (const int64_t v : {k.threads, k.batch, k.M, k.K, k.N, int64_t{k.a_transposed},
                            int64_t{k.b_transposed}}) {
      h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

int64_t compute_scratch(int64_t threads, int64_t batch, int64_t M, int64_t K, int64_t N,
                        bool a_transposed, bool b_transposed) {
  if (batch <= 0) {
    // mm reaches oneDNN as C^T = B^T A^T: the left operand stays the input unless N == 1.
    if (N != 1) return brgemm_scratch(2, 1, M, K, N, a_transposed && !(M == 1 && K == 1), threads);
    return brgemm_scratch(2, 1, 1, K, M, !b_transposed && K > 1, threads);
  }
  return brgemm_scratch(3, batch, M, K, N, a_transposed && !(M == 1 && K == 1), threads);
}

}  // namespace

bool onednn_bf16_product(bool onednn, int64_t batch, int64_t M, int64_t K, int64_t N) {
  // Below 16^3 multiply-adds ATen runs the product natively (mkldnn_gemm_min_size).
  return onednn && std::max<int64_t>(batch, 1) * M * K * N > 16 * 16 * 16;
}

int64_t bf16_matmul_scratch(bool onednn, int64_t threads, int64_t batch, int64_t M, int64_t K,
                            int64_t N, bool a_transposed, bool b_transposed) {
  if (M <= 0 || K <= 0 || N <= 0 || threads <= 0) return 0;
  if (!onednn_bf16_product(onednn, batch, M, K, N)) return 0;
  thread_local std::unordered_map<ShapeKey, int64_t, ShapeHash> known;
  const ShapeKey key{threads, batch, M, K, N, a_transposed, b_transposed};
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  if (known.size() > (1u << 16)) known.clear();  // bounded: shapes come from a few models
  const int64_t bytes = compute_scratch(threads, batch, M, K, N, a_transposed, b_transposed);
  known.emplace(key, bytes);
  return bytes;
}

}  // namespace vlm::memory::replay
