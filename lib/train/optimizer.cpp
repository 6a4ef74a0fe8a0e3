#include "train/optimizer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "runtime/compat.h"
#include "train/checkpoint_dir.h"

namespace vlm::train {
namespace {

constexpr const char* kLayoutKey = "vlm_group_layout";

const ModulePrefix* module_of(const std::string& name, const std::vector<ModulePrefix>& prefixes) {
  for (const auto& entry : prefixes) {
    if (name.rfind(entry.prefix, 0) == 0) return &entry;
  }
  return nullptr;
}

std::string prefix_list(const std::vector<ModulePrefix>& prefixes) {
  std::string list;
  for (const auto& p : prefixes) list += (list.empty() ? "" : ", ") + p.prefix + " -> " + p.module;
  return list;
}

// Parameter tensors in a fixed (group) order, split by group index.
struct GroupMembers {
  ParamGroupInfo info;
  std::vector<torch::Tensor> tensors;
};

}  // namespace

std::vector<ModulePrefix> default_module_prefixes() {
  return {{"vision", "vision_encoder."}, {"projector", "MP."}, {"language", "decoder."}};
}

NamedParameters named_parameters_of(const torch::nn::Module& model) {
  NamedParameters named;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    named.emplace_back(item.key(), item.value());
  }
  return named;
}

bool parameter_gets_weight_decay(const std::string& name, int64_t dim, bool decay_embeddings) {
  if (dim < 2) return false;  // norm weights, biases, scalars
  const bool is_embedding = name.find("embedding") != std::string::npos && dim != 4;
  return !is_embedding || decay_embeddings;
}

GroupedAdamW::GroupedAdamW(const NamedParameters& named_parameters, GroupedAdamWOptions options)
    : options_(std::move(options)) {
  // Slot 2*m + (decay ? 0 : 1) for module m, so groups come out in prefix order, decay first.
  std::vector<GroupMembers> slots(2 * options_.module_prefixes.size());
  std::set<const void*> seen;
  std::set<std::string> frozen_modules;
  for (const auto& [name, tensor] : named_parameters) {
    if (!tensor.defined() || !tensor.requires_grad()) continue;
    if (!seen.insert(tensor.unsafeGetTensorImpl()).second) continue;  // tied weight
    const ModulePrefix* module = module_of(name, options_.module_prefixes);
    if (module == nullptr) {
      throw ConfigError("trainable parameter \"" + name + "\" belongs to no module (prefixes: " +
                        prefix_list(options_.module_prefixes) + "); freeze it or add a prefix");
    }
    const auto lr = options_.peak_lr.find(module->module);
    if (lr == options_.peak_lr.end()) {
      throw ConfigError("no peak learning rate for module \"" + module->module +
                        "\" (parameter \"" + name + "\")");
    }
    if (lr->second == 0.0) {
      torch::NoGradGuard no_grad;
      tensor.requires_grad_(false);
      frozen_modules.insert(module->module);
      continue;
    }
    const bool decay = parameter_gets_weight_decay(name, tensor.dim(), options_.decay_embeddings);
    const size_t index =
        2 * static_cast<size_t>(module - options_.module_prefixes.data()) + (decay ? 0 : 1);
    GroupMembers& slot = slots[index];
    slot.info.module = module->module;
    slot.info.decay = decay;
    slot.info.peak_lr = lr->second;
    slot.info.names.push_back(name);
    slot.info.numel += tensor.numel();
    slot.tensors.push_back(tensor);
  }
  for (const auto& module : frozen_modules) {
    spdlog::info("module {} has peak lr 0: frozen, not optimized", module);
  }

  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (auto& slot : slots) {
    if (slot.tensors.empty()) continue;
    auto group_options = std::make_unique<torch::optim::AdamWOptions>(slot.info.peak_lr);
    group_options->betas(std::make_tuple(options_.beta1, options_.beta2))
        .eps(options_.eps)
        .weight_decay(slot.info.decay ? options_.weight_decay : 0.0);
    param_groups.emplace_back(slot.tensors, std::move(group_options));
    parameters_.insert(parameters_.end(), slot.tensors.begin(), slot.tensors.end());
    groups_.push_back(std::move(slot.info));
  }
  if (groups_.empty()) {
    throw ConfigError("nothing to train: every parameter is frozen or has a peak lr of 0");
  }
  optimizer_ = std::make_unique<torch::optim::AdamW>(std::move(param_groups));
}

void GroupedAdamW::set_lr_factor(double factor) {
  auto& param_groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups_.size(); ++i) {
    param_groups[i].options().set_lr(groups_[i].peak_lr * factor);
  }
}

std::map<std::string, double> GroupedAdamW::lr_by_module() const {
  std::map<std::string, double> lr;
  const auto& param_groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups_.size(); ++i) {
    lr[groups_[i].module] = param_groups[i].options().get_lr();
  }
  return lr;
}

// In place (the gradients stay allocated: the memory model counts them from the first backward
// on, docs/memory.md), and as one multi-tensor call: on CUDA a few kernel launches instead of
// one per tensor (422 at 222M; docs/BENCHMARKS.md, "the recording run").
void GroupedAdamW::zero_grad() {
  std::vector<torch::Tensor> grads;
  grads.reserve(parameters_.size());
  for (const torch::Tensor& p : parameters_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (!grads.empty()) at::_foreach_zero_(grads);
}

bool GroupedAdamW::fused() const {
  return options_.fused && runtime::compat::kFusedAdamW && parameters_.front().is_cuda();
}

void GroupedAdamW::step() {
  if (fused()) {
    fused_step();
  } else {
    optimizer_->step();
  }
}

namespace {

// torch::optim keys its per-parameter state by the TensorImpl's address: a string of it up to
// LibTorch 1.13, the pointer itself later.
template <class StateMap>
typename StateMap::key_type state_key(const torch::Tensor& param) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream address;  // what c10::guts::to_string wrote
    address << param.unsafeGetTensorImpl();
    return address.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

}  // namespace

bool GroupedAdamW::has_moments(const torch::Tensor& param) const {
  const auto& state = optimizer_->state();
  using StateMap = std::decay_t<decltype(state)>;
  return state.count(state_key<StateMap>(param)) > 0;
}

// torch::optim::AdamW's update through the fused kernel, on torch::optim::AdamW's own state
// (AdamWParamState: step, exp_avg, exp_avg_sq), so that checkpoints are the same either way and
// a run may resume with the other path. Parameters without a gradient are skipped, as there.
void GroupedAdamW::fused_step() {
  torch::NoGradGuard no_grad;
  auto& state = optimizer_->state();
  using StateMap = std::decay_t<decltype(state)>;
  for (auto& group : optimizer_->param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    std::map<int64_t, torch::Tensor> step_tensors;  // one per step count (all equal, usually)
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      auto& slot = state[state_key<StateMap>(param)];
      if (!slot) {  // the first step: moments of zeros, as torch::optim::AdamW creates them
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      s.step(s.step() + 1);
      auto& step = step_tensors[s.step()];
      if (!step.defined()) {
        step = torch::full({}, static_cast<double>(s.step()), param.options().dtype(torch::kFloat));
      }
      steps.push_back(step);
      params.push_back(param);
      grads.push_back(param.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
    }
    if (params.empty()) continue;
    runtime::compat::fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, steps,
                                  options.lr(), std::get<0>(options.betas()),
                                  std::get<1>(options.betas()), options.weight_decay(),
                                  options.eps());
  }
}

std::string GroupedAdamW::layout_signature() const {
  std::string signature;
  for (const auto& group : groups_) {
    signature += group.module + (group.decay ? ":decay:" : ":no_decay:");
    for (const auto& name : group.names) signature += name + ",";
    signature += ";";
  }
  return signature;
}

void GroupedAdamW::save(const std::filesystem::path& file) const {
  // Serialised into memory first: LibTorch's archive writer finishes the zip file in its
  // destructor, and a disk error there (disk full) can throw during unwinding and terminate
  // the process. The bytes are then written with checked writes and fsync.
  std::ostringstream bytes;
  try {
    torch::serialize::OutputArchive archive;
    optimizer_->save(archive);
    archive.write(kLayoutKey, c10::IValue(layout_signature()));
    archive.save_to(bytes);
  } catch (const c10::Error& e) {
    throw Error(ExitCode::kSaveFailed, "cannot serialise the optimizer state for " + file.string() +
                                           ": " + e.what_without_backtrace());
  }
  write_file_synced(file, bytes.str());
}

void GroupedAdamW::load(const std::filesystem::path& file) {
  try {
    // The moments are read straight onto the parameters' device (each rank's own GPU under
    // torchrun), whatever device they were saved from.
    c10::optional<torch::Device> device;
    for (const auto& group : optimizer_->param_groups()) {
      if (!group.params().empty()) {
        device = group.params().front().device();
        break;
      }
    }
    torch::serialize::InputArchive archive;
    archive.load_from(file.string(), device);
    c10::IValue layout;
    if (!archive.try_read(kLayoutKey, layout) || !layout.isString() ||
        layout.toStringRef() != layout_signature()) {
      throw Error(ExitCode::kTrainingFailed,
                  "optimizer state " + file.string() +
                      " was saved for other parameter groups (modules, frozen parts or weight "
                      "decay rules changed since); resume with the same model and optimizer "
                      "settings, or start without its optimizer state");
    }
    optimizer_->load(archive);
  } catch (const c10::Error& e) {
    throw Error(ExitCode::kTrainingFailed, "cannot load the optimizer state from " + file.string() +
                                               ": " + e.what_without_backtrace());
  }
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& param : params) {
    if (param.defined() && param.grad().defined()) grads.push_back(param.grad());
  }
  if (grads.empty()) return 0.0;
  // Multi-tensor kernels (a handful of launches on CUDA, where one kernel per gradient made
  // clipping launch-bound; per tensor on CPU): each gradient's norm (fp32, as the gradients),
  // then sqrt(sum of squared norms) = the norm of all gradients as one vector.
  const std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2);
  const double total_norm =
      at::linalg_vector_norm(at::stack(norms), 2, c10::nullopt, false, at::kFloat).item<double>();
  if (max_norm > 0.0 && std::isfinite(total_norm) && total_norm > max_norm) {
    at::_foreach_mul_(grads, max_norm / (total_norm + 1e-6));
  }
  return total_norm;
}

}  // namespace vlm::train
