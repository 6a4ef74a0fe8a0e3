// vlmtrain: trains vision-language models from YAML configs.
#include <CLI/CLI.hpp>

#include <iostream>

#include "core/error.h"
#include "vlm/build_info.h"
#include "runtime/torch_info.h"

int main(int argc, char** argv) {
  CLI::App app{"vlmtrain: train vision-language models from YAML configs"};
  app.set_version_flag("--version", [] {
    return std::string("vlmtrain ") + VLM_VERSION + " (git " + VLM_GIT_HASH + ", " +
           VLM_BUILD_TYPE + ")\nLibTorch " + vlm::runtime::torch_version() +
           ", CUDA: " + (vlm::runtime::cuda_available() ? "yes" : "no");
  });
  CLI11_PARSE(app, argc, argv);
  return 0;
}
