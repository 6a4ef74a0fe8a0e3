// json_integer: integers read back from this tool's own JSON, refusing what nlohmann's get<>()
// would convert with undefined behaviour (a float beyond the type: 1e308 in a checkpoint's
// data cursor, found by the checkpoint_state harness).
#include <catch2/catch.hpp>

#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/json_integer.h"

using nlohmann::json;
using vlm::json_integer;

TEST_CASE("json_integer takes integers within the type and refuses everything else") {
  CHECK(json_integer<int64_t>(json(-5)) == -5);
  CHECK(json_integer<uint64_t>(json(uint64_t{18446744073709551615u})) == 18446744073709551615u);
  CHECK(json_integer<uint32_t>(json(4294967295u)) == 4294967295u);
  CHECK(json_integer<int>(json(-2147483648LL)) == -2147483648LL);
  CHECK_THROWS_WITH(json_integer<uint64_t>(json(1e308)), Catch::Contains("got 1e+308"));
  CHECK_THROWS(json_integer<int64_t>(json(2.0)));  // a float, even a whole one
  CHECK_THROWS(json_integer<uint64_t>(json(-1)));
  CHECK_THROWS(json_integer<uint32_t>(json(4294967296LL)));
  CHECK_THROWS(json_integer<int64_t>(json(uint64_t{9223372036854775808u})));
  CHECK_THROWS(json_integer<int>(json(2147483648LL)));
  CHECK_THROWS(json_integer<int64_t>(json("7")));
  CHECK_THROWS(json_integer<int64_t>(json(nullptr)));
}
