// The rank-local half of the data pipeline: a planner thread runs the PlanningPipeline ahead
// of training, and worker threads decode, resize, split and collate this rank's micro-batches
// into HostBatches. At most `prefetch_batches` micro-batches (and never less than one step)
// wait, so host memory is bounded (and reported). Steps come out in order; errors (e.g. too many
// bad samples) surface from next() on the training thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "core/thread_pool.h"
#include "data/batch/host_batch.h"
#include "data/packing/planning_pipeline.h"

namespace vlm::data {

struct LoaderOptions {
  int64_t rank = 0;
  int64_t workers = 2;           // 0: collate on the planner thread
  int64_t prefetch_batches = 4;  // micro-batches decoded ahead
  CollateOptions collate;
};

struct LoadedStep {
  int64_t step = 0;
  StepPlan plan;                   // every rank's plan: shapes and the step's N
  std::vector<HostBatch> batches;  // this rank's micro-batches, in micro-step order
  nlohmann::json cursor_after;     // checkpoint this to resume after the step
  double wait_ms = 0;              // time next() waited for data
};

class Loader {
 public:
  // `pipeline` must outlive the loader; only the loader's thread touches it until destruction.
  Loader(PlanningPipeline& pipeline, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next step, or nullopt at the end of a finite stream, or nullopt as soon as
  // `interrupted` (polled every 50 ms while it waits for the planner) returns true; then
  // interrupted() says so. The planner's work in progress finishes before the loader's
  // destructor returns.
  std::optional<LoadedStep> next(const std::function<bool()>& interrupted = {});
  bool interrupted() const { return interrupted_; }

  int64_t host_bytes() const { return host_bytes_.load(); }
  int64_t peak_host_bytes() const { return peak_host_bytes_.load(); }

 private:
  struct Pending {
    int64_t step = 0;
    StepPlan plan;
    nlohmann::json cursor_after;
    std::vector<std::future<HostBatch>> batches;
  };

  void produce();
  void account(int64_t delta_bytes);

  bool interrupted_ = false;  // the last next() returned because `interrupted` said so

  PlanningPipeline& pipeline_;
  LoaderOptions options_;
  ThreadPool workers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Pending> queue_;
  int64_t queued_batches_ = 0;
  bool finished_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::atomic<int64_t> host_bytes_{0};
  std::atomic<int64_t> peak_host_bytes_{0};
  std::thread planner_;  // last: started after everything above exists
};

// Bytes a host batch holds.
int64_t host_batch_bytes(const HostBatch& batch);

}  // namespace vlm::data
