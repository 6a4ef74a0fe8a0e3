// Hugging Face SigLIP2 / SmolLM2 checkpoints and nanoVLM checkpoints mapped to canonical names,
// on small synthetic state dicts shaped like the tiny preset.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"
#include "model/weight_map.h"
#include "model/weight_map_hf.h"
#include "spec/model_spec.h"
#include "support/test_support.h"

namespace {

using vlm::model::CheckpointLayout;
using vlm::model::TensorMap;
namespace fs = std::filesystem;

// google/siglip2-* names (SiglipModel: vision tower, text tower, logit scale/bias).
TensorMap siglip_checkpoint(const vlm::spec::VisionSpec& v) {
  torch::manual_seed(1);
  const int64_t h = v.hidden_size;
  const int64_t patches = (v.image_size / v.patch_size) * (v.image_size / v.patch_size);
  TensorMap t;
  const std::string e = "vision_model.embeddings.";
  t[e + "patch_embedding.weight"] = torch::randn({h, 3, v.patch_size, v.patch_size});
  t[e + "patch_embedding.bias"] = torch::randn({h});
  t[e + "position_embedding.weight"] = torch::randn({patches, h});
  for (int64_t i = 0; i < v.num_layers; ++i) {
    const std::string l = "vision_model.encoder.layers." + std::to_string(i) + ".";
    for (const char* norm : {"layer_norm1.", "layer_norm2."}) {
      t[l + norm + "weight"] = torch::randn({h});
      t[l + norm + "bias"] = torch::randn({h});
    }
    for (const char* proj : {"q_proj.", "k_proj.", "v_proj.", "out_proj."}) {
      t[l + "self_attn." + proj + "weight"] = torch::randn({h, h});
      t[l + "self_attn." + proj + "bias"] = torch::randn({h});
    }
    t[l + "mlp.fc1.weight"] = torch::randn({v.mlp_size, h});
    t[l + "mlp.fc1.bias"] = torch::randn({v.mlp_size});
    t[l + "mlp.fc2.weight"] = torch::randn({h, v.mlp_size});
    t[l + "mlp.fc2.bias"] = torch::randn({h});
  }
  t["vision_model.post_layernorm.weight"] = torch::randn({h});
  t["vision_model.post_layernorm.bias"] = torch::randn({h});
  t["vision_model.head.probe"] = torch::randn({1, 1, h});
  t["text_model.embeddings.token_embedding.weight"] = torch::randn({10, 4});
  t["logit_scale"] = torch::randn({1});
  t["logit_bias"] = torch::randn({1});
  return t;
}

// HuggingFaceTB/SmolLM2-* names (LlamaForCausalLM, tied embeddings, bfloat16 on disk).
TensorMap smollm_checkpoint(const vlm::spec::LanguageSpec& l) {
  torch::manual_seed(2);
  const int64_t d = l.hidden_size;
  const int64_t kv = d / l.num_heads * l.num_kv_heads;
  const auto bf16 = [](std::vector<int64_t> shape) {
    return torch::randn(shape).to(torch::kBFloat16);
  };
  TensorMap t;
  t["model.embed_tokens.weight"] = bf16({l.vocab_size, d});
  for (int64_t i = 0; i < l.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "self_attn.q_proj.weight"] = bf16({d, d});
    t[p + "self_attn.k_proj.weight"] = bf16({kv, d});
    t[p + "self_attn.v_proj.weight"] = bf16({kv, d});
    t[p + "self_attn.o_proj.weight"] = bf16({d, d});
    t[p + "mlp.gate_proj.weight"] = bf16({l.mlp_size, d});
    t[p + "mlp.up_proj.weight"] = bf16({l.mlp_size, d});
    t[p + "mlp.down_proj.weight"] = bf16({d, l.mlp_size});
    t[p + "input_layernorm.weight"] = bf16({d});
    t[p + "post_attention_layernorm.weight"] = bf16({d});
  }
  t["model.norm.weight"] = bf16({d});
  return t;
}

// A canonical state dict with random values for `spec`.
TensorMap canonical_weights(const vlm::spec::ModelSpec& spec) {
  torch::manual_seed(3);
  TensorMap t;
  for (const auto& e : vlm::model::expected_tensors(spec)) t[e.name] = torch::randn(e.shape);
  return t;
}

void require_same(const TensorMap& a, const TensorMap& b) {
  CATCH_REQUIRE(a.size() == b.size());
  for (const auto& [name, tensor] : a) {
    CATCH_INFO("tensor " << name);
    CATCH_REQUIRE(b.count(name) == 1);
    CATCH_REQUIRE(b.at(name).scalar_type() == tensor.scalar_type());
    CATCH_REQUIRE(b.at(name).equal(tensor));
  }
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const vlm::DataError& e) {
    return e.what();
  }
  return "no error";
}

const vlm::spec::ModelSpec kTiny = vlm::spec::preset("tiny");

}  // namespace

CATCH_TEST_CASE("SigLIP2 map: names, fused q/k/v and positions", "[weights]") {
  const TensorMap hf = siglip_checkpoint(kTiny.vision);
  CATCH_REQUIRE(vlm::model::detect_layout(hf) == CheckpointLayout::kHfSiglipVision);
  const auto mapped = vlm::model::map_siglip_vision(hf);
  const auto expected =
      vlm::model::with_prefix(vlm::model::expected_tensors(kTiny), "vision_encoder.");
  const auto report = vlm::model::compare_weights(mapped.tensors, expected);
  CATCH_INFO(vlm::model::format_report(report));
  CATCH_REQUIRE(report.ok());
  CATCH_CHECK(mapped.ignored.size() == 4);  // text tower, pooling head, logit scale and bias

  const std::string l = "vision_model.encoder.layers.1.self_attn.";
  const at::Tensor qkv = mapped.tensors.at("vision_encoder.blocks.1.attn.qkv_proj.weight");
  CATCH_CHECK(qkv.slice(0, 0, 64).equal(hf.at(l + "q_proj.weight")));
  CATCH_CHECK(qkv.slice(0, 64, 128).equal(hf.at(l + "k_proj.weight")));
  CATCH_CHECK(qkv.slice(0, 128, 192).equal(hf.at(l + "v_proj.weight")));
  const at::Tensor bias = mapped.tensors.at("vision_encoder.blocks.1.attn.qkv_proj.bias");
  CATCH_CHECK(bias.equal(
      torch::cat({hf.at(l + "q_proj.bias"), hf.at(l + "k_proj.bias"), hf.at(l + "v_proj.bias")})));
  CATCH_CHECK(mapped.tensors.at("vision_encoder.patch_embedding.position_embedding")
                  .equal(hf.at("vision_model.embeddings.position_embedding.weight").unsqueeze(0)));
  CATCH_CHECK(mapped.tensors.at("vision_encoder.blocks.0.ln2.bias")
                  .equal(hf.at("vision_model.encoder.layers.0.layer_norm2.bias")));
  CATCH_CHECK(mapped.tensors.at("vision_encoder.layer_norm.weight")
                  .equal(hf.at("vision_model.post_layernorm.weight")));
}

CATCH_TEST_CASE("SigLIP2 map: incomplete or inconsistent projections are reported", "[weights]") {
  TensorMap hf = siglip_checkpoint(kTiny.vision);
  hf.erase("vision_model.encoder.layers.1.self_attn.k_proj.weight");
  hf["vision_model.encoder.layers.0.self_attn.extra.weight"] = torch::zeros({2});
  const auto mapped = vlm::model::map_siglip_vision(hf);
  const auto report = vlm::model::compare_weights(
      mapped.tensors, vlm::model::with_prefix(vlm::model::expected_tensors(kTiny), "vision_"));
  CATCH_REQUIRE(report.missing.size() == 1);
  CATCH_CHECK(report.missing[0].name == "vision_encoder.blocks.1.attn.qkv_proj.weight");
  CATCH_REQUIRE(report.unexpected.size() == 3);  // the orphaned q and v, and the extra tensor
  CATCH_CHECK(report.unexpected[0].name == "vision_model.encoder.layers.0.self_attn.extra.weight");
  CATCH_CHECK(report.unexpected[1].name == "vision_model.encoder.layers.1.self_attn.q_proj.weight");

  hf = siglip_checkpoint(kTiny.vision);
  hf["vision_model.encoder.layers.0.self_attn.v_proj.bias"] = torch::zeros({65});
  CATCH_CHECK_THAT(error_of([&] { vlm::model::map_siglip_vision(hf); }),
                   Catch::Contains("layer 0 bias: q/k/v projections have different shapes [64], "
                                   "[64], [65]"));
}

CATCH_TEST_CASE("SmolLM2 map: names and nanoVLM's vocabulary extension", "[weights]") {
  const TensorMap hf = smollm_checkpoint(kTiny.language);
  CATCH_REQUIRE(vlm::model::detect_layout(hf) == CheckpointLayout::kHfLlamaLanguage);
  const auto mapped = vlm::model::map_llama_language(hf, kTiny, 42);
  const auto report = vlm::model::compare_weights(
      mapped.tensors, vlm::model::with_prefix(vlm::model::expected_tensors(kTiny), "decoder."));
  CATCH_INFO(vlm::model::format_report(report));
  CATCH_REQUIRE(report.ok());
  CATCH_CHECK(mapped.tensors.at("decoder.blocks.2.attn.out_proj.weight")
                  .equal(hf.at("model.layers.2.self_attn.o_proj.weight").to(torch::kFloat)));
  CATCH_CHECK(mapped.tensors.at("decoder.blocks.3.norm1.weight")
                  .equal(hf.at("model.layers.3.input_layernorm.weight").to(torch::kFloat)));

  // Rows 0..258 are the checkpoint's; the 66 extra rows are N(0, 0.02) from the seed.
  const at::Tensor embedding = mapped.tensors.at("decoder.token_embedding.weight");
  CATCH_CHECK(embedding.scalar_type() == torch::kFloat);
  CATCH_CHECK(
      embedding.slice(0, 0, 259).equal(hf.at("model.embed_tokens.weight").to(torch::kFloat)));
  const at::Tensor added = embedding.slice(0, 259);
  CATCH_CHECK(added.size(0) == 66);
  CATCH_CHECK(added.std().item<double>() == Approx(0.02).epsilon(0.05));
  CATCH_CHECK(std::abs(added.mean().item<double>()) < 0.002);
  const auto again = vlm::model::map_llama_language(hf, kTiny, 42);
  CATCH_CHECK(again.tensors.at("decoder.token_embedding.weight").equal(embedding));
  const auto other_seed = vlm::model::map_llama_language(hf, kTiny, 43);
  CATCH_CHECK(!other_seed.tensors.at("decoder.token_embedding.weight").equal(embedding));
}

CATCH_TEST_CASE("SmolLM2 map: heads, oversize vocabularies and sharded files", "[weights]") {
  TensorMap hf = smollm_checkpoint(kTiny.language);
  hf["lm_head.weight"] = torch::randn({259, 128}).to(torch::kBFloat16);
  const auto tied = vlm::model::map_llama_language(hf, kTiny, 0);
  CATCH_CHECK(tied.tensors.count("decoder.head.weight") == 0);
  CATCH_CHECK(tied.ignored == std::vector<std::string>{"lm_head.weight"});

  auto untied_spec = kTiny;
  untied_spec.language.tie_embeddings = false;
  const auto untied = vlm::model::map_llama_language(hf, untied_spec, 0);
  const at::Tensor head = untied.tensors.at("decoder.head.weight");
  CATCH_CHECK(head.sizes() == at::IntArrayRef{325, 128});
  CATCH_CHECK(head.slice(0, 0, 259).equal(hf.at("lm_head.weight").to(torch::kFloat)));
  hf.erase("lm_head.weight");
  const auto copied = vlm::model::map_llama_language(hf, untied_spec, 0);
  CATCH_CHECK(copied.tensors.at("decoder.head.weight")
                  .equal(copied.tensors.at("decoder.token_embedding.weight")));

  auto small_vocab = kTiny;
  small_vocab.language.vocab_size = 150;
  CATCH_CHECK_THAT(
      error_of([&] { vlm::model::map_llama_language(hf, small_vocab, 0); }),
      Catch::Contains("has 259 vocabulary rows, more than the model's vocab_size + "
                      "extra_tokens = 216; set model.language.vocab_size to at least 193"));

  // The sharded form loads to exactly what the single file gives.
  vlm::test::TempDir dir("weights-sharded");
  TensorMap first;
  TensorMap second;
  std::string weight_map;
  for (const auto& [name, tensor] : hf) {
    const bool in_first = name < "model.layers.2";
    (in_first ? first : second)[name] = tensor;
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + name + "\":\"" +
                  (in_first ? "a.safetensors" : "b.safetensors") + "\"";
  }
  vlm::model::save_safetensors((dir / "a.safetensors").string(), first);
  vlm::model::save_safetensors((dir / "b.safetensors").string(), second);
  vlm::model::save_safetensors((dir / "single.safetensors").string(), hf);
  const auto index = vlm::test::write_file(dir / "model.safetensors.index.json",
                                           R"({"weight_map":{)" + weight_map + "}}");
  const auto sharded = vlm::model::load_weights(index, kTiny, 5);
  CATCH_CHECK(sharded.layout == CheckpointLayout::kHfLlamaLanguage);
  CATCH_CHECK(sharded.files.size() == 2);
  require_same(sharded.tensors,
               vlm::model::load_weights((dir / "single.safetensors").string(), kTiny, 5).tensors);
}

CATCH_TEST_CASE("nanoVLM checkpoints: saved as nanoVLM does and loaded back", "[weights]") {
  vlm::test::TempDir dir("weights-nanovlm");
  const std::string path = (dir / "model.safetensors").string();
  const TensorMap weights = canonical_weights(kTiny);
  vlm::model::save_nanovlm_weights(path, weights, kTiny);

  const vlm::model::SafetensorsFile file(path);
  CATCH_CHECK(file.header().find("decoder.head.weight") != nullptr);
  CATCH_CHECK(file.header().find("decoder.token_embedding.weight") == nullptr);
  CATCH_CHECK(file.header().metadata.at("decoder.token_embedding.weight") == "decoder.head.weight");
  // RoPE buffer for head_dim 32, base 10000: inv_freq[i] = 10000^(-2i/32).
  const at::Tensor inv_freq = file.copy("decoder.rotary_embd.inv_freq");
  CATCH_REQUIRE(inv_freq.size(0) == 16);
  CATCH_CHECK(inv_freq[0].item<float>() == 1.0f);
  CATCH_CHECK(inv_freq[8].item<float>() == Approx(0.01f));

  const auto loaded = vlm::model::load_weights(path, kTiny, 0);
  CATCH_CHECK(loaded.layout == CheckpointLayout::kNanoVLM);
  CATCH_CHECK(loaded.ignored == std::vector<std::string>{"decoder.rotary_embd.inv_freq"});
  require_same(weights, loaded.tensors);

  // Both names present and equal is fine; distinct tensors cannot be tied.
  TensorMap both = weights;
  both["decoder.head.weight"] = weights.at("decoder.token_embedding.weight").clone();
  vlm::model::save_safetensors(path, both);
  require_same(weights, vlm::model::load_weights(path, kTiny, 0).tensors);
  both["decoder.head.weight"].add_(1);
  vlm::model::save_safetensors(path, both);
  CATCH_CHECK_THAT(error_of([&] { vlm::model::load_weights(path, kTiny, 0); }),
                   Catch::Contains("set model.language.tie_embeddings: false"));

  auto untied = kTiny;
  untied.language.tie_embeddings = false;
  const TensorMap untied_weights = canonical_weights(untied);
  vlm::model::save_nanovlm_weights(path, untied_weights, untied);
  require_same(untied_weights, vlm::model::load_weights(path, untied, 0).tensors);
}

CATCH_TEST_CASE("weights: unknown layouts, bad saves and the non-throwing inspection",
                "[weights]") {
  vlm::test::TempDir dir("weights-inspect");
  const std::string unknown = (dir / "unknown.safetensors").string();
  vlm::model::save_safetensors(unknown, {{"foo.weight", torch::ones({1})}});
  CATCH_CHECK_THAT(error_of([&] { vlm::model::load_weights(unknown, kTiny, 0); }),
                   Catch::Contains("unrecognised checkpoint layout"));

  TensorMap incomplete = canonical_weights(kTiny);
  incomplete.erase("MP.proj.weight");
  CATCH_CHECK_THAT(error_of([&] {
                     vlm::model::save_nanovlm_weights((dir / "x.safetensors").string(), incomplete,
                                                      kTiny);
                   }),
                   Catch::Contains("MP.proj.weight [128, 256]"));

  const std::string siglip = (dir / "siglip.safetensors").string();
  vlm::model::save_safetensors(siglip, siglip_checkpoint(kTiny.vision));
  auto deeper = kTiny;
  deeper.vision.num_layers = 3;
  const auto inspection = vlm::model::inspect_weights(siglip, deeper);
  CATCH_CHECK(inspection.layout == CheckpointLayout::kHfSiglipVision);
  CATCH_CHECK(inspection.ignored.size() == 4);
  CATCH_CHECK(inspection.report.missing.size() == 12);  // every tensor of block 2
  CATCH_CHECK(inspection.report.unexpected.empty());
  CATCH_CHECK_THAT(error_of([&] { vlm::model::load_weights(siglip, deeper, 0); }),
                   Catch::Contains("vision_encoder.blocks.2.attn.qkv_proj.bias [192]"));
  auto wider = kTiny;
  wider.vision.mlp_size = 128;
  const auto mis = vlm::model::inspect_weights(siglip, wider);
  CATCH_CHECK(mis.report.mis_shaped.size() == 2 * 3);  // fc1 weight and bias, fc2 weight, x2
}

namespace {

// The DataError of loading `path`, with the file it names.
std::pair<std::string, std::string> load_error_at(const std::string& path,
                                                  const vlm::spec::ModelSpec& spec) {
  try {
    vlm::model::load_weights(path, spec, 0);
  } catch (const vlm::DataError& e) {
    CATCH_CHECK(e.code() == vlm::ExitCode::kData);
    return {e.what(), e.where().file};
  }
  return {"no error", ""};
}

}  // namespace

CATCH_TEST_CASE("weights: integer dtypes and non-finite values are refused at the tensor",
                "[weights]") {
  vlm::test::TempDir dir("weights-values");
  const std::string path = (dir / "model.safetensors").string();
  const TensorMap good = canonical_weights(kTiny);

  // An integer tensor of the right shape: copy_ would have converted it silently.
  TensorMap bad = good;
  bad["decoder.norm.weight"] = torch::ones({128}, torch::kInt32);
  vlm::model::save_safetensors(path, bad);
  auto [message, file] = load_error_at(path, kTiny);
  CATCH_CHECK(file == path);
  CATCH_CHECK_THAT(message, Catch::Contains("tensor 'decoder.norm.weight' has dtype I32 [128]; "
                                            "weights must be floating point"));
  bad["decoder.norm.weight"] = torch::ones({128}, torch::kBool);
  vlm::model::save_safetensors(path, bad);
  CATCH_CHECK_THAT(load_error_at(path, kTiny).first, Catch::Contains("has dtype BOOL"));

  // NaN and infinity, in fp32 and in bf16 storage.
  bad = good;  // the maps share tensors: every tensor changed below is a copy first
  bad["MP.proj.weight"] = good.at("MP.proj.weight").clone();
  bad["MP.proj.weight"][3][7] = std::nan("");
  vlm::model::save_safetensors(path, bad);
  std::tie(message, file) = load_error_at(path, kTiny);
  CATCH_CHECK(file == path);
  CATCH_CHECK_THAT(message, Catch::Contains("tensor 'MP.proj.weight' holds 1 non-finite values "
                                            "(1 NaN, 0 infinite) of 32768"));
  bad = good;
  bad["vision_encoder.layer_norm.bias"] =
      good.at("vision_encoder.layer_norm.bias").to(torch::kBFloat16);
  bad["vision_encoder.layer_norm.bias"][0] = -INFINITY;
  bad["vision_encoder.layer_norm.bias"][1] = INFINITY;
  vlm::model::save_safetensors(path, bad);
  CATCH_CHECK_THAT(load_error_at(path, kTiny).first,
                   Catch::Contains("'vision_encoder.layer_norm.bias' holds 2 non-finite values "
                                   "(0 NaN, 2 infinite)"));
  vlm::model::save_safetensors(path, good);
  CATCH_CHECK(load_error_at(path, kTiny).first == "no error");

  // Hugging Face layouts: as_float32 leaves an integer tensor as it is; the check names the
  // file's own tensor name, and the shard that holds it.
  TensorMap hf = smollm_checkpoint(kTiny.language);
  hf["model.layers.2.mlp.up_proj.weight"] =
      hf["model.layers.2.mlp.up_proj.weight"].to(torch::kInt16);
  TensorMap first;
  TensorMap second;
  std::string weight_map;
  for (const auto& [name, tensor] : hf) {
    const bool in_first = name < "model.layers.2";
    (in_first ? first : second)[name] = tensor;
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + name + "\":\"" +
                  (in_first ? "a.safetensors" : "b.safetensors") + "\"";
  }
  vlm::model::save_safetensors((dir / "a.safetensors").string(), first);
  vlm::model::save_safetensors((dir / "b.safetensors").string(), second);
  const auto index = vlm::test::write_file(dir / "model.safetensors.index.json",
                                           R"({"weight_map":{)" + weight_map + "}}");
  std::tie(message, file) = load_error_at(index, kTiny);
  CATCH_CHECK(file == (dir / "b.safetensors").string());
  CATCH_CHECK_THAT(message,
                   Catch::Contains("tensor 'model.layers.2.mlp.up_proj.weight' has dtype I16"));

  // What a layout ignores by design is not a weight: old SigLIP exports' I64 position_ids.
  TensorMap siglip = siglip_checkpoint(kTiny.vision);
  siglip["vision_model.embeddings.position_ids"] = torch::arange(16, torch::kInt64).unsqueeze(0);
  const std::string siglip_path = (dir / "siglip.safetensors").string();
  vlm::model::save_safetensors(siglip_path, siglip);
  CATCH_CHECK(load_error_at(siglip_path, kTiny).first == "no error");
  siglip["vision_model.post_layernorm.bias"][0] = std::nan("");
  vlm::model::save_safetensors(siglip_path, siglip);
  CATCH_CHECK_THAT(load_error_at(siglip_path, kTiny).first,
                   Catch::Contains("tensor 'vision_model.post_layernorm.bias' holds 1 non-finite"));
}
