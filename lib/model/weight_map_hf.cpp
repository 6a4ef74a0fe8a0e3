#include "model/weight_map_hf.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <set>
#include <utility>

#include "core/error.h"

namespace vlm::model {
namespace {

const std::string kEmbedding = "decoder.token_embedding.weight";
const std::string kHead = "decoder.head.weight";
const std::string kInvFreq = "decoder.rotary_embd.inv_freq";

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// "model.layers.12.mlp.up_proj.weight" with prefix "model.layers." -> ("12", "mlp.up_proj...").
bool split_layer(const std::string& name, const std::string& prefix, std::string* index,
                 std::string* rest) {
  if (!starts_with(name, prefix)) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  *index = name.substr(prefix.size(), dot - prefix.size());
  for (const char c : *index) {
    if (c < '0' || c > '9') return false;
  }
  *rest = name.substr(dot + 1);
  return true;
}

at::Tensor as_float32(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t;
}

// --- SigLIP (nanoVLM ViT.from_pretrained) ---------------------------------------------------

const std::map<std::string, std::string>& siglip_top_level() {
  static const std::map<std::string, std::string> names{
      {"vision_model.embeddings.patch_embedding.weight", "patch_embedding.conv.weight"},
      {"vision_model.embeddings.patch_embedding.bias", "patch_embedding.conv.bias"},
      {"vision_model.embeddings.position_embedding.weight", "patch_embedding.position_embedding"},
      {"vision_model.post_layernorm.weight", "layer_norm.weight"},
      {"vision_model.post_layernorm.bias", "layer_norm.bias"},
  };
  return names;
}

const std::map<std::string, std::string>& siglip_layer() {
  static const std::map<std::string, std::string> names{
      {"layer_norm1.weight", "ln1.weight"},
      {"layer_norm1.bias", "ln1.bias"},
      {"layer_norm2.weight", "ln2.weight"},
      {"layer_norm2.bias", "ln2.bias"},
      {"mlp.fc1.weight", "mlp.fc1.weight"},
      {"mlp.fc1.bias", "mlp.fc1.bias"},
      {"mlp.fc2.weight", "mlp.fc2.weight"},
      {"mlp.fc2.bias", "mlp.fc2.bias"},
      {"self_attn.out_proj.weight", "attn.out_proj.weight"},
      {"self_attn.out_proj.bias", "attn.out_proj.bias"},
  };
  return names;
}

// Parts of a SigLIP checkpoint nanoVLM's ViT has no use for: the text tower, the contrastive
// logit scale/bias, the attention-pooling head, and the position_ids buffer of old exports.
bool siglip_ignored(const std::string& name) {
  return starts_with(name, "text_model.") || starts_with(name, "vision_model.head.") ||
         name == "logit_scale" || name == "logit_bias" ||
         name == "vision_model.embeddings.position_ids";
}

// "q_proj.weight" -> ("q", "weight") when `rest` is self_attn.{q,k,v}_proj.{weight,bias}.
bool qkv_part(const std::string& rest, std::string* which, std::string* kind) {
  const std::string prefix = "self_attn.";
  if (!starts_with(rest, prefix) || rest.size() < prefix.size() + 8) return false;
  const std::string tail = rest.substr(prefix.size());  // "q_proj.weight"
  if (tail.compare(1, 6, "_proj.") != 0 || std::string("qkv").find(tail[0]) == std::string::npos)
    return false;
  *which = tail.substr(0, 1);
  *kind = tail.substr(7);
  return *kind == "weight" || *kind == "bias";
}

// nanoVLM: qkv = torch.cat((q, k, v), dim=0) for weight and bias of every layer.
void fuse_qkv(std::map<std::string, std::map<std::string, at::Tensor>>& parts, MappedWeights& out) {
  for (auto& [key, by_which] : parts) {  // key: "<layer>.<weight|bias>"
    const std::string layer = key.substr(0, key.find('.'));
    const std::string kind = key.substr(key.find('.') + 1);
    const std::string hf = "vision_model.encoder.layers." + layer + ".self_attn.";
    if (by_which.size() != 3) {  // leave the parts under their names: the check lists them
      for (auto& [which, t] : by_which) out.tensors[hf + which + "_proj." + kind] = t;
      continue;
    }
    const at::Tensor& q = by_which.at("q");
    if (q.sizes() != by_which.at("k").sizes() || q.sizes() != by_which.at("v").sizes()) {
      throw DataError("layer " + layer + " " + kind + ": q/k/v projections have different shapes " +
                      shape_text(q.sizes().vec()) + ", " +
                      shape_text(by_which.at("k").sizes().vec()) + ", " +
                      shape_text(by_which.at("v").sizes().vec()) + " and cannot be fused");
    }
    out.tensors["vision_encoder.blocks." + layer + ".attn.qkv_proj." + kind] =
        at::cat({q, by_which.at("k"), by_which.at("v")}, 0);
  }
}

// --- Llama / SmolLM2 (nanoVLM LanguageModel.from_pretrained) --------------------------------

const std::map<std::string, std::string>& llama_layer() {
  static const std::map<std::string, std::string> names{
      {"self_attn.q_proj.weight", "attn.q_proj.weight"},
      {"self_attn.k_proj.weight", "attn.k_proj.weight"},
      {"self_attn.v_proj.weight", "attn.v_proj.weight"},
      {"self_attn.o_proj.weight", "attn.out_proj.weight"},
      {"mlp.gate_proj.weight", "mlp.gate_proj.weight"},
      {"mlp.up_proj.weight", "mlp.up_proj.weight"},
      {"mlp.down_proj.weight", "mlp.down_proj.weight"},
      {"input_layernorm.weight", "norm1.weight"},
      {"post_attention_layernorm.weight", "norm2.weight"},
  };
  return names;
}

// nanoVLM copies the checkpoint's rows to the front and draws the rest from N(0, 0.02)
// (`init.normal_(sd[key][n:], mean=0.0, std=0.02)`). A table that does not have the model's
// width is returned unchanged so the shape check reports it.
at::Tensor extend_vocab_rows(const at::Tensor& table, const spec::LanguageSpec& l,
                             at::Generator& gen, const std::string& name) {
  const int64_t rows = l.vocab_size + l.extra_tokens;
  if (table.dim() != 2 || table.size(1) != l.hidden_size || table.size(0) == rows) return table;
  if (table.size(0) > rows) {
    throw DataError("'" + name + "' has " + std::to_string(table.size(0)) +
                    " vocabulary rows, more than the model's vocab_size + extra_tokens = " +
                    std::to_string(rows) + "; set model.language.vocab_size to at least " +
                    std::to_string(table.size(0) - l.extra_tokens));
  }
  at::Tensor added = at::empty({rows - table.size(0), l.hidden_size}, at::kFloat);
  added.normal_(0.0, 0.02, gen);
  return at::cat({table, added}, 0);
}

void collect_unmapped(const std::string& name, const at::Tensor& t, MappedWeights& out) {
  out.tensors[name] = t;  // kept under its own name: compare_weights reports it as unexpected
}

}  // namespace

const char* layout_name(CheckpointLayout layout) {
  switch (layout) {
    case CheckpointLayout::kNanoVLM:
      return "nanoVLM";
    case CheckpointLayout::kHfSiglipVision:
      return "Hugging Face SigLIP vision";
    case CheckpointLayout::kHfLlamaLanguage:
      return "Hugging Face Llama language";
    case CheckpointLayout::kUnknown:
      break;
  }
  return "unknown";
}

CheckpointLayout detect_layout(const TensorMap& tensors) {
  bool siglip = false;
  bool llama = false;
  for (const auto& [name, tensor] : tensors) {
    if (starts_with(name, "vision_encoder.") || starts_with(name, "decoder.") ||
        starts_with(name, "MP.")) {
      return CheckpointLayout::kNanoVLM;
    }
    siglip = siglip || starts_with(name, "vision_model.");
    llama = llama || starts_with(name, "model.layers.") || starts_with(name, "model.embed_tokens.");
  }
  if (siglip == llama) return CheckpointLayout::kUnknown;
  return siglip ? CheckpointLayout::kHfSiglipVision : CheckpointLayout::kHfLlamaLanguage;
}

std::vector<ExpectedTensor> expected_for_layout(CheckpointLayout layout,
                                                const spec::ModelSpec& spec) {
  switch (layout) {
    case CheckpointLayout::kNanoVLM:
      return expected_tensors(spec);
    case CheckpointLayout::kHfSiglipVision:
      return with_prefix(expected_tensors(spec), "vision_encoder.");
    case CheckpointLayout::kHfLlamaLanguage:
      return with_prefix(expected_tensors(spec), "decoder.");
    case CheckpointLayout::kUnknown:
      break;
  }
  return {};
}

MappedWeights map_nanovlm(const SafetensorsContents& contents, const spec::ModelSpec& spec) {
  MappedWeights out;
  out.layout = CheckpointLayout::kNanoVLM;
  out.files = contents.files;
  out.tensors = contents.tensors;
  if (out.tensors.erase(kInvFreq) > 0) out.ignored.push_back(kInvFreq);
  const auto head = out.tensors.find(kHead);
  if (!spec.language.tie_embeddings || head == out.tensors.end()) return out;
  const auto embedding = out.tensors.find(kEmbedding);
  if (embedding == out.tensors.end()) {
    out.tensors[kEmbedding] = head->second;  // save_model kept the tied tensor under this name
  } else if (head->second.scalar_type() != embedding->second.scalar_type() ||
             !head->second.sizes().equals(embedding->second.sizes()) ||
             !head->second.equal(embedding->second)) {
    throw DataError("the checkpoint has distinct " + kEmbedding + " and " + kHead +
                    " but the model ties them; set model.language.tie_embeddings: false to "
                    "load it");
  }
  out.tensors.erase(kHead);
  return out;
}

MappedWeights map_siglip_vision(const TensorMap& hf) {
  MappedWeights out;
  out.layout = CheckpointLayout::kHfSiglipVision;
  std::map<std::string, std::map<std::string, at::Tensor>> qkv_parts;
  const std::string layers = "vision_model.encoder.layers.";
  for (const auto& [name, raw] : hf) {
    std::string index, rest, which, kind;
    if (siglip_ignored(name)) {
      out.ignored.push_back(name);
    } else if (const auto top = siglip_top_level().find(name); top != siglip_top_level().end()) {
      // HF stores positions as an nn.Embedding table [N, D]; nanoVLM's is a [1, N, D] parameter.
      const at::Tensor t = as_float32(raw);
      const bool positions = top->second == "patch_embedding.position_embedding" && t.dim() == 2;
      out.tensors["vision_encoder." + top->second] = positions ? t.unsqueeze(0) : t;
    } else if (split_layer(name, layers, &index, &rest) && qkv_part(rest, &which, &kind)) {
      qkv_parts[index + "." + kind][which] = as_float32(raw);
    } else if (split_layer(name, layers, &index, &rest) && siglip_layer().count(rest) > 0) {
      out.tensors["vision_encoder.blocks." + index + "." + siglip_layer().at(rest)] =
          as_float32(raw);
    } else {
      collect_unmapped(name, raw, out);
    }
  }
  fuse_qkv(qkv_parts, out);
  return out;
}

MappedWeights map_llama_language(const TensorMap& hf, const spec::ModelSpec& spec, uint64_t seed) {
  MappedWeights out;
  out.layout = CheckpointLayout::kHfLlamaLanguage;
  const spec::LanguageSpec& l = spec.language;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const std::string layers = "model.layers.";
  for (const auto& [name, raw] : hf) {
    std::string index, rest;
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      continue;  // below, in nanoVLM's order (the draws of the generator depend on it)
    } else if (name == "model.norm.weight") {
      out.tensors["decoder.norm.weight"] = as_float32(raw);
    } else if (split_layer(name, layers, &index, &rest) && llama_layer().count(rest) > 0) {
      out.tensors["decoder.blocks." + index + "." + llama_layer().at(rest)] = as_float32(raw);
    } else if (split_layer(name, layers, &index, &rest) &&
               rest == "self_attn.rotary_emb.inv_freq") {
      out.ignored.push_back(name);  // old exports saved the RoPE buffer; it is derived
    } else {
      collect_unmapped(name, raw, out);
    }
  }
  const auto embedding = hf.find("model.embed_tokens.weight");
  if (embedding != hf.end()) {
    out.tensors[kEmbedding] =
        extend_vocab_rows(as_float32(embedding->second), l, gen, embedding->first);
  }
  const auto head = hf.find("lm_head.weight");
  if (l.tie_embeddings) {
    if (head != hf.end()) out.ignored.push_back(head->first);  // the head is the embedding
  } else if (head != hf.end()) {
    out.tensors[kHead] = extend_vocab_rows(as_float32(head->second), l, gen, head->first);
  } else if (embedding != hf.end()) {
    // A tied checkpoint loaded into an untied model: nanoVLM starts the head as a copy of the
    // (extended) embedding (`sd['head.weight'].copy_(sd[our_key])`).
    out.tensors[kHead] = out.tensors[kEmbedding].clone();
  }
  return out;
}

namespace {

// The dtype as a safetensors header spells it ("I32"), for errors.
std::string stored_dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kShort:
      return "I16";
    case at::kChar:
      return "I8";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      return c10::toString(type);
  }
}

// Every tensor a weights file gives the model must be floating point with finite values: an
// integer tensor would be converted to float silently (nanoVLM's copy_ would do the same), and
// a NaN or infinity would make the first step's loss NaN. Tensors ignored by design (the
// position_ids buffer of old SigLIP exports is I64) are not weights.
void check_weight_values(const SafetensorsContents& contents,
                         const std::vector<std::string>& ignored) {
  const std::set<std::string> skip(ignored.begin(), ignored.end());
  for (const auto& [name, tensor] : contents.tensors) {
    if (skip.count(name) > 0) continue;
    const auto file = contents.file_of.find(name);
    const SourceLocation where{file == contents.file_of.end() ? std::string() : file->second};
    if (!at::isFloatingType(tensor.scalar_type())) {
      throw DataError("tensor '" + name + "' has dtype " + stored_dtype_name(tensor.scalar_type()) +
                          " " + shape_text(tensor.sizes().vec()) +
                          "; weights must be floating point (F32, F16, BF16 or F64)",
                      where);
    }
    if (tensor.numel() == 0) continue;
    const int64_t bad = tensor.numel() - at::isfinite(tensor).sum().item<int64_t>();
    if (bad > 0) {
      const int64_t nans = at::isnan(tensor).sum().item<int64_t>();
      throw DataError("tensor '" + name + "' holds " + std::to_string(bad) +
                          " non-finite values (" + std::to_string(nans) + " NaN, " +
                          std::to_string(bad - nans) + " infinite) of " +
                          std::to_string(tensor.numel()) +
                          "; the weights are damaged (or were saved after a diverged step)",
                      where);
    }
  }
}

}  // namespace

MappedWeights read_weights(const std::string& path, const spec::ModelSpec& spec, uint64_t seed) {
  const SafetensorsContents contents = read_safetensors(path);
  MappedWeights out;
  switch (detect_layout(contents.tensors)) {
    case CheckpointLayout::kNanoVLM:
      out = map_nanovlm(contents, spec);
      break;
    case CheckpointLayout::kHfSiglipVision:
      out = map_siglip_vision(contents.tensors);
      break;
    case CheckpointLayout::kHfLlamaLanguage:
      out = map_llama_language(contents.tensors, spec, seed);
      break;
    case CheckpointLayout::kUnknown: {
      std::string sample;
      for (const auto& [name, t] : contents.tensors) {
        if (sample.size() > 200) break;
        sample += (sample.empty() ? "" : ", ") + name;
      }
      throw DataError(
          "unrecognised checkpoint layout (expected nanoVLM names like "
          "vision_encoder.*, SigLIP vision_model.* or Llama model.layers.*); "
          "first tensors: " +
              (sample.empty() ? std::string("none") : sample),
          SourceLocation{path});
    }
  }
  check_weight_values(contents, out.ignored);
  out.files = contents.files;
  return out;
}

MappedWeights load_weights(const std::string& path, const spec::ModelSpec& spec, uint64_t seed) {
  MappedWeights out = read_weights(path, spec, seed);
  require_weights_match(out.tensors, expected_for_layout(out.layout, spec),
                        path + " (" + layout_name(out.layout) + " layout)");
  return out;
}

WeightsInspection inspect_weights(const std::string& path, const spec::ModelSpec& spec) {
  MappedWeights mapped = read_weights(path, spec, /*seed=*/0);
  WeightsInspection out;
  out.layout = mapped.layout;
  out.files = std::move(mapped.files);
  out.ignored = std::move(mapped.ignored);
  out.report = compare_weights(mapped.tensors, expected_for_layout(out.layout, spec));
  return out;
}

void save_nanovlm_weights(const std::string& path, const TensorMap& tensors,
                          const spec::ModelSpec& spec,
                          std::map<std::string, std::string> metadata) {
  require_weights_match(tensors, expected_tensors(spec), "save_nanovlm_weights");
  TensorMap out = tensors;
  if (spec.language.tie_embeddings) {
    // safetensors.torch.save_model keeps the sorted-first name of a shared tensor and records
    // the dropped one in __metadata__ as {dropped: kept}.
    out[kHead] = out.at(kEmbedding);
    out.erase(kEmbedding);
    metadata[kEmbedding] = kHead;
  }
  // nanoVLM's RotaryEmbedding buffer: 1 / base^(arange(0, head_dim, 2) / head_dim), float32.
  const int64_t head_dim = spec.language.hidden_size / spec.language.num_heads;
  const at::Tensor exponent =
      at::arange(0, head_dim, 2, at::kFloat) / static_cast<double>(head_dim);
  out[kInvFreq] = at::pow(spec.language.rope_base, exponent).reciprocal();
  save_safetensors(path, out, metadata);
}

}  // namespace vlm::model
