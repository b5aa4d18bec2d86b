#include "src/core/json_int.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

using nlohmann::json;

TEST(JsonInt64Test, IntegersInRange) {
  EXPECT_EQ(JsonInt64(json::parse("0")), 0);
  EXPECT_EQ(JsonInt64(json::parse("-9223372036854775808")), INT64_MIN);
  EXPECT_EQ(JsonInt64(json::parse("9223372036854775807")), INT64_MAX);
}

TEST(JsonInt64Test, NeverWrapsOrCastsOutOfRange) {
  // nlohmann's get<int64_t>() gives -1 for this one.
  EXPECT_EQ(JsonInt64(json::parse("18446744073709551615")), std::nullopt);
  EXPECT_EQ(JsonInt64(json::parse("9223372036854775808")), std::nullopt);
  for (const char* f : {"5.12e31", "-1e300", "9223372036854775808.0", "2.5"})
    EXPECT_EQ(JsonInt64(json::parse(f), true), std::nullopt) << f;
  EXPECT_EQ(JsonInt64(json::parse("\"3\"")), std::nullopt);
  EXPECT_EQ(JsonInt64(json::parse("true")), std::nullopt);
}

TEST(JsonInt64Test, IntegralFloatsOnlyWhenAllowed) {
  EXPECT_EQ(JsonInt64(json::parse("128.0")), std::nullopt);
  EXPECT_EQ(JsonInt64(json::parse("128.0"), true), 128);
  EXPECT_EQ(JsonInt64(json::parse("-9223372036854775808.0"), true), INT64_MIN);
}

}  // namespace
}  // namespace loom
