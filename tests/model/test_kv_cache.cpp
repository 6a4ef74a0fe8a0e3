// Incremental decoding with a KV cache gives the hidden states of a full forward over the
// whole sequence (what greedy generation relies on to stay exact while costing one token's
// forward per step).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "model/language_model.h"
#include "spec/model_spec.h"

using namespace vlm;

CATCH_TEST_CASE("decoding with a KV cache equals the full forward, token by token and in chunks") {
  torch::manual_seed(11);
  const spec::ModelSpec spec = spec::preset("tiny");
  CATCH_REQUIRE(spec.language.num_heads != spec.language.num_kv_heads);  // GQA is exercised
  model::LanguageModel decoder(spec.language);
  decoder->eval();
  torch::NoGradGuard no_grad;
  const int64_t n = 21;
  const torch::Tensor ids = torch::randint(0, spec.language.vocab_size, {1, n}, torch::kLong);
  const torch::Tensor embeddings = decoder->embed(ids);
  const torch::Tensor full = decoder->forward(embeddings, torch::arange(n).view({1, n}),
                                              torch::tensor({int64_t{0}, n}, torch::kLong));

  // A prompt of 9 tokens, one token, a chunk of 4 (attending to the cache and causally among
  // themselves), then one token at a time.
  model::KvCache cache;
  std::vector<torch::Tensor> pieces;
  int64_t at = 0;
  for (const int64_t take : {9, 1, 4, 1, 1, 1, 1, 1, 1, 1}) {
    pieces.push_back(decoder->forward_cached(embeddings.narrow(1, at, take), cache));
    at += take;
    CATCH_CHECK(cache.length == at);
  }
  CATCH_REQUIRE(at == n);
  CATCH_REQUIRE(cache.layers.size() == static_cast<size_t>(spec.language.num_layers));
  CATCH_CHECK(cache.layers[0].keys.size(2) == n);
  CATCH_CHECK(cache.layers[0].keys.size(1) == spec.language.num_kv_heads);
  const torch::Tensor cached = torch::cat(pieces, 1);
  CATCH_CHECK((cached - full).abs().max().item<double>() < 1e-5);
}
