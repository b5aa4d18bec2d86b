// `loom generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T]
//  [--top-k K] [--top-p P] [--seed S] [--stop STR]... [--ctx N] [--json]`:
// continues a prompt with the KV cache (src/eval/generate.h) on the CPU
// backend. Greedy by default (temperature 0). Stops at the model's eos ids
// (config.json / generation_config.json), a stop string, --max-tokens or a
// full context.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/eval/generate.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::string precision = "f32";
  int64_t max_tokens = 32;
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  int64_t ctx = 0;
  int threads = 0;
  bool json = false;
};

Status RunGenerate(const GenerateArgs& args) {
  ASSIGN_OR_RETURN(Precision precision, ParsePrecision(args.precision));
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> host, CreateBackend("cpu"));
  host->SetNumThreads(args.threads);
  ASSIGN_OR_RETURN(auto model, Model::Load(args.model_dir, precision));
  ASSIGN_OR_RETURN(auto tokenizer, tok::Tokenizer::Load(args.model_dir));
  ASSIGN_OR_RETURN(tok::Encoding enc, tokenizer->Encode(args.prompt, true));
  eval::GenerateOptions o;
  o.max_new_tokens = args.max_tokens;
  o.sampling.temperature = args.temperature;
  o.sampling.top_k = args.top_k;
  o.sampling.top_p = args.top_p;
  o.sampling.seed = args.seed;
  o.stop_strings = args.stop;
  ASSIGN_OR_RETURN(o.stop_ids, eval::LoadStopIds(*model));
  RETURN_IF_ERROR(eval::ValidateSampling(o.sampling));
  eval::Generator::Options go;
  go.context = args.ctx;
  go.backend = host.get();
  ASSIGN_OR_RETURN(auto gen, eval::Generator::Create(*model, go));
  ASSIGN_OR_RETURN(std::vector<eval::Generation> out,
                   gen->Generate({enc.ids}, o, tokenizer.get()));
  const eval::Generation& g = out.front();
  if (args.json) {
    const nlohmann::json j = {{"model", args.model_dir},
                              {"prompt", args.prompt},
                              {"prompt_ids", g.prompt_ids},
                              {"token_ids", g.token_ids},
                              {"text", g.text},
                              {"stop_reason", g.stop_reason}};
    std::cout << j.dump(-1, ' ', false,
                        nlohmann::json::error_handler_t::replace)
              << "\n";
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
  cmd->add_option("--model", args->model_dir,
                  "Model directory (config.json + safetensors + tokenizer)")
      ->required();
  cmd->add_option("--prompt", args->prompt, "Prompt text")->required();
  cmd->add_option("--max-tokens", args->max_tokens,
                  "Most tokens to generate (default 32)");
  cmd->add_option("--temperature", args->temperature,
                  "0 = greedy (default); > 0 samples");
  cmd->add_option("--top-k", args->top_k, "Keep the k most likely (0 = off)");
  cmd->add_option("--top-p", args->top_p, "Nucleus mass (1 = off)");
  cmd->add_option("--seed", args->seed, "Sampling seed (default 0)");
  cmd->add_option("--stop", args->stop,
                  "Stop once the generated text contains this (repeatable)");
  cmd->add_option("--ctx", args->ctx,
                  "KV cache positions (default min(2048, max positions))");
  cmd->add_option("--precision", args->precision,
                  "f32 (default), bf16, f16 or auto");
  cmd->add_option("--threads", args->threads, "CPU threads (0 = all)");
  cmd->add_flag("--json", args->json,
                "JSON: text, token_ids (generated), prompt_ids, stop_reason");
  cmd->callback([args, exit_code] {
    *exit_code = ReportStatus("generate", RunGenerate(*args));
  });
}

}  // namespace loom::cli
