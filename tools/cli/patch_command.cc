// `loom patch --model DIR (--clean TEXT | --clean-tokens IDS) (--corrupted
//  TEXT | --corrupted-tokens IDS) [--hooks PATTERN...] [--positions
//  all|last|LIST|A:B] [--per-head] [--answer A --wrong B] --out DIR`: the
// activation-patching grid (src/eval/patch.h) written as OUT/patch.json and
// OUT/patched.logits_last.npy [rows, positions, vocab] (and the clean and
// corrupted runs' last logits, [1, vocab] each).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "src/base/progress.h"
#include "src/eval/patch.h"
#include "src/eval/session.h"
#include "src/io/file_util.h"
#include "src/io/npy.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/job_options.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

struct PatchArgs {
  std::string model_dir, out_dir;
  PromptPairFlags prompts;  // --clean ... --wrong
  std::vector<std::string> hooks = {"blocks.*.hook_resid_pre"};
  std::vector<std::string> layers;  // for bare sites in hooks
  std::string positions = "all";
  std::string metric = "logit-diff";
  int64_t batch_tokens = 0;
  std::string precision = "f32";
  int threads = 0;
  bool hf_bf16 = false, quiet = false, per_head = false;
  PlanFlags plan;  // --device ... --verify-plan (kJobCommand)
};

Status WriteLogits(const std::string& path, const float* data, int64_t rows,
                   const std::vector<int64_t>& row_shape) {
  ASSIGN_OR_RETURN(auto w, NpyWriter::Create(path, DType::kF32, row_shape));
  RETURN_IF_ERROR(w->AppendRows(data, rows));
  return w->Close();
}

Status RunPatchCommand(const PatchArgs& a) {
  if (a.metric != "logit-diff")
    return InvalidArgumentError("--metric: '" + a.metric +
                                "' is not a metric (logit-diff)");
  eval::PatchOptions o;
  o.hooks = a.hooks;
  o.layers = a.layers;
  StatusOr<InterventionPositions> positions = ParsePositionsText(a.positions);
  if (!positions.ok()) return positions.status().WithContext("--positions");
  o.positions = *std::move(positions);
  o.per_head = a.per_head;
  o.answer = a.prompts.answer;
  o.wrong = a.prompts.wrong;
  o.batch_tokens = a.batch_tokens;
  o.hf_bf16_activations = a.hf_bf16;
  // A bar over the grid's cells when stderr is a terminal.
  o.progress =
      MakeProgressBar(!a.quiet && StderrIsTerminal(), "patch", "cells");
  ASSIGN_OR_RETURN(SessionParams sp,
                   CommandSession("patch", a.model_dir, a.precision, a.plan,
                                  a.threads, a.quiet));
  // Text prompts need the tokenizer; token ids alone do not.
  sp.tokenizer =
      a.prompts.ids_only() ? TokenizerUse::kNone : TokenizerUse::kRequired;
  std::vector<int32_t> clean, corrupted;
  ASSIGN_OR_RETURN(
      std::unique_ptr<Session> session,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        const PromptPairFlags& p = a.prompts;
        ASSIGN_OR_RETURN(clean,
                         CliPromptIds("--clean", p.clean, p.clean_ids, s));
        ASSIGN_OR_RETURN(corrupted, CliPromptIds("--corrupted", p.corrupted,
                                                 p.corrupted_ids, s));
        RETURN_IF_ERROR(eval::CheckPatchInputs(clean, corrupted, o));
        return eval::PatchJob(s.config(), static_cast<int64_t>(clean.size()),
                              static_cast<int64_t>(corrupted.size()), o);
      }));
  o.segments = session->segments();
  const int64_t V = session->config().vocab_size;
  ASSIGN_OR_RETURN(eval::PatchResult r,
                   eval::RunPatch(session->model(), clean, corrupted, o));
  const nlohmann::json verify = session->VerifyPlanReport();
  if (!verify.is_null())
    std::fprintf(stderr, "loom patch: verify-plan: %s\n",
                 verify.dump().c_str());
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec)
    return IoError("--out " + a.out_dir + ": cannot create: " + ec.message());
  const int64_t P = static_cast<int64_t>(r.positions.size());
  RETURN_IF_ERROR(WriteLogits(a.out_dir + "/patched.logits_last.npy",
                              r.patched_logits_last.data(),
                              static_cast<int64_t>(r.hooks.size()), {P, V}));
  RETURN_IF_ERROR(WriteLogits(a.out_dir + "/clean.logits_last.npy",
                              r.clean_logits_last.data(), 1, {V}));
  RETURN_IF_ERROR(WriteLogits(a.out_dir + "/corrupted.logits_last.npy",
                              r.corrupted_logits_last.data(), 1, {V}));
  nlohmann::json j = eval::PatchJson(r);
  j["model"] = a.model_dir;
  j["clean_input_ids"] = clean;
  j["corrupted_input_ids"] = corrupted;
  RETURN_IF_ERROR(
      WriteTextFileDurably(a.out_dir + "/patch.json", j.dump(2) + "\n"));
  if (!a.quiet)
    std::fprintf(stderr,
                 "loom patch: %zu hooks x %lld positions in %lld forwards, "
                 "%.2f s; clean logit diff %.4f, corrupted %.4f -> %s\n",
                 r.hooks.size(), static_cast<long long>(P),
                 static_cast<long long>(r.forwards), r.seconds,
                 r.clean_logit_diff, r.corrupted_logit_diff,
                 (a.out_dir + "/patch.json").c_str());
  return Status::Ok();
}

}  // namespace

void AddPatchCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PatchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "patch",
      "Activation patching: the (hook x position) grid of a clean and a "
      "corrupted prompt, with logit differences and recovery");
  AddModelFlag(*cmd, &a->model_dir)->required();
  AddPromptPairFlags(*cmd, &a->prompts);
  CLI::Option* hooks = AddHookFlags(*cmd, &a->hooks, &a->layers);
  hooks->description(hooks->get_description() +
                     ". The hooks patched: the grid's rows");
  hooks->capture_default_str();
  cmd->add_option("--positions", a->positions,
                  "Positions patched: all (default), last, a list 1,3,-1 or "
                  "a span A:B");
  cmd->add_flag("--per-head", a->per_head,
                "attn.hook_z hooks: one grid row per head (patch_head)");
  cmd->add_option("--metric", a->metric, "logit-diff (default)");
  cmd->add_option("--batch-tokens", a->batch_tokens,
                  "Tokens per forward (patched runs are batched; default "
                  "min(4096, max positions))")
      ->check(IntRange(1));
  cmd->add_option("--out", a->out_dir, "Output directory")->required();
  AddPrecisionFlag(*cmd, &a->precision);
  AddThreadsFlag(*cmd, &a->threads);
  AddPlanFlags(*cmd, &a->plan, PlanFlagUse::kJobCommand);
  AddHfBf16Flag(*cmd, &a->hf_bf16);
  cmd->add_flag("--quiet", a->quiet, "No summary on stderr");
  cmd->callback([a, exit_code] {
    if (Status given = a->prompts.CheckGiven(); !given.ok()) {
      *exit_code = ReportStatus("patch", given);
      return;
    }
    *exit_code = ReportStatus("patch", RunPatchCommand(*a));
  });
}

}  // namespace loom::cli
