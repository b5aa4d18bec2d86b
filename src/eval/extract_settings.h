// The settings of an extraction job, parsed once: enums for the choices the
// CLI spells as words (output format, on-error policy, --add-bos, --dtype),
// and the resolved job (hooks, selectors, token budget) checked from
// config.json before anything is planned or loaded.
#ifndef LOOM_EVAL_EXTRACT_SETTINGS_H_
#define LOOM_EVAL_EXTRACT_SETTINGS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/eval/extract_derived.h"
#include "src/eval/input.h"
#include "src/eval/params.h"
#include "src/eval/row_selector.h"
#include "src/model/config.h"
#include "src/model/hooks.h"
#include "src/model/interventions.h"
#include "src/plan/job.h"
#include "src/runtime/backward.h"

namespace loom {

struct ExtractOptions;  // src/eval/extract.h

// --format npy|safetensors. kMemory (not accepted by --format): the arrays
// are kept in memory, appended per window (the Python module's extract).
enum class OutputFormat { kNpy, kSafetensors, kMemory };
StatusOr<OutputFormat> ParseOutputFormat(std::string_view text);
std::string_view OutputFormatName(OutputFormat format);

// --on-error fail|skip.
enum class OnError { kFail, kSkip };
StatusOr<OnError> ParseOnError(std::string_view text);
std::string_view OnErrorName(OnError policy);

// --add-bos auto|yes|no (the enum is eval::AddBos, shared with perplexity).
std::string_view AddBosName(eval::AddBos add_bos);

// The extract-rows parameters (src/eval/params.h) into `job`: the words
// parsed (add_bos, on_error), the numbers as they are.
Status ApplyRowParams(const eval::ExtractRowParams& p, ExtractOptions* job);

// --grad-of METRIC with --answer / --wrong (`grad_of=`, `answer=`, `wrong=`
// in Python; -1 = not given; an empty metric = no gradients): logit-diff
// needs both token ids, logprob takes none, and neither is given without
// a metric. nullopt without --grad-of.
StatusOr<std::optional<GradMetric>> ParseGradOf(std::string_view metric,
                                                int64_t answer, int64_t wrong);

// --dtype f32|bf16|f16 (the output dtype of the arrays).
StatusOr<DType> ParseOutputDType(std::string_view text);

// The job as resolved from the options and config.json.
struct ExtractSettings {
  ModelConfig config;
  HookSet hooks;  // deduplicated, in layer order
  // --sae / --lens and the outputs computed from them (extract_derived.h),
  // each an array like a hook's; `delivered`: the hooks the forward
  // delivers, `hooks` and the derived outputs' sources.
  Analyses analyses;
  std::vector<DerivedHook> derived;
  HookSet delivered;
  // HookName of each hook, same order, then each derived output's name.
  std::vector<std::string> hook_names;
  std::vector<RowSelector> selectors;  // as given, distinct file names
  // --intervene: the edits of every forward (those of a row apply to it).
  std::vector<Intervention> interventions;
  // --grad-of: the metric of every row's backward (its HOOK.grad outputs
  // are the derived outputs that are gradient()).
  std::optional<GradMetric> grad_of;
  int64_t batch_tokens = 0;   // resolved --batch-tokens
  int64_t max_positions = 0;  // the model's max_position_embeddings
  // --streaming-chunk-size (0 = off) and the resolved --max-row-tokens (0
  // when off): rows of batch_tokens < n <= max_row_tokens tokens are
  // prefilled in chunks through a KV cache of one sequence of
  // max_row_tokens positions.
  int64_t streaming_chunk_size = 0;
  int64_t max_row_tokens = 0;
  bool streaming() const { return streaming_chunk_size > 0; }
  // Key positions of one attn.hook_pattern row: the longest sequence a
  // batch holds (rows are [heads, pattern_keys()], zero past the row).
  int64_t pattern_keys() const {
    return batch_tokens < max_positions ? batch_tokens : max_positions;
  }
};

// --max-row-tokens when not given: the model's max_position_embeddings,
// capped at this (it sizes the KV cache of streamed rows).
inline constexpr int64_t kDefaultMaxRowTokens = 32768;

// Checks the options and resolves hooks, selectors and the token budget
// against the model's config; InvalidArgument (or the hook resolver's code)
// naming the bad option. `interventions` (the session's, checked against the
// config) are kept for the forwards.
StatusOr<ExtractSettings> ResolveExtractSettings(
    const ExtractOptions& options, const ModelConfig& config,
    std::vector<Intervention> interventions);

// The job the planner sizes: `planned_compute` is the compute dtype the
// weights will be run at.
JobSpec ExtractJobSpec(const ExtractOptions& options,
                       const ExtractSettings& settings, DType planned_compute);

// manifest.json's "settings": everything a --resume must find unchanged.
// `config_sha256` is config.json's hash; IoError if the model path cannot be
// made absolute.
StatusOr<nlohmann::json> SettingsJson(const ExtractOptions& options,
                                      const ExtractSettings& settings,
                                      const std::string& config_sha256,
                                      DType compute_dtype, DType output_dtype);

// `path` made absolute and normalised (as recorded in the manifest); IoError
// if the working directory cannot be read.
StatusOr<std::string> AbsolutePath(const std::string& path);

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_SETTINGS_H_
