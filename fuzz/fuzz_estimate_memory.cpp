// A config as `vlmtrain estimate-memory` answers for it from metadata: load_config(path,
// overrides), then estimate_worst_case (estimate/estimate.h) for a CPU or a CUDA target, 1 or 2
// ranks, LibTorch 1.13 or 2.11 (whose CPU kernels the replay follows). Input: the config file's
// text, then optionally a NUL byte and one "section.key=value" override per line (as fuzz_config).
// Invariants of a modelled answer: every figure is a count of bytes (not negative, within the
// model's range, memory/magnitude.h), the peak holds the static bytes, and each phase's peak is at
// most the step's; on CUDA also the step replayed for an H100 with LibTorch 2.11
// (memory/cuda_step.h), where it applies: its worst case and verdict are counts of bytes, reserved
// at least allocated.
#include <string>

#include "core/config_io.h"
#include "core/gpu_catalog.h"
#include "estimate/estimate.h"
#include "fuzz_support.h"
#include "memory/cuda_step.h"
#include "memory/magnitude.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const vlm::fuzz::ConfigInput input = vlm::fuzz::config_input(data, size);
  vlm::fuzz::guard("estimate_memory", [&] {
    const std::string path = vlm::fuzz::write_scratch("config.yaml", input.file_text);
    const vlm::Config config = vlm::load_config(path, input.overrides).config;
    // One target per input (the instrumented worst case of the default config takes seconds):
    // CPU or CUDA, 1 or 2 ranks, LibTorch 1.13 or 2.11, by the input's length.
    const bool cuda = size % 2 == 1;
    const int64_t ranks = size % 4 >= 2 ? 2 : 1;
    const vlm::memory::TorchVersion torch =
        size % 8 >= 4 ? vlm::memory::TorchVersion{1, 13} : vlm::memory::kReferenceTorch;
    const vlm::estimate::WorstCaseEstimate e =
        vlm::estimate::estimate_worst_case(config, cuda, ranks, torch);
    if (!e.modelled) return;
    const vlm::memory::StepPrediction& p = e.step.tensors;
    const auto count = [](int64_t bytes) {
      return bytes >= 0 && static_cast<double>(bytes) <= vlm::memory::kMaxModelledBytes;
    };
    const bool ok = count(p.peak_bytes) && count(p.static_bytes) &&
                    count(e.statics.total_bytes()) && p.peak_bytes >= p.static_bytes &&
                    count(p.forward_peak) && count(p.backward_peak) && count(p.optimizer_peak) &&
                    p.forward_peak <= p.peak_bytes && p.backward_peak <= p.peak_bytes &&
                    p.optimizer_peak <= p.peak_bytes && count(e.batch_tensor_bytes);
    if (!ok) {
      vlm::fuzz::invariant_failed(
          "estimate_memory", "a modelled worst case that is not a count of bytes: peak " +
                                 std::to_string(p.peak_bytes) + ", static " +
                                 std::to_string(p.static_bytes) + (cuda ? ", cuda" : ", cpu") +
                                 ", ranks " + std::to_string(ranks));
    }
    if (!cuda) return;
    vlm::sampler::MemoryBudget h100;
    h100.target =
        vlm::memory::DeviceTarget::cuda_device(*vlm::find_gpu("H100-80GB"), {2, 11}, ranks);
    h100.device_bytes = h100.target.gpu.memory_bytes;
    if (!vlm::memory::cuda::unmodelled_on(e.spec, h100.target).empty()) return;
    const vlm::estimate::StepPeak worst = vlm::estimate::worst_step_on(config, e, h100, {});
    const vlm::estimate::Verdict v = vlm::estimate::verdict(e.spec, worst, h100, {});
    if (v.device.replayed && !(count(v.device.allocated) && count(v.device.reserved) &&
                               count(v.peak_bytes) && v.device.reserved >= v.device.allocated)) {
      vlm::fuzz::invariant_failed(
          "estimate_memory", "a replayed CUDA verdict that is not a count of bytes: allocated " +
                                 std::to_string(v.device.allocated) + ", reserved " +
                                 std::to_string(v.device.reserved));
    }
  });
  return 0;
}
