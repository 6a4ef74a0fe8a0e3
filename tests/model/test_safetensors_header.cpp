// Malformed safetensors files: every broken rule is a vlm::DataError naming file, tensor and
// rule, never a crash.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "model/safetensors.h"
#include "model/safetensors_header.h"
#include "support/test_support.h"

namespace {

using vlm::model::SafetensorsFile;

std::string u64_le(uint64_t value) {
  std::string bytes(8, '\0');
  for (auto& byte : bytes) {
    byte = static_cast<char>(value & 0xff);
    value >>= 8;
  }
  return bytes;
}

// A file made of the length prefix, `header` and `data`.
std::string file_bytes(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

// The message of the DataError that opening `bytes` as a safetensors file throws.
std::string rejection(const std::string& bytes) {
  vlm::test::TempDir dir("safetensors-bad");
  const std::string path = vlm::test::write_file(dir / "bad.safetensors", bytes);
  try {
    SafetensorsFile file(path);
  } catch (const vlm::DataError& e) {
    CATCH_CHECK(std::string(e.what()).find(path) != std::string::npos);
    return e.what();
  }
  CATCH_FAIL("the file was accepted: " << bytes.substr(0, 200));
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::string kEightBytes(8, '\0');

}  // namespace

CATCH_TEST_CASE("safetensors header: a well-formed header parses", "[safetensors]") {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],"data_offsets":[4,12]},)"
      R"("a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}   )";
  const std::string bytes = file_bytes(header, std::string(12, '\0'));
  const auto parsed = vlm::model::parse_safetensors_header(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  CATCH_REQUIRE(parsed.tensors.size() == 2);
  CATCH_CHECK(parsed.tensors[0].name == "a");  // sorted by offset
  CATCH_CHECK(parsed.tensors[1].dtype == vlm::model::SafetensorsDtype::kI64);
  CATCH_CHECK(parsed.metadata.at("format") == "pt");
  CATCH_CHECK(parsed.data_start == 8 + header.size());
  CATCH_CHECK(parsed.data_size_bytes == 12);
}

CATCH_TEST_CASE("safetensors header: truncated and oversized lengths", "[safetensors]") {
  CATCH_CHECK(contains(rejection("abc"), "fewer than the 8-byte header length"));
  CATCH_CHECK(contains(rejection(""), "fewer than the 8-byte header length"));
  CATCH_CHECK(contains(rejection(u64_le(1000) + "{}"), "runs past the end of the 10-byte file"));
  CATCH_CHECK(contains(rejection(u64_le(~0ull) + "{}"), "exceeds the 100000000-byte limit"));
  // A file cut inside its data region: the last tensor's span runs past the end.
  const std::string whole =
      file_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(16, 1));
  const auto message = rejection(whole.substr(0, whole.size() - 5));
  CATCH_CHECK(contains(message, "tensor 'w'"));
  CATCH_CHECK(contains(message, "reach past the data region of 11 bytes"));
}

CATCH_TEST_CASE("safetensors header: JSON structure violations", "[safetensors]") {
  CATCH_CHECK(contains(rejection(file_bytes("{\"a\": [1, 2", "")), "header is not valid JSON"));
  CATCH_CHECK(contains(rejection(file_bytes("\x01\x02garbage", "")), "not valid JSON"));
  CATCH_CHECK(contains(rejection(file_bytes("[1, 2]", "")), "header must be a JSON object"));
  CATCH_CHECK(contains(rejection(file_bytes(R"({"a": 3})", "")), "entry must be a JSON object"));
  CATCH_CHECK(contains(rejection(file_bytes(R"({"a":{"dtype":"F32","shape":[1]}})", "")),
                       "\"data_offsets\" must be two non-negative integers"));
  CATCH_CHECK(
      contains(rejection(file_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", kEightBytes)),
               "\"shape\" must be an array"));
  CATCH_CHECK(contains(rejection(file_bytes(R"({"__metadata__":{"k":1}})", "")),
                       "\"__metadata__\" value of 'k' is not a string"));
  // A hostile header nesting a million arrays is refused while parsing, without recursion.
  const std::string deep =
      "{\"a\":" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  CATCH_CHECK(contains(rejection(file_bytes(deep, "")), "nests deeper"));
}

CATCH_TEST_CASE("safetensors header: dtype, shape and span rules", "[safetensors]") {
  const auto entry = [](const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
    return R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" +
           offsets + "}}";
  };
  const std::string data(64, '\0');
  const auto unknown = rejection(file_bytes(entry("F8_E4M3", "[2]", "[0,2]"), data));
  CATCH_CHECK(contains(unknown, "tensor 't'"));
  CATCH_CHECK(contains(unknown, "unknown dtype \"F8_E4M3\""));
  CATCH_CHECK(contains(rejection(file_bytes(entry("F32", "[2,2]", "[0,12]"), data)),
                       "shape [2,2] of F32 needs 16 bytes but data_offsets span 12"));
  CATCH_CHECK(contains(rejection(file_bytes(entry("F32", "[4]", "[60,76]"), data)),
                       "data_offsets [60, 76] reach past the data region of 64 bytes"));
  CATCH_CHECK(
      contains(rejection(file_bytes(entry("F32", "[1]", "[8,4]"), data)), "has begin > end"));
  CATCH_CHECK(contains(rejection(file_bytes(entry("F32", "[-1,4]", "[0,16]"), data)),
                       "negative dimension"));
  CATCH_CHECK(
      contains(rejection(file_bytes(entry("F32", "[2.5]", "[0,10]"), data)), "not an integer"));
  CATCH_CHECK(contains(rejection(file_bytes(entry("F32", "[18446744073709551615]", "[0,4]"), data)),
                       "not an integer in [0, 2^63-1]"));
  // Element count overflows int64, and element count fits but bytes do not.
  CATCH_CHECK(contains(rejection(file_bytes(entry("U8", "[3037000500,3037000500]", "[0,4]"), data)),
                       "overflows a 64-bit size"));
  CATCH_CHECK(contains(rejection(file_bytes(entry("F64", "[2305843009213693952]", "[0,8]"), data)),
                       "overflows a 64-bit size"));
}

CATCH_TEST_CASE("safetensors header: overlapping spans and duplicate names", "[safetensors]") {
  const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  const auto message = rejection(file_bytes(overlap, std::string(12, '\0')));
  CATCH_CHECK(contains(message, "tensor 'b'"));
  CATCH_CHECK(contains(message, "overlap tensor 'a' at [0, 8]"));

  const std::string duplicate = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  CATCH_CHECK(contains(rejection(file_bytes(duplicate, kEightBytes)), "'a': name appears twice"));
}

CATCH_TEST_CASE("safetensors header: BOOL bytes and missing files", "[safetensors]") {
  vlm::test::TempDir dir("safetensors-bool");
  const std::string path =
      vlm::test::write_file(dir / "b.safetensors",
                            file_bytes(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                                       std::string("\x01\x02\x00", 3)));
  const SafetensorsFile file(path);  // the header is fine; the values are not
  CATCH_REQUIRE_THROWS_WITH(file.copy("m"), Catch::Contains("BOOL byte 1 is 2"));
  CATCH_REQUIRE_THROWS_WITH(file.copy("nope"), Catch::Contains("no tensor named 'nope'"));
  CATCH_REQUIRE_THROWS_AS(SafetensorsFile((dir / "absent.safetensors").string()), vlm::DataError);
  CATCH_REQUIRE_THROWS_WITH(SafetensorsFile(dir.path().string()),
                            Catch::Contains("not a regular file"));
}

CATCH_TEST_CASE("safetensors header: layout and encoding", "[safetensors]") {
  using vlm::model::SafetensorsDtype;
  using vlm::model::TensorEntry;
  std::vector<TensorEntry> entries{{"z", SafetensorsDtype::kF16, {3}, 0, 0},
                                   {"a", SafetensorsDtype::kU8, {5}, 0, 0},
                                   {"m", SafetensorsDtype::kF64, {2}, 0, 0}};
  const auto laid = vlm::model::layout_tensors(entries);
  // Largest elements first keeps every tensor aligned: F64 at 0, F16 at 16, U8 at 22.
  CATCH_REQUIRE(laid.size() == 3);
  CATCH_CHECK(laid[0].name == "m");
  CATCH_CHECK(laid[0].begin == 0);
  CATCH_CHECK(laid[1].name == "z");
  CATCH_CHECK(laid[1].begin == 16);
  CATCH_CHECK(laid[2].name == "a");
  CATCH_CHECK(laid[2].end == 27);
  const std::string header = vlm::model::encode_safetensors_header(laid, {{"k", "v"}});
  CATCH_CHECK((8 + header.size()) % 8 == 0);
  CATCH_CHECK(
      header.rfind(
          R"({"__metadata__":{"k":"v"},"a":{"dtype":"U8","shape":[5],"data_offsets":[22,27]},)",
          0) == 0);
}
