// `loom perplexity --model DIR (--text FILE | --tokens FILE) [--protocol P]
//  [--ctx N] [--stride S] [--max-windows K] [--add-bos auto|yes|no] [--json]`:
// perplexity under one of the protocols of docs/eval/perplexity.md.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "src/backend/registry.h"
#include "src/base/progress.h"
#include "src/eval/input.h"
#include "src/eval/perplexity.h"
#include "src/model/registry.h"
#include "src/runtime/memory_stats.h"
#include "src/runtime/model.h"
#include "tools/cli/commands.h"
#include "tools/cli/job_options.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

struct PerplexityArgs : WindowArgs {
  std::string model_dir;
  std::string precision = "auto";
  InterventionFlags interventions;
};

Status RunPerplexity(const PerplexityArgs& args) {
  ASSIGN_OR_RETURN(eval::Protocol protocol, eval::ParseProtocol(args.protocol));
  ASSIGN_OR_RETURN(eval::AddBos add_bos, eval::ParseAddBos(args.add_bos));
  ASSIGN_OR_RETURN(SessionParams sp,
                   CommandSession("perplexity", args.model_dir, args.precision,
                                  args.plan, args.threads, args.quiet));
  ASSIGN_OR_RETURN(sp.interventions, InterventionSourceOf(args.interventions));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Session> session,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        return EvalJobOf(s.config(), args.ctx, args.chunk_rows);
      }));
  const Model& model = session->model();
  const ModelConfig& c = model.config();
  eval::InputOptions io{
      args.text_file, args.tokens_file,
      args.tokenizer_dir.empty() ? args.model_dir : args.tokenizer_dir,
      add_bos};
  ASSIGN_OR_RETURN(eval::EvalInput input, eval::LoadEvalInput(io, c));
  const int64_t ctx = session->job().context;
  if (ctx > c.max_position_embeddings)
    return OutOfRangeError("--ctx " + std::to_string(ctx) +
                           " exceeds the maximum context of " + args.model_dir +
                           " (max_position_embeddings = " +
                           std::to_string(c.max_position_embeddings) + ")");
  ASSIGN_OR_RETURN(
      eval::WindowPlan plan,
      eval::PlanWindows(static_cast<int64_t>(input.ids.size()),
                        eval::MakeWindowOptions(protocol, ctx, args.stride,
                                                args.max_windows, input)));
  eval::EvalOptions eo;
  eo.logits_chunk_rows = args.chunk_rows;
  eo.hf_bf16_activations = args.hf_bf16;
  eo.segments = session->segments();
  eo.interventions = &session->interventions();
  eo.progress = MakeProgressBar(!args.quiet && StderrIsTerminal(), "perplexity",
                                "windows");
  ASSIGN_OR_RETURN(eval::PerplexityResult r,
                   eval::EvaluatePerplexity(model, input.ids, plan, eo));
  if (args.plan.verify_plan)
    std::fprintf(stderr, "loom perplexity: verify-plan: %s\n",
                 session->VerifyPlanReport().dump().c_str());
  if (args.json) {
    const nlohmann::json j = eval::PerplexityJson(
        args.model_dir, model.compute_dtype(), input.bos,
        static_cast<int64_t>(input.ids.size()), r, session->interventions());
    std::cout << j.dump(2) << "\n";
    return Status::Ok();
  }
  std::printf("model        %s (%s, %s)\n", args.model_dir.c_str(),
              c.model_type.c_str(),
              std::string(DTypeName(model.compute_dtype())).c_str());
  std::printf("input        %s: %zu tokens%s\n", input.source.c_str(),
              input.ids.size(), input.bos ? ", BOS at the start" : ", no BOS");
  if (!session->interventions().empty())
    std::printf("interventions %s\n",
                InterventionsSummary(session->interventions()).c_str());
  std::printf("protocol     %s, ctx %lld, stride %lld\n",
              std::string(eval::ProtocolName(r.protocol)).c_str(),
              static_cast<long long>(r.ctx), static_cast<long long>(r.stride));
  std::printf("windows      %lld\n", static_cast<long long>(r.windows));
  std::printf("scored       %lld tokens (%lld evaluated)\n",
              static_cast<long long>(r.tokens_scored),
              static_cast<long long>(r.tokens_evaluated));
  std::printf("mean NLL     %.6f nats\n", r.nll_mean);
  std::printf("perplexity   %.4f\n", r.perplexity);
  std::printf("time         %.2f s, %.1f tokens/s\n", r.seconds,
              r.tokens_per_second);
  return Status::Ok();
}

}  // namespace

void AddPerplexityCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a model over a text, window by window");
  AddModelFlag(*cmd, &args->model_dir)->required();
  AddWindowOptions(cmd, args.get(), "--model");
  AddPrecisionFlag(*cmd, &args->precision);
  AddInterventionFlags(*cmd, &args->interventions);
  cmd->callback([args, exit_code] {
    *exit_code = ReportStatus("perplexity", RunPerplexity(*args));
  });
}

}  // namespace loom::cli
