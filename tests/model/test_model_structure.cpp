// Shapes, nanoVLM parameter names, parameter counts against spec/derived.h, pixel-shuffle
// order.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "model/model_fixtures.h"
#include "model/vision_language_model.h"
#include "spec/derived.h"

using namespace vlm;

namespace {

int64_t count(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel();
  return total;
}

// nanoVLM's state_dict keys for a spec (models/*.py), in PyTorch's order (a module's own
// parameters, then its children in registration order), minus the rotary buffer and, when
// tied, the head alias.
std::vector<std::string> nanovlm_parameter_names(const spec::ModelSpec& spec) {
  std::vector<std::string> names{"vision_encoder.patch_embedding.position_embedding",
                                 "vision_encoder.patch_embedding.conv.weight",
                                 "vision_encoder.patch_embedding.conv.bias"};
  for (int64_t i = 0; i < spec.vision.num_layers; ++i) {
    const std::string b = "vision_encoder.blocks." + std::to_string(i) + ".";
    for (const char* leaf : {"ln1.weight", "ln1.bias", "attn.qkv_proj.weight", "attn.qkv_proj.bias",
                             "attn.out_proj.weight", "attn.out_proj.bias", "ln2.weight", "ln2.bias",
                             "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"}) {
      names.push_back(b + leaf);
    }
  }
  names.push_back("vision_encoder.layer_norm.weight");
  names.push_back("vision_encoder.layer_norm.bias");
  names.push_back("decoder.token_embedding.weight");
  for (int64_t i = 0; i < spec.language.num_layers; ++i) {
    const std::string b = "decoder.blocks." + std::to_string(i) + ".";
    for (const char* leaf : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                             "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                             "attn.out_proj.weight", "norm1.weight", "norm2.weight"}) {
      names.push_back(b + leaf);
    }
  }
  names.push_back("decoder.norm.weight");
  if (!spec.language.tie_embeddings) names.push_back("decoder.head.weight");
  names.push_back("MP.proj.weight");
  return names;
}

}  // namespace

CATCH_TEST_CASE("named_parameters are nanoVLM's state_dict keys, in its order") {
  auto model = test::tiny_model();
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  CATCH_CHECK(names == nanovlm_parameter_names(model->spec()));
  std::vector<std::string> buffers;
  for (const auto& item : model->named_buffers()) buffers.push_back(item.key());
  CATCH_CHECK(buffers == std::vector<std::string>{"decoder.rotary_embd.inv_freq"});

  spec::ModelSpec untied = spec::preset("tiny");
  untied.language.tie_embeddings = false;
  model::VisionLanguageModel separate(untied);
  names.clear();
  for (const auto& item : separate->named_parameters()) names.push_back(item.key());
  CATCH_CHECK(names == nanovlm_parameter_names(untied));
  CATCH_CHECK(count(*separate->decoder) == spec::language_parameters(untied.language));
}

CATCH_TEST_CASE("module shapes through the tiny model") {
  auto model = test::tiny_model();
  const auto& spec = model->spec();
  const torch::Tensor crops = torch::randn({3, 3, 64, 64});
  const torch::Tensor features = model->vision_encoder->forward(crops);
  CATCH_CHECK(features.sizes() == torch::IntArrayRef({3, 64, 64}));
  CATCH_CHECK(model->MP->forward(features).sizes() == torch::IntArrayRef({3, 16, 128}));
  CATCH_CHECK(model->encode_crops(crops).sizes() == torch::IntArrayRef({3, 16, 128}));

  const auto samples = test::three_samples(spec);
  const auto batch = test::packed_batch(spec, samples);
  const auto out = model->forward(batch, /*return_logits=*/true);
  CATCH_CHECK(out.logits.sizes() == torch::IntArrayRef({2, 32, 325}));
  CATCH_CHECK(out.loss_sum.dim() == 0);
  CATCH_CHECK(out.loss_sum.scalar_type() == torch::kFloat);
  // Each sample supervises len - 1 positions minus the 16 that predict an image token.
  const int64_t expected = (19 - 16) + 9 + (23 - 16);
  CATCH_CHECK(out.supervised_tokens.item<int64_t>() == expected);
  // The loss is a sum, not a mean: near ln(vocab) per token at initialisation.
  CATCH_CHECK(out.loss_sum.item<double>() / expected == Approx(std::log(325.0)).epsilon(0.1));
}

CATCH_TEST_CASE("loss equals the summed cross-entropy of the returned logits") {
  auto model = test::tiny_model();
  const auto batch = test::packed_batch(model->spec(), test::three_samples(model->spec()));
  const auto out = model->forward(batch, true);
  const auto reference = torch::nn::functional::cross_entropy(
      out.logits.reshape({-1, out.logits.size(-1)}), batch.labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  CATCH_CHECK(out.loss_sum.item<double>() == Approx(reference.item<double>()).epsilon(1e-6));
}

CATCH_TEST_CASE("the patch embedding computes nanoVLM's Conv2d (kernel = stride = patch)") {
  auto model = test::tiny_model();
  const auto patch_embedding = std::dynamic_pointer_cast<model::ViTPatchEmbeddingsImpl>(
      model->vision_encoder->named_children()["patch_embedding"]);
  CATCH_REQUIRE(patch_embedding != nullptr);
  const auto parameters = patch_embedding->named_parameters();
  const torch::Tensor weight = parameters["conv.weight"], bias = parameters["conv.bias"];
  const torch::Tensor positions = parameters["position_embedding"];
  {
    torch::NoGradGuard no_grad;  // the tiny model's biases start at 0: make them count
    bias.normal_(0.0, 0.5);
  }
  const torch::Tensor crops = torch::randn({3, 3, 64, 64});
  const torch::Tensor reference =
      torch::conv2d(crops, weight, bias, weight.size(-1)).flatten(2).transpose(1, 2) + positions;
  const torch::Tensor embedded = patch_embedding->forward(crops);
  CATCH_CHECK(embedded.sizes() == reference.sizes());
  CATCH_CHECK(torch::allclose(embedded, reference, /*rtol=*/1e-5, /*atol=*/1e-6));
  // Patches are taken row-major: moving one pixel changes only its patch's row.
  torch::Tensor moved = crops.clone();
  moved[0][1][17][40] += 1.0f;  // patch (17 / 8, 40 / 8) = (2, 5) of an 8 x 8 grid: row 21
  const torch::Tensor changed =
      (patch_embedding->forward(moved) - embedded).abs().sum(-1)[0].nonzero().flatten();
  CATCH_CHECK(changed.numel() == 1);
  CATCH_CHECK(changed[0].item<int64_t>() == 2 * 8 + 5);
}

CATCH_TEST_CASE("pixel shuffle follows nanoVLM's reshape/permute order") {
  // A 4x4 grid of 1-channel patches numbered row-major, factor 2: token (0,0) gathers
  // patches 0,1 (first row of its 2x2 window) then 4,5; token (0,1) gathers 2,3,6,7; ...
  const torch::Tensor patches = torch::arange(16, torch::kFloat).view({1, 16, 1});
  const torch::Tensor shuffled = model::pixel_shuffle_patches(patches, 2);
  const torch::Tensor expected =
      torch::tensor({0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15}, torch::kFloat);
  CATCH_CHECK(shuffled.sizes() == torch::IntArrayRef({1, 4, 4}));
  CATCH_CHECK(torch::equal(shuffled.flatten(), expected));
  // With 2 channels each patch's channels stay together: token 0 = p0c0 p0c1 p1c0 p1c1 p4...
  const torch::Tensor two = torch::arange(32, torch::kFloat).view({1, 16, 2});
  CATCH_CHECK(torch::equal(model::pixel_shuffle_patches(two, 2)[0][0],
                           torch::tensor({0, 1, 2, 3, 8, 9, 10, 11}, torch::kFloat)));
  CATCH_CHECK_THROWS_AS(model::pixel_shuffle_patches(torch::zeros({1, 15, 1}), 2),
                        std::invalid_argument);
}

CATCH_TEST_CASE("module parameter counts equal spec/derived.h for every preset") {
  for (const std::string name : {"tiny", "nanovlm-222m", "nanovlm-460m"}) {
    CATCH_INFO("preset " << name);
    const spec::ModelSpec spec = spec::preset(name);
    const spec::ParameterCounts expected = spec::parameter_counts(spec);
    // The 460M model is ~1.8 GB of fp32: build it once, count, free.
    model::VisionLanguageModel model(spec);
    CATCH_CHECK(count(*model->vision_encoder) == expected.vision);
    CATCH_CHECK(count(*model->MP) == expected.projector);
    CATCH_CHECK(count(*model->decoder) == expected.language);
    CATCH_CHECK(count(*model) == expected.total());
  }
}
