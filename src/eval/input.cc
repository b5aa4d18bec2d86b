#include "src/eval/input.h"

#include <cctype>
#include <charconv>

#include "src/base/read_file.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::eval {

StatusOr<AddBos> ParseAddBos(std::string_view text) {
  if (text == "auto") return AddBos::kAuto;
  if (text == "yes") return AddBos::kYes;
  if (text == "no") return AddBos::kNo;
  return InvalidArgumentError("--add-bos must be auto, yes or no, got '" +
                              std::string(text) + "'");
}

StatusOr<std::vector<int32_t>> ParseTokenIds(std::string_view text,
                                             const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',' || c == '[' ||
        c == ']') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[j])) ||
            (j == i && text[j] == '-')))
      ++j;
    if (j == i || (j < text.size() &&
                   !std::isspace(static_cast<unsigned char>(text[j])) &&
                   text[j] != ',' && text[j] != ']'))
      return InvalidArgumentError(what +
                                  ": expected token ids (integers) at byte " +
                                  std::to_string(i));
    long long v = 0;
    const auto [end, ec] = std::from_chars(text.data() + i, text.data() + j, v);
    if (ec != std::errc() || end != text.data() + j || v < 0 || v > INT32_MAX)
      return InvalidArgumentError(
          what + ": token id " + std::string(text.substr(i, j - i)) +
          " at byte " + std::to_string(i) + " is out of range");
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

StatusOr<EvalInput> TokenizeText(std::string_view text,
                                 const std::string& tokenizer_dir,
                                 AddBos add_bos, const ModelConfig& config) {
  ASSIGN_OR_RETURN(auto tokenizer, tok::Tokenizer::Load(tokenizer_dir));
  ASSIGN_OR_RETURN(tok::Encoding enc,
                   tokenizer->Encode(text, /*add_special_tokens=*/false));
  EvalInput in;
  in.bos_id = tokenizer->bos_id() >= 0
                  ? tokenizer->bos_id()
                  : static_cast<int32_t>(config.bos_token_id);
  in.bos = add_bos == AddBos::kYes ||
           (add_bos == AddBos::kAuto && tokenizer->add_bos());
  if (in.bos && in.bos_id < 0)
    return InvalidArgumentError("--add-bos: the tokenizer in " + tokenizer_dir +
                                " and the model config define no BOS token");
  if (in.bos) in.ids.push_back(in.bos_id);
  in.ids.insert(in.ids.end(), enc.ids.begin(), enc.ids.end());
  return in;
}

StatusOr<EvalInput> LoadEvalInput(const InputOptions& options,
                                  const ModelConfig& config) {
  if (options.text_file.empty() == options.tokens_file.empty())
    return InvalidArgumentError(
        "give exactly one of --text FILE and --tokens FILE");
  if (!options.text_file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(options.text_file));
    ASSIGN_OR_RETURN(EvalInput in, TokenizeText(text, options.tokenizer_dir,
                                                options.add_bos, config));
    in.source = "text " + options.text_file + " (" +
                std::to_string(text.size()) + " bytes)";
    return in;
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(options.tokens_file));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   ParseTokenIds(text, options.tokens_file));
  ASSIGN_OR_RETURN(EvalInput in,
                   TokenIdsInput(std::move(ids), options.add_bos, config));
  in.source = "tokens " + options.tokens_file;
  return in;
}

StatusOr<EvalInput> TokenIdsInput(std::vector<int32_t> ids, AddBos add_bos,
                                  const ModelConfig& config) {
  EvalInput in;
  in.ids = std::move(ids);
  in.bos_id = static_cast<int32_t>(config.bos_token_id);
  const bool starts_with_bos =
      !in.ids.empty() && in.bos_id >= 0 && in.ids[0] == in.bos_id;
  switch (add_bos) {
    case AddBos::kAuto:
      in.bos = starts_with_bos;
      break;
    case AddBos::kNo:
      in.bos = false;
      break;
    case AddBos::kYes:
      if (in.bos_id < 0)
        return InvalidArgumentError(
            "--add-bos yes: the model config defines no bos_token_id");
      if (!starts_with_bos) in.ids.insert(in.ids.begin(), in.bos_id);
      in.bos = true;
      break;
  }
  return in;
}

WindowOptions MakeWindowOptions(Protocol protocol, int64_t ctx, int64_t stride,
                                int64_t max_windows, const EvalInput& input) {
  WindowOptions o;
  o.protocol = protocol;
  o.ctx = ctx;
  o.stride = stride;
  o.max_windows = max_windows;
  o.window_bos =
      protocol == Protocol::kLlamaCpp && input.bos ? input.bos_id : -1;
  return o;
}

}  // namespace loom::eval
