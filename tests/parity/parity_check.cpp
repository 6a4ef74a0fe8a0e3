// parity_check: vlmtrain's model against a reference recorded from nanoVLM's PyTorch model on the
// same weights and batch (docs/parity.md; scripts/parity/ regenerates the reference).
//
//   parity_check --write-case FILE [case options]      the weights (nanoVLM names) and batch
//   parity_check --reference FILE [case options]       compare; exit 1 when a bound is exceeded
//   case options: --preset NAME --vision-layers N --language-layers N --seed S --precision P
//
// The case is built from vlmtrain's own random generator (core/random.h), so it is the same
// bytes on every machine and LibTorch version: only the committed reference (a few kB) is kept.
// Rows hold one sample each (right-padded), where both models define the same attention;
// "packed" rows (two samples in a row) and two micro-batches show the deliberate differences.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/random.h"
#include "model/safetensors.h"
#include "model/token_loss.h"
#include "model/vision_language_model.h"
#include "spec/derived.h"
#include "train/precision.h"

namespace {

using vlm::model::VlmBatch;
using Json = nlohmann::json;

struct Options {
  std::string preset = "tiny";
  int64_t vision_layers = 0, language_layers = 0;  // 0: the preset's
  uint64_t seed = 20261124;
  std::string precision = "fp32";
  std::string device = "cpu";      // where the model runs (the reference was recorded on a CPU)
  std::string attention = "auto";  // model.attention
  std::string write_case, reference;
  std::string compare_attention;  // a second model.attention to compare against --attention
};

// Bounds per precision (docs/parity.md): relative for the loss and gradient norms, absolute
// for logits; a gradient's sum within grad_norm_rel of its L1 norm (a sign error that
// leaves the norm alone shows there). bf16 autocast rounds differently in the two implementations
// (nanoVLM's RMSNorm and cross-entropy run in bf16 on the CPU, vlmtrain's in fp32), so its
// bounds are looser: about 5x what the tiny case measures (8.6e-6, 3.9e-3, 4.1e-3).
struct Bounds {
  double loss_rel, logit_abs, grad_norm_rel;
};
Bounds bounds_for(const std::string& precision) {
  if (precision == "bf16") return {1e-3, 2e-2, 2e-2};
  return {1e-5, 1e-4, 1e-4};
}

vlm::spec::ModelSpec case_spec(const Options& o) {
  vlm::spec::ModelSpec spec = vlm::spec::preset(o.preset);
  if (o.vision_layers > 0) spec.vision.num_layers = o.vision_layers;
  if (o.language_layers > 0) spec.language.num_layers = o.language_layers;
  return spec;
}

// Every parameter from the case's generator, in registration order: norm scales 1 +- 0.1,
// biases +-0.02, everything else uniform with nanoVLM's init std 0.02.
void fill_parameters(vlm::model::VisionLanguageModel& model, vlm::Rng& rng) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool scale = !bias && p.dim() == 1;  // LayerNorm / RMSNorm weights
    std::vector<float> values(static_cast<size_t>(p.numel()));
    const double half_width = 0.02 * std::sqrt(3.0);
    for (float& v : values) {
      const double u = 2.0 * rng.uniform() - 1.0;
      v = static_cast<float>(scale ? 1.0 + 0.1 * u : bias ? 0.02 * u : half_width * u);
    }
    p.copy_(torch::from_blob(values.data(), p.sizes(), torch::kFloat32));
  }
}

struct Sample {
  int64_t length;
  std::vector<int64_t> crop_starts;  // image-token runs of one crop each
};

// `rows` of samples; each row is padded to `row_length`. The image token is the first id after
// the base vocabulary (nanoVLM finds image positions by that id; vlmtrain by position).
VlmBatch make_batch(const vlm::spec::ModelSpec& spec, const std::vector<std::vector<Sample>>& rows,
                    int64_t row_length, vlm::Rng& rng, torch::Tensor* attention_mask) {
  const int64_t per_crop = vlm::spec::image_tokens_per_crop(spec);
  const int64_t image_token = spec.language.vocab_size, crop = spec.vision.image_size;
  const int64_t b = static_cast<int64_t>(rows.size());
  std::vector<int64_t> ids(b * row_length, 0), positions(b * row_length, 0),
      labels(b * row_length, vlm::model::kIgnoreLabel), mask(b * row_length, 0), image_index,
      bounds{0};
  for (int64_t r = 0; r < b; ++r) {
    int64_t at = r * row_length;
    for (const Sample& s : rows[static_cast<size_t>(r)]) {
      std::vector<bool> image(static_cast<size_t>(s.length), false);
      for (const int64_t c : s.crop_starts) {
        for (int64_t t = c; t < c + per_crop; ++t) image[static_cast<size_t>(t)] = true;
      }
      for (int64_t t = 0; t < s.length; ++t) {
        ids[at + t] = image[t] ? image_token
                               : static_cast<int64_t>(rng.below(spec.language.vocab_size));
        positions[at + t] = t;
        mask[at + t] = 1;
        if (image[t]) image_index.push_back(at + t);
      }
      for (int64_t t = 0; t + 1 < s.length; ++t) {
        if (!image[t + 1]) labels[at + t] = ids[at + t + 1];
      }
      at += s.length;
      bounds.push_back(at);
    }
    if (at < (r + 1) * row_length) {  // the row's padding: a segment of its own
      for (int64_t t = at; t < (r + 1) * row_length; ++t) positions[t] = t - at;
      bounds.push_back((r + 1) * row_length);
    }
  }
  const int64_t crops = static_cast<int64_t>(image_index.size()) / per_crop;
  std::vector<float> pixels(static_cast<size_t>(crops * 3 * crop * crop));
  for (float& v : pixels) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
  const auto longs = [](std::vector<int64_t>& v, std::vector<int64_t> shape) {
    return torch::from_blob(v.data(), shape, torch::kLong).clone();
  };
  VlmBatch batch;
  batch.input_ids = longs(ids, {b, row_length});
  batch.position_ids = longs(positions, {b, row_length});
  batch.labels = longs(labels, {b, row_length});
  batch.cu_seqlens = longs(bounds, {static_cast<int64_t>(bounds.size())});
  batch.image_token_index = longs(image_index, {static_cast<int64_t>(image_index.size())});
  if (crops > 0) {
    batch.crops = torch::from_blob(pixels.data(), {crops, 3, crop, crop}, torch::kFloat32).clone();
  }
  if (attention_mask) *attention_mask = longs(mask, {b, row_length});
  return batch;
}

// The case: one-sample rows of different lengths (images in two of them), and the same kind
// of samples packed two to a row.
struct Case {
  vlm::spec::ModelSpec spec;
  vlm::model::VisionLanguageModel model{nullptr};
  VlmBatch rows, packed;
  torch::Tensor rows_mask, packed_mask;
};

Case make_case(const Options& o) {
  Case c;
  c.spec = case_spec(o);
  vlm::Rng rng(o.seed);
  c.model = vlm::model::VisionLanguageModel(c.spec);
  fill_parameters(c.model, rng);
  const int64_t k = vlm::spec::image_tokens_per_crop(c.spec);
  const int64_t t = 3 * k + 24;  // room for two crops and text
  c.rows = make_batch(c.spec, {{{t, {3, 3 + k}}}, {{t - 11, {5}}}, {{t - 19, {}}}}, t, rng,
                      &c.rows_mask);
  c.packed = make_batch(c.spec, {{{k + 10, {2}}, {t - k - 10, {}}}, {{t / 2, {}}, {t / 2 - 3, {4}}}},
                        t, rng, &c.packed_mask);
  vlm::ModelLevers levers;
  levers.attention = o.attention;
  c.model->set_runtime_levers(levers);
  return c;
}

vlm::model::TensorMap case_tensors(const Case& c) {
  vlm::model::TensorMap out;
  for (const auto& item : c.model->named_parameters()) out[item.key()] = item.value().detach();
  const auto put = [&](const std::string& prefix, const VlmBatch& b, const torch::Tensor& mask) {
    out[prefix + ".input_ids"] = b.input_ids;
    out[prefix + ".attention_mask"] = mask;
    out[prefix + ".targets"] = b.labels;
    if (b.crops.defined()) out[prefix + ".images"] = b.crops;
  };
  put("batch", c.rows, c.rows_mask);
  put("packed", c.packed, c.packed_mask);
  return out;
}

// nanoVLM's VLMConfig fields for the case's dimensions (scripts/parity/make_reference.py).
Json nanovlm_config(const vlm::spec::ModelSpec& s) {
  return Json{{"vit_hidden_dim", s.vision.hidden_size},
              {"vit_inter_dim", s.vision.mlp_size},
              {"vit_patch_size", s.vision.patch_size},
              {"vit_img_size", s.vision.image_size},
              {"vit_n_heads", s.vision.num_heads},
              {"vit_n_blocks", s.vision.num_layers},
              {"vit_ln_eps", s.vision.layer_norm_eps},
              {"lm_hidden_dim", s.language.hidden_size},
              {"lm_inter_dim", s.language.mlp_size},
              {"lm_rms_eps", s.language.rms_norm_eps},
              {"lm_re_base", s.language.rope_base},
              {"lm_max_position_embeddings", s.language.max_position},
              {"lm_base_vocab_size", s.language.vocab_size},
              {"extra_token_amount", s.language.extra_tokens},
              {"lm_vocab_size", s.language.vocab_size + s.language.extra_tokens},
              {"lm_n_heads", s.language.num_heads},
              {"lm_n_kv_heads", s.language.num_kv_heads},
              {"lm_n_blocks", s.language.num_layers},
              {"lm_tie_weights", s.language.tie_embeddings},
              {"mp_pixel_shuffle_factor", s.projector.pixel_shuffle},
              {"mp_image_token_length", vlm::spec::image_tokens_per_crop(s)}};
}

// Loss (summed / supervised tokens), logits, and gradients of one forward and backward.
struct Result {
  double loss = 0;
  torch::Tensor logits;
  std::map<std::string, torch::Tensor> grads;
};

// Rows [first, last) of `b` as a batch of their own: their crops are those of their image
// tokens (crops are in token order), their boundaries and positions shifted to the new start.
VlmBatch rows_of(const VlmBatch& b, int64_t first, int64_t last, int64_t per_crop) {
  const int64_t t = b.input_ids.size(1), begin = first * t, end = last * t;
  VlmBatch out;
  out.input_ids = b.input_ids.slice(0, first, last);
  out.position_ids = b.position_ids.slice(0, first, last);
  out.labels = b.labels.slice(0, first, last);
  const torch::Tensor bounds = b.cu_seqlens;
  out.cu_seqlens = bounds.index({(bounds >= begin) & (bounds <= end)}) - begin;
  const torch::Tensor index = b.image_token_index;
  const torch::Tensor inside = (index >= begin) & (index < end);
  out.image_token_index = index.index({inside}) - begin;
  const int64_t before = (index < begin).sum().item<int64_t>() / per_crop;
  const int64_t crops = out.image_token_index.numel() / per_crop;
  if (crops > 0) out.crops = b.crops.slice(0, before, before + crops);
  return out;
}

// `b` on `device`; the boundaries stay on the host, where attention reads them.
VlmBatch on_device(const VlmBatch& b, const torch::Device& device) {
  VlmBatch out = b;
  for (torch::Tensor* t :
       {&out.input_ids, &out.position_ids, &out.labels, &out.image_token_index, &out.crops}) {
    if (t->defined()) *t = t->to(device);
  }
  return out;
}

Result run(Case& c, const VlmBatch& host_batch, const std::string& precision) {
  const torch::Device device = c.model->parameters().front().device();
  const VlmBatch batch = on_device(host_batch, device);
  c.model->zero_grad();
  vlm::model::VlmOutput out;
  {
    vlm::train::AutocastScope autocast(vlm::train::parse_precision(precision), device);
    out = c.model->forward(batch, /*return_logits=*/true);
  }
  const torch::Tensor loss = out.loss_sum / out.supervised_tokens.to(torch::kDouble);
  loss.backward();
  Result r;
  r.loss = loss.item<double>();
  r.logits = out.logits.detach().to(torch::kCPU, torch::kDouble);
  for (const auto& item : c.model->named_parameters()) {
    if (item.value().grad().defined()) {
      r.grads[item.key()] = item.value().grad().to(torch::kCPU, torch::kDouble);
    }
  }
  return r;
}

// The bf16 reference was recorded where a bf16 matmul on the CPU sums its products in fp32 and
// rounds once (oneDNN's bf16 kernels; LibTorch 2.x's own gemm, whose accumulator is fp32 on
// every CPU). LibTorch 1.13's own gemm, which it runs on CPUs without AVX-512 (an AVX2-only AMD
// EPYC, for one), sums into its bf16 output when neither operand is transposed (as a linear's
// input gradient, g W, is computed), which moves the tiny case's bf16 gradients by up to 4e-2,
// beyond the bounds, in a correct model. Which kind of kernel runs is measured here, not
// assumed: 4096 products 1 x 1 sum to 4096 in fp32 (exact in bf16 too), while a running bf16
// sum stops at 256 (256 + 1 rounds back to 256). Each operand layout a linear's forward and
// backward uses (plain, the left transposed, the right transposed) is tried; returns the
// smallest sum.
double bf16_ones_dot_product() {
  constexpr int64_t k = 4096;
  const torch::Tensor plain_a = torch::ones({8, k}, torch::kBFloat16);
  const torch::Tensor plain_b = torch::ones({k, 8}, torch::kBFloat16);
  double smallest = k;
  for (const torch::Tensor& product :
       {torch::matmul(plain_a, plain_b), torch::matmul(plain_b.t(), plain_b),
        torch::matmul(plain_a, plain_a.t())}) {
    smallest = std::min(smallest, product[0][0].item<double>());
  }
  return smallest;
}

int compare(Case& c, const Options& o) {
  std::ifstream in(o.reference);
  if (!in) {
    std::cerr << "parity_check: cannot read " << o.reference << "\n";
    return 2;
  }
  const Json ref = Json::parse(in);
  if (ref.at("config") != nanovlm_config(c.spec) || ref.at("case").at("seed") != o.seed ||
      ref.at("case").at("preset") != o.preset) {
    std::printf("parity_check: %s was recorded for another case (dimensions or seed changed); "
                "regenerate it: scripts/parity/regenerate.sh  FAIL\n",
                o.reference.c_str());
    return 1;
  }
  if (o.precision == "bf16" && o.device == "cpu") {
    const double sum = bf16_ones_dot_product();
    if (sum != 4096.0) {
      std::printf(
          "bf16 matmul here sums 4096 products of 1 x 1 to %.0f: its partial sums are "
          "rounded to bf16, where the reference's kernels sum in fp32; the bf16 "
          "comparison needs such kernels (LibTorch 2.x has them on every CPU; "
          "docs/parity.md)  FAIL\n",
          sum);
      return 1;
    }
    std::printf(
        "bf16 matmul here sums its products in fp32, as where the reference was "
        "recorded\n");
  }
  const Bounds b = bounds_for(o.precision);
  const Json& want = ref.at(o.precision);
  const Result got = run(c, c.rows, o.precision);
  int failures = 0;
  const auto report = [&](const std::string& what, double error, double bound) {
    const bool ok = error <= bound;
    failures += ok ? 0 : 1;
    std::printf("%-44s %.3e  (bound %.0e)%s\n", what.c_str(), error, bound, ok ? "" : "  FAIL");
  };

  const double ref_loss = want.at("loss").get<double>();
  std::printf("loss: vlmtrain %.9f, nanoVLM %.9f\n", got.loss, ref_loss);
  report("loss, relative difference", std::abs(got.loss - ref_loss) / std::abs(ref_loss),
         b.loss_rel);

  double worst_logit = 0;
  for (const auto& s : want.at("logits")) {
    const double ours = got.logits[s[0].get<int64_t>()][s[1].get<int64_t>()][s[2].get<int64_t>()]
                            .item<double>();
    worst_logit = std::max(worst_logit, std::abs(ours - s[3].get<double>()));
  }
  report("sampled logits (" + std::to_string(want.at("logits").size()) + "), max abs difference",
         worst_logit, b.logit_abs);

  double worst_grad = 0;
  std::string worst_name;
  size_t compared = 0;
  for (const auto& [name, stats] : want.at("grads").items()) {
    const auto it = got.grads.find(name);
    if (it == got.grads.end()) {
      std::printf("gradient %s: in nanoVLM, not in vlmtrain  FAIL\n", name.c_str());
      ++failures;
      continue;
    }
    const double norm = it->second.norm().item<double>(), ref_norm = stats.at("norm");
    const double sum = it->second.sum().item<double>(), ref_sum = stats.at("sum");
    const double l1 = std::max(stats.at("abs_sum").get<double>(), 1e-30);
    const double error = std::max(std::abs(norm - ref_norm) / std::max(ref_norm, 1e-30),
                                  std::abs(sum - ref_sum) / l1);
    if (error >= worst_grad) worst_grad = error, worst_name = name;
    ++compared;
  }
  if (compared != got.grads.size()) {
    std::printf("gradients: vlmtrain has %zu, the reference %zu  FAIL\n", got.grads.size(),
                compared);
    ++failures;
  }
  report("gradient norms and sums (" + std::to_string(compared) + "), worst", worst_grad,
         b.grad_norm_rel);
  std::printf("  worst: %s\n", worst_name.c_str());

  if (o.precision == "fp32") {
    // Deliberate difference 1: packed rows. vlmtrain attends within each sample; nanoVLM across
    // the samples of a row. The same samples, so a difference here is the attention alone.
    const double ours = run(c, c.packed, "fp32").loss, theirs = ref.at("packed_loss");
    const double apart = std::abs(ours - theirs) / std::abs(theirs);
    std::printf("packed rows: vlmtrain %.6f, nanoVLM %.6f: %.2e apart (deliberate)\n", ours,
                theirs, apart);
    if (!(apart > 1e-4)) {
      std::printf("packed rows should differ (vlmtrain isolates samples)  FAIL\n");
      ++failures;
    }
    // Deliberate difference 2: two micro-batches (row 0, rows 1-2). vlmtrain divides the summed
    // loss of the whole step by its supervised tokens, so the split changes nothing; nanoVLM
    // averages each micro-batch's mean.
    const int64_t per_crop = vlm::spec::image_tokens_per_crop(c.spec);
    double sum = 0, tokens = 0;
    for (const auto& [first, last] : {std::pair<int64_t, int64_t>{0, 1}, {1, 3}}) {
      torch::NoGradGuard no_grad;
      const vlm::model::VlmOutput out = c.model->forward(
          on_device(rows_of(c.rows, first, last, per_crop), torch::Device(o.device)));
      sum += out.loss_sum.item<double>();
      tokens += static_cast<double>(out.supervised_tokens.item<int64_t>());
    }
    const double step_loss = sum / tokens;
    const double mean_of_means = ref.at("two_micro_batches").at("mean_of_means");
    std::printf("two micro-batches: vlmtrain's step loss %.6f; nanoVLM's mean of means %.6f "
                "(%.2e apart, deliberate)\n",
                step_loss, mean_of_means, std::abs(step_loss - mean_of_means) / step_loss);
    report("two micro-batches against one, vlmtrain", std::abs(step_loss - got.loss) / got.loss,
           b.loss_rel);
    const double token_weighted = ref.at("two_micro_batches").at("token_weighted");
    report("nanoVLM's token-weighted mean against its whole batch",
           std::abs(token_weighted - ref_loss) / ref_loss, b.loss_rel);
  }
  std::printf("parity_check %s (%s): %s\n", o.preset.c_str(), o.precision.c_str(),
              failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

// --compare-attention: the packed batch (two samples a row, images in both rows) through the
// decoder's attention kernel --attention and through another, same weights, same precision;
// the loss and every gradient within the precision's bounds, every logit's difference shown.
int compare_attention_kernels(Case& c, const Options& o) {
  const Result a = run(c, c.packed, o.precision);
  vlm::ModelLevers levers;
  levers.attention = o.compare_attention;
  c.model->set_runtime_levers(levers);
  const Result b = run(c, c.packed, o.precision);
  const Bounds bounds = bounds_for(o.precision);
  int failures = 0;
  const auto report = [&](const std::string& what, double error, double bound) {
    const bool ok = error <= bound;  // false for a NaN too
    failures += ok ? 0 : 1;
    std::printf("%-52s %.3e  (bound %.0e)%s\n", what.c_str(), error, bound, ok ? "" : "  FAIL");
  };
  std::printf("packed batch, %s on %s: attention %s loss %.9f, %s loss %.9f\n", o.precision.c_str(),
              o.device.c_str(), o.attention.c_str(), a.loss, o.compare_attention.c_str(), b.loss);
  report("loss, relative difference", std::abs(a.loss - b.loss) / std::abs(b.loss),
         bounds.loss_rel);
  // Every logit of the batch, as a figure: the logit bound is for the reference's sample of
  // 273 (docs/parity.md), and the largest of millions of rounding differences is another
  // statistic. The loss and every gradient carry the comparison.
  std::printf("%-52s %.3e  (all of them, max abs difference; not bounded)\n",
              ("logits (" + std::to_string(a.logits.numel()) + ")").c_str(),
              (a.logits - b.logits).abs().max().item<double>());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, g] : b.grads) {
    const auto it = a.grads.find(name);
    if (it == a.grads.end()) {
      std::printf("gradient %s: only with %s  FAIL\n", name.c_str(), o.compare_attention.c_str());
      ++failures;
      continue;
    }
    const double norm = g.norm().item<double>(), l1 = std::max(g.abs().sum().item<double>(), 1e-30);
    const double error =
        std::max(std::abs(it->second.norm().item<double>() - norm) / std::max(norm, 1e-30),
                 std::abs(it->second.sum().item<double>() - g.sum().item<double>()) / l1);
    if (!(error < worst)) worst = error, worst_name = name;
  }
  report("gradient norms and sums (" + std::to_string(b.grads.size()) + "), worst", worst,
         bounds.grad_norm_rel);
  std::printf("  worst: %s\n", worst_name.c_str());
  std::printf("parity_check %s attention %s against %s (%s, %s): %s\n", o.preset.c_str(),
              o.attention.c_str(), o.compare_attention.c_str(), o.precision.c_str(),
              o.device.c_str(), failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--preset") o.preset = value();
      else if (a == "--vision-layers") o.vision_layers = std::stoll(value());
      else if (a == "--language-layers") o.language_layers = std::stoll(value());
      else if (a == "--seed") o.seed = std::stoull(value());
      else if (a == "--precision") o.precision = value();
      else if (a == "--write-case") o.write_case = value();
      else if (a == "--reference") o.reference = value();
      else if (a == "--device")
        o.device = value();
      else if (a == "--attention")
        o.attention = value();
      else if (a == "--compare-attention")
        o.compare_attention = value();
      else throw std::invalid_argument("unknown argument " + a);
    } catch (const std::exception& e) {
      std::cerr << "parity_check: " << e.what() << "\n";
      return 2;
    }
  }
  if (o.precision != "fp32" && o.precision != "bf16") {
    std::cerr << "parity_check: --precision is fp32 or bf16\n";
    return 2;
  }
  const int modes = !o.write_case.empty() + !o.reference.empty() + !o.compare_attention.empty();
  if (modes != 1) {
    std::cerr << "parity_check: give one of --write-case FILE, --reference FILE or "
                 "--compare-attention KERNEL\n";
    return 2;
  }
  torch::set_num_threads(1);
  Case c = make_case(o);
  try {
    c.model->to(torch::Device(o.device));
    if (!o.compare_attention.empty()) return compare_attention_kernels(c, o);
  } catch (const std::exception& e) {  // a device or kernel that cannot run here
    std::cerr << "parity_check: " << e.what() << "\n";
    return 2;
  }
  if (!o.write_case.empty()) {
    const Json meta{{"preset", o.preset},
                    {"seed", o.seed},
                    {"image_token_id", c.spec.language.vocab_size},
                    {"config", nanovlm_config(c.spec)}};
    vlm::model::save_safetensors(o.write_case, case_tensors(c), {{"parity", meta.dump()}});
    std::printf("parity_check: wrote %s\n", o.write_case.c_str());
    return 0;
  }
  return compare(c, o);
}
