// Comparison of a model A (e.g. quantized or modified) with a reference B
// over the same token windows: KL(B || A) per scored token and llama.cpp's
// summary statistics, and optionally per-layer drift of the residual stream.
//
// No logits file: for every window B runs, then A; each keeps only its
// final-norm rows [T, hidden]. Logits of both are then computed for the same
// chunk of scored rows (two [chunk, vocab] buffers) and reduced to per-token
// statistics before the next chunk, so memory is O(ctx x hidden + chunk x
// vocab). With drift, B's hook_resid_post of every layer is kept for the
// window ([layers, T, hidden]) and A's is reduced against it as it arrives.
#ifndef LOOM_EVAL_COMPARE_H_
#define LOOM_EVAL_COMPARE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/eval/perplexity.h"
#include "src/eval/windows.h"
#include "src/runtime/model.h"

namespace loom::eval {

// A mean with its standard error (llama.cpp's "value ± uncertainty").
struct Estimate {
  double value = 0;
  double uncertainty = 0;
};

// Divergence of A's hook_resid_post from B's at one layer, over every token
// of every window (exllamav3 model_diff): ||A - B||_F / ||B||_F, the cosine
// of the flattened tensors, and SQNR = 10 log10(||B||^2 / ||A - B||^2) dB
// (+inf when identical).
struct LayerDrift {
  int64_t layer = 0;
  double rel_frobenius = 0;
  double cosine = 0;
  double sqnr_db = 0;
};

// EvalOptions::segments places the candidate A; reference_segments the
// reference B (each its own backends). The forwards run where they are
// placed; the rows the comparison reads (final norm, and each layer's
// residual stream with drift) are copied to the host, where both heads and
// the statistics run.
struct CompareOptions : EvalOptions {
  std::vector<ExecutorSegment> reference_segments;
  bool drift = false;
  // With a directory: the reference's top_k log-probs and the log-prob of
  // the correct token, per scored token, are written there (see
  // docs/eval/perplexity.md) so later runs can compare against them without
  // running the reference (CompareWithSavedReference).
  std::string save_reference_dir;
  int64_t top_k = 32;
};

struct CompareResult {
  Protocol protocol = Protocol::kHfStride;
  int64_t ctx = 0, stride = 0, windows = 0;
  int64_t tokens_scored = 0, tokens_evaluated = 0;
  double seconds = 0;
  double ppl_a = 0, ppl_b = 0;
  double nll_mean_a = 0, nll_mean_b = 0;
  Estimate kl;  // mean KL(B || A) in nats per token
  double kl_median = 0, kl_p90 = 0, kl_p95 = 0, kl_p99 = 0, kl_max = 0;
  Estimate ln_ppl_ratio;    // ln(PPL_A / PPL_B) = mean(nll_A - nll_B)
  Estimate ppl_diff;        // PPL_A - PPL_B
  Estimate same_top1;       // fraction of tokens where argmax A == argmax B
  Estimate delta_p;         // mean of p_A(correct) - p_B(correct)
  Estimate rms_delta_p;     // sqrt(mean((p_A - p_B)^2)) of the correct token
  double prob_pearson = 0;  // Pearson r of p_A(correct) and p_B(correct)
  std::vector<LayerDrift> drift;
  int64_t eval_bytes =
      0;  // buffers of the comparison, both executors' arenas included
  // With keep_token_logprobs: per scored token, KL(B || A) (plan order).
  std::vector<double> token_kl;
};

// Errors: different vocabularies (or, with drift, different layer count or
// hidden size), a plan the models cannot run.
StatusOr<CompareResult> CompareModels(const Model& a, const Model& b,
                                      std::span<const int32_t> ids,
                                      const WindowPlan& plan,
                                      const CompareOptions& options);

// Compares `a` with a reference saved by CompareModels' save_reference_dir,
// over the same ids and windows (checked). KL(B || A) is then computed over the
// saved top-k tokens plus one bucket holding the rest of each distribution:
// a lower bound of the full KL (merging outcomes never increases KL), exact
// when the top-k hold all of B's mass. Drift needs the live reference.
StatusOr<CompareResult> CompareWithSavedReference(
    const Model& a, std::span<const int32_t> ids, const WindowPlan& plan,
    const std::string& reference_dir, const CompareOptions& options);

// Linear-interpolated percentile of sorted values (llama.cpp's definition).
double Percentile(std::span<const double> sorted, double fraction);

// A live comparison's models must read token ids alike: the tokenizers in
// `model_dir` and `reference_dir` must hold the same token at every id
// (special tokens included). FailedPrecondition naming the first id that
// differs (or the vocabulary sizes), or the directory whose tokenizer does
// not load, with the way out: `--same-tokens` with `--tokens` ids when the
// user knows the ids agree.
Status CheckSameTokenizer(const std::string& model_dir,
                          const std::string& reference_dir);

}  // namespace loom::eval

#endif  // LOOM_EVAL_COMPARE_H_
