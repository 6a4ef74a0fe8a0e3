// The process group of a multi-process job and the collectives the trainer needs.
//
// Rendezvous from a vlm::DistEnv over a c10d TCPStore (rank 0 hosts it; under
// `torchrun --no-python` the agent already hosts it and every rank is a client), then a
// ProcessGroupGloo (CPU) or ProcessGroupNCCL (CUDA builds). Every collective waits at most
// `timeout`: a dead or hung peer makes the others fail with vlm::Error
// (ExitCode::kTrainingFailed) naming the collective, instead of hanging the job.
// World size 1 creates no process group at all and every collective is a no-op.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dist_env.h"

namespace vlm::runtime {

struct DistributedOptions {
  // How long the rendezvous and any one collective may wait for the other ranks.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // "auto" (NCCL for a CUDA device, Gloo otherwise), "gloo" or "nccl".
  std::string backend = "auto";
  // Gradient bucket size: PyTorch DDP's default bucket_cap_mb = 25.
  int64_t bucket_bytes = kGradientBucketBytes;
  // Device of the parameters and gradients; the small metric and flag tensors live here too.
  c10::Device device = c10::Device(c10::kCPU);
};

enum class GradientReduction {
  kSum,      // the trainer pre-scales the loss (loss * R / N), so a plain sum is the mean
  kAverage,  // sum, then divide by the world size
};

class Communicator {
 public:
  // Throws vlm::Error(kTrainingFailed) when the rendezvous fails or times out, and
  // vlm::Error(kUsage) for an unknown or unavailable backend.
  static std::unique_ptr<Communicator> create(const DistEnv& env,
                                              const DistributedOptions& options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world_size() const;
  bool is_distributed() const { return world_size() > 1; }
  std::string backend_name() const;  // "none" (world size 1), "gloo" or "nccl"

  // Copies every tensor of root_rank into the same tensor of the other ranks (in place, no
  // autograd). All ranks must pass tensors of the same shapes and dtypes in the same order.
  void broadcast_parameters(const std::vector<at::Tensor>& parameters, int root_rank = 0);

  // All-reduces the gradients of `parameters` in buckets of ~bucket_bytes per dtype.
  // Parameters that require grad but have none get a zero gradient first, so every rank's
  // bucket layout is the same. Parameters that do not require grad are skipped.
  void all_reduce_gradients(const std::vector<at::Tensor>& parameters, GradientReduction reduction);

  // Element-wise sum / max over ranks of a small vector (metrics); same length on all ranks.
  std::vector<double> all_reduce_sum(const std::vector<double>& values);
  std::vector<double> all_reduce_max(const std::vector<double>& values);

  // True when any rank passes true. Every rank must reach it (the OOM agreement of each
  // micro-step). Allocates no tensor memory: the flag tensor is created once at start.
  bool any_rank_flagged(bool flagged);

  void barrier();

  // The stop decision of step `step` (0-based: the step about to be trained), taken once for
  // every rank over the rendezvous store, without a collective: ranks wait for their data at
  // different moments, and a rank that must run the step's collectives cannot wait for an
  // agreement. The first rank to propose decides for all, "stop" (a stop request while it
  // waits) or "go" (its data arrived); returns whether the decision is "stop". World size 1:
  // the proposal. Each step's key is deleted two steps later.
  bool decide_stop(int64_t step, bool stop);
  // Whether step `step` was decided "stop" (polled while waiting); false while undecided.
  bool stop_decided(int64_t step);

 private:
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlm::runtime
