#include <catch2/catch.hpp>

#include "core/gpu_catalog.h"
#include "core/strings.h"
#include "core/units.h"

TEST_CASE("byte sizes parse with decimal and binary units") {
  CHECK(vlm::parse_bytes("1024") == 1024);
  CHECK(vlm::parse_bytes("80GiB") == 80ll * 1024 * 1024 * 1024);
  CHECK(vlm::parse_bytes("1.5 GB") == 1500000000ll);
  CHECK(vlm::parse_bytes("512mib") == 512ll << 20);
  CHECK(vlm::parse_bytes("0") == 0);
  CHECK_FALSE(vlm::parse_bytes("-1GB"));
  CHECK_FALSE(vlm::parse_bytes("GB"));
  CHECK_FALSE(vlm::parse_bytes("12 parsecs"));
  CHECK_FALSE(vlm::parse_bytes("1e30"));
  CHECK_FALSE(vlm::parse_bytes("99999999999 TiB"));
  CHECK(vlm::format_bytes(512) == "512 B");
  CHECK(vlm::format_bytes(3ll << 30) == "3.00 GiB");
}

TEST_CASE("closest match suggests plausible keys only") {
  CHECK(vlm::edit_distance("kitten", "sitting") == 3);
  CHECK(vlm::closest_match("batchsize", {"batch_size", "max_steps"}) == "batch_size");
  CHECK(vlm::closest_match("qqqqqqqq", {"batch_size", "max_steps"}).empty());
}

TEST_CASE("reals print in their shortest exact form") {
  CHECK(vlm::format_real(0.1) == "0.1");
  CHECK(vlm::format_real(4) == "4");
  CHECK(std::stod(vlm::format_real(1.0 / 3.0)) == 1.0 / 3.0);
  CHECK(vlm::double_quoted("a\"b\n") == "\"a\\\"b\\n\"");
}

TEST_CASE("GPUs are found by canonical name, alias and CUDA device name") {
  CHECK(vlm::find_gpu("H100-80GB")->memory_bytes == 80ll << 30);
  CHECK(vlm::find_gpu("NVIDIA H100 80GB HBM3")->name == "H100-80GB");
  CHECK(vlm::find_gpu("NVIDIA A100-SXM4-40GB")->name == "A100-40GB");
  CHECK(vlm::find_gpu("NVIDIA H200")->name == "H200-141GB");
  CHECK_FALSE(vlm::find_gpu("Voodoo 2"));
  // Exact names only: what a user writes in memory.device_memory.
  CHECK(vlm::find_gpu_by_name("h100-80gb")->name == "H100-80GB");
  CHECK(vlm::find_gpu_by_name("NVIDIA A100-SXM4-40GB")->name == "A100-40GB");  // an alias
  CHECK_FALSE(vlm::find_gpu_by_name("A100-80G"));
  CHECK_FALSE(vlm::find_gpu_by_name("H100-999GB"));
  CHECK(vlm::find_gpu("H100-999GB")->name == "H100-80GB");  // a CUDA name contains the alias
}
