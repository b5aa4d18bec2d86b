// `loom attribute --model DIR (--clean TEXT | --clean-tokens IDS)
//  (--corrupted TEXT | --corrupted-tokens IDS) [--hooks PATTERN...]
//  [--positions all|last|LIST|A:B] [--per-head] [--metric logit-diff|logprob]
//  [--answer A --wrong B] [--method atp|atp-star|ig] [--freeze
//  attn_pattern,norm_scale]
//  [--check-top N] --out DIR`: attribution patching (src/eval/attribute.h)
// written as OUT/attribution.json.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "src/eval/attribute.h"
#include "src/eval/session.h"
#include "src/runtime/model.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/job_options.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

struct AttributeArgs {
  std::string model_dir, out_dir;
  PromptPairFlags prompts;  // --clean ... --wrong
  std::vector<std::string> hooks = {"blocks.*.hook_resid_pre"};
  std::vector<std::string> layers;
  std::string positions = "all";
  std::string metric = "logit-diff";
  std::string method = "atp";
  std::vector<std::string> freeze;
  int64_t check_top = 0, steps = 32, baseline_token = 0;
  std::string precision = "f32";
  int threads = 0;
  bool quiet = false, per_head = false;
  PlanFlags plan;
};

StatusOr<eval::AttributeOptions> OptionsOf(const AttributeArgs& a) {
  eval::AttributeOptions o;
  ASSIGN_OR_RETURN(const eval::AttributeMethod method,
                   eval::ParseAttributeMethod(a.method, "--method"));
  o.grad_drop = method == eval::AttributeMethod::kAtpStar;
  ASSIGN_OR_RETURN(o.metric, ParseGradMetric(a.metric, "--metric"));
  RETURN_IF_ERROR(ParseFreeze(a.freeze, "--freeze", &o.freeze_attn_pattern,
                              &o.freeze_norm_scale));
  if (a.precision != "f32")
    return InvalidArgumentError("--precision: gradients run at f32, not " +
                                a.precision);
  o.hooks = a.hooks;
  o.layers = a.layers;
  StatusOr<InterventionPositions> positions = ParsePositionsText(a.positions);
  if (!positions.ok()) return positions.status().WithContext("--positions");
  o.positions = *std::move(positions);
  o.per_head = a.per_head;
  o.answer = a.prompts.answer;
  o.wrong = a.prompts.wrong;
  o.check_top = a.check_top;
  return o;
}

// --method ig: integrated gradients over the --clean prompt's tokens.
Status RunIg(const AttributeArgs& a, const eval::AttributeOptions& o,
             const Session& session, const std::vector<int32_t>& ids) {
  const eval::IgOptions ig = eval::IgOptionsOf(o, a.steps, a.baseline_token);
  ASSIGN_OR_RETURN(eval::IgAttribution r,
                   eval::RunIntegratedGradients(session.model(), ids, ig));
  nlohmann::json j = eval::IgJson(r, ig);
  j["model"] = a.model_dir;
  j["input_ids"] = ids;
  RETURN_IF_ERROR(
      WriteTextFileDurably(a.out_dir + "/attribution.json", j.dump(2) + "\n"));
  if (!a.quiet)
    std::fprintf(stderr,
                 "loom attribute: integrated gradients over %zu tokens, %lld "
                 "steps, %.2f s; completeness error %.3g -> %s\n",
                 r.per_token.size(), static_cast<long long>(a.steps), r.seconds,
                 j["completeness_error"].get<double>(),
                 (a.out_dir + "/attribution.json").c_str());
  return Status::Ok();
}

// --verify-plan: the job's resident bytes against the plan, on stderr.
Status ReportVerifyPlan(const Session& session) {
  const nlohmann::json verify = session.VerifyPlanReport();
  if (!verify.is_null())
    std::fprintf(stderr, "loom attribute: verify-plan: %s\n",
                 verify.dump().c_str());
  return Status::Ok();
}

Status RunAttributeCommand(const AttributeArgs& a) {
  ASSIGN_OR_RETURN(const eval::AttributeOptions o, OptionsOf(a));
  const bool ig = a.method == "ig";  // OptionsOf checked the word
  if (!ig && a.prompts.corrupted_text->count() == 0 &&
      a.prompts.corrupted_tokens->count() == 0)
    return InvalidArgumentError("give --corrupted or --corrupted-tokens");
  ASSIGN_OR_RETURN(SessionParams sp,
                   CommandSession("attribute", a.model_dir, a.precision, a.plan,
                                  a.threads, a.quiet));
  const PromptPairFlags& p = a.prompts;
  sp.tokenizer = !p.clean_ids.empty() && (ig || !p.corrupted_ids.empty())
                     ? TokenizerUse::kNone
                     : TokenizerUse::kRequired;
  std::vector<int32_t> clean, corrupted;
  ASSIGN_OR_RETURN(
      std::unique_ptr<Session> session,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        ASSIGN_OR_RETURN(clean,
                         CliPromptIds("--clean", p.clean, p.clean_ids, s));
        if (ig) {
          corrupted = clean;
        } else {
          ASSIGN_OR_RETURN(corrupted, CliPromptIds("--corrupted", p.corrupted,
                                                   p.corrupted_ids, s));
        }
        if (clean.size() != corrupted.size() || clean.empty())
          return InvalidArgumentError(
              "the clean prompt has " + std::to_string(clean.size()) +
              " tokens and the corrupted one " +
              std::to_string(corrupted.size()) +
              "; attribution needs two non-empty prompts of one length");
        return eval::AttributeJob(s.config(),
                                  static_cast<int64_t>(clean.size()), o);
      }));
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec)
    return IoError("--out " + a.out_dir + ": cannot create: " + ec.message());
  if (ig) {
    RETURN_IF_ERROR(RunIg(a, o, *session, clean));
    return ReportVerifyPlan(*session);
  }
  ASSIGN_OR_RETURN(eval::AttributeResult r,
                   eval::RunAttribute(session->model(), clean, corrupted, o));
  RETURN_IF_ERROR(ReportVerifyPlan(*session));
  nlohmann::json j = eval::AttributionJson(r, o);
  j["model"] = a.model_dir;
  j["clean_input_ids"] = clean;
  j["corrupted_input_ids"] = corrupted;
  RETURN_IF_ERROR(
      WriteTextFileDurably(a.out_dir + "/attribution.json", j.dump(2) + "\n"));
  if (!a.quiet)
    std::fprintf(stderr,
                 "loom attribute: %zu hooks x %zu positions from one "
                 "backward, %.2f s; metric clean %.4f, corrupted %.4f -> %s\n",
                 r.hooks.size(), r.positions.size(), r.seconds, r.metric_clean,
                 r.metric_corrupted, (a.out_dir + "/attribution.json").c_str());
  return Status::Ok();
}

}  // namespace

void AddAttributeCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<AttributeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attribute",
      "Attribution patching (AtP): the (hook x position) grid of loom patch "
      "estimated from one backward");
  AddModelFlag(*cmd, &a->model_dir)->required();
  AddPromptPairFlags(*cmd, &a->prompts);
  CLI::Option* hooks = AddHookFlags(*cmd, &a->hooks, &a->layers);
  hooks->description(hooks->get_description() +
                     ". The hooks attributed: the grid's rows");
  hooks->capture_default_str();
  cmd->add_option("--positions", a->positions,
                  "Positions: all (default), last, a list 1,3,-1 or a span "
                  "A:B");
  cmd->add_flag("--per-head", a->per_head,
                "attn.hook_z hooks: atp_head per head as well");
  cmd->add_option("--metric", a->metric,
                  "logit-diff (default) or logprob (the sequence "
                  "log-likelihood)");
  cmd->add_option("--method", a->method,
                  "atp (default); atp-star: AtP and AtP*'s GradDrop "
                  "(atp_star: one more backward per layer); or ig: "
                  "integrated gradients over the --clean prompt's tokens "
                  "(no --corrupted)");
  cmd->add_option("--steps", a->steps,
                  "ig: Gauss-Legendre nodes of the path integral (32)")
      ->check(IntRange(1, 4096));
  cmd->add_option("--baseline-token", a->baseline_token,
                  "ig: the baseline is the prompt with every token this id "
                  "(0)")
      ->check(IntRange(0));
  cmd->add_option("--freeze", a->freeze,
                  "Constants in the backward: attn_pattern, norm_scale "
                  "(circuit-tracer's linearization)")
      ->delimiter(',');
  cmd->add_option("--check-top", a->check_top,
                  "Run the true patch of the N largest cells and report the "
                  "approximation error")
      ->check(IntRange(0));
  cmd->add_option("--out", a->out_dir, "Output directory")->required();
  AddPrecisionFlag(*cmd, &a->precision);
  AddThreadsFlag(*cmd, &a->threads);
  AddPlanFlags(*cmd, &a->plan, PlanFlagUse::kJobCommand);
  cmd->add_flag("--quiet", a->quiet, "No summary on stderr");
  cmd->callback([a, exit_code] {
    // (--method ig reads the clean prompt only: RunAttributeCommand asks for
    // the corrupted one otherwise.)
    if (Status given = a->prompts.CheckGiven(false); !given.ok()) {
      *exit_code = ReportStatus("attribute", given);
      return;
    }
    *exit_code = ReportStatus("attribute", RunAttributeCommand(*a));
  });
}

}  // namespace loom::cli
