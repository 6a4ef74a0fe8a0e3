#include "train/evaluation.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <limits>
#include <optional>

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
  AutocastScope autocast(precision, device);
  model::VlmBatch batch = model::to_tensors(prompt, device);
  const int64_t n = prompt.tokens;
  // The prompt (images included) once, then one token at a time against the cached keys and
  // values: each step costs one token's forward instead of the whole sequence's.
  model::KvCache cache;
  torch::Tensor hidden = model->decoder->forward_cached(
      model->input_embeddings(batch).narrow(1, 0, n).to(model->decoder->head_weight().scalar_type()),
      cache);
  std::vector<int32_t> generated;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const torch::Tensor logits = model->decoder->logits(hidden.narrow(1, hidden.size(1) - 1, 1));
    const int32_t next = static_cast<int32_t>(logits.argmax().item<int64_t>());
    if (next == stop_id) break;
    generated.push_back(next);
    if (step + 1 == max_new_tokens) break;
    const torch::Tensor token =
        torch::full({1, 1}, static_cast<int64_t>(next),
                    torch::TensorOptions().dtype(torch::kLong).device(device));
    hidden = model->decoder->forward_cached(model->decoder->embed(token), cache);
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
  // This rank's share of the questions: its own validation samples, at most its part of
  // `generate` (the parts add up to it).
  const int64_t world = comm.world_size(), rank = comm.rank();
  const int64_t quota = options.generate < 0
                            ? std::numeric_limits<int64_t>::max()
                            : options.generate / world + (rank < options.generate % world ? 1 : 0);
  const int32_t im_end = setup.tokenizer().token_id("<|im_end|>").value_or(-1);
  std::vector<Question> questions;
  torch::Tensor loss_total;  // summed on the device: one host read at the end
  bool stopped = false;
  const auto stop = [&] { return stopped = stopped || (options.stop && options.stop()); };
  {
    data::Loader loader(validation, loader_options);
    while (!stop()) {
      std::optional<data::LoadedStep> step = loader.next();
      if (!step) break;
      while (std::optional<data::HostBatch> taken = step->batches.take()) {
        const data::HostBatch& host = *taken;
        if (host.rows == 0) continue;
        if (stop()) break;  // the step's other batches are dropped with it
        result.samples += host.samples;
        model::VlmBatch batch = model::to_tensors(host, device);
        AutocastScope autocast(options.precision, device);
        const model::VlmOutput out = model->forward(batch);
        loss_total = loss_total.defined() ? loss_total + out.loss_sum : out.loss_sum;
        result.supervised_tokens += host.supervised_tokens;
        for (const auto& sample : host.source_samples) {
          if (static_cast<int64_t>(questions.size()) >= quota) break;
          if (auto q = first_question(*sample, im_end)) questions.push_back(std::move(*q));
        }
      }
    }
  }

  // Every rank answers its questions, so the ranks meet again after about 1 / world of the
  // work; none generates past the time limit (a fraction of the collective timeout), so the
  // others never wait out the timeout at the reduction below.
  const auto started = std::chrono::steady_clock::now();
  int64_t answered = 0, correct = 0, cut = 0;
  for (size_t i = 0; i < questions.size(); ++i) {
    const Question& q = questions[i];
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (stop()) break;
    if (options.time_limit_s > 0 && elapsed > options.time_limit_s) {
      cut = static_cast<int64_t>(questions.size() - i);
      break;
    }
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
    ++answered;
    correct += g.correct ? 1 : 0;
    if (static_cast<int64_t>(result.examples.size()) < options.examples) {
      result.examples.push_back(g);
    }
  }
  const double loss_sum = loss_total.defined() ? loss_total.item<double>() : 0.0;
  const std::vector<double> totals = comm.all_reduce_sum(
      {loss_sum, static_cast<double>(result.supervised_tokens), static_cast<double>(result.samples),
       static_cast<double>(answered), static_cast<double>(correct), static_cast<double>(cut),
       stopped ? 1.0 : 0.0});
  result.supervised_tokens = static_cast<int64_t>(totals[1]);
  result.samples = static_cast<int64_t>(totals[2]);
  result.loss = result.supervised_tokens ? totals[0] / totals[1] : 0.0;
  result.answered = static_cast<int64_t>(totals[3]);
  result.correct = static_cast<int64_t>(totals[4]);
  result.unanswered_for_time = static_cast<int64_t>(totals[5]);
  result.interrupted = totals[6] > 0;
  model->train();
  return result;
}

}  // namespace vlm::train
