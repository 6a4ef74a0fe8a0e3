// What a bf16 product allocates on this CPU beyond its operands and its output: oneDNN's
// scratchpad, which LibTorch 2.x books through its CPU allocator for the product's duration
// (docs/memory-cpu-2x.md, "The scratchpad's rule"), measured with the tracking allocator. The
// data for replaying bf16 products on a 2.x CPU: each figure is the allocator's peak during the
// call above what was live before it, less the output.
//
// Usage: bench_onednn_scratchpad [THREADS]                the default table of shapes
//        bench_onednn_scratchpad THREADS OP B M K N ...   OP: mm (B 0), bmm, linear (B 0):
//                                                         [B,] M x K times K x N (linear: the
//                                                         weight N x K, as at::linear takes it)
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/tracking_allocator.h"

namespace {

struct Product {
  std::string op;
  int64_t batch, m, k, n;
};

int64_t scratchpad_bytes(vlm::runtime::TrackingAllocator& tracker, const Product& p) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const bool linear = p.op == "linear", batched = p.op == "bmm";
  const torch::Tensor a =
      batched ? torch::randn({p.batch, p.m, p.k}, bf16) : torch::randn({p.m, p.k}, bf16);
  const torch::Tensor b = linear    ? torch::randn({p.n, p.k}, bf16)
                          : batched ? torch::randn({p.batch, p.k, p.n}, bf16)
                                    : torch::randn({p.k, p.n}, bf16);
  const int64_t before = tracker.live_bytes();
  tracker.reset_peak();
  const torch::Tensor out = linear    ? torch::nn::functional::linear(a, b)
                            : batched ? torch::bmm(a, b)
                                      : torch::mm(a, b);
  return tracker.peak_bytes() - before - static_cast<int64_t>(out.nbytes());
}

}  // namespace

int main(int argc, char** argv) {
  auto& tracker = vlm::runtime::install_cpu_tracking_allocator();
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (threads < 1) {
    std::fprintf(stderr, "error: THREADS must be a positive whole number, got '%s'\n", argv[1]);
    return 2;
  }
  at::set_num_threads(threads);
  std::vector<Product> products;
  if (argc > 2) {
    if ((argc - 2) % 5 != 0) {
      std::fprintf(stderr, "error: products are given as OP B M K N, five words each\n");
      return 2;
    }
    for (int i = 2; i + 4 < argc; i += 5) {
      const Product p{argv[i], std::atoll(argv[i + 1]), std::atoll(argv[i + 2]),
                      std::atoll(argv[i + 3]), std::atoll(argv[i + 4])};
      if ((p.op != "mm" && p.op != "bmm" && p.op != "linear") || p.m < 1 || p.k < 1 || p.n < 1 ||
          (p.op == "bmm") != (p.batch > 0)) {
        std::fprintf(stderr,
                     "error: '%s %s %s %s %s' is not a product (OP mm|bmm|linear, "
                     "B > 0 for bmm alone, M K N > 0)\n",
                     argv[i], argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4]);
        return 2;
      }
      products.push_back(p);
    }
  } else {
    // The probes' small products, the presets' decoder and ViT linears and attention products.
    products = {{"mm", 0, 64, 48, 48},          {"mm", 0, 64, 48, 16},
                {"mm", 0, 64, 64, 64},          {"mm", 0, 48, 64, 48},
                {"mm", 0, 100, 40, 40},         {"mm", 0, 64, 33, 64},
                {"mm", 0, 128, 31, 64},         {"mm", 0, 333, 100, 77},
                {"mm", 0, 256, 96, 288},        {"mm", 0, 64, 1000, 64},
                {"linear", 0, 4096, 960, 2560}, {"linear", 0, 4096, 2560, 960},
                {"linear", 0, 4096, 960, 320},  {"linear", 0, 1024, 768, 2304},
                {"bmm", 12, 64, 16, 64},        {"bmm", 48, 48, 64, 48},
                {"bmm", 15, 200, 64, 200}};
  }
  std::printf("LibTorch %d.%d, %d threads: bytes a bf16 product allocates beyond its output\n",
              TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, threads);
  for (const Product& p : products) {
    std::printf("%-6s B %-4lld M %-5lld K %-5lld N %-5lld %8lld\n", p.op.c_str(),
                (long long)p.batch, (long long)p.m, (long long)p.k, (long long)p.n,
                (long long)scratchpad_bytes(tracker, p));
  }
  return 0;
}
