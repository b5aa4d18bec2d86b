#include "src/base/spelling.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(SpellingTest, EditDistance) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("scale", "scale"), 0u);
  EXPECT_EQ(EditDistance("scal", "scale"), 1u);
  EXPECT_EQ(EditDistance("scael", "scale"), 2u);  // a swap is two edits
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

TEST(SpellingTest, NearestWithinTheDistanceOnly) {
  const std::vector<std::string_view> fields = {"hook", "mode", "scale",
                                                "positions"};
  EXPECT_EQ(Nearest("scal", fields, 2), "scale");
  EXPECT_EQ(Nearest("postions", fields, 2), "positions");
  EXPECT_EQ(Nearest("mdoe", fields, 2), "mode");
  EXPECT_EQ(Nearest("temperature", fields, 3), "");
  EXPECT_EQ(Nearest("x", {}, 5), "");
  EXPECT_EQ(MisspellingDistance("scal"), 2u);
  EXPECT_EQ(MisspellingDistance("hook_resid_pots"), 5u);
}

}  // namespace
}  // namespace loom
