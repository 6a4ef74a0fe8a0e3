#include "data/batch/loader.h"

#include <chrono>

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

Loader::Loader(PlanningPipeline& pipeline, LoaderOptions options)
    : pipeline_(pipeline),
      options_(std::move(options)),
      workers_(static_cast<size_t>(options_.workers)),
      planner_([this] { produce(); }) {}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  planner_.join();
  // Pending futures are waited for by the pool's destructor (it drains its queue).
}

void Loader::account(int64_t delta_bytes) {
  const int64_t now = host_bytes_.fetch_add(delta_bytes) + delta_bytes;
  int64_t peak = peak_host_bytes_.load();
  while (now > peak && !peak_host_bytes_.compare_exchange_weak(peak, now)) {
  }
}

void Loader::produce() {
  try {
    for (;;) {
      std::optional<PlannedStep> planned = pipeline_.next_step();
      if (!planned) break;
      Pending pending{
          planned->step, std::move(planned->plan), std::move(planned->cursor_after), {}};
      const auto& mine = pending.plan.micro_batches.at(static_cast<size_t>(options_.rank));
      // A step is handed over whole, so the queue must hold at least one step.
      const int64_t capacity =
          std::max<int64_t>(options_.prefetch_batches, static_cast<int64_t>(mine.size()));
      for (const MicroBatch& micro : mine) {
        // Wait for room: at most `capacity` micro-batches ahead of training.
        {
          std::unique_lock<std::mutex> lock(mutex_);
          changed_.wait(lock, [this, capacity] { return stopping_ || queued_batches_ < capacity; });
          if (stopping_) return;
          ++queued_batches_;
        }
        std::vector<std::shared_ptr<const BuiltSample>> samples;
        for (const Pack& pack : micro.packs) {
          for (const PackItem& item : pack.items)
            samples.push_back(pipeline_.sample(item.sample_id));
        }
        pending.batches.push_back(workers_.submit([this, micro, samples = std::move(samples)] {
          HostBatch batch = collate_host_batch(micro, samples, options_.collate);
          account(host_batch_bytes(batch));
          return batch;
        }));
      }
      pipeline_.release(pending.plan);  // the jobs hold their samples
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(std::move(pending));
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
  }
  changed_.notify_all();
}

std::optional<LoadedStep> Loader::next(const std::function<bool()>& interrupted) {
  const auto start = std::chrono::steady_clock::now();
  interrupted_ = false;
  Pending pending;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto ready = [this] { return !queue_.empty() || finished_; };
    while (!changed_.wait_for(lock, std::chrono::milliseconds(50), ready)) {
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
  LoadedStep step{pending.step, std::move(pending.plan), {}, std::move(pending.cursor_after), 0};
  for (auto& future : pending.batches) {
    step.batches.push_back(future.get());  // rethrows a worker's exception
    account(-host_batch_bytes(step.batches.back()));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --queued_batches_;
    }
    changed_.notify_all();
  }
  step.wait_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return step;
}

}  // namespace vlm::data
