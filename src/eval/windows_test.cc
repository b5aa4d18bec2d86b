// Window plans of the three protocols (docs/eval/perplexity.md).
#include "src/eval/windows.h"

#include <gtest/gtest.h>

#include "src/eval/input.h"

namespace loom::eval {
namespace {

TEST(WindowsTest, HfStrideScoresEveryTokenOnce) {
  // The stories260K golden: N = 9847, ctx 256, stride 128.
  auto plan = PlanWindows(
      9847, {.protocol = Protocol::kHfStride, .ctx = 256, .stride = 128});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->windows.size(), 76u);
  EXPECT_EQ(plan->tokens_scored, 9846);
  const Window& first = plan->windows.front();
  EXPECT_EQ(first.begin, 0);
  EXPECT_EQ(first.end, 256);
  EXPECT_EQ(first.score_begin, 1);
  EXPECT_EQ(first.scored(), 255);
  EXPECT_EQ(plan->windows[1].score_begin, 256);
  EXPECT_EQ(plan->windows[1].scored(), 128);
  const Window& last = plan->windows.back();
  EXPECT_EQ(last.begin, 9600);
  EXPECT_EQ(last.end, 9847);  // short last window
  EXPECT_EQ(last.scored(), 119);
  int64_t next = 1;
  for (const Window& w : plan->windows) {
    EXPECT_EQ(w.score_begin, next);
    next = w.score_end;
  }
  EXPECT_EQ(next, 9847);
}

TEST(WindowsTest, HfStrideDefaultsAndLimits) {
  auto plan = PlanWindows(
      1000, {.protocol = Protocol::kHfStride, .ctx = 100, .max_windows = 3});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stride, 50);
  EXPECT_EQ(plan->windows.size(), 3u);
  EXPECT_EQ(plan->tokens_scored, 99 + 50 + 50);
  // stride == ctx: disjoint windows; a window's first token has no context
  // inside its window, so it is never scored.
  auto disjoint = PlanWindows(
      300, {.protocol = Protocol::kHfStride, .ctx = 100, .stride = 100});
  ASSERT_TRUE(disjoint.ok());
  ASSERT_EQ(disjoint->windows.size(), 3u);
  EXPECT_EQ(disjoint->windows[1].score_begin,
            101);  // position 100 starts window 1: not scorable
  EXPECT_EQ(disjoint->tokens_scored, 99 * 3);
}

TEST(WindowsTest, LlamaCppChunksScoreTheSecondHalf) {
  auto plan = PlanWindows(
      1300, {.protocol = Protocol::kLlamaCpp, .ctx = 512, .window_bos = 1});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->windows.size(), 2u);  // 1300 / 512, the rest dropped
  EXPECT_EQ(plan->stride, 512);
  EXPECT_EQ(plan->windows[1].begin, 512);
  EXPECT_EQ(plan->windows[1].score_begin, 512 + 257);
  EXPECT_EQ(plan->windows[1].scored(),
            255);  // llama-perplexity: n_ctx - n_ctx/2 - 1
  std::vector<int32_t> ids(1300, 9), out(512);
  auto w = WindowIds(*plan, plan->windows[1], ids, out);
  EXPECT_EQ(w[0], 1);
  EXPECT_EQ(w[1], 9);
  EXPECT_FALSE(
      PlanWindows(1300,
                  {.protocol = Protocol::kLlamaCpp, .ctx = 512, .stride = 256})
          .ok());
  EXPECT_FALSE(
      PlanWindows(500, {.protocol = Protocol::kLlamaCpp, .ctx = 512}).ok());
}

TEST(WindowsTest, AllTokensFollowsCompareQ) {
  // exllamav3: for a in range(0, N - ctx, stride).
  auto plan = PlanWindows(
      1000, {.protocol = Protocol::kAllTokens, .ctx = 256, .stride = 128});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->windows.size(), 6u);  // a = 0, 128, ..., 640 (< 744)
  EXPECT_EQ(plan->windows.back().begin, 640);
  EXPECT_EQ(plan->tokens_scored, 6 * 255);
  auto exact = PlanWindows(
      1024, {.protocol = Protocol::kAllTokens, .ctx = 256, .stride = 256});
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->windows.size(),
            3u);  // range(0, 768, 256): the window ending at N is not used
  EXPECT_FALSE(
      PlanWindows(256, {.protocol = Protocol::kAllTokens, .ctx = 256}).ok());
}

// Hugging Face's strided recipe over a text shorter than ctx: one window of
// the whole text, every token after the first scored.
TEST(WindowsTest, HfStrideScoresATextShorterThanCtxAsOneWindow) {
  auto plan = PlanWindows(10, {.protocol = Protocol::kHfStride, .ctx = 64});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->windows.size(), 1u);
  EXPECT_EQ(plan->windows[0].begin, 0);
  EXPECT_EQ(plan->windows[0].end, 10);
  EXPECT_EQ(plan->windows[0].score_begin, 1);
  EXPECT_EQ(plan->windows[0].score_end, 10);
  EXPECT_EQ(plan->tokens_scored, 9);
  EXPECT_EQ(plan->ctx, 64);
  auto two = PlanWindows(2, {.protocol = Protocol::kHfStride, .ctx = 64});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->tokens_scored, 1);
  auto one = PlanWindows(1, {.protocol = Protocol::kHfStride, .ctx = 64});
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("nothing to score"), std::string::npos);
}

TEST(WindowsTest, Errors) {
  auto short_text =
      PlanWindows(10, {.protocol = Protocol::kLlamaCpp, .ctx = 64});
  ASSERT_FALSE(short_text.ok());
  EXPECT_NE(short_text.status().message().find("10 tokens"), std::string::npos);
  EXPECT_FALSE(
      PlanWindows(100, {.protocol = Protocol::kHfStride, .ctx = 1}).ok());
  EXPECT_FALSE(
      PlanWindows(100,
                  {.protocol = Protocol::kHfStride, .ctx = 10, .stride = 11})
          .ok());
  EXPECT_FALSE(
      PlanWindows(100,
                  {.protocol = Protocol::kHfStride, .ctx = 10, .window_bos = 1})
          .ok());
  EXPECT_FALSE(ParseProtocol("wikitext").ok());
  EXPECT_EQ(*ParseProtocol("all-tokens"), Protocol::kAllTokens);
}

TEST(InputTest, ParsesTokenIds) {
  auto ids = ParseTokenIds("[1, 2,3]\n 4\t5", "t");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_FALSE(ParseTokenIds("1 2x 3", "t").ok());
  EXPECT_FALSE(ParseTokenIds("-4", "t").ok());
}

}  // namespace
}  // namespace loom::eval
