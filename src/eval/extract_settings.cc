#include "src/eval/extract_settings.h"

#include <algorithm>
#include <filesystem>

#include "src/eval/extract.h"

namespace loom {
namespace {

using Json = nlohmann::json;

Status CheckPlainOptions(const ExtractOptions& o) {
  if (o.commit_every <= 0)
    return InvalidArgumentError("--commit-every must be > 0");
  if (!o.template_text.empty() &&
      o.template_text.find("{text}") == std::string::npos)
    return InvalidArgumentError("--template '" + o.template_text +
                                "' has no {text} placeholder");
  if (o.dtype && !IsComputeDType(*o.dtype))
    return InvalidArgumentError("--dtype '" + std::string(DTypeName(*o.dtype)) +
                                "': expected f32, bf16 or f16");
  if (o.grad_of) {
    if (o.precision != Precision::kAuto && o.precision != Precision::kF32)
      return InvalidArgumentError(
          "--grad-of: gradients run at f32; give --precision f32 (or leave "
          "it auto), not a 16-bit precision");
    if (o.streaming_chunk_size > 0)
      return UnimplementedError(
          "--grad-of with --streaming-chunk-size: a row's backward runs in "
          "one pass (raise --batch-tokens instead)");
    if (!o.interventions_file.empty() || !o.interventions_json.empty() ||
        !o.control_vectors.empty())
      return UnimplementedError(
          "--grad-of with interventions or control vectors: the backward "
          "runs the unedited model");
  }
  return Status();
}

StatusOr<std::vector<RowSelector>> ParseSelectors(
    const std::vector<std::string>& specs) {
  std::vector<RowSelector> selectors;
  for (const std::string& s : specs) {
    ASSIGN_OR_RETURN(RowSelector sel, ParseRowSelector(s));
    for (const auto& prev : selectors)
      if (prev.file_name == sel.file_name)
        return InvalidArgumentError("selector '" + s + "' given twice");
    selectors.push_back(std::move(sel));
  }
  if (selectors.empty()) return InvalidArgumentError("no selectors (--select)");
  return selectors;
}

// --streaming-chunk-size / --max-row-tokens against the resolved batch
// budget; fills s->streaming_chunk_size and s->max_row_tokens.
Status ResolveStreaming(const ExtractOptions& o, ExtractSettings* s) {
  if (o.streaming_chunk_size < 0)
    return InvalidArgumentError(
        "--streaming-chunk-size must be >= 0 (0 = off), "
        "got " +
        std::to_string(o.streaming_chunk_size));
  if (o.max_row_tokens < 0)
    return InvalidArgumentError("--max-row-tokens must be > 0, got " +
                                std::to_string(o.max_row_tokens));
  if (o.streaming_chunk_size == 0) {
    if (o.max_row_tokens > 0)
      return InvalidArgumentError(
          "--max-row-tokens needs --streaming-chunk-size (it is the longest "
          "row streamed through the KV cache)");
    return Status();
  }
  if (o.streaming_chunk_size > s->batch_tokens)
    return InvalidArgumentError(
        "--streaming-chunk-size " + std::to_string(o.streaming_chunk_size) +
        " exceeds --batch-tokens " + std::to_string(s->batch_tokens) +
        " (a chunk is one forward)");
  const int64_t m = o.max_row_tokens > 0
                        ? o.max_row_tokens
                        : std::min(kDefaultMaxRowTokens, s->max_positions);
  if (m > s->max_positions)
    return InvalidArgumentError(
        "--max-row-tokens " + std::to_string(m) +
        " exceeds the model's max_position_embeddings " +
        std::to_string(s->max_positions));
  if (m < std::min(s->batch_tokens, s->max_positions))
    return InvalidArgumentError(
        "--max-row-tokens " + std::to_string(m) + " is below --batch-tokens " +
        std::to_string(s->batch_tokens) +
        " (rows up to --batch-tokens run in one pass; streaming is for longer "
        "ones)");
  s->streaming_chunk_size = o.streaming_chunk_size;
  s->max_row_tokens = m;
  return Status();
}

}  // namespace

StatusOr<std::string> AbsolutePath(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) return IoError(path + ": cannot make absolute: " + ec.message());
  return p.lexically_normal().string();
}

StatusOr<OutputFormat> ParseOutputFormat(std::string_view text) {
  if (text == "npy") return OutputFormat::kNpy;
  if (text == "safetensors") return OutputFormat::kSafetensors;
  return InvalidArgumentError("--format '" + std::string(text) +
                              "': expected npy or safetensors");
}

std::string_view OutputFormatName(OutputFormat format) {
  switch (format) {
    case OutputFormat::kNpy:
      return "npy";
    case OutputFormat::kSafetensors:
      return "safetensors";
    case OutputFormat::kMemory:
      return "memory";
  }
  return "?";
}

StatusOr<OnError> ParseOnError(std::string_view text) {
  if (text == "fail") return OnError::kFail;
  if (text == "skip") return OnError::kSkip;
  return InvalidArgumentError("--on-error '" + std::string(text) +
                              "': expected fail or skip");
}

Status ApplyRowParams(const eval::ExtractRowParams& p, ExtractOptions* job) {
  ASSIGN_OR_RETURN(job->add_bos, eval::ParseAddBos(p.add_bos));
  ASSIGN_OR_RETURN(job->on_error, ParseOnError(p.on_error));
  job->batch_tokens = p.batch_tokens;
  job->commit_every = p.commit_every;
  job->streaming_chunk_size = p.streaming_chunk_size;
  job->max_row_tokens = p.max_row_tokens;
  return Status();
}

std::string_view OnErrorName(OnError policy) {
  return policy == OnError::kFail ? "fail" : "skip";
}

std::string_view AddBosName(eval::AddBos add_bos) {
  switch (add_bos) {
    case eval::AddBos::kAuto:
      return "auto";
    case eval::AddBos::kYes:
      return "yes";
    case eval::AddBos::kNo:
      return "no";
  }
  return "?";
}

StatusOr<std::optional<GradMetric>> ParseGradOf(std::string_view metric,
                                                int64_t answer, int64_t wrong) {
  const bool tokens = answer >= 0 || wrong >= 0;
  if (metric.empty()) {
    if (tokens)
      return InvalidArgumentError(
          "--answer / --wrong: only with --grad-of logit-diff");
    return std::optional<GradMetric>();
  }
  GradMetric m;
  ASSIGN_OR_RETURN(m.kind, ParseGradMetric(metric, "--grad-of"));
  if (m.kind == GradMetricKind::kLogitDiff) {
    if (answer < 0 || wrong < 0)
      return InvalidArgumentError(
          "--grad-of logit-diff: give --answer A and --wrong B (token ids; "
          "the metric is logits[last, A] - logits[last, B] of each row)");
    m.answer = static_cast<int32_t>(answer);
    m.wrong = static_cast<int32_t>(wrong);
  } else if (tokens) {
    return InvalidArgumentError(
        "--answer / --wrong: --grad-of logprob (the row's log-likelihood) "
        "takes no answer tokens");
  }
  return std::optional<GradMetric>(m);
}

StatusOr<DType> ParseOutputDType(std::string_view text) {
  const std::optional<DType> d = ParseDType(text);
  if (!d || !IsComputeDType(*d))
    return InvalidArgumentError("--dtype '" + std::string(text) +
                                "': expected f32, bf16 or f16");
  return *d;
}

// --hooks (plain hooks and derived outputs), --sae and --lens into `s`.
Status ResolveCapture(const ExtractOptions& o, ExtractSettings* s) {
  ASSIGN_OR_RETURN(s->analyses, LoadAnalyses(o.analysis, s->config));
  s->analyses.gradients = o.grad_of.has_value();
  s->grad_of = o.grad_of;
  if (o.grad_of && o.grad_of->kind == GradMetricKind::kLogitDiff)
    for (const auto& [flag, id] : {std::pair("--answer", o.grad_of->answer),
                                   {"--wrong", o.grad_of->wrong}})
      if (id < 0 || id >= s->config.vocab_size)
        return InvalidArgumentError(
            std::string(flag) + " " + std::to_string(id) +
            " is outside the vocabulary (0.." +
            std::to_string(s->config.vocab_size - 1) + ")");
  std::vector<std::string> plain;
  std::vector<DerivedItem> items;
  SplitDerivedItems(o.hooks, &plain, &items);
  const int64_t dashboard = s->analyses.dashboard;
  if (dashboard > 0 && (!o.shard.whole() || o.format == OutputFormat::kMemory))
    return UnimplementedError(
        "--sae-dashboard: written by one `loom extract` process into its "
        "--out (not with --shard, whose outputs `loom merge` joins, nor in "
        "memory)");
  if (!plain.empty() || (items.empty() && dashboard == 0)) {
    ASSIGN_OR_RETURN(s->hooks, ResolveExtractHooks(plain, o.layers, s->config,
                                                   o.streaming_chunk_size > 0));
  }
  ASSIGN_OR_RETURN(
      s->derived, ResolveDerivedHooks(items, s->hooks, s->analyses, s->config));
  s->delivered = s->hooks;
  for (const HookPoint& hp : s->hooks.hooks())
    s->hook_names.push_back(HookName(hp));
  for (const DerivedHook& d : s->derived) {
    if (!d.gradient()) s->delivered.Add(d.source);
    s->hook_names.push_back(d.name);
  }
  if (dashboard > 0)
    for (const HookPoint& h : s->analyses.sae_hooks) s->delivered.Add(h);
  return Status();
}

StatusOr<ExtractSettings> ResolveExtractSettings(
    const ExtractOptions& o, const ModelConfig& config,
    std::vector<Intervention> interventions) {
  RETURN_IF_ERROR(CheckPlainOptions(o));
  ExtractSettings s;
  s.config = config;
  RETURN_IF_ERROR(ResolveCapture(o, &s));
  ASSIGN_OR_RETURN(s.selectors, ParseSelectors(o.selectors));
  for (const DerivedHook& d : s.derived)
    for (const RowSelector& sel : s.selectors)
      if (d.integer() && sel.reduced())
        return InvalidArgumentError("--select " + sel.spec + ": " + d.name +
                                    " holds indices, which have no " +
                                    sel.spec);
  s.interventions = std::move(interventions);
  s.max_positions = s.config.max_position_embeddings;
  s.batch_tokens = o.batch_tokens > 0
                       ? o.batch_tokens
                       : std::min<int64_t>(4096, s.max_positions);
  RETURN_IF_ERROR(ResolveStreaming(o, &s));
  return s;
}

JobSpec ExtractJobSpec(const ExtractOptions& o, const ExtractSettings& s,
                       DType planned_compute) {
  JobSpec job;
  job.batch_tokens = s.batch_tokens;
  job.context = std::min(s.batch_tokens, s.max_positions);
  job.hooks = s.delivered;
  job.capture_dtype = o.dtype.value_or(planned_compute);
  job.selector = Selector::kLast;
  for (const RowSelector& sel : s.selectors) {
    if (sel.ragged())
      job.selector = Selector::kAll;
    else if (sel.reduced() && job.selector != Selector::kAll)
      job.selector = Selector::kMean;
  }
  // Staging holds a commit window.
  job.seqs_per_batch = std::min(o.commit_every, job.batch_tokens);
  job.weight_compute_dtype = planned_compute;
  job.intervention_bytes = InterventionBytes(s.interventions);
  const bool analyses =
      s.analyses.dashboard > 0 ||
      std::any_of(s.derived.begin(), s.derived.end(),
                  [](const DerivedHook& d) { return !d.gradient(); });
  if (analyses)
    job.analysis_bytes = DerivedBytes(s.analyses, s.derived, s.config);
  // --grad-of: each row alone through the backward's forward (every layer
  // boundary and the logits kept) and its own buffers.
  if (s.grad_of) {
    job.tapped_hooks = BackwardTappedHooks(s.config, job.hooks);
    job.logits = true;
    job.logits_chunk_rows = std::min<int64_t>(256, s.batch_tokens);
    job.backward_bytes =
        PlannedBackwardBytes(s.config, s.batch_tokens, job.logits_chunk_rows);
    // The HOOK.grad arrays' staging, as a captured hook's.
    const int64_t rows =
        job.selector == Selector::kAll ? job.batch_tokens : job.Seqs();
    for (const DerivedHook& d : s.derived)
      if (d.gradient())
        job.backward_bytes += rows * d.width * DTypeSize(job.capture_dtype);
  }
  // Streamed long rows: one KV cache of one sequence of the longest row
  // (its dtype: the backend's activations', the planner's default).
  if (s.streaming()) {
    job.kv_context = s.max_row_tokens;
    job.kv_seqs = 1;
  }
  return job;
}

StatusOr<Json> SettingsJson(const ExtractOptions& o, const ExtractSettings& s,
                            const std::string& config_sha256,
                            DType compute_dtype, DType output_dtype) {
  ASSIGN_OR_RETURN(std::string model_path, AbsolutePath(o.model_dir));
  std::vector<std::string> selector_specs;
  for (const auto& sel : s.selectors) selector_specs.push_back(sel.spec);
  const ModelConfig& c = s.config;
  Json settings{
      {"model",
       {{"path", model_path},
        {"config_sha256", config_sha256},
        {"model_type", c.model_type},
        {"architecture", c.architecture},
        {"num_layers", c.num_layers},
        {"hidden_size", c.hidden_size}}},
      {"compute_dtype", std::string(DTypeLongName(compute_dtype))},
      {"output_dtype", std::string(DTypeLongName(output_dtype))},
      {"hooks", s.hook_names},
      {"selectors", selector_specs},
      {"template", o.template_text},
      {"add_bos", std::string(AddBosName(o.add_bos))},
      {"batch_tokens", s.batch_tokens},
      {"commit_every", o.commit_every},
      {"on_error", std::string(OnErrorName(o.on_error))},
      {"format", std::string(OutputFormatName(o.format))},
      {"shard", o.shard.ToString()},
      {"hf_bf16_activations", o.hf_bf16_activations},
      {"streaming_chunk_size", s.streaming_chunk_size},
      {"max_row_tokens", s.max_row_tokens},
  };
  // Only when given, so that a manifest written before interventions existed
  // resumes unchanged.
  if (!s.interventions.empty())
    settings["interventions"] = InterventionsJson(s.interventions);
  if (!s.analyses.empty())
    settings["analyses"] = {{"sae", o.analysis.sae},
                            {"sae_topk", o.analysis.sae_topk},
                            {"lens", o.analysis.lens},
                            {"lens_topk", o.analysis.lens_topk}};
  if (s.analyses.dashboard > 0)
    settings["analyses"]["sae_dashboard"] = s.analyses.dashboard;
  if (s.grad_of) {
    settings["grad_of"] = {{"metric", GradMetricName(s.grad_of->kind)}};
    if (s.grad_of->kind == GradMetricKind::kLogitDiff) {
      settings["grad_of"]["answer"] = s.grad_of->answer;
      settings["grad_of"]["wrong"] = s.grad_of->wrong;
    }
  }
  return settings;
}

}  // namespace loom
