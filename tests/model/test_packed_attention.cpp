// Packed rows behave exactly like separate samples: block-diagonal causal attention from
// cu_seqlens, positions restarting per sample.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "model/model_fixtures.h"
#include "model/packed_attention.h"
#include "model/varlen_attention.h"

using namespace vlm;

CATCH_TEST_CASE("segment ids and the block-diagonal causal mask from cu_seqlens") {
  const torch::Tensor cu = torch::tensor({0, 3, 4, 6, 8}, torch::kLong);  // rows of 4
  const torch::Tensor segments = model::segment_ids(cu, 2, 4);
  CATCH_CHECK(torch::equal(segments, torch::tensor({0, 0, 0, 1, 2, 2, 3, 3}).view({2, 4})));
  const torch::Tensor mask = model::packed_causal_mask(cu, 2, 4);
  CATCH_CHECK(mask.sizes() == torch::IntArrayRef({2, 1, 4, 4}));
  const torch::Tensor row0 = torch::tensor({1, 0, 0, 0,  //
                                            1, 1, 0, 0,  //
                                            1, 1, 1, 0,  //
                                            0, 0, 0, 1})
                                 .to(torch::kBool)
                                 .view({4, 4});
  CATCH_CHECK(torch::equal(mask[0][0], row0));
  const torch::Tensor row1 =
      torch::tensor({1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1}).to(torch::kBool).view({4, 4});
  CATCH_CHECK(torch::equal(mask[1][0], row1));
}

CATCH_TEST_CASE("invalid cu_seqlens are rejected with a reason") {
  const auto rejects = [](std::vector<int64_t> cu, const std::string& reason) {
    CATCH_INFO(reason);
    CATCH_CHECK_THROWS_WITH(model::segment_ids(torch::tensor(cu, torch::kLong), 2, 4),
                            Catch::Contains(reason));
  };
  rejects({0, 3, 8, 7}, "must start at 0 and end at B * T = 8");
  rejects({1, 4, 8}, "must start at 0");
  rejects({0, 4, 4, 8}, "strictly increasing");
  rejects({0, 3, 8}, "may not span two rows");
  rejects({0}, "at least 2 entries");
}

CATCH_TEST_CASE("a pack of three samples gives each sample's own logits") {
  auto model = test::tiny_model();
  torch::NoGradGuard no_grad;
  const auto& spec = model->spec();
  const auto samples = test::three_samples(spec);
  const auto packed = model->forward(test::packed_batch(spec, samples), true).logits;
  for (size_t i = 0; i < samples.size(); ++i) {
    CATCH_INFO("sample " << i);
    const auto alone = model->forward(test::single_batch(spec, samples[i]), true).logits[0];
    const auto [row, offset] = test::pack_layout()[i];
    const auto slice = packed[row].narrow(0, offset, samples[i].ids.size(0));
    CATCH_CHECK((slice - alone).abs().max().item<double>() < 1e-5);
  }
}

CATCH_TEST_CASE("a packed sample's outputs have exactly zero gradient outside it") {
  auto model = test::tiny_model();
  const auto& spec = model->spec();
  const auto samples = test::three_samples(spec);
  const auto batch = test::packed_batch(spec, samples);
  const torch::Tensor embeddings = model->input_embeddings(batch).detach().requires_grad_(true);
  const auto logits = model->forward_embeddings(embeddings, batch, true).logits;
  // Any function of sample 1's logits (row 0, tokens 20..29).
  torch::manual_seed(5);
  const auto weights = torch::randn({10, logits.size(-1)});
  (logits[0].narrow(0, 20, 10) * weights).sum().backward();

  const torch::Tensor grad = embeddings.grad();
  const torch::Tensor inside = grad[0].narrow(0, 20, 10);
  CATCH_CHECK(inside.abs().sum().item<double>() > 0);
  const torch::Tensor outside_mask = torch::ones({2, 32}, torch::kBool);
  outside_mask[0].narrow(0, 20, 10).fill_(false);
  CATCH_CHECK(grad.index({outside_mask}).abs().max().item<double>() == 0.0);
}

CATCH_TEST_CASE("the grouped causal path equals the per-segment masked path, values and "
                "gradients") {
  torch::manual_seed(7);
  // Rows of 24 tokens: segments of very different lengths, a row that is one segment, and
  // single-token segments (padding), so groups hold several segments and padding is needed.
  const torch::Tensor cu = torch::tensor({0, 11, 14, 15, 24, 48, 49, 60, 61, 72}, torch::kLong);
  const int64_t rows = 3, tokens = 24, heads = 4, dim = 8;
  const auto leaf = [&] {
    return torch::randn({rows, heads, tokens, dim}, torch::kDouble).requires_grad_(true);
  };
  const torch::Tensor q = leaf(), k = leaf(), v = leaf();
  const torch::Tensor weights = torch::randn({rows, heads, tokens, dim}, torch::kDouble);
  const auto run = [&](model::SegmentKernel kernel) {
    const torch::Tensor out = model::segment_attention(q, k, v, cu, kernel);
    const auto grads = torch::autograd::grad({(out * weights).sum()}, {q, k, v});
    return std::vector<torch::Tensor>{out.detach(), grads[0], grads[1], grads[2]};
  };
  const auto masked = run(model::SegmentKernel::kPerSegmentMask);
  const auto grouped = run(model::SegmentKernel::kGroupedCausal);
  for (size_t i = 0; i < masked.size(); ++i) {
    CATCH_CHECK(grouped[i].sizes() == masked[i].sizes());
    CATCH_CHECK((grouped[i] - masked[i]).abs().max().item<double>() < 1e-12);
  }
  // And the full block-diagonal mask agrees with both, to the fp32 softmax that the math path
  // computes (compat.h) over rows instead of segments.
  const torch::Tensor full = model::multi_head_attention(
      q, k, v, model::packed_causal_mask(cu, rows, tokens));
  CATCH_CHECK((full.detach() - masked[0]).abs().max().item<double>() < 1e-6);
}

CATCH_TEST_CASE("model.attention resolves to a kernel and says why varlen cannot run here") {
  const torch::Tensor q = torch::zeros({1, 4, 8, 16}, torch::kBFloat16);  // [B, H, T, D], CPU
  CATCH_CHECK(model::resolve_segment_kernel(model::AttentionChoice::kAuto, q, 2) ==
              model::default_segment_kernel());
  CATCH_CHECK(model::resolve_segment_kernel(model::AttentionChoice::kGrouped, q, 2) ==
              model::SegmentKernel::kGroupedCausal);
  CATCH_CHECK(model::resolve_segment_kernel(model::AttentionChoice::kPerSegment, q, 2) ==
              model::SegmentKernel::kPerSegmentMask);
  const std::string why_not = model::varlen_attention_unavailable(q, 2);
  CATCH_CHECK_FALSE(why_not.empty());
  CATCH_CHECK_THROWS_WITH(
      model::resolve_segment_kernel(model::AttentionChoice::kVarlen, q, 2),
      Catch::Contains("model.attention is varlen, which cannot run here: " + why_not));
  CATCH_CHECK(model::parse_attention_choice("per_segment") == model::AttentionChoice::kPerSegment);
  CATCH_CHECK_THROWS_WITH(model::parse_attention_choice("flash"),
                          Catch::Contains("known: auto, varlen, grouped, per_segment"));
}

CATCH_TEST_CASE(
    "multi_head_attention: the grouped and per-segment choices agree with grouped-query "
    "heads") {
  torch::manual_seed(11);
  const torch::Tensor cu = torch::tensor({0, 5, 16, 19, 32}, torch::kLong);  // rows of 16
  const torch::Tensor q = torch::randn({2, 4, 16, 8}, torch::kDouble);
  const torch::Tensor k = torch::randn({2, 2, 16, 8}, torch::kDouble);
  const torch::Tensor v = torch::randn({2, 2, 16, 8}, torch::kDouble);
  const torch::Tensor grouped =
      model::multi_head_attention(q, k, v, cu, model::AttentionChoice::kGrouped);
  const torch::Tensor masked =
      model::multi_head_attention(q, k, v, cu, model::AttentionChoice::kPerSegment);
  CATCH_CHECK((grouped - masked).abs().max().item<double>() < 1e-12);
  // Query head 3 reads key/value head 1 (heads [2, 4) share it): equal to the same attention
  // with that key/value head given to it alone.
  const torch::Tensor alone =
      model::multi_head_attention(q.narrow(1, 3, 1), k.narrow(1, 1, 1), v.narrow(1, 1, 1), cu,
                                  model::AttentionChoice::kPerSegment);
  CATCH_CHECK((masked.narrow(1, 3, 1) - alone).abs().max().item<double>() < 1e-12);
}
