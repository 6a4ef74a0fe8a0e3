// safetensors round trips, determinism, atomic writes and sharded checkpoints.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"
#include "support/test_support.h"

namespace {

using vlm::model::TensorMap;
namespace fs = std::filesystem;

void require_same(const TensorMap& a, const TensorMap& b) {
  CATCH_REQUIRE(a.size() == b.size());
  for (const auto& [name, tensor] : a) {
    CATCH_INFO("tensor " << name);
    const at::Tensor& other = b.at(name);
    CATCH_REQUIRE(other.scalar_type() == tensor.scalar_type());
    CATCH_REQUIRE(other.sizes() == tensor.sizes());
    CATCH_REQUIRE(other.equal(tensor));
  }
}

TensorMap mixed_tensors() {
  torch::manual_seed(7);
  TensorMap t;
  t["f32"] = torch::randn({3, 5});
  t["bf16"] = torch::randn({4, 7}).to(torch::kBFloat16);
  t["f16"] = torch::randn({9}).to(torch::kHalf);
  t["i64"] = torch::tensor({int64_t{-1}, int64_t{1} << 40, int64_t{7}});
  t["f64"] = torch::randn({2, 2}, torch::kDouble);
  t["i32"] = torch::randint(-1000, 1000, {6}, torch::kInt);
  t["i16"] = torch::randint(-1000, 1000, {3}, torch::kShort);
  t["i8"] = torch::randint(-100, 100, {5}, torch::kChar);
  t["u8"] = torch::randint(0, 255, {5}, torch::kByte);
  t["bool"] = torch::tensor({true, false, true});
  t["scalar"] = torch::tensor(3.5f);
  t["empty"] = torch::zeros({0, 4});
  t["transposed"] = torch::arange(12, torch::kFloat).reshape({3, 4}).t();  // not contiguous
  return t;
}

}  // namespace

CATCH_TEST_CASE("safetensors: round trip keeps values and dtypes exactly", "[safetensors]") {
  vlm::test::TempDir dir("safetensors-rt");
  const std::string path = (dir / "m.safetensors").string();
  const TensorMap saved = mixed_tensors();
  vlm::model::save_safetensors(path, saved, {{"format", "pt"}});
  const auto contents = vlm::model::read_safetensors(path);
  require_same(saved, contents.tensors);
  CATCH_CHECK(contents.metadata.at("format") == "pt");
  CATCH_CHECK(contents.files == std::vector<std::string>{path});
  CATCH_CHECK(!fs::exists(path + ".tmp"));

  const vlm::model::SafetensorsFile file(path);
  CATCH_CHECK(file.header().data_start % 8 == 0);
  for (const auto& entry : file.header().tensors) {
    CATCH_CHECK(entry.begin % vlm::model::dtype_size_bytes(entry.dtype) == 0);
  }
}

CATCH_TEST_CASE("safetensors: save-load-save is byte-identical", "[safetensors]") {
  vlm::test::TempDir dir("safetensors-bytes");
  const auto first = dir / "first.safetensors";
  const auto second = dir / "second.safetensors";
  const auto third = dir / "third.safetensors";
  vlm::model::save_safetensors(first.string(), mixed_tensors(), {{"b", "2"}, {"a", "1"}});
  const auto loaded = vlm::model::read_safetensors(first.string());
  vlm::model::save_safetensors(second.string(), loaded.tensors, loaded.metadata);
  vlm::model::save_safetensors(third.string(), mixed_tensors(), {{"a", "1"}, {"b", "2"}});
  const std::string bytes = vlm::test::read_file(first);
  CATCH_CHECK(bytes == vlm::test::read_file(second));
  CATCH_CHECK(bytes == vlm::test::read_file(third));
}

CATCH_TEST_CASE("safetensors: views share the mapping without writing the file", "[safetensors]") {
  vlm::test::TempDir dir("safetensors-view");
  const std::string path = (dir / "v.safetensors").string();
  vlm::model::save_safetensors(path, {{"w", torch::arange(6, torch::kFloat)}});
  const std::string before = vlm::test::read_file(path);
  at::Tensor view;
  {
    const vlm::model::SafetensorsFile file(path);
    view = file.view("w");
  }  // the view keeps the mapping alive past the file object
  CATCH_CHECK(view.equal(torch::arange(6, torch::kFloat)));
  view.mul_(2);  // copy-on-write pages: the file stays as it was
  CATCH_CHECK(view[5].item<float>() == 10.0f);
  CATCH_CHECK(vlm::test::read_file(path) == before);
}

CATCH_TEST_CASE("safetensors: failed saves leave nothing behind", "[safetensors]") {
  vlm::test::TempDir dir("safetensors-fail");
  const std::string path = (dir / "m.safetensors").string();
  vlm::model::save_safetensors(path, {{"keep", torch::ones({2})}});
  const std::string before = vlm::test::read_file(path);
  TensorMap bad{{"a", torch::ones({2})}, {"c", torch::ones({2}, torch::kComplexFloat)}};
  CATCH_REQUIRE_THROWS_WITH(vlm::model::save_safetensors(path, bad),
                            Catch::Contains("tensor 'c' has dtype"));
  CATCH_REQUIRE_THROWS_AS(vlm::model::save_safetensors(path, {{"__metadata__", torch::ones(1)}}),
                          std::invalid_argument);
  CATCH_CHECK(vlm::test::read_file(path) == before);
  CATCH_CHECK(!fs::exists(path + ".tmp"));
  const std::string missing_dir = (dir / "no" / "such" / "m.safetensors").string();
  CATCH_REQUIRE_THROWS_WITH(vlm::model::save_safetensors(missing_dir, {{"a", torch::ones(1)}}),
                            Catch::Contains("cannot create"));
}

namespace {

// Two shards and their index, as Hugging Face writes a sharded checkpoint.
void write_sharded(const fs::path& dir, const TensorMap& all) {
  TensorMap first;
  TensorMap second;
  std::string weight_map;
  for (const auto& [name, tensor] : all) {
    const bool in_first = first.size() <= second.size();
    (in_first ? first : second)[name] = tensor;
    const char* shard =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + name + "\":\"" + shard + "\"";
  }
  vlm::model::save_safetensors((dir / "model-00001-of-00002.safetensors").string(), first);
  vlm::model::save_safetensors((dir / "model-00002-of-00002.safetensors").string(), second);
  vlm::test::write_file(dir / "model.safetensors.index.json",
                        R"({"metadata":{"total_size":1},"weight_map":{)" + weight_map + "}}");
}

}  // namespace

CATCH_TEST_CASE("safetensors: sharded checkpoints load through their index", "[safetensors]") {
  vlm::test::TempDir dir("safetensors-shards");
  const TensorMap all = mixed_tensors();
  write_sharded(dir.path(), all);
  const auto by_index =
      vlm::model::read_safetensors((dir / "model.safetensors.index.json").string());
  require_same(all, by_index.tensors);
  CATCH_CHECK(by_index.files.size() == 2);
  require_same(all, vlm::model::load_safetensors(dir.path().string()));  // the directory form
}

CATCH_TEST_CASE("safetensors: inconsistent shard indexes are rejected", "[safetensors]") {
  vlm::test::TempDir dir("safetensors-badindex");
  vlm::model::save_safetensors((dir / "s1.safetensors").string(),
                               {{"a", torch::ones({2})}, {"b", torch::ones({2})}});
  const auto index = dir / "model.safetensors.index.json";
  const auto rejection = [&](const std::string& json) {
    vlm::test::write_file(index, json);
    try {
      vlm::model::load_safetensors(index.string());
    } catch (const vlm::DataError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CATCH_CHECK_THAT(rejection(R"({"weight_map":{"a":"s1.safetensors"}})"),
                   Catch::Contains("holds tensor 'b', which the index does not assign"));
  CATCH_CHECK_THAT(
      rejection(
          R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s1.safetensors"}})"),
      Catch::Contains("assigns tensor 'c'"));
  CATCH_CHECK_THAT(rejection(R"({"weight_map":{"a":"../s1.safetensors"}})"),
                   Catch::Contains("not a file inside the index's directory"));
  CATCH_CHECK_THAT(rejection(R"({"weight_map":{"a":"/etc/passwd"}})"),
                   Catch::Contains("not a file inside the index's directory"));
  CATCH_CHECK_THAT(rejection(R"({"metadata":{}})"), Catch::Contains("no \"weight_map\" object"));
  CATCH_CHECK_THAT(rejection(R"({"weight_map":{"a":"s9.safetensors"}})"),
                   Catch::Contains("cannot open weights file"));
  CATCH_CHECK_THAT(rejection("{not json"), Catch::Contains("shard index is not valid JSON"));
  fs::remove(index);
  CATCH_REQUIRE_THROWS_WITH(vlm::model::load_safetensors(dir.path().string()),
                            Catch::Contains("neither model.safetensors"));
}
