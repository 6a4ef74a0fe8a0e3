// Runtime-layer costs: the tracking CPU allocator's overhead per allocation, and the latency /
// bandwidth of the Communicator's collectives with 2 ranks (2 threads, Gloo over loopback).
//
//   ./build/bench/bench_collectives [gradient_mib=64] [iterations=5]
#include <torch/torch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/distributed.h"
#include "runtime/tracking_allocator.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double ns_per_small_allocation(int count) {
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    auto t = torch::empty({16}, torch::kFloat32);
  }
  return seconds_since(start) * 1e9 / count;
}

int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// Runs body(rank, communicator) on two threads; returns rank 0's result.
double on_two_ranks(const std::function<double(int, vlm::runtime::Communicator&)>& body) {
  const int port = free_loopback_port();
  double results[2] = {0, 0};
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      vlm::DistEnv env;
      env.rank = rank;
      env.world_size = 2;
      env.local_rank = rank;
      env.master_port = port;
      auto communicator = vlm::runtime::Communicator::create(env);
      results[rank] = body(rank, *communicator);
    });
  }
  for (auto& thread : ranks) thread.join();
  return results[0];
}

std::vector<torch::Tensor> parameters_with_grads(int64_t total_mib) {
  constexpr int64_t kFloatsPerTensor = 1 << 20;  // 4 MiB tensors
  std::vector<torch::Tensor> parameters;
  for (int64_t i = 0; i < total_mib / 4; ++i) {
    auto p = torch::zeros({kFloatsPerTensor}).requires_grad_(true);
    p.mutable_grad() = torch::ones({kFloatsPerTensor});
    parameters.push_back(p);
  }
  return parameters;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t gradient_mib = argc > 1 ? std::atoll(argv[1]) : 64;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 5;
  torch::set_num_threads(1);

  constexpr int kAllocations = 200000;
  ns_per_small_allocation(kAllocations / 10);  // warm-up
  const double plain_ns = ns_per_small_allocation(kAllocations);
  vlm::runtime::install_cpu_tracking_allocator();
  const double tracked_ns = ns_per_small_allocation(kAllocations);
  std::printf("allocator: torch::empty({16}) %.0f ns plain, %.0f ns tracked (+%.0f ns)\n", plain_ns,
              tracked_ns, tracked_ns - plain_ns);

  constexpr int kSmallCollectives = 2000;
  const double flag_us = on_two_ranks([](int rank, vlm::runtime::Communicator& c) {
    c.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < kSmallCollectives; ++i) c.any_rank_flagged(rank == 1 && i % 2 == 0);
    return seconds_since(start) * 1e6 / kSmallCollectives;
  });
  const double metrics_us = on_two_ranks([](int rank, vlm::runtime::Communicator& c) {
    const std::vector<double> metrics(8, 1.0 + rank);
    c.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < kSmallCollectives; ++i) c.all_reduce_sum(metrics);
    return seconds_since(start) * 1e6 / kSmallCollectives;
  });
  std::printf("any_rank_flagged: %.1f us; all_reduce_sum of 8 doubles: %.1f us (2 ranks)\n",
              flag_us, metrics_us);

  const double gradient_s = on_two_ranks([&](int, vlm::runtime::Communicator& c) {
    auto parameters = parameters_with_grads(gradient_mib);
    c.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      c.all_reduce_gradients(parameters, vlm::runtime::GradientReduction::kAverage);
    }
    return seconds_since(start) / iterations;
  });
  const double broadcast_s = on_two_ranks([&](int, vlm::runtime::Communicator& c) {
    auto parameters = parameters_with_grads(gradient_mib);
    c.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) c.broadcast_parameters(parameters);
    return seconds_since(start) / iterations;
  });
  const double mib = static_cast<double>(gradient_mib);
  std::printf("all_reduce_gradients %lld MiB fp32 (25 MiB buckets): %.1f ms, %.0f MiB/s\n",
              static_cast<long long>(gradient_mib), gradient_s * 1e3, mib / gradient_s);
  std::printf("broadcast_parameters %lld MiB fp32: %.1f ms, %.0f MiB/s\n",
              static_cast<long long>(gradient_mib), broadcast_s * 1e3, mib / broadcast_s);
  return 0;
}
