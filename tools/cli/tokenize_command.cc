// `loom tokenize MODEL_DIR [--text T | --file F] [--no-special] [--json]`:
// shows the token ids, token strings and byte offsets the model will see.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "src/base/read_file.h"
#include "src/tokenizer/tokenizer.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

struct TokenizeArgs {
  std::string model_dir;
  std::string text;
  std::string file;
  bool no_special = false;
  bool json = false;
  bool replace_invalid_utf8 = false;
};

StatusOr<std::string> ReadInput(const TokenizeArgs& args, bool have_text) {
  if (have_text) return args.text;
  if (!args.file.empty() && args.file != "-")
    return ReadFileToString(args.file);
  std::stringstream buffer;
  buffer << std::cin.rdbuf();
  return buffer.str();
}

Status RunTokenize(const TokenizeArgs& args, bool have_text) {
  ASSIGN_OR_RETURN(std::string text, ReadInput(args, have_text));
  ASSIGN_OR_RETURN(auto tokenizer, tok::Tokenizer::Load(args.model_dir));
  tok::EncodeOptions options;
  options.add_special_tokens = !args.no_special;
  options.invalid_utf8 = args.replace_invalid_utf8
                             ? tok::InvalidUtf8Policy::kReplace
                             : tok::InvalidUtf8Policy::kError;
  ASSIGN_OR_RETURN(tok::Encoding enc, tokenizer->Encode(text, options));
  if (args.json) {
    nlohmann::json out;
    out["ids"] = enc.ids;
    nlohmann::json tokens = nlohmann::json::array();
    nlohmann::json offsets = nlohmann::json::array();
    for (size_t i = 0; i < enc.ids.size(); ++i) {
      tokens.push_back(tokenizer->IdToToken(enc.ids[i]));
      offsets.push_back({enc.offsets[i].first, enc.offsets[i].second});
    }
    out["tokens"] = std::move(tokens);
    out["offsets"] = std::move(offsets);
    std::cout << out.dump(-1, ' ', false,
                          nlohmann::json::error_handler_t::replace)
              << "\n";
    return Status::Ok();
  }
  std::printf("%zu tokens (%s, %s special tokens)\n", enc.ids.size(),
              tokenizer->source().c_str(),
              args.no_special ? "without" : "with");
  std::printf("%6s %8s  %-14s %s\n", "index", "id", "bytes", "token");
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    const std::string range = "[" + std::to_string(enc.offsets[i].first) +
                              ", " + std::to_string(enc.offsets[i].second) +
                              ")";
    const nlohmann::json token = tokenizer->IdToToken(enc.ids[i]);
    std::printf(
        "%6zu %8d  %-14s %s\n", i, enc.ids[i], range.c_str(),
        token.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            .c_str());
  }
  return Status::Ok();
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize",
                                     "Show the token ids, tokens and byte "
                                     "offsets a model's tokenizer produces");
  cmd->add_option("model_dir", args->model_dir,
                  "Model directory (or one holding only tokenizer files)")
      ->required();
  auto* text_opt = cmd->add_option("--text", args->text, "Text to tokenize");
  cmd->add_option("--file", args->file,
                  "File to tokenize ('-' for stdin; the default)")
      ->excludes(text_opt);
  cmd->add_flag("--no-special", args->no_special,
                "Do not add special tokens (HF add_special_tokens=False)");
  cmd->add_flag("--json", args->json,
                "Print {\"ids\", \"tokens\", \"offsets\"} as JSON");
  cmd->add_flag("--replace-invalid-utf8", args->replace_invalid_utf8,
                "Replace invalid UTF-8 by U+FFFD instead of failing");
  cmd->callback([args, text_opt, exit_code] {
    *exit_code =
        ReportStatus("tokenize", RunTokenize(*args, text_opt->count() > 0));
  });
}

}  // namespace loom::cli
