#include "memory/cuda_caching_allocator.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace vlm::memory {

namespace {

int64_t round_up(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

// The lowest address of a bucket of equal sizes, as the size-ordered set gives it.
template <typename Block>
typename std::vector<Block*>::iterator lowest_address(std::vector<Block*>& bucket) {
  return std::min_element(bucket.begin(), bucket.end(),
                          [](const Block* a, const Block* b) { return a->address < b->address; });
}

template <typename Sizes>
auto size_at_least(Sizes& sizes, int64_t size) {
  return std::lower_bound(sizes.begin(), sizes.end(), size,
                          [](const auto& entry, int64_t s) { return entry.first < s; });
}

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

CudaCachingAllocatorModel::CudaCachingAllocatorModel() = default;
CudaCachingAllocatorModel::~CudaCachingAllocatorModel() = default;
CudaCachingAllocatorModel::CudaCachingAllocatorModel(CudaCachingAllocatorModel&&) noexcept =
    default;
CudaCachingAllocatorModel& CudaCachingAllocatorModel::operator=(
    CudaCachingAllocatorModel&&) noexcept = default;

CudaCachingAllocatorModel::Block* CudaCachingAllocatorModel::new_block() {
  if (!spare_.empty()) {
    Block* b = spare_.back();
    spare_.pop_back();
    *b = Block();
    return b;
  }
  if (arena_used_ < arena_.size()) {
    Block* b = &arena_[arena_used_++];
    *b = Block();
    return b;
  }
  ++arena_used_;
  return &arena_.emplace_back();
}

void CudaCachingAllocatorModel::clear() {
  small_free_.clear();
  large_free_.clear();
  live_.clear();
  arena_used_ = 0;
  spare_.clear();
  segments_.clear();
  allocated_ = reserved_ = peak_allocated_ = peak_reserved_ = refused_ = 0;
  next_address_ = kFirstAddress;
}

void CudaCachingAllocatorModel::SmallPool::clear() {
  for (size_t w = 0; w < nonempty.size(); ++w) {
    for (uint64_t bits = nonempty[w]; bits != 0; bits &= bits - 1) {
      buckets[w * 64 + static_cast<size_t>(__builtin_ctzll(bits))].clear();
    }
    nonempty[w] = 0;
  }
}

void CudaCachingAllocatorModel::LargePool::insert(Block* b) {
  auto at = size_at_least(sizes, b->size);
  if (at == sizes.end() || at->first != b->size) {
    uint32_t bucket = 0;
    if (!spare.empty()) {
      bucket = spare.back();
      spare.pop_back();
    } else {
      bucket = static_cast<uint32_t>(buckets.size());
      buckets.emplace_back();
    }
    at = sizes.insert(at, {b->size, bucket});
  }
  buckets[at->second].push_back(b);
}

void CudaCachingAllocatorModel::LargePool::drop_if_empty(size_t at) {
  const uint32_t bucket = sizes[at].second;
  if (!buckets[bucket].empty()) return;
  spare.push_back(bucket);
  sizes.erase(sizes.begin() + static_cast<std::ptrdiff_t>(at));
}

void CudaCachingAllocatorModel::LargePool::erase(Block* b) {
  const auto at = size_at_least(sizes, b->size);
  if (at == sizes.end() || at->first != b->size) return;
  auto& bucket = buckets[at->second];
  const auto it = std::find(bucket.begin(), bucket.end(), b);
  if (it == bucket.end()) return;
  *it = bucket.back();
  bucket.pop_back();
  drop_if_empty(static_cast<size_t>(at - sizes.begin()));
}

CudaCachingAllocatorModel::Block* CudaCachingAllocatorModel::LargePool::take(int64_t size) {
  const auto at = size_at_least(sizes, size);
  if (at == sizes.end()) return nullptr;
  auto& bucket = buckets[at->second];
  const auto best = lowest_address<Block>(bucket);
  Block* b = *best;
  *best = bucket.back();
  bucket.pop_back();
  drop_if_empty(static_cast<size_t>(at - sizes.begin()));
  return b;
}

void CudaCachingAllocatorModel::LargePool::clear() {
  for (const auto& [size, bucket] : sizes) {
    buckets[bucket].clear();
    spare.push_back(bucket);
  }
  sizes.clear();
}

void CudaCachingAllocatorModel::SmallPool::insert(Block* b) {
  const int64_t c = b->size / kCudaMinBlockSize;
  buckets[static_cast<size_t>(c)].push_back(b);
  nonempty[static_cast<size_t>(c / 64)] |= uint64_t{1} << (c % 64);
}

void CudaCachingAllocatorModel::SmallPool::erase(Block* b) {
  const int64_t c = b->size / kCudaMinBlockSize;
  auto& bucket = buckets[static_cast<size_t>(c)];
  const auto it = std::find(bucket.begin(), bucket.end(), b);
  if (it == bucket.end()) return;
  *it = bucket.back();
  bucket.pop_back();
  if (bucket.empty()) nonempty[static_cast<size_t>(c / 64)] &= ~(uint64_t{1} << (c % 64));
}

int64_t CudaCachingAllocatorModel::SmallPool::first_class(int64_t from) const {
  for (int64_t w = from / 64; w < static_cast<int64_t>(nonempty.size()); ++w) {
    uint64_t bits = nonempty[static_cast<size_t>(w)];
    if (w == from / 64) bits &= ~uint64_t{0} << (from % 64);
    if (bits != 0) return w * 64 + __builtin_ctzll(bits);
  }
  return -1;
}

bool CudaCachingAllocatorModel::SmallPool::fits(int64_t size) const {
  return first_class(size / kCudaMinBlockSize) >= 0;
}

CudaCachingAllocatorModel::Block* CudaCachingAllocatorModel::SmallPool::take(int64_t size) {
  const int64_t c = first_class(size / kCudaMinBlockSize);
  if (c < 0) return nullptr;
  auto& bucket = buckets[static_cast<size_t>(c)];
  const auto best = lowest_address<Block>(bucket);
  Block* b = *best;
  *best = bucket.back();
  bucket.pop_back();
  if (bucket.empty()) nonempty[static_cast<size_t>(c / 64)] &= ~(uint64_t{1} << (c % 64));
  return b;
}

void CudaCachingAllocatorModel::insert_free(Block* b) {
  if (b->small) return small_free_.insert(b);
  large_free_.insert(b);
}

void CudaCachingAllocatorModel::erase_free(Block* b) {
  if (b->small) return small_free_.erase(b);
  large_free_.erase(b);
}

void CudaCachingAllocatorModel::load(const std::vector<Segment>& segments) {
  clear();
  for (const Segment& s : segments) {
    uint64_t address = s.address;
    Block* prev = nullptr;
    for (const auto& [bytes, allocated] : s.blocks) {
      Block* b = new_block();
      b->address = address;
      b->size = bytes;
      b->small = !s.large;
      b->allocated = allocated;
      b->prev = prev;
      if (prev != nullptr) prev->next = b;
      if (prev == nullptr) segments_.push_back(b);
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
  return small ? small_free_.take(size) : large_free_.take(size);
}

bool CudaCachingAllocatorModel::needs_segment(int64_t bytes) const {
  const int64_t size = cuda_block_bytes(bytes);
  if (size <= kCudaSmallSize) return !small_free_.fits(size);
  return !large_free_.fits(size);
}

uint64_t CudaCachingAllocatorModel::allocate(int64_t bytes,
                                             std::optional<uint64_t> new_segment_address) {
  Block* b = allocate_block(bytes, new_segment_address);
  live_.emplace(b->address, b);
  return b->address;
}

const void* CudaCachingAllocatorModel::acquire(int64_t bytes) {
  return allocate_block(bytes, std::nullopt);
}

void CudaCachingAllocatorModel::release(const void* block) {
  free_block(const_cast<Block*>(static_cast<const Block*>(block)));
}

// release_cached_blocks: every segment that is one free block (never split, or merged whole
// again) goes back to the device, from both pools.
void CudaCachingAllocatorModel::release_cached_segments() {
  size_t kept = 0;
  for (Block* head : segments_) {
    if (head->allocated || head->next != nullptr) {
      segments_[kept++] = head;
      continue;
    }
    erase_free(head);
    reserved_ -= head->size;
    spare_.push_back(head);
  }
  segments_.resize(kept);
}

CudaCachingAllocatorModel::Block* CudaCachingAllocatorModel::allocate_block(
    int64_t bytes, std::optional<uint64_t> new_segment_address) {
  if (bytes <= 0) throw std::invalid_argument("CudaCachingAllocatorModel: a request of 0 bytes");
  const int64_t size = cuda_block_bytes(bytes);  // round_size
  const bool small = size <= kCudaSmallSize;     // get_pool
  Block* b = take_free_block(size, small);
  if (b == nullptr) {  // alloc_block: one cudaMalloc of get_allocation_size
    const int64_t segment = cuda_segment_bytes(size);
    if (capacity_ > 0 && reserved_ + segment > capacity_) {
      release_cached_segments();
      if (reserved_ + segment > capacity_) ++refused_;
    }
    b = new_block();
    b->size = segment;
    b->small = small;
    b->address = new_segment_address.value_or(next_address_);
    next_address_ =
        std::max(next_address_, b->address + static_cast<uint64_t>(b->size) + (uint64_t{1} << 30));
    segments_.push_back(b);
    reserved_ += b->size;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }
  // should_split: the small pool splits off any remainder of >= 512 B, the large pool only one
  // of more than kSmallSize; otherwise the request keeps (and counts) the whole block.
  const int64_t remaining = b->size - size;
  if (small ? remaining >= kCudaMinBlockSize : remaining > kCudaSmallSize) {
    Block* r = new_block();
    r->address = b->address + static_cast<uint64_t>(size);
    r->size = remaining;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = size;
    insert_free(r);
  }
  b->allocated = true;
  allocated_ += b->size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return b;
}

// Block `b` takes in the block after it (free, and out of its pool), which goes away.
void CudaCachingAllocatorModel::absorb_next(Block* b) {
  Block* n = b->next;
  erase_free(n);
  b->size += n->size;
  b->next = n->next;
  if (n->next != nullptr) n->next->prev = b;
  spare_.push_back(n);
}

// free_block: the block merges with a free neighbour on either side (try_merge_blocks), then
// goes back to its pool. Segments are never returned (no emptyCache).
bool CudaCachingAllocatorModel::free(uint64_t address) {
  const auto it = live_.find(address);
  if (it == live_.end()) return false;
  Block* b = it->second;
  live_.erase(it);
  free_block(b);
  return true;
}

void CudaCachingAllocatorModel::free_block(Block* b) {
  b->allocated = false;
  allocated_ -= b->size;
  if (Block* p = b->prev; p != nullptr && !p->allocated) {
    erase_free(p);  // its size changes: out of the size-ordered pool first
    absorb_next(p);
    b = p;
  }
  if (b->next != nullptr && !b->next->allocated) absorb_next(b);
  insert_free(b);
}

std::vector<CudaCachingAllocatorModel::Segment> CudaCachingAllocatorModel::segments() const {
  std::vector<const Block*> heads(segments_.begin(), segments_.end());
  std::sort(heads.begin(), heads.end(),
            [](const Block* a, const Block* b) { return a->address < b->address; });
  std::vector<Segment> out;
  for (const Block* head : heads) {
    Segment& s = out.emplace_back();
    s.address = head->address;
    s.large = !head->small;
    for (const Block* b = head; b != nullptr; b = b->next) {
      s.blocks.emplace_back(b->size, b->allocated);
    }
  }
  return out;
}

}  // namespace vlm::memory
