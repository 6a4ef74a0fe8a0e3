#include "memory/memory_spec.h"

#include <algorithm>
#include <regex>
#include <stdexcept>

#include "core/dist_env.h"
#include "memory/magnitude.h"

namespace vlm::memory {

std::string TorchVersion::str() const {
  return std::to_string(major) + "." + std::to_string(minor);
}

std::optional<TorchVersion> parse_torch_version(std::string_view text) {
  static const std::regex pattern(R"(^(\d{1,3})\.(\d{1,3})(\.\d+)?([+a-z].*)?$)");
  const std::string s(text);
  std::smatch m;
  if (!std::regex_match(s, m, pattern)) return std::nullopt;
  return TorchVersion{std::stoi(m[1]), std::stoi(m[2])};
}

ComputePrecision compute_precision(const std::string& name) {
  if (name == "fp32") return ComputePrecision::kFp32;
  if (name == "bf16" || name == "fp16") return ComputePrecision::kBf16;
  throw std::invalid_argument("unknown precision '" + name + "' (fp32, bf16, fp16)");
}

bool onednn_bf16_products() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // The compiler's CPU check, like cpuinfo's, also asks the OS whether it saves AVX-512 state.
  static const bool here = __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return here;
#else
  return false;
#endif
}

MemorySpec memory_spec(const spec::ModelSpec& dims, const ModelLevers& levers,
                       ComputePrecision precision) {
  MemorySpec s;
  s.onednn_bf16 = onednn_bf16_products();
  s.dims = dims;
  s.levers = levers;
  s.precision = precision;
  const int64_t frozen_bytes = levers.frozen_in_bf16() ? 2 : 4;
  auto state = [&](bool frozen) { return ModuleState{!frozen, frozen ? frozen_bytes : 4}; };
  s.vision = state(levers.freeze_vision);
  s.projector = state(levers.freeze_projector);
  s.language = state(levers.freeze_language);
  return s;
}

MemorySpec memory_spec(const Config& config) {
  MemorySpec s =
      memory_spec(config.model.dims, config.model, compute_precision(config.train.precision));
  // A peak learning rate of 0 freezes a module in the optimizer (train/optimizer.h); its
  // parameters keep their fp32 storage.
  if (config.train.lr.vision == 0.0) s.vision.trainable = false;
  if (config.train.lr.projector == 0.0) s.projector.trainable = false;
  if (config.train.lr.language == 0.0) s.language.trainable = false;
  // As runtime::configure_threads resolves train.threads.
  s.threads = config.train.threads > 0 ? config.train.threads : cpu_share_from_process().threads;
  // Every command sizes its memory from here: the one place a config beyond the model's range
  // is refused.
  check_config_in_range(config, s);
  return s;
}

MemorySpec run_spec(const Config& config, bool cuda, int64_t ranks) {
  MemorySpec spec = memory_spec(config);
  if (cuda) spec.threads = 0;  // the CPU-only terms
  spec.ranks = ranks;
  return spec;
}

}  // namespace vlm::memory
