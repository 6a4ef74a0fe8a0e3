#include "data/batch/loader.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace vlm::data {

int64_t host_batch_bytes(const HostBatch& b) {
  const int64_t crops = b.staged_crops ? b.num_crops * 3 * b.crop_size * b.crop_size  // pinned
                                       : static_cast<int64_t>(b.crops.size());
  return static_cast<int64_t>(crops * static_cast<int64_t>(sizeof(float)) +
                              static_cast<int64_t>((b.input_ids.size() + b.position_ids.size() +
                                                    b.labels.size() + b.cu_seqlens.size()) *
                                                       sizeof(int32_t) +
                                                   b.image_token_index.size() * sizeof(int64_t)));
}

namespace detail {

// What the loader shares with the steps it hands out: one lock for everything, the room for
// micro-batches collated ahead, and the host bytes they hold.
struct LoaderShared {
  std::mutex mutex;
  std::condition_variable changed;
  int64_t capacity = 1;  // micro-batches submitted and not yet taken, at most
  int64_t queued = 0;
  bool stopping = false;  // the loader is going away
  std::atomic<int64_t> host_bytes{0};
  std::atomic<int64_t> peak_host_bytes{0};

  void account(int64_t delta_bytes) {
    const int64_t now = host_bytes.fetch_add(delta_bytes) + delta_bytes;
    int64_t peak = peak_host_bytes.load();
    while (now > peak && !peak_host_bytes.compare_exchange_weak(peak, now)) {
    }
  }
  // A submitted micro-batch's result taken or dropped: its room is free again.
  void free_room(const std::optional<int64_t>& bytes) {
    if (bytes) account(-*bytes);
    {
      std::lock_guard<std::mutex> lock(mutex);
      --queued;
    }
    changed.notify_all();
  }
};

// One step's micro-batches: submitted by the planner thread in order, taken by the consumer in
// order. Guarded by shared->mutex.
struct StepBatchState {
  StepBatchState(std::shared_ptr<LoaderShared> s, size_t n) : shared(std::move(s)), size(n) {}
  std::shared_ptr<LoaderShared> shared;
  size_t size = 0;
  std::deque<std::future<HostBatch>> ready;  // submitted, not yet taken
  size_t taken = 0;
  bool dropped = false;      // the consumer let the step go: submit nothing more
  std::exception_ptr error;  // the planner could not submit the rest
};

// Waits for a dropped micro-batch's collation and frees its room.
void drop(LoaderShared& shared, std::future<HostBatch>& future) {
  std::optional<int64_t> bytes;
  try {
    bytes = host_batch_bytes(future.get());
  } catch (...) {  // a failed collation accounted nothing
  }
  shared.free_room(bytes);
}

}  // namespace detail

// --- StepBatches ---------------------------------------------------------------------------

StepBatches::StepBatches(std::shared_ptr<detail::StepBatchState> state)
    : state_(std::move(state)) {}

StepBatches StepBatches::ready(std::vector<HostBatch> batches) {
  auto shared = std::make_shared<detail::LoaderShared>();
  shared->capacity = shared->queued = static_cast<int64_t>(batches.size());
  auto state = std::make_shared<detail::StepBatchState>(shared, batches.size());
  for (HostBatch& batch : batches) {
    shared->account(host_batch_bytes(batch));
    std::promise<HostBatch> promise;
    promise.set_value(std::move(batch));
    state->ready.push_back(promise.get_future());
  }
  return StepBatches(std::move(state));
}

StepBatches& StepBatches::operator=(StepBatches&& other) noexcept {
  if (this != &other) {
    drop_rest();
    state_ = std::move(other.state_);
    wait_ms_ = other.wait_ms_;
  }
  return *this;
}

StepBatches::~StepBatches() { drop_rest(); }

int64_t StepBatches::size() const { return state_ ? static_cast<int64_t>(state_->size) : 0; }

std::optional<HostBatch> StepBatches::take() {
  if (!state_) return std::nullopt;
  detail::StepBatchState& s = *state_;
  detail::LoaderShared& shared = *s.shared;
  const auto start = std::chrono::steady_clock::now();
  std::future<HostBatch> future;
  {
    std::unique_lock<std::mutex> lock(shared.mutex);
    if (s.taken == s.size) return std::nullopt;
    shared.changed.wait(lock, [&] { return !s.ready.empty() || s.error || shared.stopping; });
    if (s.ready.empty()) {
      if (s.error) std::rethrow_exception(s.error);
      throw std::logic_error("a step's micro-batch was taken after its loader stopped");
    }
    future = std::move(s.ready.front());
    s.ready.pop_front();
    ++s.taken;
  }
  std::optional<HostBatch> batch;
  try {
    batch = future.get();  // rethrows a worker's exception
  } catch (...) {
    shared.free_room(std::nullopt);
    throw;
  }
  shared.free_room(host_batch_bytes(*batch));
  wait_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return batch;
}

void StepBatches::drop_rest() {
  if (!state_) return;
  std::deque<std::future<HostBatch>> rest;
  {
    std::lock_guard<std::mutex> lock(state_->shared->mutex);
    state_->dropped = true;
    rest.swap(state_->ready);
  }
  state_->shared->changed.notify_all();  // a planner waiting for room to submit more stops
  for (auto& future : rest) detail::drop(*state_->shared, future);
  state_.reset();
}

// --- Loader --------------------------------------------------------------------------------

Loader::Loader(PlanningPipeline& pipeline, LoaderOptions options)
    : pipeline_(pipeline),
      options_(std::move(options)),
      shared_(std::make_shared<detail::LoaderShared>()),
      workers_(static_cast<size_t>(options_.workers)) {
  shared_->capacity = std::max<int64_t>(options_.prefetch_batches, 1);
  planner_ = std::thread([this] { produce(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->changed.notify_all();
  pipeline_.stop();  // a step in the making is not needed: within one sample
  planner_.join();
  // Pending futures are waited for by the pool's destructor (it drains its queue).
}

int64_t Loader::host_bytes() const { return shared_->host_bytes.load(); }
int64_t Loader::peak_host_bytes() const { return shared_->peak_host_bytes.load(); }

void Loader::produce() {
  detail::LoaderShared& shared = *shared_;
  std::shared_ptr<detail::StepBatchState> current;  // the step whose batches are submitted
  try {
    for (;;) {
      std::optional<PlannedStep> planned = pipeline_.next_step();
      if (!planned) break;
      if (planned->step == options_.stall_step) {
        std::unique_lock<std::mutex> lock(shared.mutex);
        shared.changed.wait(lock, [&] { return shared.stopping; });
        return;
      }
      // Each micro-batch with its samples, taken before the plan releases them.
      const auto& mine = planned->plan.micro_batches.at(static_cast<size_t>(options_.rank));
      std::vector<std::pair<MicroBatch, std::vector<std::shared_ptr<const BuiltSample>>>> jobs;
      jobs.reserve(mine.size());
      for (const MicroBatch& micro : mine) {
        std::vector<std::shared_ptr<const BuiltSample>> samples;
        for (const Pack& pack : micro.packs) {
          for (const PackItem& item : pack.items)
            samples.push_back(pipeline_.sample(item.sample_id));
        }
        jobs.emplace_back(micro, std::move(samples));
      }
      pipeline_.release(planned->plan);
      current = std::make_shared<detail::StepBatchState>(shared_, jobs.size());
      {
        std::lock_guard<std::mutex> lock(shared.mutex);
        queue_.push_back(
            {planned->step, std::move(planned->plan), std::move(planned->cursor_after), current});
      }
      shared.changed.notify_all();
      for (auto& [micro, samples] : jobs) {
        {  // Room: at most `capacity` micro-batches collated ahead of the ones taken.
          std::unique_lock<std::mutex> lock(shared.mutex);
          shared.changed.wait(lock, [&] {
            return shared.stopping || current->dropped || shared.queued < shared.capacity;
          });
          if (shared.stopping) return;
          if (current->dropped) break;
          ++shared.queued;
        }
        std::future<HostBatch> future =
            workers_.submit([this, micro = std::move(micro), samples = std::move(samples)] {
              HostBatch batch = collate_host_batch(micro, samples, options_.collate);
              shared_->account(host_batch_bytes(batch));
              return batch;
            });
        bool handed = false;
        {
          std::lock_guard<std::mutex> lock(shared.mutex);
          if (!current->dropped) {
            current->ready.push_back(std::move(future));
            handed = true;
          }
        }
        if (!handed) detail::drop(shared, future);  // dropped while it was submitted
        shared.changed.notify_all();
      }
      current.reset();
    }
  } catch (const PlanningStopped&) {
    return;  // the loader is going away
  } catch (...) {
    std::lock_guard<std::mutex> lock(shared.mutex);
    error_ = std::current_exception();
    if (current) current->error = error_;  // its consumer waits for the rest
  }
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    finished_ = true;
  }
  shared.changed.notify_all();
}

std::optional<LoadedStep> Loader::next(const std::function<bool()>& interrupted) {
  const auto start = std::chrono::steady_clock::now();
  interrupted_ = false;
  Pending pending;
  {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    const auto ready = [this] { return !queue_.empty() || finished_; };
    while (!shared_->changed.wait_for(lock, std::chrono::milliseconds(50), ready)) {
      if (interrupted && interrupted()) {
        interrupted_ = true;
        return std::nullopt;
      }
    }
    if (queue_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return std::nullopt;
    }
    pending = std::move(queue_.front());
    queue_.pop_front();
  }
  LoadedStep step;
  step.step = pending.step;
  step.plan = std::move(pending.plan);
  step.batches = StepBatches(std::move(pending.batches));
  step.cursor_after = std::move(pending.cursor_after);
  step.wait_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return step;
}

}  // namespace vlm::data
