#include "memory/cuda_caching_allocator.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace vlm::memory {

namespace {

int64_t round_up(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

}  // namespace

int64_t cuda_block_bytes(int64_t request) {
  return request <= 0 ? 0 : round_up(request, kCudaMinBlockSize);
}

int64_t cuda_segment_bytes(int64_t block) {
  if (block <= 0) return 0;
  if (block <= kCudaSmallSize) return kCudaSmallBuffer;
  if (block < kCudaMinLargeAlloc) return kCudaLargeBuffer;
  return round_up(block, kCudaRoundLarge);
}

// A block of a segment; prev / next link the blocks of one segment in address order.
struct CudaCachingAllocatorModel::Block {
  uint64_t address = 0;
  int64_t size = 0;
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
};

// BlockComparatorSize: by size, then address (one stream, so the stream compares equal).
bool CudaCachingAllocatorModel::BySize::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

CudaCachingAllocatorModel::CudaCachingAllocatorModel() = default;
CudaCachingAllocatorModel::~CudaCachingAllocatorModel() = default;
CudaCachingAllocatorModel::CudaCachingAllocatorModel(CudaCachingAllocatorModel&&) noexcept =
    default;
CudaCachingAllocatorModel& CudaCachingAllocatorModel::operator=(
    CudaCachingAllocatorModel&&) noexcept = default;

void CudaCachingAllocatorModel::insert_free(Block* b) {
  (b->small ? small_free_ : large_free_).insert(b);
}

void CudaCachingAllocatorModel::erase_free(Block* b) {
  (b->small ? small_free_ : large_free_).erase(b);
}

void CudaCachingAllocatorModel::load(const std::vector<Segment>& segments) {
  *this = CudaCachingAllocatorModel();
  for (const Segment& s : segments) {
    uint64_t address = s.address;
    Block* prev = nullptr;
    for (const auto& [bytes, allocated] : s.blocks) {
      auto block = std::make_unique<Block>();
      Block* b = block.get();
      b->address = address;
      b->size = bytes;
      b->small = !s.large;
      b->allocated = allocated;
      b->prev = prev;
      if (prev != nullptr) prev->next = b;
      blocks_.emplace(address, std::move(block));
      reserved_ += bytes;
      if (allocated) {
        live_.emplace(address, b);
        allocated_ += bytes;
      } else {
        insert_free(b);
      }
      prev = b;
      address += static_cast<uint64_t>(bytes);
    }
    next_address_ = std::max(next_address_, address + (uint64_t{1} << 30));
  }
  reset_peaks();
}

void CudaCachingAllocatorModel::reset_peaks() {
  peak_allocated_ = allocated_;
  peak_reserved_ = reserved_;
}

// get_free_block: the smallest cached block of the pool at least as large (lower_bound of the
// size-ordered pool). With max_split_size unset neither of its "oversized block" refusals apply.
CudaCachingAllocatorModel::Block* CudaCachingAllocatorModel::take_free_block(int64_t size,
                                                                             bool small) {
  auto& pool = small ? small_free_ : large_free_;
  Block key;
  key.size = size;
  key.address = 0;
  const auto it = pool.lower_bound(&key);
  if (it == pool.end()) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

bool CudaCachingAllocatorModel::needs_segment(int64_t bytes) const {
  const int64_t size = cuda_block_bytes(bytes);
  const auto& pool = size <= kCudaSmallSize ? small_free_ : large_free_;
  Block key;
  key.size = size;
  return pool.lower_bound(&key) == pool.end();
}

uint64_t CudaCachingAllocatorModel::allocate(int64_t bytes,
                                             std::optional<uint64_t> new_segment_address) {
  if (bytes <= 0) throw std::invalid_argument("CudaCachingAllocatorModel: a request of 0 bytes");
  const int64_t size = cuda_block_bytes(bytes);  // round_size
  const bool small = size <= kCudaSmallSize;     // get_pool
  Block* b = take_free_block(size, small);
  if (b == nullptr) {  // alloc_block: one cudaMalloc of get_allocation_size
    auto block = std::make_unique<Block>();
    b = block.get();
    b->size = cuda_segment_bytes(size);
    b->small = small;
    b->address = new_segment_address.value_or(next_address_);
    next_address_ =
        std::max(next_address_, b->address + static_cast<uint64_t>(b->size) + (uint64_t{1} << 30));
    blocks_.emplace(b->address, std::move(block));
    reserved_ += b->size;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }
  // should_split: the small pool splits off any remainder of >= 512 B, the large pool only one
  // of more than kSmallSize; otherwise the request keeps (and counts) the whole block.
  const int64_t remaining = b->size - size;
  if (small ? remaining >= kCudaMinBlockSize : remaining > kCudaSmallSize) {
    auto rest = std::make_unique<Block>();
    Block* r = rest.get();
    r->address = b->address + static_cast<uint64_t>(size);
    r->size = remaining;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = size;
    blocks_.emplace(r->address, std::move(rest));
    insert_free(r);
  }
  b->allocated = true;
  allocated_ += b->size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  live_.emplace(b->address, b);
  return b->address;
}

// Block `b` takes in the block after it (free, and out of its pool), which goes away.
void CudaCachingAllocatorModel::absorb_next(Block* b) {
  Block* n = b->next;
  erase_free(n);
  b->size += n->size;
  b->next = n->next;
  if (n->next != nullptr) n->next->prev = b;
  blocks_.erase(n->address);
}

// free_block: the block merges with a free neighbour on either side (try_merge_blocks), then
// goes back to its pool. Segments are never returned (no emptyCache).
bool CudaCachingAllocatorModel::free(uint64_t address) {
  const auto it = live_.find(address);
  if (it == live_.end()) return false;
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  allocated_ -= b->size;
  if (Block* p = b->prev; p != nullptr && !p->allocated) {
    erase_free(p);  // its size changes: out of the size-ordered pool first
    absorb_next(p);
    b = p;
  }
  if (b->next != nullptr && !b->next->allocated) absorb_next(b);
  insert_free(b);
  return true;
}

std::vector<CudaCachingAllocatorModel::Segment> CudaCachingAllocatorModel::segments() const {
  std::vector<Segment> out;
  for (const auto& [address, block] : blocks_) {
    if (block->prev != nullptr) continue;  // not a segment's first block
    Segment& s = out.emplace_back();
    s.address = address;
    s.large = !block->small;
    for (const Block* b = block.get(); b != nullptr; b = b->next) {
      s.blocks.emplace_back(b->size, b->allocated);
    }
  }
  return out;
}

}  // namespace vlm::memory
