// loom extract --model DIR --input FILE --out DIR [options]
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "src/eval/extract.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/job_options.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {

namespace {

struct ExtractCliOptions {
  ExtractOptions job;
  PlanFlags plan;
  std::string precision = "auto";
  // Words parsed into the job's enums in the callback.
  std::string add_bos = "auto";
  std::string dtype;
  std::string format = "npy";
  std::string on_error = "fail";
  bool progress = false;
  bool quiet = false;
};

// The flags given as words, into the job's enums.
Status ParseWords(const ExtractCliOptions& opts, ExtractOptions* job) {
  ASSIGN_OR_RETURN(job->precision, ParsePrecision(opts.precision));
  ASSIGN_OR_RETURN(job->add_bos, eval::ParseAddBos(opts.add_bos));
  ASSIGN_OR_RETURN(job->format, ParseOutputFormat(opts.format));
  ASSIGN_OR_RETURN(job->on_error, ParseOnError(opts.on_error));
  if (!opts.dtype.empty()) {
    ASSIGN_OR_RETURN(job->dtype, ParseOutputDType(opts.dtype));
  }
  return Status();
}

}  // namespace

void AddExtractCommand(CLI::App& app, int* exit_code) {
  using Options = ExtractCliOptions;
  auto opts = std::make_shared<Options>();
  ExtractOptions& j = opts->job;
  CLI::App* cmd = app.add_subcommand(
      "extract",
      "Extract activations at hook points for every prompt of an input file");
  cmd->add_option("--model", j.model_dir, "Hugging Face model directory")
      ->required();
  cmd->add_option("--input", j.input_path,
                  "JSONL rows {\"id\":…, \"text\":…} or {\"id\":…, "
                  "\"tokens\":[…]}, or plain text (one prompt per line)")
      ->required();
  cmd->add_option(
         "--out", j.out_dir,
         "Output directory (manifest.json + one .npy per hook x selector)")
      ->required();
  AddHookFlags(*cmd, &j.hooks, &j.layers)->required();
  cmd->add_option("--select", j.selectors,
                  "Selectors: last, first, mean, max, all, pos:I[,J…], "
                  "span:A:B (repeatable)")
      ->capture_default_str();
  cmd->add_option("--template", j.template_text,
                  "Wrap each text prompt: \"…{text}…\"");
  cmd->add_option("--add-bos", opts->add_bos,
                  "auto (the tokenizer's default), yes or no")
      ->capture_default_str();
  cmd->add_option("--dtype", opts->dtype,
                  "Output dtype f32, bf16 or f16 (default: the compute dtype)");
  cmd->add_option("--format", opts->format, "npy or safetensors")
      ->capture_default_str();
  cmd->add_option("--precision", opts->precision, "auto, f32, bf16 or f16")
      ->capture_default_str();
  AddThreadsFlag(*cmd, &j.threads);
  cmd->add_option("--batch-tokens", j.batch_tokens,
                  "Token budget per batch (default min(4096, max positions))")
      ->check(IntRange(1));
  cmd->add_option("--streaming-chunk-size", j.streaming_chunk_size,
                  "Rows longer than --batch-tokens run alone, prefilled in "
                  "chunks of N tokens that carry the KV cache: the hidden "
                  "states of one full pass (unlike TheLoom's independent "
                  "chunks). 0 = off: such rows are errors")
      ->capture_default_str()
      ->check(IntRange(0));
  cmd->add_option("--max-row-tokens", j.max_row_tokens,
                  "With --streaming-chunk-size: the longest row streamed; "
                  "sizes the planned KV cache (default min(32768, max "
                  "positions))")
      ->check(IntRange(1));
  cmd->add_option("--commit-every", j.commit_every,
                  "Rows per commit (the unit of resume)")
      ->capture_default_str()
      ->check(IntRange(1));
  cmd->add_option("--on-error", opts->on_error,
                  "fail or skip (skipped rows are recorded with the reason)")
      ->capture_default_str();
  cmd->add_flag(
      "--resume", j.resume,
      "Continue an interrupted job in --out after its last committed row");
  cmd->add_flag("--replace-invalid-utf8", j.replace_invalid_utf8,
                "Replace invalid UTF-8 in plain-text input with U+FFFD (as "
                "Python's errors='replace') "
                "instead of failing the row");
  AddPlanFlags(*cmd, &opts->plan, PlanFlagUse::kJobCommand);
  cmd->add_flag("--hf-bf16", j.hf_bf16_activations, kHfBf16Help);
  cmd->add_flag("--progress", opts->progress,
                "Progress on stderr even when it is not a terminal");
  cmd->add_flag("--quiet", opts->quiet, "No progress and no summary");
  cmd->callback([opts, exit_code] {
    ExtractOptions job = opts->job;
    job.plan = opts->plan;  // the JobPlanOptions part
    if (Status st = ParseWords(*opts, &job); !st.ok()) {
      *exit_code = ReportStatus("extract", st);
      return;
    }
    const bool show =
        !opts->quiet && (opts->progress || ::isatty(STDERR_FILENO));
    if (show) {
      // ETA from the share of the input read (after a --resume it counts
      // the rows done before as if this run had read them).
      job.progress = [](int64_t rows, int64_t tokens, double secs,
                        double fraction) {
        const double eta =
            fraction > 0 ? secs * (1.0 - fraction) / fraction : 0.0;
        std::fprintf(stderr,
                     "\rloom extract: %lld rows, %.0f%% of the input, "
                     "%.0f tokens/s, ETA %.0fs   ",
                     static_cast<long long>(rows), 100.0 * fraction,
                     secs > 0 ? static_cast<double>(tokens) / secs : 0.0, eta);
        std::fflush(stderr);
      };
    }
    StatusOr<ExtractSummary> s = RunExtract(job);
    if (show) std::fprintf(stderr, "\n");
    if (!s.ok()) {
      *exit_code = ReportStatus("extract", s.status());
      return;
    }
    if (!opts->quiet) {
      nlohmann::json out = s->ToJson();
      out["out"] = job.out_dir;
      std::printf("%s\n", out.dump(2).c_str());
    }
  });
}

}  // namespace loom::cli
