// Packed-row layout: positions restart, labels shift inside samples only, cu_seqlens, padding.
#include <catch2/catch.hpp>

#include <random>

#include "data/packing/packed_row.h"

using namespace vlm::data;

TEST_CASE("packed row: two samples and padding, value by value") {
  const std::vector<int32_t> ids_a = {1, 2, 3}, ids_b = {4, 5};
  const std::vector<uint8_t> sup_a = {0, 1, 1}, sup_b = {1, 1};
  const PackedRow row = build_packed_row(
      {SampleTokens{ids_a.data(), sup_a.data(), 3}, SampleTokens{ids_b.data(), sup_b.data(), 2}}, 8,
      0);
  REQUIRE(row.input_ids == std::vector<int32_t>{1, 2, 3, 4, 5, 0, 0, 0});
  REQUIRE(row.position_ids == std::vector<int32_t>{0, 1, 2, 0, 1, 0, 0, 0});
  // 3 never predicts 4 (next sample); 5 predicts nothing; padding is ignored.
  REQUIRE(row.labels == std::vector<int32_t>{2, 3, -100, 5, -100, -100, -100, -100});
  REQUIRE(row.cu_seqlens == std::vector<int32_t>{0, 3, 5});
  REQUIRE(row.cu_seqlens_int64() == std::vector<int64_t>{0, 3, 5});
  REQUIRE(row.supervised_tokens == 3);
  REQUIRE(row.sample_tokens == 5);
  REQUIRE(row.length() == 8);
}

TEST_CASE("packed row: unsupervised targets are ignored, no padding when row_length is 0") {
  const std::vector<int32_t> ids = {7, 8, 9, 10};
  const std::vector<uint8_t> sup = {1, 0, 1, 0};
  const PackedRow row = build_packed_row({SampleTokens{ids.data(), sup.data(), 4}}, 0, -1);
  REQUIRE(row.input_ids == ids);
  REQUIRE(row.labels == std::vector<int32_t>{-100, 9, -100, -100});
  REQUIRE(row.supervised_tokens == 1);
  REQUIRE(row.cu_seqlens == std::vector<int32_t>{0, 4});
}

TEST_CASE("packed row: too many tokens for the row is an error, empty pack is all padding") {
  const std::vector<int32_t> ids = {1, 2, 3};
  const std::vector<uint8_t> sup = {1, 1, 1};
  REQUIRE_THROWS_AS(build_packed_row({SampleTokens{ids.data(), sup.data(), 3}}, 2, 0),
                    std::invalid_argument);
  const PackedRow empty = build_packed_row({}, 4, 5);
  REQUIRE(empty.input_ids == std::vector<int32_t>{5, 5, 5, 5});
  REQUIRE(empty.cu_seqlens == std::vector<int32_t>{0});
  REQUIRE(empty.supervised_tokens == 0);
}

TEST_CASE("packed row: on random packs labels never cross a sample boundary") {
  std::mt19937 rng(9);
  PackedRow row;  // reused: build_packed_row_into must reset everything
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::vector<uint8_t>> sup;
    std::vector<SampleTokens> samples;
    const int n = 1 + int(rng() % 6);
    int64_t total = 0;
    for (int s = 0; s < n; ++s) {
      const int len = 1 + int(rng() % 40);
      ids.emplace_back();
      sup.emplace_back();
      for (int t = 0; t < len; ++t) {
        ids.back().push_back(int32_t(rng() % 1000));
        sup.back().push_back(uint8_t(rng() % 2));
      }
      total += len;
    }
    for (int s = 0; s < n; ++s) {
      samples.push_back(SampleTokens{ids[s].data(), sup[s].data(), int64_t(ids[s].size())});
    }
    build_packed_row_into(samples, total + int64_t(rng() % 10), 0, row);
    REQUIRE(row.cu_seqlens.size() == size_t(n + 1));
    REQUIRE(row.cu_seqlens.back() == total);
    int64_t supervised = 0, expected_supervised = 0;
    for (int s = 0; s < n; ++s) {
      const int32_t begin = row.cu_seqlens[s], end = row.cu_seqlens[s + 1];
      for (int32_t t = begin; t < end; ++t) {
        REQUIRE(row.position_ids[t] == t - begin);
        REQUIRE(row.input_ids[t] == ids[s][t - begin]);
        if (row.labels[t] != kIgnoreLabel) {
          ++supervised;
          REQUIRE(t + 1 < end);
          REQUIRE(row.labels[t] == row.input_ids[t + 1]);
        }
        if (t + 1 < end && sup[s][t + 1 - begin]) ++expected_supervised;
      }
    }
    for (int64_t t = total; t < row.length(); ++t) {
      REQUIRE(row.labels[t] == kIgnoreLabel);
      REQUIRE(row.position_ids[t] == 0);
    }
    REQUIRE(supervised == row.supervised_tokens);
    REQUIRE(supervised == expected_supervised);
  }
}
