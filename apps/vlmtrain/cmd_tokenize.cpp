// vlmtrain tokenize: token ids of stdin lines, or one dataset sample rendered through the chat
// template with its supervised and image tokens marked (what to look at when a loss looks wrong).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/hash.h"
#include "data/data_setup.h"
#include "data/image/image_decode.h"
#include "data/image/image_probe.h"
#include "data/source/image_ref.h"
#include "data/source/sample_reader.h"

namespace vlm::app {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  int64_t render = -1;
  bool json = false;
};

// The sample as read from its dataset, as one JSON object: its turns and each image's bytes
// (size, digest) and decoded size, what a converted dataset is checked against.
nlohmann::json sample_json(const data::RawSample& raw, const data::BuiltSample& sample) {
  nlohmann::json turns = nlohmann::json::array();
  for (const data::ChatTurn& turn : raw.turns) {
    turns.push_back(
        {{"role", turn.role == data::ChatRole::kUser ? "user" : "assistant"}, {"text", turn.text}});
  }
  nlohmann::json images = nlohmann::json::array();
  for (const data::ImageRef& image : sample.images) {
    const std::vector<uint8_t> bytes = data::read_image_bytes(image);
    const data::RgbImage decoded = data::decode_image_bytes(bytes, image.name());
    images.push_back(
        {{"name", image.name()},
         {"bytes", bytes.size()},
         {"fnv1a64", hex64(fnv1a64(std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                                    bytes.size())))},
         {"format", data::image_format_name(
                        data::probe_image_bytes(bytes.data(), bytes.size(), image.name()).format)},
         {"width", decoded.width},
         {"height", decoded.height}});
  }
  return {{"where", sample.where.str()},
          {"tokens", sample.tokens.ids.size()},
          {"supervised_tokens", sample.tokens.supervised_tokens},
          {"crops", sample.tokens.crops},
          {"turns", turns},
          {"images", images}};
}

int encode_lines(const data::Tokenizer& tokenizer) {
  std::string line;
  while (std::getline(std::cin, line)) {
    const auto ids = tokenizer.encode(line);
    std::cout << nlohmann::json(ids).dump() << "\n";
  }
  return 0;
}

// Prints the sample token by token: supervised text in [[...]], runs of image tokens
// collapsed to <|image|> x N.
int render_sample(const Config& config, int64_t index, bool as_json) {
  if (config.data.train.empty()) throw ConfigError("--render needs data.train in the config");
  data::DataSetup setup(config, 1);
  const auto& dataset = config.data.train.front();
  const std::unique_ptr<data::SampleReader> reader = data::open_dataset(
      {dataset.path, dataset.weight, data::parse_dataset_format(dataset.format)});
  if (index >= static_cast<int64_t>(reader->size())) {
    throw UsageError("--render " + std::to_string(index) + ": the dataset has " +
                         std::to_string(reader->size()) + " samples",
                     SourceLocation{dataset.path});
  }
  const size_t at = static_cast<size_t>(index);
  const data::ParsedLine parsed = reader->read(at);
  if (const auto* problem = std::get_if<data::SampleProblem>(&parsed)) {
    throw DataError("sample is skipped in training (" + problem->reason + "): " + problem->message,
                    problem->where.known() ? problem->where : reader->where(at));
  }
  const data::RawSample& raw = std::get<data::RawSample>(parsed);
  const data::BuildResult built = setup.builder().build(raw);
  if (const auto* problem = std::get_if<data::SampleProblem>(&built)) {
    throw DataError("sample is skipped in training (" + problem->reason + "): " + problem->message,
                    raw.where);
  }
  const auto& sample = std::get<data::BuiltSample>(built);
  if (as_json) {
    std::cout << sample_json(raw, sample).dump() << "\n";
    return 0;
  }
  const auto& tokens = sample.tokens;
  const int32_t image = setup.image_tokens().image;
  std::string out;
  bool in_supervised = false;
  for (size_t i = 0; i < tokens.ids.size();) {
    if (tokens.ids[i] == image) {
      size_t run = i;
      while (run < tokens.ids.size() && tokens.ids[run] == image) ++run;
      out += "<|image|> x " + std::to_string(run - i);
      i = run;
      continue;
    }
    const bool supervised = tokens.supervised[i] != 0;
    if (supervised != in_supervised) out += supervised ? "[[" : "]]";
    in_supervised = supervised;
    out += setup.tokenizer().decode({tokens.ids[i]});
    ++i;
  }
  if (in_supervised) out += "]]";
  std::cout << sample.where.str() << ": " << tokens.ids.size() << " tokens, "
            << tokens.supervised_tokens << " supervised ([[...]]), " << tokens.images << " images, "
            << tokens.crops << " crops, " << tokens.image_tokens << " image tokens\n"
            << out << "\n";
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& root, const GlobalOptions& global) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = root.add_subcommand(
      "tokenize", "Token ids of stdin lines (one JSON array per line), or --render a sample");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "tokenizer.json (or builtin:bytes) instead of the config's model.tokenizer");
  cmd->add_option("--render", args->render,
                  "Show sample N of the first training dataset through the chat template")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", args->json,
                "With --render: the sample as JSON (its turns; each image's name, size, FNV-1a "
                "digest of its bytes, format and decoded size)");
  return {cmd, [args, &global] {
            if (args->json && args->render < 0) throw UsageError("--json goes with --render N");
            if (args->render >= 0) {
              return render_sample(load_config_and_logging(global, true).config, args->render,
                                   args->json);
            }
            std::string source = args->tokenizer;
            if (source.empty()) {
              if (global.config_path.empty()) {
                throw UsageError("tokenize needs --tokenizer FILE or --config FILE");
              }
              source = load_config_and_logging(global, true).config.model.tokenizer;
            }
            const data::Tokenizer tokenizer = source == "builtin:bytes"
                                                  ? data::Tokenizer::builtin_bytes()
                                                  : data::Tokenizer::from_file(source);
            return encode_lines(tokenizer);
          }};
}

}  // namespace vlm::app
