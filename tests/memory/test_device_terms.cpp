// The device terms without a device: the caching allocator's rounding at its boundaries, the
// CPU's zeros, NCCL's buffers from two ranks on, the cuBLAS workspaces per LibTorch version and
// GPU, and the model states' rounding counted by hand for the tiny preset.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/error.h"
#include "memory/device_terms.h"
#include "memory/parameter_tensors.h"
#include "memory/static_memory.h"
#include "spec/derived.h"

using namespace vlm;
using memory::cuda_block_bytes;
using memory::cuda_segment_bytes;

namespace {

constexpr int64_t MiB = 1 << 20;

memory::MemorySpec tiny_spec() {
  return memory::memory_spec(spec::preset("tiny"), ModelLevers{}, memory::ComputePrecision::kFp32);
}

memory::DeviceTarget gpu(const std::string& name, const std::string& torch, int64_t ranks = 1) {
  return memory::DeviceTarget::cuda_device(*find_gpu(name), *memory::parse_torch_version(torch),
                                           ranks);
}

const memory::StepState kSteady{true, true};  // gradients and moments exist

}  // namespace

TEST_CASE("device terms: blocks are rounded up to 512 bytes, nothing for 0 bytes") {
  CHECK(cuda_block_bytes(0) == 0);
  CHECK(cuda_block_bytes(1) == 512);
  CHECK(cuda_block_bytes(511) == 512);
  CHECK(cuda_block_bytes(512) == 512);
  CHECK(cuda_block_bytes(513) == 1024);
  CHECK(cuda_block_bytes(MiB - 1) == MiB);
  CHECK(cuda_block_bytes(MiB) == MiB);
  CHECK(cuda_block_bytes(MiB + 1) == MiB + 512);
}

TEST_CASE("device terms: segments of 2 MiB to 1 MiB, 20 MiB below 10 MiB, then 2 MiB steps") {
  CHECK(cuda_segment_bytes(0) == 0);
  CHECK(cuda_segment_bytes(512) == 2 * MiB);
  CHECK(cuda_segment_bytes(MiB) == 2 * MiB);  // kSmallSize is still small
  CHECK(cuda_segment_bytes(MiB + 512) == 20 * MiB);
  CHECK(cuda_segment_bytes(10 * MiB - 512) == 20 * MiB);
  CHECK(cuda_segment_bytes(10 * MiB) == 10 * MiB);  // kMinLargeAlloc: rounded to 2 MiB
  CHECK(cuda_segment_bytes(10 * MiB + 512) == 12 * MiB);
  CHECK(cuda_segment_bytes(33 * MiB) == 34 * MiB);
}

TEST_CASE("device terms: LibTorch versions as the binary reports them") {
  CHECK(memory::parse_torch_version("1.13.1")->str() == "1.13");
  CHECK(memory::parse_torch_version("2.1")->str() == "2.1");
  CHECK(memory::parse_torch_version("2.3.0+cu121")->str() == "2.3");
  CHECK(memory::parse_torch_version("2.4.0a0+git1234")->str() == "2.4");
  CHECK_FALSE(memory::parse_torch_version("2"));
  CHECK_FALSE(memory::parse_torch_version("two.one"));
  CHECK_FALSE(memory::parse_torch_version(""));
  CHECK(memory::TorchVersion{2, 0}.at_least(1, 13));
  CHECK_FALSE(memory::TorchVersion{1, 13}.at_least(2, 0));
}

TEST_CASE("device terms: the tiny model's parameters tensor by tensor add up to its counts") {
  const auto s = tiny_spec();
  const auto counts = spec::parameter_counts(s.dims);
  int64_t elements = 0, bytes = 0, buffers = 0;
  for (const auto& t : memory::parameter_tensors(s)) {
    if (t.buffer) {
      buffers += t.elements;
    } else {
      elements += t.elements;
    }
    bytes += t.bytes();
  }
  CHECK(elements == counts.total());
  CHECK(buffers == 16);  // RoPE's inverse frequencies: head_dim 32 / 2
  CHECK(bytes == memory::static_memory(s).parameter_bytes());
}

TEST_CASE("device terms: the tiny model's states rounded to 512-byte blocks, counted by hand") {
  // Vision (d = 64, 2 blocks): the conv bias (256 B -> 512), per block ln1 and ln2 weight and
  // bias, the qkv, out_proj and fc2 biases (7 x 256 B short of a block), the final LayerNorm's
  // two; every weight is a multiple of 512 B. Language: only inv_freq (64 B -> 512); the
  // projector's weight is 128 KiB.
  const int64_t parameters = 256 + 2 * 7 * 256 + 2 * 256 + 448;
  const int64_t gradients = 256 + 2 * 7 * 256 + 2 * 256;  // no gradient for the buffer
  const auto s = tiny_spec();
  const int64_t raw = memory::static_memory(s).parameter_bytes();
  CHECK(memory::static_tensor_bytes(s, {false, false}, true) - raw == parameters);
  const int64_t with_gradients = memory::static_tensor_bytes(s, {true, false}, true) -
                                 memory::static_tensor_bytes(s, {true, false}, false);
  CHECK(with_gradients == parameters + gradients);
  const int64_t with_moments = memory::static_tensor_bytes(s, kSteady, true) -
                               memory::static_tensor_bytes(s, kSteady, false);
  CHECK(with_moments == parameters + 3 * gradients);  // exp_avg and exp_avg_sq round alike

  const auto b =
      memory::device_breakdown(s, kSteady, 50'000'000, 10'000'000, gpu("A100-80GB", "2.1"));
  CHECK(b.block_rounding == parameters + 3 * gradients);
}

TEST_CASE("device terms: on the CPU every device term is 0 and allocated is the tensors") {
  const auto s = tiny_spec();
  const auto b =
      memory::device_breakdown(s, kSteady, 12'345'678, 4'000'000, memory::DeviceTarget::cpu());
  CHECK_FALSE(b.cuda);
  CHECK(b.allocated == 12'345'678);
  CHECK(b.reserved == 12'345'678);
  CHECK(b.device == 12'345'678);
  for (const auto& [name, bytes] : b.terms()) {
    INFO(name);
    if (name != "tensors" && name != "allocated" && name != "reserved" && name != "device") {
      CHECK(bytes == 0);
    }
  }
}

TEST_CASE("device terms: cuBLAS workspaces by LibTorch version, GPU and CUBLAS_WORKSPACE_CONFIG") {
  const auto s = tiny_spec();
  // LibTorch 2.x: two handles (the trainer's thread, autograd's) with a workspace each, in the
  // caching allocator; 32 MiB on sm_90, else 4096 KiB * 2 + 16 KiB * 8.
  auto b = memory::device_breakdown(s, kSteady, 0, 0, gpu("H100-80GB", "2.1"));
  CHECK(b.cublas_workspaces == 2 * 32 * MiB);
  CHECK(b.cublas_outside == 0);
  b = memory::device_breakdown(s, kSteady, 0, 0, gpu("A100-80GB", "2.0"));
  CHECK(b.cublas_workspaces == 2 * 8'519'680);
  // LibTorch 1.13: cuBLAS allocated its own, outside the allocator.
  b = memory::device_breakdown(s, kSteady, 0, 0, gpu("A100-80GB", "1.13"));
  CHECK(b.cublas_workspaces == 0);
  CHECK(b.cublas_outside == 2 * 8'519'680);
  CHECK(b.device - b.reserved - b.cuda_context == 2 * 8'519'680);
  // ROCm: not cuBLAS.
  b = memory::device_breakdown(s, kSteady, 0, 0, gpu("MI300X-192GB", "2.1"));
  CHECK(b.cublas_workspaces + b.cublas_outside == 0);

  auto target = gpu("A100-80GB", "2.1");
  target.cublas_workspace_config = ":4096:8";
  CHECK(memory::cublas_workspace_bytes(target) == 32 * MiB);
  target.cublas_workspace_config = ":16:8";
  CHECK(memory::cublas_workspace_bytes(target) == 128 * 1024);
  target.cublas_workspace_config = "garbage";  // LibTorch warns and keeps its default
  CHECK(memory::cublas_workspace_bytes(target) == 8'519'680);
}

TEST_CASE("device terms: CUBLAS_WORKSPACE_CONFIG and NCCL_BUFFSIZE out of range name themselves") {
  // Read as cuBLAS's handle pool and NCCL read them.
  CHECK(memory::cublas_workspace_config_bytes(":4096:2:16:8") == 4096 * 1024 * 2 + 16 * 1024 * 8);
  CHECK(memory::cublas_workspace_config_bytes("") == std::nullopt);
  CHECK(memory::cublas_workspace_config_bytes(":0:8") == 0);
  CHECK(memory::nccl_buffsize_bytes("8388608") == 8388608);
  CHECK(memory::nccl_buffsize_bytes("") == std::nullopt);
  CHECK(memory::nccl_buffsize_bytes("4MB") == std::nullopt);  // not an integer: NCCL's default
  CHECK(memory::nccl_buffsize_bytes("-5") == std::nullopt);
  CHECK(memory::nccl_buffsize_bytes("-99999999999999999999999") == std::nullopt);
  // Beyond what they read (an int for PyTorch, which throws) or beyond any device: a usage
  // error naming the variable, not std::out_of_range or a wrapped product.
  auto target = gpu("A100-80GB", "2.1");
  for (const char* value : {":99999999999999999999:1", ":2147483648:1", ":2147483647:2147483647",
                            ":1048576:1024:1:1", ":1:1:1073741824:2"}) {
    INFO(value);
    target.cublas_workspace_config = value;
    CHECK_THROWS_AS(memory::cublas_workspace_bytes(target), UsageError);
    CHECK_THROWS_WITH(memory::cublas_workspace_bytes(target),
                      Catch::Contains("CUBLAS_WORKSPACE_CONFIG=" + std::string(value)));
  }
  for (const char* value : {"99999999999999999999", "1099511627777"}) {
    INFO(value);
    CHECK_THROWS_AS(memory::nccl_buffsize_bytes(value), UsageError);
    CHECK_THROWS_WITH(memory::nccl_buffsize_bytes(value),
                      Catch::Contains("NCCL_BUFFSIZE=" + std::string(value)));
  }
  CHECK(memory::nccl_buffsize_bytes("1099511627776") == memory::kMaxEnvironmentBytes);
}

TEST_CASE("device terms: segments of the model states and workspaces, fragmentation allowance") {
  const auto s = tiny_spec();
  // Every tiny tensor is a small block; the two 8,519,680-byte workspaces share one 20 MiB
  // segment.
  const int64_t blocks = memory::static_tensor_bytes(s, kSteady, true);
  const int64_t small_slack = (blocks + 2 * MiB - 1) / (2 * MiB) * (2 * MiB) - blocks;
  const int64_t tensor_static = memory::static_tensor_bytes(s, kSteady, false);
  const int64_t peak = tensor_static + 30'000'000;
  const auto b = memory::device_breakdown(s, kSteady, peak, tensor_static, gpu("A100-80GB", "2.1"));
  CHECK(b.segment_slack == small_slack + 20 * MiB - 2 * 8'519'680);
  CHECK(b.allocated == peak + b.block_rounding + 2 * 8'519'680);
  CHECK(b.fragmentation == std::llround(0.10 * static_cast<double>(b.allocated - tensor_static)));
  CHECK(b.reserved == b.allocated + b.segment_slack + b.fragmentation);
  CHECK(b.cuda_context == 287'047'680);
  CHECK(b.device == b.reserved + b.cuda_context);
}

TEST_CASE("device terms: NCCL's buffers from two ranks on, none for one") {
  const auto s = tiny_spec();
  const auto one =
      memory::device_breakdown(s, kSteady, 1'000'000, 500'000, gpu("H100-80GB", "2.1", 1));
  const auto two =
      memory::device_breakdown(s, kSteady, 1'000'000, 500'000, gpu("H100-80GB", "2.1", 2));
  CHECK(one.nccl_buffers == 0);
  // 8 channels x 2 ring connections x (Simple 4 MiB + LL 512 KiB + LL128 4,800 KiB).
  CHECK(two.nccl_buffers == 8 * 2 * (4 * MiB + 524'288 + 4'915'200));
  CHECK(two.device - one.device == two.nccl_buffers);
  CHECK(two.allocated == one.allocated);
  CHECK(two.reserved == one.reserved);

  auto small = gpu("H100-80GB", "2.1", 2);
  small.nccl_buffsize = MiB;  // NCCL_BUFFSIZE=1048576
  CHECK(memory::device_breakdown(s, kSteady, 1'000'000, 500'000, small).nccl_buffers ==
        8 * 2 * (MiB + 524'288 + 4'915'200));
}

TEST_CASE("device terms: every layer grows with the tensors, the state and the ranks") {
  const auto s = tiny_spec();
  const auto target = gpu("L40S-48GB", "2.2");
  memory::DeviceBreakdown last;
  for (int64_t peak = 1'000'000; peak <= 64'000'000; peak *= 2) {
    const auto b = memory::device_breakdown(s, kSteady, peak, 1'000'000, target);
    CHECK(b.allocated >= b.tensors);
    CHECK(b.reserved >= b.allocated);
    CHECK(b.device >= b.reserved);
    CHECK(b.allocated > last.allocated);
    CHECK(b.reserved > last.reserved);
    CHECK(b.device > last.device);
    last = b;
  }
  const auto fresh = memory::device_breakdown(s, {false, false}, 9'000'000, 1'000'000, target);
  const auto steady = memory::device_breakdown(s, kSteady, 9'000'000, 1'000'000, target);
  CHECK(steady.block_rounding > fresh.block_rounding);
  auto more = target;
  more.ranks = 8;
  CHECK(memory::device_breakdown(s, kSteady, 9'000'000, 1'000'000, more).device > steady.device);
}

TEST_CASE("device terms: corrections scale the part above the model states and add an offset") {
  const auto s = tiny_spec();
  const auto target = gpu("A100-80GB", "2.1");
  const auto plain = memory::device_breakdown(s, kSteady, 40'000'000, 10'000'000, target);
  memory::DeviceCorrections c;
  c.activation_scale = 1.5;
  c.allocated_offset_bytes = 1'000'000;
  c.fragmentation = 0.0;
  c.cuda_context_bytes = 600'000'000;
  const auto corrected = memory::device_breakdown(s, kSteady, 40'000'000, 10'000'000, target, c);
  const int64_t above = plain.allocated - 10'000'000;
  CHECK(corrected.allocated == 10'000'000 + above * 3 / 2 + 1'000'000);
  CHECK(corrected.calibration == corrected.allocated - plain.allocated);
  CHECK(corrected.uncalibrated_allocated() == plain.allocated);
  CHECK(corrected.fragmentation == 0);
  CHECK(corrected.cuda_context == 600'000'000);
  // On the CPU too (a "cpu" entry): the same algebra over the tensors.
  const auto cpu =
      memory::device_breakdown(s, kSteady, 40'000'000, 10'000'000, memory::DeviceTarget::cpu(), c);
  CHECK(cpu.allocated == 10'000'000 + 45'000'000 + 1'000'000);
  CHECK(cpu.device == cpu.allocated);
}

// A calibration entry in range whose offset takes a peak below the model states (once a
// negative peak that "fits", issue 29): refused, naming the entry, never a verdict.
TEST_CASE("device terms: a correction below the model states is refused, naming the entry") {
  const auto s = tiny_spec();
  memory::DeviceCorrections corrections;
  corrections.allocated_offset_bytes = -(int64_t{1} << 40);
  CHECK_THROWS_WITH(memory::device_breakdown(s, kSteady, 50'000'000, 10'000'000,
                                             gpu("A100-80GB", "2.1"), corrections),
                    Catch::Matchers::Contains("memory.calibration: the entry for A100-80GB / "
                                              "LibTorch 2.1") &&
                        Catch::Matchers::Contains("below the model states"));
  corrections.allocated_offset_bytes = -30'000'000;  // the peak stays above the states
  CHECK(memory::device_breakdown(s, kSteady, 50'000'000, 10'000'000, gpu("A100-80GB", "2.1"),
                                 corrections)
            .allocated >= 10'000'000);
}
