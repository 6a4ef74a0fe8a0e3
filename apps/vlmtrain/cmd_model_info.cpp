// vlmtrain model-info: parameters per module, bytes, tokens per crop, FLOPs; with --weights,
// check a safetensors file (or sharded index) against the model before submitting a job.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "core/units.h"
#include "model/weight_map_hf.h"
#include "spec/derived.h"

namespace vlm::app {
namespace {

struct ModelInfoArgs {
  std::string weights;
  bool json = false;
};

nlohmann::json module_info(int64_t parameters, bool frozen, bool frozen_bf16) {
  const int64_t bytes_per = frozen && frozen_bf16 ? 2 : 4;
  return {{"parameters", parameters},
          {"trainable", frozen ? 0 : parameters},
          {"frozen", frozen ? parameters : 0},
          {"dtype", frozen && frozen_bf16 ? "bf16" : "fp32"},
          {"bytes", parameters * bytes_per}};
}

nlohmann::json model_info(const ModelConfig& m) {
  const spec::ModelSpec& s = m.dims;
  const auto counts = spec::parameter_counts(s);
  const bool bf16 = m.frozen_dtype == "bf16";
  nlohmann::json modules = {
      {"vision", module_info(counts.vision, m.freeze_vision, bf16)},
      {"projector", module_info(counts.projector, m.freeze_projector, bf16)},
      {"language", module_info(counts.language, m.freeze_language, bf16)},
  };
  int64_t trainable = 0, bytes = 0;
  for (const auto& [name, info] : modules.items()) {
    trainable += info["trainable"].get<int64_t>();
    bytes += info["bytes"].get<int64_t>();
  }
  return {{"preset", s.preset},
          {"parameters", counts.total()},
          {"trainable_parameters", trainable},
          {"weight_bytes", bytes},
          {"modules", modules},
          {"patches_per_crop", spec::patches_per_crop(s.vision)},
          {"image_tokens_per_crop", spec::image_tokens_per_crop(s)},
          {"vocab_rows", spec::language_vocab_rows(s.language)},
          {"forward_flops_per_lm_token_at_4096",
           spec::language_forward_flops_per_token(s.language, 4096)},
          {"forward_flops_per_crop", spec::vision_forward_flops_per_crop(s)}};
}

std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_text(const nlohmann::json& info) {
  std::printf("model %s: %s parameters (%s trainable), %s of weights\n",
              info["preset"].get<std::string>().c_str(), grouped(info["parameters"]).c_str(),
              grouped(info["trainable_parameters"]).c_str(),
              format_bytes(info["weight_bytes"].get<int64_t>()).c_str());
  for (const char* name : {"vision", "projector", "language"}) {
    const auto& m = info["modules"][name];
    std::printf("  %-10s %15s  %s%s\n", name, grouped(m["parameters"]).c_str(),
                m["dtype"].get<std::string>().c_str(),
                m["frozen"].get<int64_t>() ? ", frozen" : "");
  }
  std::printf("crop: %lld patches -> %lld image tokens; vocabulary rows %lld\n",
              static_cast<long long>(info["patches_per_crop"].get<int64_t>()),
              static_cast<long long>(info["image_tokens_per_crop"].get<int64_t>()),
              static_cast<long long>(info["vocab_rows"].get<int64_t>()));
  std::printf("forward FLOPs: %.3g per LM token (4096-token context), %.3g per crop\n",
              info["forward_flops_per_lm_token_at_4096"].get<double>(),
              info["forward_flops_per_crop"].get<double>());
}

int run_model_info(const GlobalOptions& global, const ModelInfoArgs& args) {
  const LoadedConfig loaded = load_config_and_logging(global, false);
  const Config& config = loaded.config;
  nlohmann::json info = model_info(config.model);
  bool weights_ok = true;
  std::string report_text;
  if (!args.weights.empty()) {
    const model::WeightsInspection inspection =
        model::inspect_weights(args.weights, config.model.dims);
    weights_ok = inspection.report.ok();
    report_text = model::format_report(inspection.report);
    nlohmann::json missing = nlohmann::json::array(), unexpected = nlohmann::json::array(),
                   mis_shaped = nlohmann::json::array();
    for (const auto& t : inspection.report.missing) missing.push_back(t.name);
    for (const auto& t : inspection.report.unexpected) unexpected.push_back(t.name);
    for (const auto& t : inspection.report.mis_shaped) mis_shaped.push_back(t.name);
    info["weights"] = {
        {"path", args.weights},      {"layout", model::layout_name(inspection.layout)},
        {"files", inspection.files}, {"matched", inspection.report.matched},
        {"missing", missing},        {"unexpected", unexpected},
        {"mis_shaped", mis_shaped},  {"ok", weights_ok}};
  }
  if (args.json) {
    std::cout << info.dump(2) << "\n";
  } else {
    print_text(info);
    if (!args.weights.empty()) {
      std::cout << "weights " << args.weights << " ("
                << info["weights"]["layout"].get<std::string>() << "):\n"
                << report_text << "\n";
    }
  }
  return weights_ok ? 0 : static_cast<int>(ExitCode::kData);
}

}  // namespace

Command add_model_info_command(CLI::App& root, const GlobalOptions& global) {
  auto args = std::make_shared<ModelInfoArgs>();
  CLI::App* cmd = root.add_subcommand(
      "model-info", "Parameters, bytes, tokens per crop and FLOPs of the configured model");
  cmd->add_option("--weights", args->weights,
                  "Check a safetensors file, sharded index.json or directory against the model "
                  "(exit code 3 when tensors are missing, unexpected or mis-shaped)");
  cmd->add_flag("--json", args->json, "JSON output");
  return {cmd, [args, &global] { return run_model_info(global, *args); }};
}

}  // namespace vlm::app
