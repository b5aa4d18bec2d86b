#include "src/base/status.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace loom {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0)
    return InvalidArgumentError("x=" + std::to_string(x) + " is odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status().ok());
  Status s = NotFoundError("tensor a.b");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: tensor a.b");
  EXPECT_EQ(s.WithContext("file x").message(), "file x: tensor a.b");
}

TEST(StatusTest, AssignOrReturnPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  StatusOr<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "x=3 is odd");
}

// A StatusOr of an optional made from std::nullopt is OK and holds an
// empty optional (std::optional<T>'s own converting constructor would leave
// the StatusOr with no value at all).
TEST(StatusTest, StatusOrOfAnEmptyOptional) {
  const auto none = []() -> StatusOr<std::optional<std::string>> {
    return std::nullopt;
  };
  StatusOr<std::optional<std::string>> s = none();
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->has_value());
  StatusOr<std::optional<std::string>> t = std::string("x");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->value(), "x");
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  StatusOr<int> r = InvalidArgumentError("bad");
  EXPECT_DEATH((void)r.value(), "bad");
}

}  // namespace
}  // namespace loom
