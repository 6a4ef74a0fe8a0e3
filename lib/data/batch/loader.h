// The rank-local half of the data pipeline: a planner thread runs the PlanningPipeline ahead
// of training, and worker threads decode, resize, split and collate this rank's micro-batches
// into HostBatches. A step is handed out as soon as it is planned; its micro-batches follow one
// by one (StepBatches), and at most `prefetch_batches` of them are collated and not yet taken,
// across steps: host memory is bounded (and reported) whatever the gradient accumulation.
// Steps come out in order; errors (e.g. too many bad samples) surface on the training thread,
// from next() or from StepBatches::take().
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "data/batch/host_batch.h"
#include "data/packing/planning_pipeline.h"

namespace vlm::data {

struct LoaderOptions {
  int64_t rank = 0;
  int64_t workers = 2;           // 0: collate on the planner thread
  int64_t prefetch_batches = 4;  // micro-batches collated ahead of the ones taken
  CollateOptions collate;
  // Tests (VLMTRAIN_INJECT_FAULT=stall_data@N): the planner holds step `stall_step` (0-based)
  // back until the loader stops, as data that never comes; -1: never.
  int64_t stall_step = -1;
};

namespace detail {
struct LoaderShared;
struct StepBatchState;
}  // namespace detail

// This rank's micro-batches of one step, taken in micro-step order as the loader's workers
// collate them. Take them all, or destroy the object (which drops the rest), before asking the
// loader for its next step: the loader's planner waits for room.
class StepBatches {
 public:
  StepBatches() = default;
  explicit StepBatches(std::shared_ptr<detail::StepBatchState> state);
  StepBatches(StepBatches&& other) noexcept = default;
  StepBatches& operator=(StepBatches&& other) noexcept;
  ~StepBatches();

  // Micro-batches collated already, without a loader (tests, tools that hold a step).
  static StepBatches ready(std::vector<HostBatch> batches);

  int64_t size() const;  // the step's micro-batches on this rank
  // The next micro-batch, waiting for its collation; rethrows a worker's error; nullopt after
  // the last one.
  std::optional<HostBatch> take();
  double wait_ms() const { return wait_ms_; }  // time take() waited, summed

 private:
  void drop_rest();

  std::shared_ptr<detail::StepBatchState> state_;
  double wait_ms_ = 0;
};

struct LoadedStep {
  int64_t step = 0;
  StepPlan plan;                // every rank's plan: shapes and the step's N
  StepBatches batches;          // this rank's micro-batches, in micro-step order
  nlohmann::json cursor_after;  // checkpoint this to resume after the step
  double wait_ms = 0;           // time next() waited for the plan
};

class Loader {
 public:
  // `pipeline` must outlive the loader; only the loader's thread plans with it until
  // destruction, which stops it for good.
  Loader(PlanningPipeline& pipeline, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next step, or nullopt at the end of a finite stream, or nullopt as soon as
  // `interrupted` (polled every 50 ms while it waits for the planner) returns true; then
  // interrupted() says so. The destructor stops the planner within one sample
  // (PlanningPipeline::stop): the pipeline plans nothing more after the loader.
  std::optional<LoadedStep> next(const std::function<bool()>& interrupted = {});
  bool interrupted() const { return interrupted_; }

  int64_t host_bytes() const;       // collated micro-batches not yet taken
  int64_t peak_host_bytes() const;  // their most at any moment

 private:
  struct Pending {
    int64_t step = 0;
    StepPlan plan;
    nlohmann::json cursor_after;
    std::shared_ptr<detail::StepBatchState> batches;
  };

  void produce();

  bool interrupted_ = false;  // the last next() returned because `interrupted` said so

  PlanningPipeline& pipeline_;
  LoaderOptions options_;
  std::shared_ptr<detail::LoaderShared> shared_;  // the lock, the room, the byte counts
  ThreadPool workers_;
  std::deque<Pending> queue_;  // planned steps not yet handed out (under shared_'s lock)
  bool finished_ = false;
  std::exception_ptr error_;
  std::thread planner_;  // last: started after everything above exists
};

// Bytes a host batch holds.
int64_t host_batch_bytes(const HostBatch& batch);

}  // namespace vlm::data
