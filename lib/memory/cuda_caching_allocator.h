// The CUDA caching allocator of LibTorch, as a model: which block a request gets, when a new
// segment is taken from the device, how freed blocks merge, and so the allocated and reserved
// bytes (torch.cuda.max_memory_allocated / max_memory_reserved) of any sequence of requests and
// frees. The rules are PyTorch's c10/cuda/CUDACachingAllocator.cpp with its default settings
// (no max_split_size, no roundup divisions, no expandable segments, one stream), the same from
// LibTorch 1.13 to 2.11; docs/memory.md ("The CUDA caching allocator") cites each.
//
// Replayed from recorded GPU traces (bench/gpu/, docs/memory-trace.md) it reproduces the real
// allocator block for block (tests/memory/test_cuda_caching_allocator.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

namespace vlm::memory {

// c10/core/AllocatorConfig.h (2.11; CUDACachingAllocator.cpp before) and
// CUDACachingAllocator.cpp's kLargeBuffer.
inline constexpr int64_t kCudaMinBlockSize = 512;        // kMinBlockSize: every block
inline constexpr int64_t kCudaSmallSize = 1 << 20;       // kSmallSize: largest small block
inline constexpr int64_t kCudaSmallBuffer = 2 << 20;     // kSmallBuffer: small segments
inline constexpr int64_t kCudaLargeBuffer = 20 << 20;    // kLargeBuffer: 1-10 MiB blocks
inline constexpr int64_t kCudaMinLargeAlloc = 10 << 20;  // kMinLargeAlloc
inline constexpr int64_t kCudaRoundLarge = 2 << 20;      // kRoundLarge: larger segments

// The block the caching allocator hands out for a request of `request` bytes: 0 for 0 (no
// allocation: NativeCachingAllocator::allocate skips size 0), else rounded up to 512 B
// (round_size). allocated_bytes counts blocks.
int64_t cuda_block_bytes(int64_t request);
// The segment (one cudaMalloc) a new block of `block` bytes gets when no cached one fits
// (get_allocation_size): 2 MiB for blocks <= 1 MiB, 20 MiB below 10 MiB, else rounded up to
// 2 MiB. 0 for 0.
int64_t cuda_segment_bytes(int64_t block);

class CudaCachingAllocatorModel {
 public:
  // A segment and its blocks in address order (the allocator's snapshot, or the model's).
  struct Segment {
    uint64_t address = 0;
    bool large = false;                            // the large pool's (else the small pool's)
    std::vector<std::pair<int64_t, bool>> blocks;  // bytes, allocated
    bool operator==(const Segment& o) const {
      return address == o.address && large == o.large && blocks == o.blocks;
    }
  };

  CudaCachingAllocatorModel();
  ~CudaCachingAllocatorModel();
  CudaCachingAllocatorModel(CudaCachingAllocatorModel&&) noexcept;
  CudaCachingAllocatorModel& operator=(CudaCachingAllocatorModel&&) noexcept;

  // Starts from a recorded state: the allocated blocks are live at their addresses.
  void load(const std::vector<Segment>& segments);
  // Back to the empty allocator, keeping the memory of its tables (the step replay makes a
  // prediction after another on one model). Every block handed out before is void.
  void clear();

  // A request of `bytes` (> 0). When no cached block fits, a segment is taken from the device,
  // at `new_segment_address` if given (a replay of a recorded trace), else at an address above
  // every segment so far. Returns the block's address, the key of free().
  uint64_t allocate(int64_t bytes, std::optional<uint64_t> new_segment_address = std::nullopt);
  // Whether allocate(bytes) would take a new segment.
  bool needs_segment(int64_t bytes) const;
  // Frees the block at `address` (completed: one stream, no pending events). False when no
  // block is allocated there.
  bool free(uint64_t address);
  // The same pair for a caller that keeps the block it was given (the step replay, tens of
  // thousands of requests a prediction): no lookup by address. A block taken by acquire is
  // given back by release, never by free(address).
  const void* acquire(int64_t bytes);
  void release(const void* block);

  // The most the allocator may reserve, 0 for no bound: a memory fraction's cap
  // (setMemoryFraction: fraction x the device's memory) or what cudaMalloc can still get. When a
  // new segment would pass it, the allocator returns every cached segment that holds no
  // allocated block to the device and tries again (alloc_block, then release_cached_blocks:
  // release_available_cached_blocks does nothing without max_split_size); a segment that still
  // does not fit is an out-of-memory error, counted in refused() (the model takes it anyway, so
  // a replay goes on).
  void set_capacity(int64_t bytes) { capacity_ = bytes; }
  int64_t capacity() const { return capacity_; }
  int64_t refused() const { return refused_; }

  int64_t allocated_bytes() const { return allocated_; }
  int64_t reserved_bytes() const { return reserved_; }
  int64_t peak_allocated_bytes() const { return peak_allocated_; }
  int64_t peak_reserved_bytes() const { return peak_reserved_; }
  void reset_peaks();

  std::vector<Segment> segments() const;

 private:
  // A block of a segment; prev / next link the blocks of one segment in address order.
  struct Block {
    uint64_t address = 0;
    int64_t size = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;
    Block* next = nullptr;
  };
  Block* new_block();
  Block* allocate_block(int64_t bytes, std::optional<uint64_t> new_segment_address);
  void free_block(Block* b);
  Block* take_free_block(int64_t size, bool small);
  void release_cached_segments();
  void insert_free(Block* b);
  void erase_free(Block* b);
  void absorb_next(Block* b);

  // The pools, searched as PyTorch's BlockComparatorSize orders them with one stream (by size,
  // then address): the small pool's blocks (at most a 2 MiB segment each, so at most 4,096
  // sizes of 512 B) in one bucket per size with a bitmap of the non-empty ones, the large pool
  // in a bucket per size too, the sizes in a sorted vector (thousands of blocks, far fewer
  // sizes; the buckets are reused, so a size that comes and goes allocates nothing). The step
  // replay makes tens of thousands of requests a prediction; a tree per pool was most of its
  // time, then a tree's node per size.
  struct SmallPool {
    static constexpr int64_t kSizes = kCudaSmallBuffer / kCudaMinBlockSize;
    std::vector<std::vector<Block*>> buckets = std::vector<std::vector<Block*>>(kSizes + 1);
    std::vector<uint64_t> nonempty = std::vector<uint64_t>(kSizes / 64 + 1, 0);
    void insert(Block* b);
    void erase(Block* b);
    Block* take(int64_t size);                // best fit, out of the pool; nullptr when none
    bool fits(int64_t size) const;            // a block of at least `size` is there
    int64_t first_class(int64_t from) const;  // the first non-empty bucket from `from`, or -1
    void clear();
  };
  struct LargePool {
    std::vector<std::pair<int64_t, uint32_t>> sizes;  // ascending: a size and its bucket
    std::vector<std::vector<Block*>> buckets;
    std::vector<uint32_t> spare;  // buckets no size holds
    void insert(Block* b);
    void erase(Block* b);
    Block* take(int64_t size);  // best fit, out of the pool; nullptr when none
    bool fits(int64_t size) const { return !sizes.empty() && sizes.back().first >= size; }
    void clear();

   private:
    void drop_if_empty(size_t at);  // a size whose bucket emptied leaves `sizes`
  };
  SmallPool small_free_;
  LargePool large_free_;
  std::unordered_map<uint64_t, Block*> live_;  // allocated blocks by address (free(address))
  std::deque<Block> arena_;                    // every block made; stable addresses
  size_t arena_used_ = 0;  // arena_'s blocks handed out since clear() (spare_'s included)
  std::vector<Block*> spare_;                  // blocks merged away, for reuse
  std::vector<Block*> segments_;               // each segment's first block
  int64_t allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  int64_t capacity_ = 0, refused_ = 0;
  static constexpr uint64_t kFirstAddress = uint64_t{1} << 48;  // the model's own segments
  uint64_t next_address_ = kFirstAddress;
};

}  // namespace vlm::memory
