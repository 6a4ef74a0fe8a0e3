// Canonical (nanoVLM) tensor names and shapes, and the missing/unexpected/mis-shaped report.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>

#include "core/error.h"
#include "model/weight_map.h"
#include "spec/model_spec.h"

namespace {

using vlm::model::ExpectedTensor;

std::map<std::string, std::vector<int64_t>> by_name(const std::vector<ExpectedTensor>& list) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& e : list) out[e.name] = e.shape;
  return out;
}

int64_t total_elements(const std::vector<ExpectedTensor>& list) {
  int64_t total = 0;
  for (const auto& e : list) {
    int64_t n = 1;
    for (const int64_t d : e.shape) n *= d;
    total += n;
  }
  return total;
}

std::map<std::string, at::Tensor> zeros_for(const std::vector<ExpectedTensor>& list) {
  std::map<std::string, at::Tensor> out;
  for (const auto& e : list) out[e.name] = torch::zeros(e.shape);
  return out;
}

}  // namespace

CATCH_TEST_CASE("expected_tensors: nanoVLM names and shapes of the tiny preset", "[weights]") {
  const auto spec = vlm::spec::preset("tiny");
  const auto list = vlm::model::expected_tensors(spec);
  // ViT: 3 embedding tensors + 12 per block x 2 + final norm 2; LM: embedding + 9 per block x 4
  // + final norm; projector 1 (the head is tied, so it is the embedding).
  CATCH_CHECK(list.size() == 3 + 12 * 2 + 2 + 1 + 9 * 4 + 1 + 1);
  CATCH_CHECK(list.front().name == "vision_encoder.patch_embedding.conv.weight");
  CATCH_CHECK(list.back().name == "MP.proj.weight");
  const auto shapes = by_name(list);
  CATCH_CHECK(shapes.size() == list.size());  // no duplicates
  using S = std::vector<int64_t>;
  CATCH_CHECK(shapes.at("vision_encoder.patch_embedding.conv.weight") == S{64, 3, 8, 8});
  CATCH_CHECK(shapes.at("vision_encoder.patch_embedding.position_embedding") == S{1, 64, 64});
  CATCH_CHECK(shapes.at("vision_encoder.blocks.1.attn.qkv_proj.weight") == S{192, 64});
  CATCH_CHECK(shapes.at("vision_encoder.blocks.1.attn.qkv_proj.bias") == S{192});
  CATCH_CHECK(shapes.at("vision_encoder.blocks.0.mlp.fc2.weight") == S{64, 256});
  CATCH_CHECK(shapes.at("vision_encoder.layer_norm.bias") == S{64});
  CATCH_CHECK(shapes.at("decoder.token_embedding.weight") == S{259 + 66, 128});
  CATCH_CHECK(shapes.at("decoder.blocks.3.attn.k_proj.weight") == S{64, 128});  // 2 kv heads x 32
  CATCH_CHECK(shapes.at("decoder.blocks.3.attn.out_proj.weight") == S{128, 128});
  CATCH_CHECK(shapes.at("decoder.blocks.0.mlp.down_proj.weight") == S{128, 384});
  CATCH_CHECK(shapes.at("decoder.blocks.0.norm2.weight") == S{128});
  CATCH_CHECK(shapes.at("MP.proj.weight") == S{128, 64 * 2 * 2});
  CATCH_CHECK(shapes.count("decoder.head.weight") == 0);
  CATCH_CHECK(shapes.count("vision_encoder.blocks.2.ln1.weight") == 0);

  auto untied = spec;
  untied.language.tie_embeddings = false;
  const auto untied_shapes = by_name(vlm::model::expected_tensors(untied));
  CATCH_CHECK(untied_shapes.at("decoder.head.weight") == S{325, 128});
}

CATCH_TEST_CASE("expected_tensors: nanoVLM-460M has 460,113,984 parameters", "[weights]") {
  // By hand: SigLIP2-B/16-512 without its pooling head = 86,433,024 (patch conv 590,592,
  // 1024 positions x 768, 12 blocks of 7,087,872, final norm 1,536); SmolLM2-360M with 66
  // extra tokens = 361,884,480 (embedding 49,218 x 960, 32 blocks of 9,832,320, norm 960);
  // projector 960 x 768*16 = 11,796,480.
  const auto list = vlm::model::expected_tensors(vlm::spec::preset("nanovlm-460m"));
  CATCH_CHECK(total_elements(vlm::model::with_prefix(list, "vision_encoder.")) == 86'433'024);
  CATCH_CHECK(total_elements(vlm::model::with_prefix(list, "decoder.")) == 361'884'480);
  CATCH_CHECK(total_elements(vlm::model::with_prefix(list, "MP.")) == 11'796'480);
  CATCH_CHECK(total_elements(list) == 460'113'984);
}

CATCH_TEST_CASE("compare_weights: missing, unexpected and mis-shaped tensors", "[weights]") {
  const auto expected = vlm::model::expected_tensors(vlm::spec::preset("tiny"));
  auto loaded = zeros_for(expected);
  CATCH_CHECK(vlm::model::compare_weights(loaded, expected).ok());
  CATCH_CHECK_NOTHROW(vlm::model::require_weights_match(loaded, expected, "x"));

  loaded.erase("MP.proj.weight");
  loaded.erase("decoder.norm.weight");
  loaded["decoder.extra.weight"] = torch::zeros({2, 3});
  loaded["vision_encoder.layer_norm.weight"] = torch::zeros({65});
  const auto report = vlm::model::compare_weights(loaded, expected);
  CATCH_CHECK(!report.ok());
  CATCH_CHECK(report.matched == static_cast<int64_t>(expected.size()) - 3);
  CATCH_REQUIRE(report.missing.size() == 2);
  CATCH_CHECK(report.missing[0].name == "MP.proj.weight");  // sorted by name
  CATCH_CHECK(report.missing[1].name == "decoder.norm.weight");
  CATCH_REQUIRE(report.unexpected.size() == 1);
  CATCH_CHECK(report.unexpected[0].shape == std::vector<int64_t>{2, 3});
  CATCH_REQUIRE(report.mis_shaped.size() == 1);
  CATCH_CHECK(report.mis_shaped[0].actual_shape == std::vector<int64_t>{65});

  const std::string text = vlm::model::format_report(report);
  CATCH_CHECK_THAT(text,
                   Catch::StartsWith(std::to_string(expected.size() - 3) +
                                     " matched, 2 missing, 1 unexpected, 1 with the wrong shape"));
  CATCH_CHECK_THAT(text, Catch::Contains("\n  MP.proj.weight [128, 256]"));
  CATCH_CHECK_THAT(text, Catch::Contains("\n  decoder.extra.weight [2, 3]"));
  CATCH_CHECK_THAT(text,
                   Catch::Contains("vision_encoder.layer_norm.weight: expected [64], found [65]"));
  CATCH_REQUIRE_THROWS_WITH(vlm::model::require_weights_match(loaded, expected, "ckpt.safetensors"),
                            Catch::StartsWith("ckpt.safetensors: weights do not fit the model"));
}

CATCH_TEST_CASE("format_report: long lists are truncated", "[weights]") {
  const auto expected = vlm::model::expected_tensors(vlm::spec::preset("tiny"));
  const auto report = vlm::model::compare_weights({}, expected);
  CATCH_CHECK(report.missing.size() == expected.size());
  const std::string text = vlm::model::format_report(report, 5);
  CATCH_CHECK_THAT(text, Catch::Contains("missing (" + std::to_string(expected.size()) + "):"));
  CATCH_CHECK_THAT(text,
                   Catch::EndsWith("... and " + std::to_string(expected.size() - 5) + " more"));
  // Summary line, then the title, five names and the "... and N more" line.
  CATCH_CHECK(std::count(text.begin(), text.end(), '\n') == 1 + 5 + 1);
}
