#include "memory/parameter_tensors.h"

#include <algorithm>
#include <array>

#include "spec/derived.h"

namespace vlm::memory {
namespace {

// Appends the tensors of one module, all with the module's state.
class ModuleTensors {
 public:
  ModuleTensors(std::vector<ParameterTensor>& out, std::string prefix, const ModuleState& state)
      : out_(out), prefix_(std::move(prefix)), state_(state) {}

  void parameter(const std::string& name, int64_t elements) {
    out_.push_back({prefix_ + name, elements, state_.parameter_bytes, state_.trainable, false});
  }
  // A buffer keeps fp32 whatever the module's dtype (the model casts parameters only).
  void buffer(const std::string& name, int64_t elements) {
    out_.push_back({prefix_ + name, elements, 4, false, true});
  }

 private:
  std::vector<ParameterTensor>& out_;
  std::string prefix_;
  const ModuleState& state_;
};

// lib/model/vision_transformer.cpp: the patch embedding (a conv kernel and bias), learned
// positions, pre-LN blocks with a fused qkv, the final LayerNorm; every linear has a bias.
void add_vision(const spec::VisionSpec& v, ModuleTensors m) {
  const int64_t d = v.hidden_size;
  m.parameter("patch_embedding.conv.weight", d * 3 * v.patch_size * v.patch_size);
  m.parameter("patch_embedding.conv.bias", d);
  m.parameter("patch_embedding.position_embedding", spec::patches_per_crop(v) * d);
  for (int64_t i = 0; i < v.num_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    m.parameter(b + "ln1.weight", d);
    m.parameter(b + "ln1.bias", d);
    m.parameter(b + "attn.qkv_proj.weight", 3 * d * d);
    m.parameter(b + "attn.qkv_proj.bias", 3 * d);
    m.parameter(b + "attn.out_proj.weight", d * d);
    m.parameter(b + "attn.out_proj.bias", d);
    m.parameter(b + "ln2.weight", d);
    m.parameter(b + "ln2.bias", d);
    m.parameter(b + "mlp.fc1.weight", v.mlp_size * d);
    m.parameter(b + "mlp.fc1.bias", v.mlp_size);
    m.parameter(b + "mlp.fc2.weight", d * v.mlp_size);
    m.parameter(b + "mlp.fc2.bias", d);
  }
  m.parameter("layer_norm.weight", d);
  m.parameter("layer_norm.bias", d);
}

// lib/model/language_model.cpp: the token embedding, RoPE's inverse frequencies (a buffer),
// bias-free blocks, the final RMSNorm and an untied head when there is one.
void add_language(const spec::LanguageSpec& l, ModuleTensors m) {
  const int64_t d = l.hidden_size, rows = spec::language_vocab_rows(l);
  const int64_t kv_width = spec::language_head_dim(l) * l.num_kv_heads;
  m.parameter("token_embedding.weight", rows * d);
  m.buffer("rotary_embd.inv_freq", spec::language_head_dim(l) / 2);
  for (int64_t i = 0; i < l.num_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    m.parameter(b + "mlp.gate_proj.weight", l.mlp_size * d);
    m.parameter(b + "mlp.up_proj.weight", l.mlp_size * d);
    m.parameter(b + "mlp.down_proj.weight", d * l.mlp_size);
    m.parameter(b + "attn.q_proj.weight", d * d);
    m.parameter(b + "attn.k_proj.weight", kv_width * d);
    m.parameter(b + "attn.v_proj.weight", kv_width * d);
    m.parameter(b + "attn.out_proj.weight", d * d);
    m.parameter(b + "norm1.weight", d);
    m.parameter(b + "norm2.weight", d);
  }
  m.parameter("norm.weight", d);
  if (!l.tie_embeddings) m.parameter("head.weight", rows * d);
}

}  // namespace

std::vector<ParameterTensor> parameter_tensors(const MemorySpec& spec) {
  std::vector<ParameterTensor> out;
  // lib/model/vision_language_model.cpp registers the vision encoder, the decoder, the
  // projector, in this order.
  add_vision(spec.dims.vision, ModuleTensors(out, "vision_encoder.", spec.vision));
  add_language(spec.dims.language, ModuleTensors(out, "decoder.", spec.language));
  ModuleTensors(out, "MP.", spec.projector)
      .parameter("proj.weight", spec::projector_parameters(spec.dims));
  return out;
}

namespace {

bool decays(const std::string& name) {
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("position_embedding") || has("token_embedding")) return false;  // embeddings
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) return false;
  return !(has("norm") || has(".ln1.") || has(".ln2."));  // norm weights: one dimension
}

OptimizerOrder compute_order(const MemorySpec& spec, bool image_path) {
  std::vector<ParameterTensor> tensors = parameter_tensors(spec);
  // named_parameters lists the patch embedding's own positions before its conv's tensors.
  const auto positions = std::find_if(tensors.begin(), tensors.end(), [](const ParameterTensor& t) {
    return t.name == "vision_encoder.patch_embedding.position_embedding";
  });
  if (positions != tensors.end()) std::rotate(tensors.begin(), positions, positions + 1);
  OptimizerOrder order;
  for (const char* module : {"vision_encoder.", "MP.", "decoder."}) {
    if (!image_path && std::string(module) != "decoder.") continue;  // no gradient yet
    for (const bool decay : {true, false}) {
      size_t count = 0;
      for (const ParameterTensor& t : tensors) {
        if (!t.trainable || t.name.rfind(module, 0) != 0 || decays(t.name) != decay) continue;
        order.elements.push_back(t.elements);
        order.largest = std::max(order.largest, t.elements);
        ++count;
      }
      if (count > 0) {
        order.group_sizes.push_back(count);
        if (std::string(module) == "decoder.") ++order.decoder_groups;
      }
    }
  }
  return order;
}

struct ModelTables {
  std::array<int64_t, 21> key{};
  bool filled = false;
  std::vector<int64_t> state_bytes;
  OptimizerOrder order[2];  // [image path]
};

const ModelTables& tables_of(const MemorySpec& spec) {
  const auto& v = spec.dims.vision;
  const auto& l = spec.dims.language;
  const std::array<int64_t, 21> key = {v.image_size,
                                       v.patch_size,
                                       v.hidden_size,
                                       v.num_layers,
                                       v.num_heads,
                                       v.mlp_size,
                                       spec.dims.projector.pixel_shuffle,
                                       l.hidden_size,
                                       l.num_layers,
                                       l.num_heads,
                                       l.num_kv_heads,
                                       l.mlp_size,
                                       l.vocab_size,
                                       l.extra_tokens,
                                       l.tie_embeddings,
                                       spec.vision.trainable,
                                       spec.vision.parameter_bytes,
                                       spec.projector.trainable,
                                       spec.projector.parameter_bytes,
                                       spec.language.trainable,
                                       spec.language.parameter_bytes};
  thread_local ModelTables cached;
  if (!cached.filled || cached.key != key) {
    cached.key = key;
    cached.filled = true;
    cached.state_bytes.clear();
    for (const ParameterTensor& t : parameter_tensors(spec))
      cached.state_bytes.push_back(t.bytes());
    cached.order[0] = compute_order(spec, false);
    cached.order[1] = compute_order(spec, true);
  }
  return cached;
}

}  // namespace

size_t OptimizerOrder::decoder_tensors() const {
  size_t count = 0;
  for (size_t g = group_sizes.size() - decoder_groups; g < group_sizes.size(); ++g) {
    count += group_sizes[g];
  }
  return count;
}

const OptimizerOrder& optimizer_order(const MemorySpec& spec, bool image_path) {
  return tables_of(spec).order[image_path ? 1 : 0];
}

const std::vector<int64_t>& model_state_bytes(const MemorySpec& spec) {
  return tables_of(spec).state_bytes;
}

}  // namespace vlm::memory
