#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "core/error.h"
#include "support/test_support.h"
#include "train/optimizer.h"

using namespace vlm::train;

namespace {

// Parameters named like nanoVLM's (vision_encoder / MP / decoder), small and deterministic.
NamedParameters tiny_vlm_parameters() {
  torch::manual_seed(11);
  auto p = [](std::vector<int64_t> shape) { return torch::randn(shape).requires_grad_(true); };
  torch::Tensor token_embedding = p({10, 4});
  return {
      {"vision_encoder.patch_embedding.conv.weight", p({4, 3, 2, 2})},  // conv: decays
      {"vision_encoder.patch_embedding.conv.bias", p({4})},
      {"vision_encoder.patch_embedding.position_embedding", p({1, 5, 4})},
      {"vision_encoder.blocks.0.ln1.weight", p({4})},
      {"vision_encoder.blocks.0.mlp.fc1.weight", p({8, 4})},
      {"MP.proj.weight", p({4, 16})},
      {"decoder.token_embedding.weight", token_embedding},
      {"decoder.blocks.0.attn.q_proj.weight", p({4, 4})},
      {"decoder.norm.weight", p({4})},
      {"decoder.head.weight", token_embedding},       // tied to the token embedding
      {"decoder.rotary.inv_freq", torch::ones({2})},  // frozen buffer-like tensor
  };
}

GroupedAdamWOptions three_lrs() {
  GroupedAdamWOptions options;
  options.peak_lr = {{"vision", 5e-5}, {"projector", 1e-3}, {"language", 1e-4}};
  options.weight_decay = 0.1;
  return options;
}

// A deterministic loss over all trainable tensors, so gradients are reproducible.
void compute_grads(const std::vector<torch::Tensor>& params, int step) {
  torch::Tensor loss = torch::zeros({});
  for (size_t i = 0; i < params.size(); ++i) {
    loss = loss + (params[i] * (0.1 * static_cast<double>(i + 1 + step))).sin().sum();
  }
  loss.backward();
}

void train_steps(GroupedAdamW& adamw, int first_step, int count) {
  for (int step = first_step; step < first_step + count; ++step) {
    adamw.zero_grad();
    compute_grads(adamw.parameters(), step);
    adamw.set_lr_factor(0.5 + 0.1 * step);
    adamw.step();
  }
}

NamedParameters clone_parameters(const NamedParameters& named) {
  NamedParameters copy;
  std::map<const void*, torch::Tensor> clones;  // keeps tied tensors tied
  for (const auto& [name, tensor] : named) {
    auto [it, inserted] = clones.try_emplace(tensor.unsafeGetTensorImpl());
    if (inserted) it->second = tensor.detach().clone().requires_grad_(tensor.requires_grad());
    copy.emplace_back(name, it->second);
  }
  return copy;
}

}  // namespace

CATCH_TEST_CASE("weight decay rule: matrices decay, norms, biases and embeddings do not",
                "[optimizer]") {
  CATCH_CHECK(parameter_gets_weight_decay("decoder.blocks.0.mlp.up.weight", 2, false));
  CATCH_CHECK(parameter_gets_weight_decay("vision_encoder.patch_embedding.conv.weight", 4, false));
  CATCH_CHECK_FALSE(parameter_gets_weight_decay("decoder.norm.weight", 1, false));
  CATCH_CHECK_FALSE(parameter_gets_weight_decay("MP.proj.bias", 1, false));
  CATCH_CHECK_FALSE(parameter_gets_weight_decay("decoder.token_embedding.weight", 2, false));
  CATCH_CHECK_FALSE(
      parameter_gets_weight_decay("vision_encoder.patch_embedding.position_embedding", 3, false));
  CATCH_CHECK(parameter_gets_weight_decay("decoder.token_embedding.weight", 2, true));
  CATCH_CHECK_FALSE(parameter_gets_weight_decay("decoder.norm.weight", 1, true));
}

CATCH_TEST_CASE("parameters are grouped by module and decay, frozen and tied ones handled",
                "[optimizer]") {
  const NamedParameters named = tiny_vlm_parameters();
  GroupedAdamW adamw(named, three_lrs());
  const auto& groups = adamw.groups();
  CATCH_REQUIRE(groups.size() == 5);  // projector has no no-decay tensor: no empty group
  CATCH_CHECK(groups[0].module == "vision");
  CATCH_CHECK(groups[0].decay);
  CATCH_CHECK(groups[0].names ==
              std::vector<std::string>{"vision_encoder.patch_embedding.conv.weight",
                                       "vision_encoder.blocks.0.mlp.fc1.weight"});
  CATCH_CHECK(groups[0].numel == 4 * 3 * 2 * 2 + 8 * 4);
  CATCH_CHECK_FALSE(groups[1].decay);
  CATCH_CHECK(groups[1].names.size() == 3);  // conv bias, position embedding, ln1.weight
  CATCH_CHECK(groups[2].module == "projector");
  CATCH_CHECK(groups[2].peak_lr == 1e-3);
  CATCH_CHECK(groups[3].names == std::vector<std::string>{"decoder.blocks.0.attn.q_proj.weight"});
  // The tied head is the token embedding: one entry, under its first name.
  CATCH_CHECK(groups[4].names ==
              std::vector<std::string>{"decoder.token_embedding.weight", "decoder.norm.weight"});
  CATCH_CHECK(adamw.parameters().size() == 9);

  auto& torch_groups = adamw.optimizer().param_groups();
  CATCH_REQUIRE(torch_groups.size() == 5);
  auto weight_decay = [&](size_t i) {
    return static_cast<torch::optim::AdamWOptions&>(torch_groups[i].options()).weight_decay();
  };
  CATCH_CHECK(weight_decay(0) == 0.1);
  CATCH_CHECK(weight_decay(1) == 0.0);
  CATCH_CHECK(weight_decay(4) == 0.0);

  adamw.set_lr_factor(0.5);
  const auto lr = adamw.lr_by_module();
  CATCH_CHECK(lr.at("vision") == 2.5e-5);
  CATCH_CHECK(lr.at("projector") == 5e-4);
  CATCH_CHECK(lr.at("language") == 5e-5);
}

CATCH_TEST_CASE("decoupled weight decay shrinks only the decay groups", "[optimizer]") {
  const NamedParameters named = tiny_vlm_parameters();
  GroupedAdamWOptions options = three_lrs();
  options.peak_lr = {{"vision", 0.5}, {"projector", 0.5}, {"language", 0.5}};
  GroupedAdamW adamw(named, options);
  std::vector<torch::Tensor> before;
  for (const auto& p : adamw.parameters()) {
    before.push_back(p.detach().clone());
    p.mutable_grad() = torch::zeros_like(p);  // Adam's update is 0: only the decay acts
  }
  adamw.step();
  for (size_t i = 0; i < before.size(); ++i) {
    const torch::Tensor& p = adamw.parameters()[i];
    const bool decays = i < 2 || i == 5 || i == 6;  // groups 0, 2 and 3 in group order
    const torch::Tensor expected = decays ? before[i] * (1.0 - 0.5 * 0.1) : before[i];
    CATCH_CHECK(torch::allclose(p.detach(), expected, 1e-6, 1e-7));
  }
}

CATCH_TEST_CASE("optimizer state save/load resumes bit-identically", "[optimizer]") {
  vlm::test::TempDir dir("optim");
  const std::string file = (dir / "optimizer.pt").string();
  const NamedParameters named = tiny_vlm_parameters();
  GroupedAdamW uninterrupted(named, three_lrs());
  train_steps(uninterrupted, 0, 3);
  uninterrupted.save(file);
  const NamedParameters at_checkpoint = clone_parameters(named);
  train_steps(uninterrupted, 3, 2);

  GroupedAdamW resumed(at_checkpoint, three_lrs());
  resumed.load(file);
  train_steps(resumed, 3, 2);
  GroupedAdamW fresh(clone_parameters(at_checkpoint), three_lrs());  // no state: must differ
  train_steps(fresh, 3, 2);

  bool fresh_differs = false;
  for (size_t i = 0; i < uninterrupted.parameters().size(); ++i) {
    CATCH_CHECK(torch::equal(resumed.parameters()[i], uninterrupted.parameters()[i]));
    fresh_differs |= !torch::equal(fresh.parameters()[i], uninterrupted.parameters()[i]);
  }
  CATCH_CHECK(fresh_differs);

  // A different group layout (embeddings now decay) refuses the file.
  GroupedAdamWOptions other = three_lrs();
  other.decay_embeddings = true;
  GroupedAdamW mismatched(clone_parameters(at_checkpoint), other);
  CATCH_CHECK_THROWS_AS(mismatched.load(file), vlm::Error);
  CATCH_CHECK_THROWS_AS(resumed.load((dir / "missing.pt").string()), vlm::Error);
}

CATCH_TEST_CASE("optimizer configuration errors and modules with lr 0", "[optimizer]") {
  NamedParameters named = tiny_vlm_parameters();
  GroupedAdamWOptions missing_lr = three_lrs();
  missing_lr.peak_lr.erase("projector");
  CATCH_CHECK_THROWS_AS(GroupedAdamW(named, missing_lr), vlm::ConfigError);

  NamedParameters stray = tiny_vlm_parameters();
  stray.emplace_back("lm_head.weight", torch::ones({2, 2}).requires_grad_(true));
  CATCH_CHECK_THROWS_AS(GroupedAdamW(stray, three_lrs()), vlm::ConfigError);

  GroupedAdamWOptions frozen_vision = three_lrs();
  frozen_vision.peak_lr["vision"] = 0.0;
  GroupedAdamW adamw(named, frozen_vision);
  for (const auto& group : adamw.groups()) CATCH_CHECK(group.module != "vision");
  CATCH_CHECK_FALSE(named[0].second.requires_grad());  // frozen like nanoVLM does
  CATCH_CHECK(named[5].second.requires_grad());

  // named_parameters_of reads a module's parameters with their dotted names.
  torch::nn::Sequential model(torch::nn::Linear(2, 3));
  const NamedParameters from_module = named_parameters_of(*model);
  CATCH_REQUIRE(from_module.size() == 2);
  CATCH_CHECK(from_module[0].first == "0.weight");
}

CATCH_TEST_CASE("clip_grad_norm reports the global norm and clips only when asked", "[optimizer]") {
  auto with_grad = [](std::vector<double> values) {
    torch::Tensor p = torch::zeros({static_cast<int64_t>(values.size())}).requires_grad_(true);
    p.mutable_grad() = torch::tensor(values, torch::kFloat);
    return p;
  };
  std::vector<torch::Tensor> params = {with_grad({3.0}), with_grad({0.0, 4.0}),
                                       torch::zeros({1}).requires_grad_(true)};
  CATCH_CHECK(clip_grad_norm(params, 0.0) == 5.0);  // measure only
  CATCH_CHECK(params[0].grad().item<float>() == 3.0f);
  CATCH_CHECK(clip_grad_norm(params, 10.0) == 5.0);  // below the limit: unchanged
  CATCH_CHECK(params[0].grad().item<float>() == 3.0f);
  CATCH_CHECK(clip_grad_norm(params, 1.0) == 5.0);  // returns the norm before clipping
  CATCH_CHECK(params[0].grad().item<float>() == Catch::Detail::Approx(0.6).epsilon(1e-5));
  CATCH_CHECK(params[1].grad()[1].item<float>() == Catch::Detail::Approx(0.8).epsilon(1e-5));
  CATCH_CHECK(clip_grad_norm(params, 0.0) == Catch::Detail::Approx(1.0).epsilon(1e-5));

  std::vector<torch::Tensor> bad = {with_grad({std::numeric_limits<double>::infinity(), 1.0})};
  CATCH_CHECK(std::isinf(clip_grad_norm(bad, 1.0)));
  CATCH_CHECK(bad[0].grad()[1].item<float>() == 1.0f);  // left for the skip, not NaN-ed
  CATCH_CHECK(clip_grad_norm({}, 1.0) == 0.0);
}

CATCH_TEST_CASE("optimizer state saved to a full disk is a save failure naming the file",
                "[optimizer]") {
  // /dev/full fails every write with ENOSPC, as a full disk does. The state is serialised in
  // memory and written with checked writes: an error with the save-failed code, not a
  // LibTorch exception escaping (or std::terminate from its writer's destructor).
  const NamedParameters named = tiny_vlm_parameters();
  GroupedAdamW adamw(named, three_lrs());
  train_steps(adamw, 0, 1);
  try {
    adamw.save("/dev/full");
    CATCH_FAIL("no error");
  } catch (const vlm::Error& e) {
    CATCH_CHECK(e.code() == vlm::ExitCode::kSaveFailed);
    CATCH_CHECK_THAT(e.what(), Catch::Contains("cannot write /dev/full") &&
                                   Catch::Contains(std::strerror(ENOSPC)));
  }
}

CATCH_TEST_CASE("the fused AdamW runs on CUDA only: CPU keeps LibTorch's, whose bytes the memory "
                "model replays", "[optimizer]") {
  for (const bool fused : {true, false}) {
    GroupedAdamWOptions options = three_lrs();
    options.fused = fused;
    GroupedAdamW adamw(tiny_vlm_parameters(), options);
    CATCH_CHECK_FALSE(adamw.fused());
  }
}
