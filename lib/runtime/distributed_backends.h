// Internal to the runtime layer: creation of the c10d store and backends, one file per
// backend so only distributed_nccl_cuda.cpp needs the NCCL headers.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <exception>
#include <string>

#include "core/dist_env.h"
#include "runtime/compat.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace vlm::runtime::detail {

// "2.5 s": durations in error messages.
std::string seconds_text(std::chrono::milliseconds duration);
// An exception's message without the C++ stack trace c10::Error appends.
std::string error_text(const std::exception& error);

// The TCPStore of `env` (rank 0 hosts it unless the launcher's agent does). Under the agent
// store, keys are prefixed "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/" like torch.distributed
// does, so a restarted attempt never reads a previous attempt's keys.
c10::intrusive_ptr<c10d::Store> make_store(const DistEnv& env, std::chrono::milliseconds timeout);

c10::intrusive_ptr<compat::CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env,
    std::chrono::milliseconds timeout);

#if VLM_WITH_CUDA
// Makes `device` the current CUDA device first (NCCL binds a communicator to it).
c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env,
    std::chrono::milliseconds timeout, const c10::Device& device);
#endif

}  // namespace vlm::runtime::detail
