#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/distributed.h"
#include "runtime/tracking_allocator.h"

using vlm::DistEnv;
using vlm::runtime::Communicator;
using vlm::runtime::DistributedOptions;
using vlm::runtime::GradientReduction;

namespace {

// A TCP port that was free a moment ago on 127.0.0.1 (the kernel picks it for port 0).
int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

DistEnv rank_env(int rank, int world_size, int port) {
  DistEnv env;
  env.launcher = "torchrun";
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

DistributedOptions test_options(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  DistributedOptions options;
  options.timeout = timeout;
  options.bucket_bytes = 64;  // several buckets even for the tiny test models
  return options;
}

// Runs `body(rank, communicator)` on two threads, each rank with its own process group over
// one TCP store on loopback. Catch2 assertions are not thread-safe: bodies store results and
// the test asserts after the join. The first exception of either rank is rethrown.
void run_two_ranks(const std::function<void(int, Communicator&)>& body,
                   const DistributedOptions& options = test_options()) {
  const int port = free_loopback_port();
  std::exception_ptr errors[2];
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto communicator = Communicator::create(rank_env(rank, 2, port), options);
        body(rank, *communicator);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// Two linear layers (float32) and a float64 bias-like parameter; `unused` only gets a
// gradient when use_extra is true.
struct TinyModel {
  torch::nn::Linear first{nullptr}, second{nullptr};
  torch::Tensor scale, unused;

  explicit TinyModel(uint64_t seed) {
    torch::manual_seed(seed);
    first = torch::nn::Linear(4, 3);
    second = torch::nn::Linear(3, 2);
    scale = torch::randn({2}, torch::kFloat64).requires_grad_(true);
    unused = torch::randn({5}).requires_grad_(true);
  }
  std::vector<torch::Tensor> parameters() const {
    auto all = first->parameters();
    for (const auto& p : second->parameters()) all.push_back(p);
    all.push_back(scale);
    all.push_back(unused);
    return all;
  }
  void backward(const torch::Tensor& input, bool use_extra) {
    auto out = second->forward(torch::tanh(first->forward(input))).to(torch::kFloat64) * scale;
    auto loss = out.pow(2).sum();
    if (use_extra) loss = loss + unused.sum().to(torch::kFloat64) * 3.0;
    loss.backward();
  }
};

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  }
  return grads;
}

void check_reduced_gradients(GradientReduction reduction) {
  // Rank r's model: same weights (seed 7), its own input, rank 0 alone uses `unused`.
  std::vector<torch::Tensor> local[2], reduced[2];
  run_two_ranks([&](int rank, Communicator& communicator) {
    TinyModel model(7);
    torch::manual_seed(100 + rank);
    model.backward(torch::randn({6, 4}), /*use_extra=*/rank == 0);
    local[rank] = grads_of(model.parameters());
    communicator.all_reduce_gradients(model.parameters(), reduction);
    reduced[rank] = grads_of(model.parameters());
  });
  const double divisor = reduction == GradientReduction::kAverage ? 2.0 : 1.0;
  CATCH_REQUIRE(local[0].size() == 6);
  CATCH_CHECK_FALSE(torch::allclose(local[0][0], local[1][0]));  // the ranks really differ
  for (size_t i = 0; i < local[0].size(); ++i) {
    const auto expected = (local[0][i] + local[1][i]) / divisor;
    CATCH_INFO("parameter " << i);
    CATCH_CHECK(torch::allclose(reduced[0][i], expected, 1e-6, 1e-7));
    CATCH_CHECK(torch::equal(reduced[0][i], reduced[1][i]));
  }
  // `unused` had no gradient on rank 1: it was materialised as zeros and reduced.
  CATCH_CHECK(torch::allclose(reduced[1][5], torch::full({5}, 3.0 / divisor)));
}

}  // namespace

CATCH_TEST_CASE("world size 1: no process group, every collective is a no-op") {
  auto communicator = Communicator::create(DistEnv{});
  CATCH_CHECK(communicator->world_size() == 1);
  CATCH_CHECK_FALSE(communicator->is_distributed());
  CATCH_CHECK(communicator->backend_name() == "none");
  CATCH_CHECK(communicator->any_rank_flagged(true));
  CATCH_CHECK_FALSE(communicator->any_rank_flagged(false));
  CATCH_CHECK(communicator->all_reduce_sum({1.5, 2.0}) == std::vector<double>{1.5, 2.0});
  CATCH_CHECK(communicator->all_reduce_max({-1.0}) == std::vector<double>{-1.0});
  TinyModel model(3);
  model.backward(torch::randn({2, 4}), false);
  const auto before = grads_of(model.parameters());
  communicator->all_reduce_gradients(model.parameters(), GradientReduction::kAverage);
  communicator->broadcast_parameters(model.parameters());
  communicator->barrier();
  CATCH_CHECK(torch::equal(model.parameters()[0].grad(), before[0]));
  CATCH_CHECK_FALSE(model.unused.grad().defined());  // the fast path touches nothing
}

CATCH_TEST_CASE("distributed: invalid options are usage errors") {
  DistEnv env = rank_env(2, 2, 29500);
  CATCH_CHECK_THROWS_AS(Communicator::create(env), vlm::Error);
  DistributedOptions bad_backend;
  bad_backend.backend = "mpi";
  try {
    Communicator::create(rank_env(0, 2, free_loopback_port()), bad_backend);
    CATCH_FAIL("expected an error");
  } catch (const vlm::Error& e) {
    CATCH_CHECK(e.code() == vlm::ExitCode::kUsage);
    CATCH_CHECK(std::string(e.what()).find("mpi") != std::string::npos);
  }
}

CATCH_TEST_CASE("distributed: gradient all-reduce averages over two ranks", "[gloo]") {
  check_reduced_gradients(GradientReduction::kAverage);
}

CATCH_TEST_CASE("distributed: gradient all-reduce sums when the loss is pre-scaled", "[gloo]") {
  check_reduced_gradients(GradientReduction::kSum);
}

CATCH_TEST_CASE("distributed: broadcast makes rank 1's parameters equal rank 0's", "[gloo]") {
  std::vector<torch::Tensor> before[2], after[2];
  run_two_ranks([&](int rank, Communicator& communicator) {
    TinyModel model(rank == 0 ? 11 : 22);
    for (const auto& p : model.parameters()) before[rank].push_back(p.detach().clone());
    communicator.broadcast_parameters(model.parameters(), /*root_rank=*/0);
    for (const auto& p : model.parameters()) after[rank].push_back(p.detach().clone());
  });
  for (size_t i = 0; i < before[0].size(); ++i) {
    CATCH_INFO("parameter " << i);
    CATCH_CHECK_FALSE(torch::equal(before[0][i], before[1][i]));
    CATCH_CHECK(torch::equal(after[0][i], before[0][i]));
    CATCH_CHECK(torch::equal(after[1][i], before[0][i]));
  }
}

CATCH_TEST_CASE("distributed: flag, metric and barrier collectives", "[gloo]") {
  bool one_flagged[2], none_flagged[2];
  std::vector<double> sums[2], maxima[2];
  run_two_ranks([&](int rank, Communicator& communicator) {
    one_flagged[rank] = communicator.any_rank_flagged(rank == 1);
    none_flagged[rank] = communicator.any_rank_flagged(false);
    sums[rank] = communicator.all_reduce_sum({1.0 + rank, 0.25});
    maxima[rank] = communicator.all_reduce_max({static_cast<double>(rank), -5.0 * rank});
    communicator.barrier();
  });
  for (int rank = 0; rank < 2; ++rank) {
    CATCH_CHECK(one_flagged[rank]);
    CATCH_CHECK_FALSE(none_flagged[rank]);
    CATCH_CHECK(sums[rank] == std::vector<double>{3.0, 0.5});
    CATCH_CHECK(maxima[rank] == std::vector<double>{1.0, 0.0});
  }
}

CATCH_TEST_CASE("distributed: a missing peer fails the rendezvous within the timeout", "[gloo]") {
  const auto started = std::chrono::steady_clock::now();
  try {
    Communicator::create(rank_env(0, 2, free_loopback_port()),
                         test_options(std::chrono::seconds(2)));
    CATCH_FAIL("a process group with a missing rank must not come up");
  } catch (const vlm::Error& e) {
    CATCH_CHECK(e.code() == vlm::ExitCode::kTrainingFailed);
    CATCH_INFO(e.what());
    CATCH_CHECK(std::string(e.what()).find("rendezvous") != std::string::npos);
  }
  const auto elapsed = std::chrono::steady_clock::now() - started;
  CATCH_CHECK(elapsed >= std::chrono::milliseconds(1500));
  CATCH_CHECK(elapsed < std::chrono::seconds(8));
}

CATCH_TEST_CASE("distributed: a hung peer fails the collective with a clear error", "[gloo]") {
  std::promise<void> rank0_done;
  auto rank0_finished = rank0_done.get_future().share();
  std::string message;
  vlm::ExitCode code = vlm::ExitCode::kOk;
  std::chrono::steady_clock::duration elapsed{};
  run_two_ranks(
      [&](int rank, Communicator& communicator) {
        communicator.barrier();  // both up
        if (rank == 1) {         // hangs: never reaches the flag all-reduce
          rank0_finished.wait();
          return;
        }
        const auto started = std::chrono::steady_clock::now();
        try {
          communicator.any_rank_flagged(true);
        } catch (const vlm::Error& e) {
          message = e.what();
          code = e.code();
        }
        elapsed = std::chrono::steady_clock::now() - started;
        rank0_done.set_value();
      },
      test_options(std::chrono::seconds(2)));
  CATCH_INFO(message);
  CATCH_CHECK(code == vlm::ExitCode::kTrainingFailed);
  CATCH_CHECK(message.find("any_rank_flagged") != std::string::npos);
  CATCH_CHECK(message.find("rank 0 of 2") != std::string::npos);
  CATCH_CHECK(elapsed >= std::chrono::milliseconds(1500));
  CATCH_CHECK(elapsed < std::chrono::seconds(8));
}

CATCH_TEST_CASE("distributed: the OOM agreement allocates no tensor memory", "[gloo]") {
  // The flag all-reduce runs right after an OOM of the budgeted allocator: with the cap at
  // exactly the live bytes, any allocation would throw.
  bool agreed[2] = {false, false};
  int64_t refused = -1;
  auto body = [&](int rank, Communicator& communicator) {
    auto& allocator = vlm::runtime::install_cpu_tracking_allocator();
    communicator.barrier();
    const int64_t refused_before = allocator.refused_allocations();
    if (rank == 0) allocator.set_cap_bytes(allocator.live_bytes());
    communicator.barrier();
    agreed[rank] = communicator.any_rank_flagged(rank == 0);
    communicator.barrier();
    if (rank == 0) {
      refused = allocator.refused_allocations() - refused_before;
      allocator.clear_cap();
    }
  };
  try {
    run_two_ranks(body);
  } catch (...) {
    vlm::runtime::install_cpu_tracking_allocator().clear_cap();  // keep later tests uncapped
    throw;
  }
  CATCH_CHECK(agreed[0]);
  CATCH_CHECK(agreed[1]);
  CATCH_CHECK(refused == 0);
}
