// Catch2 main for the torch test suites: fixes the intra-op thread count so results and run
// times do not depend on the machine (LibTorch 1.13 would pick hardware_concurrency()/2).
#define CATCH_CONFIG_RUNNER
#include <torch/torch.h>
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  torch::set_num_threads(1);
  return Catch::Session().run(argc, argv);
}
