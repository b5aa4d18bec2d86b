// `loom generate --model DIR (--prompt TEXT | --prompt-tokens IDS)
// [--max-tokens N] [--temperature T]
//  [--top-k K] [--top-p P] [--seed S] [--stop STR]... [--ctx N] [--json]
//  [--hooks H,... [--layers L,...] [--select S]...] [--prefill-chunk N]`:
// continues a prompt with the KV cache (src/eval/generate.h) on the CPU
// backend. Greedy by default (temperature 0). Stops at the model's eos ids
// (config.json / generation_config.json), a stop string, --max-tokens or a
// full context.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/eval/generate.h"
#include "src/eval/row_selector.h"
#include "src/eval/session.h"
#include "src/model/registry.h"
#include "src/runtime/model.h"
#include "src/serve/api.h"
#include "src/serve/engine.h"
#include "src/tokenizer/tokenizer.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/job_options.h"
#include "tools/cli/param_flags.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::vector<int64_t> prompt_tokens;  // --prompt-tokens, instead of text
  std::string precision = "f32";
  // --max-tokens --temperature --top-k --top-p --seed --stop
  // (eval::GenerationParams).
  int64_t max_tokens = 32;
  eval::SamplingOptions sampling;
  std::vector<std::string> stop;
  int64_t ctx = 0;
  int threads = 0;
  bool json = false;
  std::vector<std::string> hooks;   // extract's hook patterns
  std::vector<std::string> layers;  // with bare site names
  std::vector<std::string> select = {"last"};
  int64_t chunk = 256;
  InterventionFlags interventions;
  PlanFlags plan;  // --device ... --verify-plan (kJobCommand)
};

// --verify-plan's report on stderr, when asked.
void PrintVerifyPlan(const Session& session) {
  const nlohmann::json verify = session.VerifyPlanReport();
  if (!verify.is_null())
    std::fprintf(stderr, "loom generate: verify-plan: %s\n",
                 verify.dump().c_str());
}

// The JSON's text: null without a tokenizer (there is no text to give).
nlohmann::json TextJson(const tok::Tokenizer* tokenizer,
                        const std::string& text) {
  return tokenizer == nullptr ? nlohmann::json(nullptr) : nlohmann::json(text);
}

// The JSON's prompt: the text, or null for token ids.
nlohmann::json PromptJson(const GenerateArgs& args) {
  return args.prompt_tokens.empty() ? nlohmann::json(args.prompt)
                                    : nlohmann::json(nullptr);
}

// With --hooks: the serving engine (one slot) captures the hooks at every
// position fed (the prompt, then each generated token but the last), and the
// selectors of `loom extract` pick the rows written to the JSON. The
// interventions of the flags edit the one prompt (input row 0), so the
// captures are the edited values.
Status RunGenerateWithHooks(const GenerateArgs& args, Precision precision) {
  serve::EngineOptions eo;
  eo.precision = precision;
  eo.slots = 1;
  eo.context = args.ctx;
  eo.prefill_chunk = args.chunk;
  eo.threads = args.threads;
  eo.max_queue = 1;
  eo.extra_hooks_setting = kHooksFlag;  // errors name the flag, not serve's key
  eo.plan = args.plan;
  eo.command = "generate";
  std::vector<RowSelector> selectors;
  for (const std::string& s : args.select) {
    ASSIGN_OR_RETURN(RowSelector r, ParseRowSelector(s));
    selectors.push_back(r);
  }
  // Bare site names with --layers resolve like extract's; config.json alone
  // answers that (the weights load once, in the engine).
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(args.model_dir));
  ASSIGN_OR_RETURN(HookSet set, ResolveHooks(args.hooks, args.layers, config));
  ASSIGN_OR_RETURN(eo.interventions, InterventionSourceOf(args.interventions));
  if (set.empty()) return InvalidArgumentError("--hooks: no hook selected");
  for (const HookPoint& h : set.hooks()) eo.extra_hooks.push_back(HookName(h));
  ASSIGN_OR_RETURN(
      auto engine,
      serve::Engine::Create(std::filesystem::path(args.model_dir).filename(),
                            args.model_dir, eo));
  serve::GenRequest r;
  ASSIGN_OR_RETURN(r.prompt,
                   CliPromptIds("--prompt", args.prompt, args.prompt_tokens,
                                engine->session()));
  r.max_new_tokens = args.max_tokens;
  r.sampling = args.sampling;
  r.stop_strings = args.stop;
  r.stop_ids = engine->stop_ids();
  r.hooks = set.hooks();
  r.rows = serve::CaptureRows::kAll;
  r.interventions = engine->session().interventions();
  ASSIGN_OR_RETURN(auto ticket, engine->Submit(r));
  ASSIGN_OR_RETURN(serve::GenResult g, ticket->Wait());
  PrintVerifyPlan(engine->session());
  nlohmann::json acts = nlohmann::json::object();
  for (size_t h = 0; h < r.hooks.size(); ++h) {
    nlohmann::json per = nlohmann::json::object();
    for (const RowSelector& s : selectors) {
      int64_t k = 0;
      ASSIGN_OR_RETURN(
          std::vector<float> rows,
          SelectRows(s, g.captures[h].data(), g.rows, g.widths[h], &k));
      per[s.spec] = serve::EncodeArray(rows.data(), k, g.widths[h], false,
                                       DType::kF32, serve::ArrayFormat::kList);
    }
    acts[HookName(r.hooks[h])] = std::move(per);
  }
  const nlohmann::json j = {{"model", args.model_dir},
                            {"prompt", PromptJson(args)},
                            {"prompt_ids", g.prompt_ids},
                            {"token_ids", g.token_ids},
                            {"text", TextJson(engine->tokenizer(), g.text)},
                            {"stop_reason", g.stop_reason},
                            {"activation_rows", g.rows},
                            {"activations", acts}};
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << "\n";
  return Status::Ok();
}

Status RunGenerate(const GenerateArgs& args) {
  // As extract refuses an empty text row and serve an empty `prompt`.
  if (args.prompt_tokens.empty() && args.prompt.empty())
    return InvalidArgumentError("--prompt: empty text");
  ASSIGN_OR_RETURN(Precision precision, ParsePrecision(args.precision));
  if (!args.hooks.empty()) return RunGenerateWithHooks(args, precision);
  ASSIGN_OR_RETURN(SessionParams sp,
                   CommandSession("generate", args.model_dir, args.precision,
                                  args.plan, args.threads, false));
  // Token ids need no tokenizer; --stop does, and text (CliPromptIds says
  // so, suggesting --prompt-tokens).
  sp.tokenizer =
      args.stop.empty() ? TokenizerUse::kOptional : TokenizerUse::kRequired;
  ASSIGN_OR_RETURN(sp.interventions, InterventionSourceOf(args.interventions));
  eval::Generator::Options go;
  go.context = args.ctx;
  go.prefill_chunk = args.chunk;
  ASSIGN_OR_RETURN(
      std::unique_ptr<Session> session,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        ASSIGN_OR_RETURN(go, eval::Generator::Resolve(s.config(), go));
        return eval::Generator::Job(s.config(), go);
      }));
  go.segments = session->segments();
  const tok::Tokenizer* tokenizer = session->tokenizer();
  ASSIGN_OR_RETURN(
      std::vector<int32_t> ids,
      CliPromptIds("--prompt", args.prompt, args.prompt_tokens, *session));
  eval::GenerateOptions o;
  o.max_new_tokens = args.max_tokens;
  o.sampling = args.sampling;
  o.stop_strings = args.stop;
  ASSIGN_OR_RETURN(o.stop_ids, eval::LoadStopIds(session->model()));
  o.interventions = &session->interventions();
  ASSIGN_OR_RETURN(auto gen, eval::Generator::Create(session->model(), go));
  ASSIGN_OR_RETURN(std::vector<eval::Generation> out,
                   gen->Generate({ids}, o, tokenizer));
  PrintVerifyPlan(*session);
  const eval::Generation& g = out.front();
  if (args.json) {
    const nlohmann::json j = {{"model", args.model_dir},
                              {"prompt", PromptJson(args)},
                              {"prompt_ids", g.prompt_ids},
                              {"token_ids", g.token_ids},
                              {"text", TextJson(tokenizer, g.text)},
                              {"stop_reason", g.stop_reason}};
    std::cout << j.dump(-1, ' ', false,
                        nlohmann::json::error_handler_t::replace)
              << "\n";
    return Status::Ok();
  }
  if (tokenizer == nullptr) {  // no text: the generated ids
    std::string line;
    for (int32_t id : g.token_ids)
      line += (line.empty() ? "" : ",") + std::to_string(id);
    std::cout << line << "\n";
    return Status::Ok();
  }
  std::cout << g.text << "\n";
  return Status::Ok();
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Continue a prompt (KV cache; greedy or sampled)");
  AddModelFlag(*cmd, &args->model_dir)->required();
  auto* text = cmd->add_option("--prompt", args->prompt, "Prompt text");
  auto* ids = cmd->add_option("--prompt-tokens", args->prompt_tokens,
                              "Prompt token ids (5,17,300), as given (no BOS "
                              "added); a checkpoint without a tokenizer needs "
                              "them, and prints the generated ids")
                  ->delimiter(',');
  text->excludes(ids);
  auto* one = cmd->add_option_group("prompt");
  one->add_option(text);
  one->add_option(ids);
  one->require_option(1);
  AddParamFlags(*cmd, eval::GenerationParams(&args->max_tokens, &args->sampling,
                                             &args->stop));
  CLI::Option* max_tokens = cmd->get_option("--max-tokens");
  max_tokens->description(max_tokens->get_description() +
                          "; with --hooks, 0 captures the prompt's "
                          "activations only");
  cmd->add_option("--ctx", args->ctx,
                  "KV cache positions (default min(2048, max positions))")
      ->check(IntRange(1));
  AddPrecisionFlag(*cmd, &args->precision);
  AddThreadsFlag(*cmd, &args->threads);
  cmd->add_flag("--json", args->json,
                "JSON: text, token_ids (generated), prompt_ids, stop_reason");
  CLI::Option* hooks = AddHookFlags(*cmd, &args->hooks, &args->layers);
  hooks->description(hooks->get_description() +
                     ". The hidden states returned; implies --json, adds "
                     "`activations`");
  AddSelectFlag(*cmd, &args->select,
                "Row selectors over the positions fed (prompt, then "
                "generated tokens but the last): last (default), first, "
                "mean, max, all, pos:I,J, span:A:B");
  cmd->add_option("--prefill-chunk,--streaming-chunk-size", args->chunk,
                  "Prompt tokens per forward (default 256); longer prompts "
                  "are prefilled in chunks carrying the KV cache (exact)")
      ->check(IntRange(1));
  AddInterventionFlags(*cmd, &args->interventions);
  AddPlanFlags(*cmd, &args->plan, PlanFlagUse::kJobCommand);
  cmd->callback([args, exit_code] {
    *exit_code = ReportStatus("generate", RunGenerate(*args));
  });
}

}  // namespace loom::cli
