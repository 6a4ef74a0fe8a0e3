#include "runtime/distributed.h"

#include <torch/torch.h>

#include <torch/csrc/utils/tensor_flatten.h>
#include "runtime/compat.h"
#if VLM_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <deque>
#include <random>
#include <thread>

#include "core/error.h"
#include "runtime/distributed_backends.h"

namespace vlm::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// Extra time given to a CPU work object beyond the backend's own timeout, so that Gloo's
// timeout (which leaves its worker thread free) fires first; ours is the safety net.
constexpr std::chrono::milliseconds kWaitGrace{1000};

// At most this many gradient buckets in flight: overlaps one bucket's reduction with the
// next one's flattening while holding only two bucket copies of the gradients.
constexpr size_t kBucketsInFlight = 2;

// all_reduce_sum / all_reduce_max reduce at most this many values in the communicator's own
// buffer (more are reduced in a fresh tensor).
constexpr int64_t kMetricSlots = 64;

std::string choose_backend(const DistributedOptions& options) {
  if (options.backend == "auto") return options.device.is_cuda() ? "nccl" : "gloo";
  if (options.backend == "gloo" || options.backend == "nccl") return options.backend;
  throw Error(ExitCode::kUsage,
              "unknown distributed backend '" + options.backend + "': use auto, gloo or nccl");
}

c10::intrusive_ptr<compat::CollectiveBackend> make_backend(
    const std::string& name, const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env,
    const DistributedOptions& options) {
  if (name == "gloo") {
#if VLM_WITH_GLOO
    return detail::make_gloo_backend(store, env, options.timeout);
#else
    throw Error(ExitCode::kUsage,
                "the gloo backend is not in this build of vlmtrain (its LibTorch ships no gloo "
                "headers; docs/gpu.md): use backend nccl on CUDA");
#endif
  }
#if VLM_WITH_CUDA
  return detail::make_nccl_backend(store, env, options.timeout, options.device);
#else
  throw Error(ExitCode::kUsage,
              "the nccl backend needs a CUDA build of vlmtrain (this LibTorch has no CUDA); "
              "use backend gloo for CPU training");
#endif
}

}  // namespace

struct Communicator::Impl {
  DistEnv env;
  DistributedOptions options;
  std::string backend_name = "none";
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::CollectiveBackend> backend;
  at::Tensor flag;     // int32 [1] on options.device, reused by any_rank_flagged and barrier
  at::Tensor doubles;  // float64 [kMetricSlots] on options.device, reused by all_reduce_sum/max
  // The stop decisions' keys in the store: a prefix of this process group's own, since a
  // torchrun agent's store outlives a restarted group (decide_stop).
  std::string decision_prefix;

  std::string decision_key(int64_t step) const { return decision_prefix + std::to_string(step); }
  template <class Op>
  auto with_store(const char* what, Op op) const {
    try {
      return op(*store);
    } catch (const std::exception& e) {
      throw Error(ExitCode::kTrainingFailed,
                  std::string("the rendezvous store failed (") + what + ") on rank " +
                      std::to_string(env.rank) + ": " + e.what() +
                      ". Rank 0 (or the launcher hosting the store) may have died; check its log.");
    }
  }

  bool distributed() const { return env.world_size > 1; }

  [[noreturn]] void fail(const std::string& collective, Clock::time_point started,
                         const std::string& cause) const {
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    throw Error(ExitCode::kTrainingFailed,
                "collective " + collective + " failed on rank " + std::to_string(env.rank) +
                    " of " + std::to_string(env.world_size) + " after " +
                    detail::seconds_text(waited) + " (timeout " +
                    detail::seconds_text(options.timeout) + "): " + cause +
                    ". A peer rank died, hung, or is not running the same collectives; check "
                    "the other ranks' logs. If steps legitimately take longer, raise the "
                    "distributed timeout.");
  }

  // Waits for `work` at most the timeout. CPU (Gloo): the work object blocks on a condition
  // variable. CUDA (NCCL): Work::wait only orders streams, so poll completion on the host,
  // which is what a caller reading the result needs anyway.
  void wait(const WorkPtr& work, const std::string& collective, Clock::time_point started) const {
    try {
      if (options.device.is_cpu()) {
        work->wait(options.timeout + kWaitGrace);
        return;
      }
      const auto deadline = started + options.timeout;
      while (!work->isCompleted()) {
        if (Clock::now() > deadline) fail(collective, started, "no completion within the timeout");
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      work->wait();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(collective, started, detail::error_text(e));
    }
  }

  // Gloo's worker thread lets go of a finished work, and of the tensor it reduced, a moment
  // after completing it. On the CPU, wait (at most a second) until this thread holds the last
  // reference, so that a gradient bucket is freed when all_reduce_gradients returns rather than
  // while the optimizer allocates: the step's peak then does not depend on that race, and the
  // memory model (docs/memory.md, "The gradient all-reduce") counts the bucket freed.
  void await_release(const WorkPtr& work) const {
    if (!options.device.is_cpu()) return;
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    while (work.use_count() > 1 && Clock::now() < deadline) std::this_thread::yield();
  }

  WorkPtr start_all_reduce(at::Tensor& tensor, c10d::ReduceOp op, const std::string& collective,
                           Clock::time_point started) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions all_reduce_options;
    all_reduce_options.reduceOp = op;
    all_reduce_options.timeout = options.timeout;
    try {
      return backend->allreduce(tensors, all_reduce_options);
    } catch (const std::exception& e) {
      fail(collective, started, detail::error_text(e));
    }
  }

  void all_reduce(at::Tensor& tensor, c10d::ReduceOp op, const std::string& collective) {
    const auto started = Clock::now();
    wait(start_all_reduce(tensor, op, collective, started), collective, started);
  }

  void broadcast(at::Tensor& tensor, int root_rank, const std::string& collective) {
    const auto started = Clock::now();
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions broadcast_options;
    broadcast_options.rootRank = root_rank;
    broadcast_options.rootTensor = 0;
    broadcast_options.timeout = options.timeout;
    WorkPtr work;
    try {
      work = backend->broadcast(tensors, broadcast_options);
    } catch (const std::exception& e) {
      fail(collective, started, detail::error_text(e));
    }
    wait(work, collective, started);
  }

  std::vector<double> all_reduce_doubles(const std::vector<double>& values, c10d::ReduceOp op,
                                         const std::string& collective) {
    if (!distributed() || values.empty()) return values;
    const auto n = static_cast<int64_t>(values.size());
    // The communicator's own buffer: no allocation right after the gradient all-reduce, while
    // the backend's worker thread may still hold the last bucket (the memory model's peak would
    // then depend on that race).
    at::Tensor tensor = n <= doubles.numel()
                            ? doubles.narrow(0, 0, n)
                            : torch::empty({n}, doubles.options());
    if (tensor.is_cpu()) {
      std::copy(values.begin(), values.end(), tensor.data_ptr<double>());
    } else {
      tensor.copy_(torch::tensor(values, torch::kFloat64));
    }
    all_reduce(tensor, op, collective);
    std::vector<double> out(values.size());
    if (tensor.is_cpu()) {
      std::copy_n(tensor.data_ptr<double>(), n, out.begin());
    } else {
      const at::Tensor host = tensor.to(torch::kCPU);
      std::copy_n(host.data_ptr<double>(), n, out.begin());
    }
    return out;
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::create(const DistEnv& env,
                                                   const DistributedOptions& options) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw Error(ExitCode::kUsage, "invalid rank " + std::to_string(env.rank) + " for world size " +
                                      std::to_string(env.world_size));
  }
  if (options.timeout.count() <= 0) {
    throw Error(ExitCode::kUsage, "the distributed timeout must be positive");
  }
  if (options.bucket_bytes <= 0) {
    throw Error(ExitCode::kUsage, "the gradient bucket size must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->options = options;
  if (env.world_size > 1) {
    impl->backend_name = choose_backend(options);
    impl->store = detail::make_store(env, options.timeout);
    impl->backend = make_backend(impl->backend_name, impl->store, env, options);
    impl->flag =
        torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt32).device(options.device));
    impl->doubles = torch::zeros(
        {kMetricSlots}, torch::TensorOptions().dtype(torch::kFloat64).device(options.device));
  }
  std::unique_ptr<Communicator> communicator(new Communicator(std::move(impl)));
  if (env.world_size > 1) {
    // Rank 0 draws the prefix; every rank takes it (52 bits: exact in a double).
    std::random_device random;
    const uint64_t drawn =
        ((static_cast<uint64_t>(random()) << 32) | random()) & ((uint64_t{1} << 52) - 1);
    const double agreed =
        communicator->all_reduce_max({env.rank == 0 ? static_cast<double>(drawn) : 0.0})[0];
    communicator->impl_->decision_prefix =
        "vlm/" + std::to_string(static_cast<uint64_t>(agreed)) + "/stop/";
  }
  return communicator;
}

int Communicator::rank() const { return impl_->env.rank; }
int Communicator::world_size() const { return impl_->env.world_size; }
std::string Communicator::backend_name() const { return impl_->backend_name; }

void Communicator::broadcast_parameters(const std::vector<at::Tensor>& parameters, int root_rank) {
  if (!impl_->distributed() || parameters.empty()) return;
  torch::NoGradGuard no_grad;
  const auto buckets =
      torch::utils::take_tensors(parameters, static_cast<size_t>(impl_->options.bucket_bytes));
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto& group = buckets[b].tensors;
    at::Tensor flat = torch::utils::flatten_dense_tensors(group);
    impl_->broadcast(flat, root_rank,
                     "broadcast_parameters (bucket " + std::to_string(b + 1) + " of " +
                         std::to_string(buckets.size()) + ")");
    if (impl_->env.rank == root_rank) continue;
    const auto views = torch::utils::unflatten_dense_tensors(flat, group);
    for (size_t i = 0; i < group.size(); ++i) group[i].copy_(views[i]);
  }
}

void Communicator::all_reduce_gradients(const std::vector<at::Tensor>& parameters,
                                        GradientReduction reduction) {
  if (!impl_->distributed()) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& parameter : parameters) {
    if (!parameter.requires_grad()) continue;
    // An unused parameter has no gradient on this rank but may have one elsewhere.
    if (!parameter.grad().defined()) {
      parameter.mutable_grad() = torch::zeros_like(parameter);
    }
    grads.push_back(parameter.grad());
  }
  if (grads.empty()) return;
  const auto buckets =
      torch::utils::take_tensors(grads, static_cast<size_t>(impl_->options.bucket_bytes));

  struct InFlight {
    size_t bucket;
    at::Tensor flat;
    WorkPtr work;
    std::string collective;
    Clock::time_point started;
  };
  std::deque<InFlight> in_flight;
  const double world = static_cast<double>(impl_->env.world_size);
  auto finish_oldest = [&] {
    InFlight& done = in_flight.front();
    impl_->wait(done.work, done.collective, done.started);
    impl_->await_release(done.work);
    if (reduction == GradientReduction::kAverage) done.flat.div_(world);
    const auto& group = buckets[done.bucket].tensors;
    const auto views = torch::utils::unflatten_dense_tensors(done.flat, group);
    for (size_t i = 0; i < group.size(); ++i) group[i].copy_(views[i]);
    in_flight.pop_front();
  };
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (in_flight.size() == kBucketsInFlight) finish_oldest();
    InFlight next{b, torch::utils::flatten_dense_tensors(buckets[b].tensors), WorkPtr(),
                  "all_reduce_gradients (bucket " + std::to_string(b + 1) + " of " +
                      std::to_string(buckets.size()) + ")",
                  Clock::now()};
    next.work =
        impl_->start_all_reduce(next.flat, c10d::ReduceOp::SUM, next.collective, next.started);
    in_flight.push_back(std::move(next));
  }
  while (!in_flight.empty()) finish_oldest();
}

std::vector<double> Communicator::all_reduce_sum(const std::vector<double>& values) {
  return impl_->all_reduce_doubles(values, c10d::ReduceOp::SUM, "all_reduce_sum");
}

std::vector<double> Communicator::all_reduce_max(const std::vector<double>& values) {
  return impl_->all_reduce_doubles(values, c10d::ReduceOp::MAX, "all_reduce_max");
}

bool Communicator::decide_stop(int64_t step, bool stop) {
  if (!impl_->distributed()) return stop;
  const std::string proposal = stop ? "stop" : "go";
  const std::vector<uint8_t> decided = impl_->with_store("decide_stop", [&](c10d::Store& store) {
    return store.compareSet(impl_->decision_key(step), {},
                            std::vector<uint8_t>(proposal.begin(), proposal.end()));
  });
  // Every rank has left step - 2's decision behind: its step's collectives are done.
  if (impl_->env.rank == 0 && step >= 2) {
    impl_->with_store("decide_stop", [&](c10d::Store& store) {
      return store.deleteKey(impl_->decision_key(step - 2));
    });
  }
  return std::string(decided.begin(), decided.end()) == "stop";
}

bool Communicator::stop_decided(int64_t step) {
  if (!impl_->distributed()) return false;
  return impl_->with_store("stop_decided", [&](c10d::Store& store) {
    const std::string key = impl_->decision_key(step);
    if (!store.check({key})) return false;
    const std::vector<uint8_t> value = store.get(key);
    return std::string(value.begin(), value.end()) == "stop";
  });
}

bool Communicator::any_rank_flagged(bool flagged) {
  if (!impl_->distributed()) return flagged;
  impl_->flag.fill_(flagged ? 1 : 0);
  impl_->all_reduce(impl_->flag, c10d::ReduceOp::MAX, "any_rank_flagged");
  return impl_->flag.item<int32_t>() != 0;
}

void Communicator::barrier() {
  if (!impl_->distributed()) return;
  // An all-reduce of the flag rather than the backend's barrier: NCCL's barrier guesses its
  // device from the rank, and this one needs no extra memory.
  impl_->flag.zero_();
  impl_->all_reduce(impl_->flag, c10d::ReduceOp::SUM, "barrier");
}

}  // namespace vlm::runtime
