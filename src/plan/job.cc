#include "src/plan/job.h"

#include <string>

namespace loom {

std::string_view JobModeName(JobMode m) {
  return m == JobMode::kAnalysis ? "analysis" : "generation";
}

std::string_view SelectorName(Selector s) {
  switch (s) {
    case Selector::kAll:
      return "all";
    case Selector::kLast:
      return "last";
    case Selector::kMean:
      return "mean";
  }
  return "?";
}

StatusOr<JobMode> ParseJobMode(std::string_view s) {
  if (s == "analysis") return JobMode::kAnalysis;
  if (s == "generation") return JobMode::kGeneration;
  return InvalidArgumentError("--mode '" + std::string(s) +
                              "': expected analysis or generation");
}

StatusOr<Selector> ParseSelector(std::string_view s) {
  if (s == "all") return Selector::kAll;
  if (s == "last") return Selector::kLast;
  if (s == "mean") return Selector::kMean;
  return InvalidArgumentError("--select '" + std::string(s) +
                              "': expected all, last or mean");
}

StatusOr<CaptureTarget> ParseCaptureTarget(std::string_view s) {
  if (s == "host") return CaptureTarget::kHost;
  if (s == "device") return CaptureTarget::kDevice;
  return InvalidArgumentError("--capture-to '" + std::string(s) +
                              "': expected host or device");
}

StatusOr<int64_t> CaptureBytes(const ModelConfig& c, const JobSpec& job,
                               const HookPoint& hook) {
  const int64_t T = job.batch_tokens, S = job.Seqs();
  const int64_t elem = DTypeSize(job.capture_dtype);
  // attn.hook_pattern: one [heads, MaxSeqLen] row per query token.
  ASSIGN_OR_RETURN(const int64_t cols, HookWidth(hook, c, job.MaxSeqLen()));
  const int64_t rows = job.selector == Selector::kAll ? T : S;
  return rows * cols * elem;
}

Status ValidateJob(const ModelConfig& c, const JobSpec& job) {
  if (job.batch_tokens <= 0)
    return InvalidArgumentError(
        "--batch-tokens = " + std::to_string(job.batch_tokens) +
        ", expected > 0");
  if (job.context <= 0)
    return InvalidArgumentError("--ctx = " + std::to_string(job.context) +
                                ", expected > 0");
  if (job.context > c.max_position_embeddings)
    return InvalidArgumentError("--ctx = " + std::to_string(job.context) +
                                " exceeds max_position_embeddings = " +
                                std::to_string(c.max_position_embeddings) +
                                " of " + c.model_type);
  if (job.kv_context < 0 ||
      (job.kv_context > 0 && job.mode == JobMode::kGeneration))
    return InvalidArgumentError(
        "kv context = " + std::to_string(job.kv_context) +
        ", expected >= 0 (and 0 for generation, whose --ctx sizes the cache)");
  if (job.kv_context > c.max_position_embeddings)
    return InvalidArgumentError(
        "kv context = " + std::to_string(job.kv_context) +
        " exceeds max_position_embeddings = " +
        std::to_string(c.max_position_embeddings) + " of " + c.model_type);
  if (job.logits_chunk_rows <= 0)
    return InvalidArgumentError(
        "logits chunk = " + std::to_string(job.logits_chunk_rows) +
        " rows, expected > 0");
  if (job.capture_buffers <= 0)
    return InvalidArgumentError(
        "capture buffers = " + std::to_string(job.capture_buffers) +
        ", expected > 0");
  if (job.seqs_per_batch < 0 || job.seqs_per_batch > job.batch_tokens)
    return InvalidArgumentError(
        "sequences per batch = " + std::to_string(job.seqs_per_batch) +
        ", expected in [0, batch tokens = " + std::to_string(job.batch_tokens) +
        "]");
  if (job.kv_page_size < 0 || job.kv_pages < 0 ||
      (job.kv_page_size > 0) != (job.kv_pages > 0))
    return InvalidArgumentError(
        "kv paging: page size " + std::to_string(job.kv_page_size) +
        " and pages " + std::to_string(job.kv_pages) +
        ", expected both > 0 (paged) or both 0 (contiguous)");
  for (const HookPoint& h : job.hooks.hooks()) {
    RETURN_IF_ERROR(CheckHookExists(h, c));
    RETURN_IF_ERROR(CaptureBytes(c, job, h).status());
  }
  for (const HookPoint& h : job.tapped_hooks.hooks())
    RETURN_IF_ERROR(CheckHookExists(h, c));
  return Status();
}

}  // namespace loom
