// The forward side of an extraction, shared by `loom extract` (rows from a
// file, arrays to files) and the Python module (rows from a list, arrays in
// memory): the session's row preparer, and the
// WindowRunner that runs a window of prepared rows through the executor into
// an OutputSet's staging (token-budget batches, then the rows longer than a
// batch streamed chunk by chunk through a KV cache).
#ifndef LOOM_EVAL_EXTRACT_RUN_H_
#define LOOM_EVAL_EXTRACT_RUN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/eval/extract.h"
#include "src/eval/extract_derived_runner.h"
#include "src/eval/extract_outputs.h"
#include "src/eval/extract_rows.h"
#include "src/eval/extract_settings.h"
#include "src/eval/job_plan.h"
#include "src/eval/session.h"
#include "src/runtime/backward.h"
#include "src/runtime/executor.h"
#include "src/runtime/kv_cache.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"

namespace loom {

// The default batch budget for a short input (--batch-tokens not given, no
// streaming, an input file of at most kShortInputBytes): the total tokens of
// its rows rounded up to 64, when every row is valid under the default
// budget, so that a handful of prompts does not plan (and touch) arenas for
// 4096 tokens. Otherwise (or when the input cannot be read here: the run
// reports that) s.batch_tokens unchanged. Reads and tokenizes the input once
// (`tokenizer` may be null: then `tokenizer_error` is why).
inline constexpr int64_t kShortInputBytes = 64 << 10;
int64_t ShortInputBatchTokens(const ExtractOptions& o, const ExtractSettings& s,
                              const tok::Tokenizer* tokenizer,
                              const std::string& tokenizer_error);
// The same rule for rows given in memory (the Python module's extract):
// rows of at most kShortInputBytes of text and token ids (4 bytes each) get
// their own tokens' budget, so that a call and `loom extract` on the same
// prompts plan (and shape attn.hook_pattern rows) alike.
int64_t ShortRowsBatchTokens(const ExtractOptions& o, const ExtractSettings& s,
                             std::span<const InputRow> rows,
                             const tok::Tokenizer* tokenizer,
                             const std::string& tokenizer_error);

// Refuses interventions that would edit nothing in this extraction
// (CheckInterventionsApply): `rows` past the input's rows (counted from the
// input file only when some intervention lists rows; an unreadable input
// is reported later, by name), apply_to "generated".
Status CheckExtractInterventions(const ExtractOptions& o,
                                 const std::vector<Intervention>& list);

// settings.batch_tokens of the manifest in `out_dir`; 0 if there is none.
int64_t RecordedBatchTokens(const std::string& out_dir);

// The row preparer of a job (borrows the tokenizer and the selectors), for
// the model whose config is `c`; `tokenizer` may be null (then
// `tokenizer_error` is why).
RowPreparer MakeRowPreparer(const ExtractOptions& o, const ExtractSettings& s,
                            const ModelConfig& c,
                            const tok::Tokenizer* tokenizer,
                            const std::string& tokenizer_error);
RowPreparer MakeRowPreparer(const ExtractOptions& o, const ExtractSettings& s,
                            const Session& session);

// --streaming-chunk-size before anything is loaded: the cache lives on one
// device whose backend has attention over a KV cache.
Status CheckStreamingBackends(const std::vector<ExecutorSegment>& segments);

// Everything the job's forwards touch, created once before the first one:
// the executor (arenas for batch_tokens tokens), the sink with its device
// staging, and for streamed rows the KV cache of one sequence.
class WindowRunner {
 public:
  // `outputs` and `model` are borrowed and must outlive the runner.
  static StatusOr<std::unique_ptr<WindowRunner>> Create(
      const ExtractSettings& s, bool hf_bf16_activations, const Model& model,
      const std::vector<ExecutorSegment>& segments, OutputSet* outputs);
  ~WindowRunner();

  // Runs the window's batches (and its streamed rows) into the outputs'
  // staging (--grad-of: each row alone through the backward) and finishes it
  // (OutputSet::FinishWindow); adds the tokens run. `cancelled`, when set, is
  // asked before every forward: true ends the window with Cancelled (the
  // staging is then incomplete).
  Status Run(const std::vector<PreparedRow>& window, int64_t* tokens,
             const std::function<bool()>& cancelled = nullptr);

 private:
  struct Streamer;
  class GradCapture;
  WindowRunner() = default;
  // --grad-of: `r` gets the backward (and no executor).
  static StatusOr<std::unique_ptr<WindowRunner>> CreateBackward(
      const ExtractSettings& s, const Model& model,
      std::unique_ptr<WindowRunner> r, OutputSet* outputs);
  // --grad-of: every valid row of the window through the backward.
  Status RunBackward(const std::vector<PreparedRow>& window, int64_t* tokens,
                     const std::function<bool()>& cancelled);
  Status StreamRow(const std::vector<PreparedRow>& window, int64_t slot,
                   int64_t* tokens, const std::function<bool()>& cancelled);

  // The edits of the batch in progress: the interventions of each of its
  // rows (capacity reserved once per window).
  void CollectEdits(const std::vector<PreparedRow>& window,
                    const std::vector<int64_t>& slots);

  int64_t batch_tokens_ = 0;
  OutputSet* outputs_ = nullptr;
  const std::vector<Intervention>* interventions_ = nullptr;
  std::vector<SequenceEdit> edits_;
  std::unique_ptr<Executor> ex_;
  std::unique_ptr<DerivedRunner> derived_;  // --sae / --lens; null: none
  std::unique_ptr<ExtractSink> sink_;
  std::unique_ptr<Streamer> streamer_;
  // --grad-of: the backward (instead of ex_) and its metric.
  std::unique_ptr<Backward> backward_;
  std::unique_ptr<GradCapture> grads_;
  GradMetric metric_;
};

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_RUN_H_
