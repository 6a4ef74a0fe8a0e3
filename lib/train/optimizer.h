// AdamW with one parameter group per (module, weight decay yes/no), as nanoVLM trains its
// vision encoder, projector and language model with separate peak learning rates.
//
// Module of a parameter: the first prefix of `module_prefixes` its name starts with
// (nanoVLM's names: "vision_encoder." -> vision, "MP." -> projector, "decoder." -> language).
// Weight decay (decoupled, Loshchilov & Hutter 2019) applies only to the weight matrices of
// linear and conv layers. No decay for:
//   - tensors with fewer than 2 dimensions: norm weights, biases, scalars;
//   - embeddings: names containing "embedding" (token and position embeddings, also a position
//     embedding stored as a bare [1, N, D] parameter), unless decay_embeddings is set.
//     Exception: 4-D tensors are conv kernels, e.g. the ViT patch embedding
//     ("vision_encoder.patch_embedding.conv.weight", HF "...embeddings.patch_embedding.weight"),
//     which is a linear layer over patches and decays like one.
// Frozen parameters (requires_grad false) are left out. A module whose peak lr is 0 is frozen
// here (requires_grad set false, as nanoVLM does for an lr of 0). A tensor listed twice (tied
// weights, e.g. the LM head sharing the token embedding) joins the optimizer once, under its
// first name. Groups are created in the order of `module_prefixes`, decay group first; empty
// groups are not created.
//
// Per step the trainer calls set_lr_factor(schedule.lr_factor(step)), which sets each
// group's lr to its module's peak * factor.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace vlm::train {

struct ModulePrefix {
  std::string module;  // "vision", "projector", "language"
  std::string prefix;  // "vision_encoder.", "MP.", "decoder."
};

std::vector<ModulePrefix> default_module_prefixes();

struct GroupedAdamWOptions {
  std::map<std::string, double> peak_lr;  // by module; every module with parameters needs one
  std::vector<ModulePrefix> module_prefixes = default_module_prefixes();
  double weight_decay = 0.01;  // torch.optim.AdamW's default
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool decay_embeddings = false;
  // On CUDA with a LibTorch that has it (runtime::compat::kFusedAdamW): one fused kernel per
  // group instead of torch::optim::AdamW's kernels per parameter; the same state either way.
  bool fused = true;
};

// What the trainer needs to know about one optimizer parameter group.
struct ParamGroupInfo {
  std::string module;
  bool decay = false;
  double peak_lr = 0.0;
  std::vector<std::string> names;  // parameter names, in model order
  int64_t numel = 0;               // elements in the group
};

using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

// Converts a module's named_parameters() into NamedParameters.
NamedParameters named_parameters_of(const torch::nn::Module& model);

// Whether `name` (of a tensor with `dim` dimensions) gets weight decay under the rule above.
bool parameter_gets_weight_decay(const std::string& name, int64_t dim, bool decay_embeddings);

class GroupedAdamW {
 public:
  // Throws vlm::ConfigError for a trainable parameter that matches no module prefix, a module
  // without a peak lr, or no trainable parameter at all.
  GroupedAdamW(const NamedParameters& named_parameters, GroupedAdamWOptions options);

  torch::optim::AdamW& optimizer() { return *optimizer_; }
  const std::vector<ParamGroupInfo>& groups() const { return groups_; }
  // Every tensor the optimizer updates, in group order (for clipping and unscaling).
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }

  // lr of every group = its module's peak lr * factor.
  void set_lr_factor(double factor);
  // The lr each module's groups use now.
  std::map<std::string, double> lr_by_module() const;

  void zero_grad();
  void step();
  // Whether step() runs the fused kernel (options.fused, CUDA parameters, a LibTorch with it).
  bool fused() const;
  // Whether `param` has AdamW moments (a step with its gradient has run, or a resume loaded
  // them).
  bool has_moments(const torch::Tensor& param) const;

  // Optimizer state (AdamW moments, step counts, group options) for exact resume, serialised
  // through torch::serialize::OutputArchive into memory, plus the group layout, which load()
  // checks; then written with every write checked and fsynced (checkpoint_dir.h). Throws
  // vlm::Error (kSaveFailed) naming the file and the errno text when it cannot be written.
  void save(const std::filesystem::path& file) const;
  // Throws vlm::Error (kTrainingFailed) when the file is unreadable or was saved for another
  // group layout (different modules, decay split or parameter names).
  void load(const std::filesystem::path& file);

 private:
  std::string layout_signature() const;
  void fused_step();

  GroupedAdamWOptions options_;
  std::vector<ParamGroupInfo> groups_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

// Global L2 norm of the gradients of `params` (undefined gradients count as zero), computed in
// fp32 with one host sync. When max_norm > 0 and the norm exceeds it, gradients are scaled by
// max_norm / (norm + 1e-6) (torch.nn.utils.clip_grad_norm_'s formula); max_norm == 0 only
// measures. Returns the norm before clipping (nan/inf when a gradient is not finite; gradients
// are then left unchanged, the step should be skipped).
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace vlm::train
