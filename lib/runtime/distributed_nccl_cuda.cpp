// NCCL (CUDA) backend; compiled only when LibTorch has CUDA. ProcessGroupNCCL.hpp declares
// nothing without USE_C10D_NCCL, and includes <nccl.h>: with a PyTorch wheel's LibTorch the
// NCCL headers come from the nvidia-nccl package (site-packages/nvidia/nccl/include).
#include <torch/torch.h>

#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <string>

#include "core/error.h"
#include "runtime/distributed_backends.h"

namespace vlm::runtime::detail {

c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env,
    std::chrono::milliseconds timeout, const c10::Device& device) {
  // The trainer's device (local rank, or 0 when a task sees a single GPU).
  const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
  c10::cuda::set_device(index);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;  // the watchdog aborts collectives that run longer
  try {
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, options);
  } catch (const std::exception& e) {
    throw Error(ExitCode::kTrainingFailed,
                "could not create the NCCL process group on rank " + std::to_string(env.rank) +
                    " (cuda:" + std::to_string(index) + "): " + error_text(e));
  }
}

}  // namespace vlm::runtime::detail
