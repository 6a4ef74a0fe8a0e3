// The step runner on the CPU: a step's host batches are given back on the runner's own thread
// (their memory took the training thread 12-17 ms a step on a GPU, docs/BENCHMARKS.md), and
// no later than when the next step has run.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <thread>

#include "core/dist_env.h"
#include "model/model_fixtures.h"
#include "runtime/distributed.h"
#include "train/fault_injector.h"
#include "train/optimizer.h"
#include "train/step_runner.h"

using namespace vlm;

namespace {

// Where and whether the sample behind a host batch was freed.
struct FreeProbe {
  std::atomic<bool> freed{false};
  std::thread::id thread;
};

// A text-only batch of one 8-token row (every token but the last supervised), whose source
// sample reports to `probe` when it is freed.
data::HostBatch text_batch(const spec::ModelSpec& spec, FreeProbe& probe) {
  data::HostBatch b;
  b.rows = 1;
  b.row_length = 8;
  b.crop_size = spec.vision.image_size;
  for (int32_t t = 0; t < 8; ++t) {
    b.input_ids.push_back(3 + t);
    b.position_ids.push_back(t);
    b.labels.push_back(t + 1 < 8 ? 4 + t : data::kIgnoreLabel);
  }
  b.cu_seqlens = {0, 8};
  b.samples = 1;
  b.tokens = 8;
  b.supervised_tokens = 7;
  b.source_samples.push_back(
      std::shared_ptr<const data::BuiltSample>(new data::BuiltSample(), [&probe](auto* sample) {
        probe.thread = std::this_thread::get_id();
        delete sample;
        probe.freed = true;
      }));
  return b;
}

}  // namespace

CATCH_TEST_CASE("a step's host batches are freed on the runner's thread by the next step's end") {
  auto model = test::tiny_model();
  train::GroupedAdamWOptions options;
  options.peak_lr = {{"vision", 1e-4}, {"projector", 1e-4}, {"language", 1e-4}};
  train::GroupedAdamW optimizer(train::named_parameters_of(*model), options);
  auto comm = runtime::Communicator::create(DistEnv{});
  train::FaultInjector faults;
  FreeProbe first, second;
  {
    train::StepRunner runner(train::StepRunnerContext{model,
                                                      &optimizer,
                                                      comm.get(),
                                                      torch::Device(torch::kCPU),
                                                      train::Precision::kFp32,
                                                      nullptr,
                                                      &faults,
                                                      nullptr,
                                                      {},
                                                      nullptr});
    train::RunState state;
    std::vector<data::HostBatch> step1;
    step1.push_back(text_batch(model->spec(), first));
    data::StepBatches batches1 = data::StepBatches::ready(std::move(step1));
    const train::StepWork work = runner.run(batches1, 1.0 / 7, 1, state);
    CATCH_CHECK(std::isfinite(work.loss_sum));
    CATCH_CHECK(work.loss_sum > 0);

    std::vector<data::HostBatch> step2;
    step2.push_back(text_batch(model->spec(), second));
    data::StepBatches batches2 = data::StepBatches::ready(std::move(step2));
    runner.run(batches2, 1.0 / 7, 2, state);
    // The first step's batches are gone once the second step has run, freed elsewhere.
    CATCH_CHECK(first.freed);
    CATCH_CHECK(first.thread != std::this_thread::get_id());
  }
  // The runner's end frees what is still waiting, on its thread as well.
  CATCH_CHECK(second.freed);
  CATCH_CHECK(second.thread != std::this_thread::get_id());
}
