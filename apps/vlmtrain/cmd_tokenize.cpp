// vlmtrain tokenize: token ids of stdin lines, or one dataset sample rendered through the chat
// template with its supervised and image tokens marked (what to look at when a loss looks wrong).
#include <iostream>
#include <string>

#include "commands.h"
#include "data/data_setup.h"
#include "data/source/manifest.h"

namespace vlm::app {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  int64_t render = -1;
};

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
int render_sample(const Config& config, int64_t index) {
  if (config.data.train.empty()) throw ConfigError("--render needs data.train in the config");
  data::DataSetup setup(config, 1);
  const auto& dataset = config.data.train.front();
  data::Manifest manifest(dataset.path, data::parse_manifest_format(dataset.format));
  if (index >= static_cast<int64_t>(manifest.size())) {
    throw UsageError("--render " + std::to_string(index) + ": the dataset has " +
                         std::to_string(manifest.size()) + " samples",
                     SourceLocation{dataset.path});
  }
  const data::ParsedLine parsed = manifest.read(static_cast<size_t>(index));
  if (const auto* problem = std::get_if<data::SampleProblem>(&parsed)) {
    throw DataError(
        "sample is skipped in training (" + problem->reason + "): " + problem->message,
        SourceLocation{manifest.path(), manifest.line_number(static_cast<size_t>(index))});
  }
  const data::BuildResult built = setup.builder().build(std::get<data::RawSample>(parsed));
  if (const auto* problem = std::get_if<data::SampleProblem>(&built)) {
    throw DataError(
        "sample is skipped in training (" + problem->reason + "): " + problem->message,
        SourceLocation{manifest.path(), manifest.line_number(static_cast<size_t>(index))});
  }
  const auto& sample = std::get<data::BuiltSample>(built);
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
  return {cmd, [args, &global] {
            if (args->render >= 0) {
              return render_sample(load_config_and_logging(global, true).config, args->render);
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
