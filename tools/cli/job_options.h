// Options shared by the evaluations (perplexity, compare): what text is
// evaluated, how it is cut into windows, and the job commands' plan flags
// (plan_flags.h). Declared once here; each command adds them.
#ifndef LOOM_TOOLS_CLI_JOB_OPTIONS_H_
#define LOOM_TOOLS_CLI_JOB_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/eval/session.h"
#include "src/io/file_util.h"
#include "src/model/control_vectors.h"
#include "src/model/interventions.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/param_flags.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {

// What text is evaluated and how it is cut into windows.
struct WindowArgs : eval::WindowParams {  // --protocol --ctx ... --chunk-rows
  std::string text_file, tokens_file, tokenizer_dir;
  int threads = 0;
  bool json = false, quiet = false;
  bool hf_bf16 = false;
  PlanFlags plan;  // --device ... --verify-plan (kJobCommand)
};

// --intervene, --steer, --ablate-direction and the llama.cpp control-vector
// flags (docs/interventions.md): the edits applied in the forward, shared by
// every command that computes.
struct InterventionFlags {
  std::string file;
  std::vector<std::string> steer, ablate;
  std::vector<std::string> control_vectors;  // --control-vector FILE
  // --control-vector-scaled FILE SCALE (the scale as given).
  std::vector<std::pair<std::string, std::string>> control_vectors_scaled;
  std::vector<int64_t> control_vector_layer_range;  // A B, or empty
};
inline void AddInterventionFlags(CLI::App& cmd, InterventionFlags* f) {
  auto field = [](std::string_view name, auto* target) {
    return eval::ParamField{&eval::InterventionParam(name), target, {}};
  };
  AddParamFlag(cmd, field("intervene", &f->file))->check(CLI::ExistingFile);
  AddParamFlag(cmd, field("steer", &f->steer));
  AddParamFlag(cmd, field("ablate_direction", &f->ablate));
  AddParamFlag(cmd, field("control_vector", &f->control_vectors));
  // Pairs (FILE SCALE, A B): named and explained by the table, typed here.
  const eval::ParamSpec& scaled =
      eval::InterventionParam("control_vector_scaled");
  cmd.add_option(eval::ParamFlag(scaled), f->control_vectors_scaled,
                 std::string(scaled.help));
  const eval::ParamSpec& range =
      eval::InterventionParam("control_vector_layer_range");
  cmd.add_option(eval::ParamFlag(range), f->control_vector_layer_range,
                 std::string(range.help))
      ->expected(2);
}

// The control-vector files of the flags: --control-vector's (scale 1), then
// --control-vector-scaled's. InvalidArgument naming a scale that is not a
// finite number.
inline StatusOr<std::vector<ControlVectorFile>> ControlVectorFlagFiles(
    const InterventionFlags& f) {
  std::vector<ControlVectorFile> files;
  for (const std::string& path : f.control_vectors)
    files.push_back({path, 1.0f});
  for (const auto& [path, text] : f.control_vectors_scaled) {
    char* end = nullptr;
    const float scale = std::strtof(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() ||
        !std::isfinite(scale))
      return InvalidArgumentError("--control-vector-scaled " + path + " " +
                                  text + ": the scale is not a finite number");
    files.push_back({path, scale});
  }
  return files;
}

// --control-vector-layer-range A B, when given.
inline std::optional<ControlVectorLayerRange> ControlVectorFlagRange(
    const InterventionFlags& f) {
  if (f.control_vector_layer_range.size() != 2) return std::nullopt;
  return ControlVectorLayerRange{f.control_vector_layer_range[0],
                                 f.control_vector_layer_range[1]};
}

// A command's session: its name, --model, --precision (parsed here), the
// placement flags and --threads; the command sets the rest (tokenizer,
// interventions).
inline StatusOr<SessionParams> CommandSession(const char* command,
                                              const std::string& model_dir,
                                              const std::string& precision,
                                              const JobPlanOptions& plan,
                                              int threads, bool quiet) {
  SessionParams sp;
  sp.command = command;
  sp.model_dir = model_dir;
  ASSIGN_OR_RETURN(sp.precision, ParsePrecision(precision));
  sp.plan = plan;
  sp.threads = threads;
  sp.quiet = quiet;
  return sp;
}

// The interventions of the flags as a session reads them (the file's, then
// the shorthand ones, then the control vectors').
inline StatusOr<InterventionSource> InterventionSourceOf(
    const InterventionFlags& f) {
  InterventionSource s;
  s.file = f.file;
  ASSIGN_OR_RETURN(s.json, ShorthandInterventions(f.steer, f.ablate));
  ASSIGN_OR_RETURN(s.control_vectors, ControlVectorFlagFiles(f));
  s.control_vector_range = ControlVectorFlagRange(f);
  return s;
}

// A prompt given as text (`flag`, "--prompt") or as token ids (`flag` +
// "-tokens"): the ids as given (no BOS added), each checked against the
// vocabulary, or the text encoded with its special tokens. A checkpoint
// without a tokenizer takes ids only, and text is refused saying why.
inline StatusOr<std::vector<int32_t>> CliPromptIds(
    const std::string& flag, const std::string& text,
    const std::vector<int64_t>& ids, const Session& s) {
  const int64_t vocab = s.config().vocab_size;
  std::vector<int32_t> out;
  if (!ids.empty()) {
    for (int64_t id : ids) {
      if (id < 0 || id >= vocab)
        return OutOfRangeError(flag + "-tokens: id " + std::to_string(id) +
                               " is outside the vocabulary [0, " +
                               std::to_string(vocab) + ")");
      out.push_back(static_cast<int32_t>(id));
    }
    return out;
  }
  if (text.empty())
    return InvalidArgumentError(flag +
                                ": the prompt is empty (give text, or ids "
                                "with " +
                                flag + "-tokens)");
  if (s.tokenizer() == nullptr)
    return InvalidArgumentError(flag + ": text needs a tokenizer, and " +
                                s.params().model_dir + " has none (" +
                                s.tokenizer_error() +
                                "); give token ids with " + flag + "-tokens");
  ASSIGN_OR_RETURN(tok::Encoding enc, s.tokenizer()->Encode(text, true));
  return std::move(enc.ids);
}

// The clean and corrupted prompts of `loom patch` and `loom attribute`:
// --clean / --clean-tokens and --corrupted / --corrupted-tokens (text or
// ids, one of each), and --answer / --wrong.
struct PromptPairFlags {
  std::string clean, corrupted;                   // text
  std::vector<int64_t> clean_ids, corrupted_ids;  // or token ids
  int64_t answer = -1, wrong = -1;
  CLI::Option *clean_text = nullptr, *clean_tokens = nullptr;
  CLI::Option *corrupted_text = nullptr, *corrupted_tokens = nullptr;
  // Both prompts given as ids: no tokenizer needed.
  bool ids_only() const { return !clean_ids.empty() && !corrupted_ids.empty(); }
  // InvalidArgument when a prompt is missing (given but empty, --clean "",
  // is the prompt's own error, not a missing flag).
  // with_corrupted false: the corrupted prompt is optional.
  Status CheckGiven(bool with_corrupted = true) const {
    if (clean_text->count() == 0 && clean_tokens->count() == 0)
      return InvalidArgumentError("give --clean or --clean-tokens");
    if (with_corrupted && corrupted_text->count() == 0 &&
        corrupted_tokens->count() == 0)
      return InvalidArgumentError("give --corrupted or --corrupted-tokens");
    return Status();
  }
};

inline void AddPromptPairFlags(CLI::App& cmd, PromptPairFlags* f) {
  f->clean_text = cmd.add_option("--clean", f->clean, "Clean prompt text");
  f->clean_tokens = cmd.add_option("--clean-tokens", f->clean_ids,
                                   "Clean prompt token ids (5,17,300)")
                        ->delimiter(',');
  f->clean_text->excludes(f->clean_tokens);
  f->corrupted_text = cmd.add_option("--corrupted", f->corrupted,
                                     "Corrupted prompt text (as many tokens)");
  f->corrupted_tokens = cmd.add_option("--corrupted-tokens", f->corrupted_ids,
                                       "Corrupted prompt token ids")
                            ->delimiter(',');
  f->corrupted_text->excludes(f->corrupted_tokens);
  cmd.add_option("--answer", f->answer,
                 "Token id A (default: the clean run's argmax)")
      ->check(IntRange(0));
  cmd.add_option("--wrong", f->wrong,
                 "Token id B (default: the corrupted run's argmax, or its "
                 "runner-up when that is A)")
      ->check(IntRange(0));
}

// `text` as the whole file `path`, replaced durably (a reader sees the old
// file or the new one).
inline Status WriteTextFileDurably(const std::string& path,
                                   const std::string& text) {
  return io_internal::ReplaceFileDurably(
             path,
             [&](int fd, const std::string& tmp) {
               return io_internal::PwriteFully(
                   fd, tmp, text.data(), static_cast<int64_t>(text.size()), 0);
             })
      .status();
}

// --text/--tokens, --tokenizer, --protocol, --ctx, --stride, --max-windows,
// --add-bos, --chunk-rows, --threads, --json, --quiet and the plan options.
inline void AddWindowOptions(CLI::App* cmd, WindowArgs* a,
                             const char* tokenizer_default) {
  auto* text =
      cmd->add_option("--text", a->text_file, "Text file (UTF-8, read as is)");
  auto* tokens =
      cmd->add_option("--tokens", a->tokens_file,
                      "File of token ids (whitespace/comma separated)");
  text->excludes(tokens);
  cmd->add_option(
      "--tokenizer", a->tokenizer_dir,
      std::string("Tokenizer directory (default: ") + tokenizer_default + ")");
  AddParamFlags(*cmd, eval::WindowParamFields(a));
  AddPlanFlags(*cmd, &a->plan, PlanFlagUse::kJobCommand);
  AddHfBf16Flag(*cmd, &a->hf_bf16);
  AddThreadsFlag(*cmd, &a->threads);
  cmd->add_flag("--json", a->json, "Print the result as JSON");
  cmd->add_flag("--quiet", a->quiet, "No progress bar or warnings");
}

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_JOB_OPTIONS_H_
