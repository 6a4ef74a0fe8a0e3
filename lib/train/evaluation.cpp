#include "train/evaluation.h"

#include <algorithm>
#include <cctype>

#include "core/strings.h"
#include "data/batch/loader.h"
#include "model/batch_tensors.h"

namespace vlm::train {
namespace {

std::string normalised(std::string s) {
  s = trim(s);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  while (!s.empty() && (s.back() == '.' || s.back() == '!')) s.pop_back();
  return s;
}

// The first question of a sample: its ids up to the first supervised token (the prompt,
// images included), and the ids of the first answer (supervised, without <|im_end|>).
struct Question {
  std::shared_ptr<const data::BuiltSample> prompt;
  std::vector<int32_t> answer;
};

std::optional<Question> first_question(const data::BuiltSample& sample, int32_t im_end) {
  const auto& ids = sample.tokens.ids;
  const auto& sup = sample.tokens.supervised;
  const auto first = std::find(sup.begin(), sup.end(), uint8_t{1});
  if (first == sup.end()) return std::nullopt;
  const size_t start = static_cast<size_t>(first - sup.begin());
  Question q;
  for (size_t i = start; i < ids.size() && sup[i] && ids[i] != im_end; ++i)
    q.answer.push_back(ids[i]);
  auto prompt = std::make_shared<data::BuiltSample>(sample);
  prompt->tokens.ids.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(start));
  prompt->tokens.supervised.assign(start, 0);
  prompt->tokens.supervised_tokens = 0;
  q.prompt = std::move(prompt);
  return q;
}

}  // namespace

std::vector<int32_t> generate_greedy(model::VisionLanguageModel& model,
                                     const data::HostBatch& prompt, int32_t stop_id,
                                     int64_t max_new_tokens, const torch::Device& device,
                                     Precision precision) {
  torch::NoGradGuard no_grad;
  model::VlmBatch batch = model::to_tensors(prompt, device);
  std::vector<int64_t> ids(prompt.input_ids.begin(),
                           prompt.input_ids.begin() + static_cast<std::ptrdiff_t>(prompt.tokens));
  std::vector<int32_t> generated;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t n = static_cast<int64_t>(ids.size());
    batch.input_ids = torch::tensor(ids, torch::kInt64).view({1, n}).to(device);
    batch.position_ids = torch::arange(n, torch::kInt64).view({1, n}).to(device);
    batch.labels = torch::full({1, n}, -100, torch::kInt64).to(device);
    batch.cu_seqlens = torch::tensor(std::vector<int64_t>{0, n}, torch::kInt64).to(device);
    torch::Tensor logits;
    {
      AutocastScope autocast(precision, device);
      logits = model->forward(batch, /*return_logits=*/true).logits;
    }
    const int32_t next = static_cast<int32_t>(logits[0][n - 1].argmax().item<int64_t>());
    if (next == stop_id) break;
    generated.push_back(next);
    ids.push_back(next);
  }
  return generated;
}

EvalResult evaluate(model::VisionLanguageModel& model, const data::DataSetup& setup,
                    data::PlanningPipeline& validation, runtime::Communicator& comm,
                    const torch::Device& device, const EvalOptions& options) {
  torch::NoGradGuard no_grad;
  model->eval();
  EvalResult result;
  const data::LoaderOptions loader_options = setup.loader_options(comm.rank());
  const int32_t im_end = setup.tokenizer().token_id("<|im_end|>").value_or(-1);
  std::vector<Question> questions;
  double loss_sum = 0;
  {
    data::Loader loader(validation, loader_options);
    while (auto step = loader.next()) {
      for (const data::HostBatch& host : step->batches) {
        if (host.rows == 0) continue;
        result.samples += host.samples;
        model::VlmBatch batch = model::to_tensors(host, device);
        AutocastScope autocast(options.precision, device);
        const model::VlmOutput out = model->forward(batch);
        loss_sum += out.loss_sum.item<double>();
        result.supervised_tokens += out.supervised_tokens.item<int64_t>();
        const bool want_more =
            options.generate < 0 || static_cast<int64_t>(questions.size()) < options.generate;
        if (comm.rank() == 0 && want_more) {
          for (const auto& sample : host.source_samples) {
            if (auto q = first_question(*sample, im_end)) questions.push_back(std::move(*q));
          }
        }
      }
    }
  }
  const std::vector<double> totals =
      comm.all_reduce_sum({loss_sum, static_cast<double>(result.supervised_tokens),
                           static_cast<double>(result.samples)});
  result.supervised_tokens = static_cast<int64_t>(totals[1]);
  result.samples = static_cast<int64_t>(totals[2]);
  result.loss = result.supervised_tokens ? totals[0] / totals[1] : 0.0;

  if (comm.rank() == 0) {
    if (options.generate >= 0 && static_cast<int64_t>(questions.size()) > options.generate) {
      questions.resize(static_cast<size_t>(options.generate));
    }
    for (const Question& q : questions) {
      data::MicroBatch micro;
      data::Pack pack;
      pack.add(q.prompt->item(0));
      micro.packs.push_back(pack);
      micro.shape.add(pack);
      const data::HostBatch prompt =
          data::collate_host_batch(micro, {q.prompt}, loader_options.collate);
      const auto answer =
          generate_greedy(model, prompt, im_end, options.max_new_tokens, device, options.precision);
      GeneratedAnswer g;
      g.expected = setup.tokenizer().decode(q.answer);
      g.answer = setup.tokenizer().decode(answer);
      g.correct = normalised(g.answer) == normalised(g.expected);
      g.question = q.prompt->where.str();
      ++result.answered;
      result.correct += g.correct ? 1 : 0;
      if (static_cast<int64_t>(result.examples.size()) < options.examples)
        result.examples.push_back(g);
    }
  }
  comm.barrier();
  model->train();
  return result;
}

}  // namespace vlm::train
