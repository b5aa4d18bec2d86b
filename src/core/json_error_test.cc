#include "src/core/json_error.h"

#include <gtest/gtest.h>

#include <string>

namespace loom {
namespace {

TEST(LocateJsonErrorTest, OffsetLineColumnAndWhat) {
  const std::string cut = "{\"a\": [1, 2";
  EXPECT_EQ(LocateJsonError(cut).offset, static_cast<int64_t>(cut.size()));
  EXPECT_NE(LocateJsonError(cut).what.find("unexpected end of input"),
            std::string::npos)
      << LocateJsonError(cut).what;
  const std::string missing_colon = "{\"a\" 1}";
  EXPECT_EQ(LocateJsonError(missing_colon).offset,
            static_cast<int64_t>(missing_colon.find('1')));
  const std::string trailing = "{} x";
  EXPECT_EQ(LocateJsonError(trailing).offset,
            static_cast<int64_t>(trailing.find('x')));
  EXPECT_EQ(LocateJsonError("").offset, 0);
  EXPECT_EQ(LocateJsonError("{\"a\": [1, 2]}").offset, -1);
  EXPECT_EQ(LocateJsonError("{\"a\": [1, 2]}").what, "");
}

TEST(LocateJsonErrorTest, LineAndColumnCountFromOne) {
  // The error is the 'x' on the second line, its fourth character.
  const JsonParseError e = LocateJsonError("{\"a\": 1,\n  \"x\" 2}");
  EXPECT_EQ(e.line, 2);
  EXPECT_EQ(e.column, 7);
  EXPECT_NE(e.Where().find("line 2, column 7 (byte offset 15): "),
            std::string::npos)
      << e.Where();
}

}  // namespace
}  // namespace loom
