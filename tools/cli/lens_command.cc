// `loom lens --model DIR (--prompt TEXT | --prompt-tokens IDS) [--hooks ...]
//  [--topk K] [--tuned PATH] [--json]`: the logit lens (or a tuned lens) of
// one prompt, one forward: for each residual hook (default
// blocks.0.hook_resid_pre and every blocks.i.hook_resid_post) and each
// position, the top-k tokens of the model's own head read there
// (src/eval/lens_job.h). A table of top-1 tokens on stdout, or the whole grid
// as JSON.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "src/eval/lens_job.h"
#include "src/eval/session.h"
#include "src/model/lens.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/job_options.h"
#include "tools/cli/param_flags.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

struct LensArgs {
  std::string model_dir, prompt, tuned;
  std::vector<int64_t> prompt_ids;
  std::vector<std::string> hooks, layers;
  int64_t topk = 10, chunk_rows = 256;
  std::string precision = "auto";
  int threads = 0;
  bool hf_bf16 = false, json = false, quiet = false, kl = false;
  PlanFlags plan;
};

// A cell of the table: the token as text, control characters escaped, cut
// to `width` bytes (at a UTF-8 boundary).
std::string Cell(const nlohmann::json& word, size_t width) {
  std::string s;
  for (char c : word.get<std::string>()) {
    if (c == '\n') {
      s += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      s += ' ';
    } else {
      s += c;
    }
  }
  if (s.size() > width) {
    size_t n = width;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    s.resize(n);
  }
  return s;
}

// One line per hook: its top-1 token at each position.
void PrintTable(const nlohmann::json& j) {
  constexpr size_t kWidth = 10;
  const bool words = j.contains("topk_tokens");
  size_t name_width = 0;
  for (const auto& h : j["hooks"])
    name_width = std::max(name_width, h.get<std::string>().size());
  std::printf("%-*s", static_cast<int>(name_width), "");
  for (size_t t = 0; t < j["input_ids"].size(); ++t)
    std::printf("  %-*s", static_cast<int>(kWidth),
                words ? Cell(j["tokens"][t], kWidth).c_str()
                      : std::to_string(j["input_ids"][t].get<int>()).c_str());
  std::printf("\n");
  for (size_t h = 0; h < j["hooks"].size(); ++h) {
    std::printf("%-*s", static_cast<int>(name_width),
                j["hooks"][h].get<std::string>().c_str());
    for (size_t t = 0; t < j["input_ids"].size(); ++t)
      std::printf(
          "  %-*s", static_cast<int>(kWidth),
          words ? Cell(j["topk_tokens"][h][t][0], kWidth).c_str()
                : std::to_string(j["topk_ids"][h][t][0].get<int>()).c_str());
    std::printf("\n");
  }
  if (!j.contains("kl_to_final")) return;
  std::printf("\nKL(final || lens), nats\n");
  for (size_t h = 0; h < j["hooks"].size(); ++h) {
    std::printf("%-*s", static_cast<int>(name_width),
                j["hooks"][h].get<std::string>().c_str());
    for (const auto& kl : j["kl_to_final"][h])
      std::printf("  %-*.4g", static_cast<int>(kWidth), kl.get<double>());
    std::printf("\n");
  }
}

Status RunLens(const LensArgs& a) {
  ASSIGN_OR_RETURN(SessionParams sp,
                   CommandSession("lens", a.model_dir, a.precision, a.plan,
                                  a.threads, a.quiet));
  sp.tokenizer =
      a.prompt_ids.empty() ? TokenizerUse::kRequired : TokenizerUse::kOptional;
  std::optional<TunedLens> tuned;
  if (!a.tuned.empty()) {
    StatusOr<TunedLens> t = LoadTunedLens(a.tuned);
    if (!t.ok()) return t.status().WithContext("--tuned");
    tuned = *std::move(t);
  }
  eval::LensGridOptions o;
  o.hooks = a.hooks;
  o.layers = a.layers;
  o.topk = a.topk;
  o.chunk_rows = a.chunk_rows;
  o.tuned = tuned ? &*tuned : nullptr;
  o.kl = a.kl;
  o.hf_bf16_activations = a.hf_bf16;
  std::vector<int32_t> ids;
  ASSIGN_OR_RETURN(
      std::unique_ptr<Session> session,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        ASSIGN_OR_RETURN(ids,
                         CliPromptIds("--prompt", a.prompt, a.prompt_ids, s));
        return eval::LensGridJob(s.config(), static_cast<int64_t>(ids.size()),
                                 o);
      }));
  o.segments = session->segments();
  ASSIGN_OR_RETURN(const eval::LensGrid grid,
                   eval::RunLensGrid(session->model(), ids, o));
  nlohmann::json j = eval::LensGridJson(grid, ids, session->tokenizer());
  j["model"] = a.model_dir;
  j["lens"] = tuned ? "tuned" : "logit";
  if (tuned) j["tuned"] = tuned->path;
  const nlohmann::json verify = session->VerifyPlanReport();
  if (!verify.is_null()) j["verify_plan"] = verify;
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    PrintTable(j);
  }
  if (!a.quiet)
    std::fprintf(stderr,
                 "loom lens: %s lens, %zu hooks x %lld tokens, top-%lld, "
                 "%.3f s (%.3f s in the lens)\n",
                 tuned ? "tuned" : "logit", grid.hooks.size(),
                 static_cast<long long>(grid.tokens),
                 static_cast<long long>(grid.topk), grid.seconds,
                 grid.lens_seconds);
  return Status::Ok();
}

}  // namespace

void AddLensCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<LensArgs>();
  CLI::App* cmd = app.add_subcommand(
      "lens",
      "Logit lens or tuned lens of one prompt: the top tokens of the model's "
      "own head read at each residual hook and position");
  AddModelFlag(*cmd, &a->model_dir)->required();
  auto* text = cmd->add_option("--prompt", a->prompt, "Prompt text");
  auto* ids = cmd->add_option("--prompt-tokens", a->prompt_ids,
                              "Prompt token ids (5,17,300), used as given")
                  ->delimiter(',');
  text->excludes(ids);
  CLI::Option* hooks = AddHookFlags(*cmd, &a->hooks, &a->layers);
  hooks->description(hooks->get_description() +
                     ". Residual hooks only; default "
                     "blocks.0.hook_resid_pre,blocks.*.hook_resid_post");
  AddParamFlags(*cmd, eval::LensGridParams(&a->topk, &a->kl));
  AddParamFlag(*cmd, {&eval::WindowParam("chunk_rows"), &a->chunk_rows, {}});
  cmd->add_option("--tuned", a->tuned,
                  "A tuned lens: the folder tuned-lens saves (params.pt or "
                  "params.safetensors) or one of those files");
  cmd->add_flag("--json", a->json,
                "The whole grid as JSON (hooks, tokens, top-k ids, logits "
                "and tokens)");
  AddPrecisionFlag(*cmd, &a->precision);
  AddThreadsFlag(*cmd, &a->threads);
  AddPlanFlags(*cmd, &a->plan, PlanFlagUse::kJobCommand);
  AddHfBf16Flag(*cmd, &a->hf_bf16);
  cmd->add_flag("--quiet", a->quiet, "No summary on stderr");
  cmd->callback([a, exit_code, text, ids] {
    if (text->count() == 0 && ids->count() == 0) {
      *exit_code = ReportStatus(
          "lens", InvalidArgumentError("give --prompt or --prompt-tokens"));
      return;
    }
    *exit_code = ReportStatus("lens", RunLens(*a));
  });
}

}  // namespace loom::cli
