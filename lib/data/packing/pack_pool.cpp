#include "data/packing/pack_pool.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace vlm::data {

bool PackLimits::fits(const Pack& pack, const PackItem& item) const {
  return pack.tokens + item.tokens <= max_tokens && pack.images + item.images <= max_images &&
         (max_crops <= 0 || pack.crops + item.crops <= max_crops);
}

bool PackLimits::is_full(const Pack& pack) const {
  return max_tokens - pack.tokens <= close_slack_tokens() || pack.images >= max_images ||
         (max_crops > 0 && pack.crops >= max_crops);
}

PackPool::PackPool(PackLimits limits)
    : limits_(limits),
      close_slack_tokens_(limits.close_slack_tokens()),
      buckets_(static_cast<size_t>(limits.max_tokens) + 1) {}

void PackPool::add(const PackItem& item) {
  if (item.tokens < 0 || item.tokens > limits_.max_tokens) {
    throw std::invalid_argument("PackPool::add: sample " + std::to_string(item.sample_id) +
                                " has " + std::to_string(item.tokens) +
                                " tokens, outside [0, max_seq_len]");
  }
  const uint64_t seq = next_seq_++;
  arrivals_.push_back(Slot{item, false, kNone});
  Bucket& bucket = buckets_[item.tokens];
  if (bucket.tail != kNone) {
    slot(bucket.tail).next_same_length = seq;
  } else {
    bucket.head = seq;
  }
  bucket.tail = seq;
  if (++bucket.count == 1) {
    lengths_.insert(std::lower_bound(lengths_.begin(), lengths_.end(), item.tokens), item.tokens);
  }
  ++live_;
}

PackItem PackPool::take_length(int64_t length) {
  Bucket& bucket = buckets_[length];
  Slot& taken = slot(bucket.head);
  bucket.head = taken.next_same_length;
  if (bucket.head == kNone) bucket.tail = kNone;
  if (--bucket.count == 0) {
    lengths_.erase(std::lower_bound(lengths_.begin(), lengths_.end(), length));
  }
  taken.taken = true;
  --live_;
  PackItem item = taken.item;
  trim_front();
  return item;
}

void PackPool::trim_front() {
  while (!arrivals_.empty() && arrivals_.front().taken) {
    arrivals_.pop_front();
    ++first_seq_;
  }
}

PackItem PackPool::take_oldest() {
  if (live_ == 0) throw std::logic_error("PackPool::take_oldest on an empty pool");
  // The oldest sample is also the oldest of its length, so it heads its bucket.
  return take_length(arrivals_.front().item.tokens);
}

std::vector<PackItem> PackPool::items_oldest_first() const {
  std::vector<PackItem> items;
  items.reserve(static_cast<size_t>(live_));
  for (const Slot& s : arrivals_) {
    if (!s.taken) items.push_back(s.item);
  }
  return items;
}

int64_t PackPool::available(int64_t length, const Choice& reserved) const {
  int64_t count = buckets_[length].count;
  for (int i = 0; i < reserved.count; ++i) count -= reserved.lengths[i] == length;
  return count;
}

int64_t PackPool::largest_index_at_most(int64_t limit) const {
  auto it = std::upper_bound(lengths_.begin(), lengths_.end(), limit);
  return static_cast<int64_t>(it - lengths_.begin()) - 1;
}

bool PackPool::best_single(int64_t gap, const Choice& reserved, Choice& out) const {
  for (int64_t i = largest_index_at_most(gap); i >= 0; --i) {
    if (available(lengths_[i], reserved) > 0) {
      out = Choice{};
      out.push(lengths_[i]);
      return true;
    }
  }
  return false;
}

// The pair with the largest sum <= gap; of equal sums the most balanced. Walks the smaller
// length a down from gap/2 while the partner pointer (largest b <= gap - a) walks up.
bool PackPool::best_pair(int64_t gap, const Choice& reserved, Choice& out) const {
  const int64_t top = largest_index_at_most(gap);
  int64_t i = largest_index_at_most(gap / 2);
  if (i < 0 || top < 0) return false;
  int64_t j = largest_index_at_most(gap - lengths_[i]);
  const int64_t n = static_cast<int64_t>(lengths_.size());
  int64_t best_sum = -1, best_a = 0, best_b = 0;
  for (; i >= 0; --i) {
    const int64_t a = lengths_[i];
    if (a + lengths_[top] <= best_sum) break;  // smaller a cannot beat the best sum
    if (available(a, reserved) < 1) continue;
    while (j + 1 < n && lengths_[j + 1] <= gap - a) ++j;
    int64_t k = j;
    for (; k >= i; --k) {
      if (available(lengths_[k], reserved) >= (k == i ? 2 : 1)) break;
    }
    if (k < i) continue;
    if (a + lengths_[k] > best_sum) {
      best_sum = a + lengths_[k];
      best_a = a;
      best_b = lengths_[k];
      if (best_sum == gap) break;
    }
  }
  if (best_sum < 0) return false;
  out = Choice{};
  out.push(best_b);
  out.push(best_a);
  return true;
}

// The available length nearest to `target` among those <= limit (ties: the longer one).
bool PackPool::nearest_at_most(int64_t target, int64_t limit, const Choice& reserved,
                               int64_t& length) const {
  const int64_t n = static_cast<int64_t>(lengths_.size());
  int64_t up = std::lower_bound(lengths_.begin(), lengths_.end(), target) - lengths_.begin();
  while (up < n && lengths_[up] <= limit && available(lengths_[up], reserved) < 1) ++up;
  const bool has_up = up < n && lengths_[up] <= limit;
  int64_t down = std::min(up, largest_index_at_most(target));
  while (down >= 0 && (lengths_[down] > limit || available(lengths_[down], reserved) < 1)) {
    --down;
  }
  if (!has_up && down < 0) return false;
  if (has_up && (down < 0 || lengths_[up] - target <= target - lengths_[down])) {
    length = lengths_[up];
  } else {
    length = lengths_[down];
  }
  return true;
}

PackPool::Choice PackPool::search(int64_t gap) const {
  Choice best, candidate;
  const Choice none;
  auto good_enough = [&] { return gap - best.tokens <= close_slack_tokens_; };
  if (best_single(gap, none, candidate)) best = candidate;
  if (good_enough()) return best;
  if (best_pair(gap, none, candidate) && candidate.tokens > best.tokens) best = candidate;
  for (int k = 3; k <= kCompletionItems && !good_enough(); ++k) {
    Choice partial;
    int64_t rest = gap;
    bool found = true;
    for (int taken = 0; taken < k - 2 && found; ++taken) {
      int64_t length = 0;
      found = nearest_at_most(rest / (k - taken), rest, partial, length);
      if (found) {
        partial.push(length);
        rest -= length;
      }
    }
    if (!found || !best_pair(rest, partial, candidate)) continue;
    if (partial.tokens + candidate.tokens > best.tokens) {
      for (int i = 0; i < candidate.count; ++i) partial.push(candidate.lengths[i]);
      best = partial;
    }
  }
  return best;
}

bool PackPool::choice_fits(const Pack& pack, const Choice& choice) const {
  int64_t images = pack.images, crops = pack.crops;
  for (int i = 0; i < choice.count; ++i) {
    // The i-th use of a length takes the bucket's next sample after the earlier uses.
    int earlier = 0;
    for (int e = 0; e < i; ++e) earlier += choice.lengths[e] == choice.lengths[i];
    uint64_t seq = buckets_[choice.lengths[i]].head;
    for (int step = 0; step < earlier; ++step) seq = slot(seq).next_same_length;
    images += slot(seq).item.images;
    crops += slot(seq).item.crops;
  }
  return images <= limits_.max_images && (limits_.max_crops <= 0 || crops <= limits_.max_crops);
}

bool PackPool::add_largest_fitting(Pack& pack) {
  for (int64_t i = largest_index_at_most(limits_.max_tokens - pack.tokens); i >= 0; --i) {
    const int64_t length = lengths_[i];
    if (limits_.fits(pack, slot(buckets_[length].head).item)) {
      pack.add(take_length(length));
      return true;
    }
  }
  return false;
}

void PackPool::complete(Pack& pack) {
  // While even kCompletionItems of the longest fitting samples could not fill the gap, take
  // the sample nearest to the gap's even share among the fewest samples that could fill it:
  // that leaves a gap the search can close (the longest sample can leave one between what
  // k and k+1 samples reach, e.g. 114 tokens with samples of 30..36).
  while (live_ > 0) {
    const int64_t gap = limits_.max_tokens - pack.tokens;
    const int64_t top = largest_index_at_most(gap);
    if (top < 0 || lengths_[top] * kCompletionItems >= gap) break;
    const int64_t samples_needed = (gap + lengths_[top] - 1) / lengths_[top];
    int64_t length = 0;
    if (nearest_at_most(gap / samples_needed, gap, Choice{}, length) &&
        limits_.fits(pack, slot(buckets_[length].head).item)) {
      pack.add(take_length(length));
    } else if (!add_largest_fitting(pack)) {
      return;
    }
  }
  const Choice choice = search(limits_.max_tokens - pack.tokens);
  if (choice.count > 0 && choice_fits(pack, choice)) {
    for (int i = 0; i < choice.count; ++i) pack.add(take_length(choice.lengths[i]));
  }
  // Room left (or a choice that broke the image / crop caps): the largest samples that fit.
  while (add_largest_fitting(pack)) {
  }
}

}  // namespace vlm::data
