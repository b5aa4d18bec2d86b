// Evaluation protocols: which windows of a token stream are run through the
// model and which of their tokens are scored. docs/eval/perplexity.md
// specifies each protocol exactly; PlanWindows is the one implementation.
//
// A window is a fresh forward of ids[begin, end) from position 0 (no cache).
// A scored position t in [score_begin, score_end) contributes
// log p(ids[t] | window tokens before t), read from logits row t - begin - 1.
#ifndef LOOM_EVAL_WINDOWS_H_
#define LOOM_EVAL_WINDOWS_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace loom::eval {

enum class Protocol {
  kHfStride,   // Hugging Face's strided recipe: every token scored once
  kLlamaCpp,   // llama-perplexity: non-overlapping chunks, second half scored
  kAllTokens,  // exllamav3 compare_q: full windows every stride, all tokens
               // scored
};

// "hf-stride", "llama-cpp", "all-tokens".
StatusOr<Protocol> ParseProtocol(std::string_view name);
std::string_view ProtocolName(Protocol protocol);

struct Window {
  int64_t begin = 0, end = 0;              // tokens [begin, end) of the stream
  int64_t score_begin = 0, score_end = 0;  // scored absolute positions
  int64_t length() const { return end - begin; }
  int64_t scored() const { return score_end - score_begin; }
};

struct WindowOptions {
  Protocol protocol = Protocol::kHfStride;
  int64_t ctx = 0;     // window length, >= 2
  int64_t stride = 0;  // 0 = the protocol's default (ctx / 2; llama-cpp: ctx)
  int64_t max_windows = 0;  // 0 = all
  // llama-cpp only: the first token of every window is replaced by this id
  // (llama-perplexity with a BOS-adding vocabulary); -1 = no replacement.
  int32_t window_bos = -1;
};

struct WindowPlan {
  Protocol protocol = Protocol::kHfStride;
  int64_t ctx = 0;
  int64_t stride = 0;
  int32_t window_bos = -1;
  int64_t num_tokens = 0;  // length of the stream
  std::vector<Window> windows;
  int64_t tokens_scored = 0;     // sum of scored() (overlaps counted again)
  int64_t tokens_evaluated = 0;  // sum of length()
  int64_t max_window_tokens = 0;
  int64_t max_window_scored = 0;
};

// Plans the windows over a stream of `num_tokens` tokens. A stream shorter
// than ctx is one window of its length under hf-stride (as Hugging Face's
// recipe). Errors: ctx < 2, stride outside [1, ctx], a stride other than ctx
// for llama-cpp, and a stream too short (hf-stride needs >= 2 tokens,
// llama-cpp >= ctx, all-tokens > ctx).
StatusOr<WindowPlan> PlanWindows(int64_t num_tokens,
                                 const WindowOptions& options);

// Copies window `w` of `ids` into `out` (at least w.length() ids), applying the
// plan's BOS replacement. Returns the span written.
std::span<const int32_t> WindowIds(const WindowPlan& plan, const Window& w,
                                   std::span<const int32_t> ids,
                                   std::span<int32_t> out);

}  // namespace loom::eval

#endif  // LOOM_EVAL_WINDOWS_H_
