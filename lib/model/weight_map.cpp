#include "model/weight_map.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace vlm::model {
namespace {

using Shape = std::vector<int64_t>;

void add(std::vector<ExpectedTensor>& out, std::string name, Shape shape) {
  out.push_back({std::move(name), std::move(shape)});
}

// nanoVLM ViT (vision_transformer.py): ViTPatchEmbeddings (conv + learned positions, no CLS
// token for SigLIP), ViTBlock {ln1, attn.qkv_proj (fused q|k|v), attn.out_proj, ln2, mlp.fc1,
// mlp.fc2}, final layer_norm. All linears and norms have biases.
void add_vision(const spec::VisionSpec& v, std::vector<ExpectedTensor>& out) {
  const std::string p = "vision_encoder.";
  const int64_t h = v.hidden_size;
  const int64_t patches_per_side = v.image_size / v.patch_size;
  add(out, p + "patch_embedding.conv.weight", {h, 3, v.patch_size, v.patch_size});
  add(out, p + "patch_embedding.conv.bias", {h});
  add(out, p + "patch_embedding.position_embedding", {1, patches_per_side * patches_per_side, h});
  for (int64_t i = 0; i < v.num_layers; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    add(out, b + "ln1.weight", {h});
    add(out, b + "ln1.bias", {h});
    add(out, b + "attn.qkv_proj.weight", {3 * h, h});
    add(out, b + "attn.qkv_proj.bias", {3 * h});
    add(out, b + "attn.out_proj.weight", {h, h});
    add(out, b + "attn.out_proj.bias", {h});
    add(out, b + "ln2.weight", {h});
    add(out, b + "ln2.bias", {h});
    add(out, b + "mlp.fc1.weight", {v.mlp_size, h});
    add(out, b + "mlp.fc1.bias", {v.mlp_size});
    add(out, b + "mlp.fc2.weight", {h, v.mlp_size});
    add(out, b + "mlp.fc2.bias", {h});
  }
  add(out, p + "layer_norm.weight", {h});
  add(out, p + "layer_norm.bias", {h});
}

// nanoVLM LanguageModel (language_model.py): token_embedding over base + extra tokens,
// LanguageModelBlock {mlp.gate/up/down_proj, attn.q/k/v/out_proj (GQA: k and v have
// num_kv_heads heads), norm1, norm2} without biases, final RMSNorm, head (tied by default).
void add_language(const spec::LanguageSpec& l, std::vector<ExpectedTensor>& out) {
  const std::string p = "decoder.";
  const int64_t d = l.hidden_size;
  const int64_t vocab = l.vocab_size + l.extra_tokens;
  const int64_t kv = (d / l.num_heads) * l.num_kv_heads;
  add(out, p + "token_embedding.weight", {vocab, d});
  for (int64_t i = 0; i < l.num_layers; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    add(out, b + "mlp.gate_proj.weight", {l.mlp_size, d});
    add(out, b + "mlp.up_proj.weight", {l.mlp_size, d});
    add(out, b + "mlp.down_proj.weight", {d, l.mlp_size});
    add(out, b + "attn.q_proj.weight", {d, d});
    add(out, b + "attn.k_proj.weight", {kv, d});
    add(out, b + "attn.v_proj.weight", {kv, d});
    add(out, b + "attn.out_proj.weight", {d, d});
    add(out, b + "norm1.weight", {d});
    add(out, b + "norm2.weight", {d});
  }
  add(out, p + "norm.weight", {d});
  if (!l.tie_embeddings) add(out, p + "head.weight", {vocab, d});
}

template <typename Item, typename NameOf>
void list_items(std::ostringstream& out, const std::string& title, std::vector<Item> items,
                size_t max_listed, NameOf describe) {
  if (items.empty()) return;
  out << "\n" << title << " (" << items.size() << "):";
  for (size_t i = 0; i < items.size() && i < max_listed; ++i) out << "\n  " << describe(items[i]);
  if (items.size() > max_listed) out << "\n  ... and " << items.size() - max_listed << " more";
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

std::vector<ExpectedTensor> expected_tensors(const spec::ModelSpec& spec) {
  std::vector<ExpectedTensor> out;
  add_vision(spec.vision, out);
  add_language(spec.language, out);
  // ModalityProjector (modality_projector.py): pixel shuffle concatenates s^2 ViT tokens, then
  // one bias-free linear into the LM width.
  const int64_t s = spec.projector.pixel_shuffle;
  add(out, "MP.proj.weight", {spec.language.hidden_size, spec.vision.hidden_size * s * s});
  return out;
}

std::vector<ExpectedTensor> with_prefix(const std::vector<ExpectedTensor>& expected,
                                        const std::string& prefix) {
  std::vector<ExpectedTensor> out;
  for (const auto& e : expected) {
    if (e.name.compare(0, prefix.size(), prefix) == 0) out.push_back(e);
  }
  return out;
}

WeightReport compare_weights(const std::map<std::string, at::Tensor>& loaded,
                             const std::vector<ExpectedTensor>& expected) {
  WeightReport report;
  std::map<std::string, const ExpectedTensor*> by_name;
  for (const auto& e : expected) by_name[e.name] = &e;
  for (const auto& [name, e] : by_name) {
    const auto it = loaded.find(name);
    if (it == loaded.end()) {
      report.missing.push_back(*e);
    } else if (it->second.sizes().vec() != e->shape) {
      report.mis_shaped.push_back({name, e->shape, it->second.sizes().vec()});
    } else {
      ++report.matched;
    }
  }
  for (const auto& [name, tensor] : loaded) {
    if (by_name.count(name) == 0) report.unexpected.push_back({name, tensor.sizes().vec()});
  }
  return report;
}

std::string format_report(const WeightReport& report, size_t max_listed) {
  std::ostringstream out;
  out << report.matched << " matched, " << report.missing.size() << " missing, "
      << report.unexpected.size() << " unexpected, " << report.mis_shaped.size()
      << " with the wrong shape";
  const auto named = [](const ExpectedTensor& t) { return t.name + " " + shape_text(t.shape); };
  list_items(out, "missing", report.missing, max_listed, named);
  list_items(out, "unexpected", report.unexpected, max_listed, named);
  list_items(out, "wrong shape", report.mis_shaped, max_listed, [](const MisShapedTensor& t) {
    return t.name + ": expected " + shape_text(t.expected_shape) + ", found " +
           shape_text(t.actual_shape);
  });
  return out.str();
}

void require_weights_match(const std::map<std::string, at::Tensor>& loaded,
                           const std::vector<ExpectedTensor>& expected, const std::string& source) {
  const WeightReport report = compare_weights(loaded, expected);
  if (report.ok()) return;
  throw DataError("weights do not fit the model: " + format_report(report) +
                      "\nCheck that the model preset / model.* dimensions match the checkpoint "
                      "(vlmtrain model-info --weights PATH shows the full comparison).",
                  SourceLocation{source});
}

}  // namespace vlm::model
