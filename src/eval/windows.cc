#include "src/eval/windows.h"

#include <algorithm>
#include <string>

#include "src/base/check.h"

namespace loom::eval {

StatusOr<Protocol> ParseProtocol(std::string_view name) {
  if (name == "hf-stride") return Protocol::kHfStride;
  if (name == "llama-cpp") return Protocol::kLlamaCpp;
  if (name == "all-tokens") return Protocol::kAllTokens;
  return InvalidArgumentError(
      "unknown protocol '" + std::string(name) +
      "' (expected hf-stride, llama-cpp or all-tokens)");
}

std::string_view ProtocolName(Protocol protocol) {
  switch (protocol) {
    case Protocol::kHfStride:
      return "hf-stride";
    case Protocol::kLlamaCpp:
      return "llama-cpp";
    case Protocol::kAllTokens:
      return "all-tokens";
  }
  return "?";
}

StatusOr<WindowPlan> PlanWindows(int64_t num_tokens,
                                 const WindowOptions& options) {
  const std::string name(ProtocolName(options.protocol));
  const int64_t n = num_tokens, ctx = options.ctx;
  if (ctx < 2)
    return InvalidArgumentError("ctx must be at least 2, got " +
                                std::to_string(ctx));
  if (options.max_windows < 0)
    return InvalidArgumentError("max_windows must be >= 0, got " +
                                std::to_string(options.max_windows));
  int64_t stride = options.stride;
  if (options.protocol == Protocol::kLlamaCpp) {
    if (stride != 0 && stride != ctx)
      return InvalidArgumentError(
          "protocol llama-cpp uses non-overlapping chunks: stride must equal "
          "ctx = " +
          std::to_string(ctx) + ", got " + std::to_string(stride));
    stride = ctx;
  } else if (stride == 0) {
    stride = ctx / 2;
  }
  if (stride < 1 || stride > ctx)
    return InvalidArgumentError(
        "stride must be in [1, ctx = " + std::to_string(ctx) + "], got " +
        std::to_string(stride));
  if (options.window_bos >= 0 && options.protocol != Protocol::kLlamaCpp)
    return InvalidArgumentError(
        "a per-window BOS belongs to protocol llama-cpp only, not " + name);
  // hf-stride scores a stream shorter than ctx as one window of its length,
  // as Hugging Face's strided recipe does (its first window is
  // ids[0:min(ctx, n)]); it needs two tokens to score one.
  if (options.protocol == Protocol::kHfStride && n < 2)
    return InvalidArgumentError(
        "the text has " + std::to_string(n) + (n == 1 ? " token" : " tokens") +
        ": nothing to score (protocol hf-stride scores every token after "
        "the first)");
  const bool need_more = options.protocol == Protocol::kAllTokens;
  if ((n < ctx && options.protocol != Protocol::kHfStride) ||
      (need_more && n == ctx))
    return InvalidArgumentError(
        "the text has " + std::to_string(n) + " tokens, " +
        (need_more ? "not more than" : "fewer than") +
        " one window of ctx = " + std::to_string(ctx) + " tokens (protocol " +
        name + "); use a smaller --ctx");

  WindowPlan plan;
  plan.protocol = options.protocol;
  plan.ctx = ctx;
  plan.stride = stride;
  plan.window_bos = options.window_bos;
  plan.num_tokens = n;
  const int64_t limit =
      options.max_windows > 0 ? options.max_windows : INT64_MAX;
  switch (options.protocol) {
    case Protocol::kHfStride: {
      int64_t prev_end = 0;
      for (int64_t b = 0; static_cast<int64_t>(plan.windows.size()) < limit;
           b += stride) {
        const int64_t e = std::min(b + ctx, n);
        plan.windows.push_back({b, e, std::max(prev_end, b + 1), e});
        prev_end = e;
        if (e == n) break;
      }
      break;
    }
    case Protocol::kLlamaCpp: {
      const int64_t first = ctx / 2;
      if (ctx - first - 1 < 1)
        return InvalidArgumentError(
            "protocol llama-cpp scores nothing with ctx = " +
            std::to_string(ctx) + "; use ctx >= 3");
      for (int64_t i = 0; i < n / ctx && i < limit; ++i) {
        const int64_t b = i * ctx;
        plan.windows.push_back({b, b + ctx, b + first + 1, b + ctx});
      }
      break;
    }
    case Protocol::kAllTokens: {
      for (int64_t a = 0;
           a < n - ctx && static_cast<int64_t>(plan.windows.size()) < limit;
           a += stride)
        plan.windows.push_back({a, a + ctx, a + 1, a + ctx});
      break;
    }
  }
  for (const Window& w : plan.windows) {
    LOOM_CHECK(w.begin >= 0 && w.end <= n && w.score_begin > w.begin &&
               w.score_end <= w.end && w.scored() > 0);
    plan.tokens_scored += w.scored();
    plan.tokens_evaluated += w.length();
    plan.max_window_tokens = std::max(plan.max_window_tokens, w.length());
    plan.max_window_scored = std::max(plan.max_window_scored, w.scored());
  }
  return plan;
}

std::span<const int32_t> WindowIds(const WindowPlan& plan, const Window& w,
                                   std::span<const int32_t> ids,
                                   std::span<int32_t> out) {
  LOOM_CHECK(static_cast<int64_t>(out.size()) >= w.length() &&
             w.end <= static_cast<int64_t>(ids.size()));
  std::copy(ids.begin() + w.begin, ids.begin() + w.end, out.begin());
  if (plan.window_bos >= 0) out[0] = plan.window_bos;
  return out.first(w.length());
}

}  // namespace loom::eval
