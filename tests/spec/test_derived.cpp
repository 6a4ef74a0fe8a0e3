// Derived numbers of the model spec: token geometry, parameter counts (pinned to nanoVLM's
// published module sizes), FLOPs and the structural checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "spec/derived.h"

using namespace vlm::spec;

namespace {

bool any_problem_mentions(const ModelSpec& spec, const std::string& needle) {
  const auto problems = spec_problems(spec);
  return std::any_of(problems.begin(), problems.end(),
                     [&](const std::string& p) { return p.find(needle) != std::string::npos; });
}

}  // namespace

TEST_CASE("nanovlm-460m reproduces nanoVLM's parameter counts exactly") {
  const ModelSpec spec = preset("nanovlm-460m");
  const ParameterCounts counts = parameter_counts(spec);
  REQUIRE(counts.vision == 86'433'024);
  REQUIRE(counts.projector == 11'796'480);
  REQUIRE(counts.language == 361'884'480);
  REQUIRE(counts.total() == 460'113'984);
  // Untied, the head adds another (49152 + 66) x 960 matrix.
  REQUIRE(language_parameters(spec.language, false) == 361'884'480 + 49'218 * 960);
  REQUIRE(language_parameters(spec.language, true) == 361'884'480);
}

TEST_CASE("nanovlm-460m token geometry: 1024 patches, 64 image tokens per crop") {
  const ModelSpec spec = preset("nanovlm-460m");
  REQUIRE(patches_per_side(spec.vision) == 32);
  REQUIRE(patches_per_crop(spec.vision) == 1024);
  REQUIRE(image_tokens_per_crop(spec) == 64);
  REQUIRE(projector_input_dim(spec) == 12'288);
  REQUIRE(vision_head_dim(spec.vision) == 64);
  REQUIRE(language_head_dim(spec.language) == 64);
  REQUIRE(language_vocab_rows(spec.language) == 49'218);
}

TEST_CASE("nanovlm-222m is SigLIP-B/16-224 + pixel shuffle 2 + SmolLM2-135M") {
  const ModelSpec spec = preset("nanovlm-222m");
  REQUIRE(patches_per_crop(spec.vision) == 196);
  REQUIRE(image_tokens_per_crop(spec) == 49);
  const ParameterCounts counts = parameter_counts(spec);
  REQUIRE(counts.vision == 85'797'120);  // google/siglip-base-patch16-224's vision tower
  REQUIRE(counts.projector == 3072 * 576);
  // SmolLM2-135M has 134,515,008 parameters; one <|image|> row adds 576.
  REQUIRE(counts.language == 134'515'008 + 576);
  REQUIRE(counts.total() == 222'082'176);
  REQUIRE(spec_problems(spec).empty());
}

TEST_CASE("tiny preset counts, by hand") {
  const ModelSpec spec = preset("tiny");
  REQUIRE(image_tokens_per_crop(spec) == 16);
  const ParameterCounts counts = parameter_counts(spec);
  // conv 3*8*8*64+64, positions 64*64, 2 blocks of 49,984, final LN 128.
  REQUIRE(counts.vision == 12'352 + 4'096 + 2 * 49'984 + 128);
  REQUIRE(counts.projector == 256 * 128);
  // embedding 325*128, 4 blocks of (attention 49,152 + MLP 147,456 + norms 256), final norm.
  REQUIRE(counts.language == 41'600 + 4 * 196'864 + 128);
  REQUIRE(spec_problems(spec).empty());
}

TEST_CASE("LM forward FLOPs: 2N per token plus 4 L d per key attended") {
  const LanguageSpec lm = preset("tiny").language;
  // 4 blocks x (49,152 + 147,456) matmul weights + the 325 x 128 head.
  REQUIRE(language_matmul_parameters(lm) == 828'032);
  REQUIRE(language_forward_flops_per_token(lm, 1) == Approx(2.0 * 828'032 + 4 * 4 * 128));
  REQUIRE(language_forward_flops_per_token(lm, 100) - language_forward_flops_per_token(lm, 99) ==
          Approx(4 * 4 * 128));
  // A causal sample is the sum of its tokens, token i attending to i + 1 keys.
  double summed = 0;
  for (int64_t i = 0; i < 37; ++i) summed += language_forward_flops_per_token(lm, i + 1);
  REQUIRE(language_forward_flops_per_sample(lm, 37) == Approx(summed));
}

TEST_CASE("ViT forward FLOPs per crop, by hand for tiny") {
  const ModelSpec spec = preset("tiny");
  // Per patch: conv 2*3*64*64 = 24,576; per layer 2*(4*64^2 + 2*64*256) + 4*64*64 = 114,688.
  const double per_patch = 24'576 + 2 * 114'688;
  const double projector = 2.0 * 256 * 128 * 16;
  REQUIRE(vision_forward_flops_per_crop(spec) == Approx(64 * per_patch + projector));
  // 460M: 2 * 85.5M matmul weights * 1024 patches = 175.2 GFLOP, attention
  // 4 * 12 * 768 * 1024^2 = 38.7 GFLOP, projector 2 * 12288 * 960 * 64 = 1.5 GFLOP.
  REQUIRE(vision_forward_flops_per_crop(preset("nanovlm-460m")) == Approx(215.3e9).epsilon(0.001));
}

TEST_CASE("spec_problems names every structural mismatch") {
  ModelSpec spec = preset("nanovlm-460m");
  REQUIRE(spec_problems(spec).empty());

  ModelSpec heads = spec;
  heads.vision.num_heads = 7;
  REQUIRE(any_problem_mentions(heads,
                               "model.vision.hidden_size (768) is not a multiple of "
                               "model.vision.num_heads (7)"));

  ModelSpec kv = spec;
  kv.language.num_kv_heads = 4;
  REQUIRE(any_problem_mentions(kv,
                               "model.language.num_heads (15) is not a multiple of "
                               "model.language.num_kv_heads (4)"));

  ModelSpec patch = spec;
  patch.vision.patch_size = 15;
  REQUIRE(any_problem_mentions(patch,
                               "model.vision.image_size (512) is not a multiple of "
                               "model.vision.patch_size (15)"));

  ModelSpec shuffle = spec;
  shuffle.projector.pixel_shuffle = 3;
  REQUIRE(any_problem_mentions(shuffle, "does not divide the patch grid side"));

  ModelSpec odd = spec;
  odd.language.hidden_size = 945;  // 15 heads of 63
  REQUIRE(any_problem_mentions(odd, "is odd"));

  ModelSpec zero = spec;
  zero.language.num_layers = 0;
  zero.vision.layer_norm_eps = 0;
  const auto problems = spec_problems(zero);
  REQUIRE(problems.size() == 2);
  REQUIRE(any_problem_mentions(zero, "model.language.num_layers is 0"));
  REQUIRE(any_problem_mentions(zero, "model.vision.layer_norm_eps is 0"));
}
