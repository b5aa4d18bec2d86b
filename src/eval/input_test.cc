// Token-id parsing of evaluation inputs: numbers too large for any integer
// type and a lone sign are errors naming the byte, not exceptions.
#include "src/eval/input.h"

#include <gtest/gtest.h>

namespace loom::eval {
namespace {

TEST(ParseTokenIdsTest, HugeOrSignOnlyIdsAreErrors) {
  auto huge = ParseTokenIds("1 99999999999999999999999 3", "ids.txt");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find(
                "ids.txt: token id 99999999999999999999999 at byte 2 is out "
                "of range"),
            std::string::npos)
      << huge.status().message();
  auto sign = ParseTokenIds("5, -", "ids.txt");
  ASSERT_FALSE(sign.ok());
  EXPECT_NE(sign.status().message().find("at byte 3"), std::string::npos)
      << sign.status().message();
  auto max = ParseTokenIds("2147483647", "ids.txt");
  ASSERT_TRUE(max.ok()) << max.status().ToString();
  EXPECT_EQ(*max, std::vector<int32_t>{2147483647});
  EXPECT_FALSE(ParseTokenIds("2147483648", "ids.txt").ok());
}

}  // namespace
}  // namespace loom::eval
