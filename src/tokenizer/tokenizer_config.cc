#include "src/tokenizer/tokenizer_config.h"

#include <filesystem>

#include "src/tokenizer/json_util.h"

namespace loom::tok {
namespace {

// A special token given as "<s>" or as {"content": "<s>", ...}.
StatusOr<std::optional<std::string>> TokenString(const Json& obj,
                                                 std::string_view key,
                                                 const JsonPath& at) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string())
    return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    ASSIGN_OR_RETURN(std::string s, GetString(*it, "content", at.Child(key)));
    return std::optional<std::string>(s);
  }
  return JsonError(at.Child(key),
                   "expected a string or an object with \"content\"");
}

StatusOr<std::optional<bool>> OptionalBool(const Json& obj,
                                           std::string_view key,
                                           const JsonPath& at) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return JsonError(at.Child(key), "expected a boolean");
  return std::optional<bool>(it->get<bool>());
}

}  // namespace

StatusOr<TokenizerConfig> TokenizerConfig::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  TokenizerConfig cfg;
  Json config_json = Json::object();
  const std::string path = (fs::path(dir) / "tokenizer_config.json").string();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    cfg.present = true;
    ASSIGN_OR_RETURN(Json j, ReadJsonFile(path, "tokenizer_config.json"));
    const JsonPath at{"tokenizer_config.json", ""};
    if (!j.is_object()) return JsonError(at, "expected an object");
    config_json = j;
    ASSIGN_OR_RETURN(cfg.add_bos_token, OptionalBool(j, "add_bos_token", at));
    ASSIGN_OR_RETURN(cfg.add_eos_token, OptionalBool(j, "add_eos_token", at));
    ASSIGN_OR_RETURN(cfg.add_prefix_space,
                     OptionalBool(j, "add_prefix_space", at));
    ASSIGN_OR_RETURN(cfg.legacy, OptionalBool(j, "legacy", at));
    ASSIGN_OR_RETURN(cfg.spaces_between_special_tokens,
                     OptionalBool(j, "spaces_between_special_tokens", at));
    ASSIGN_OR_RETURN(cfg.clean_up_tokenization_spaces,
                     OptionalBool(j, "clean_up_tokenization_spaces", at));
    ASSIGN_OR_RETURN(cfg.bos_token, TokenString(j, "bos_token", at));
    ASSIGN_OR_RETURN(cfg.eos_token, TokenString(j, "eos_token", at));
    ASSIGN_OR_RETURN(cfg.pad_token, TokenString(j, "pad_token", at));
    ASSIGN_OR_RETURN(cfg.unk_token, TokenString(j, "unk_token", at));
    ASSIGN_OR_RETURN(cfg.tokenizer_class,
                     OptString(j, "tokenizer_class", at, ""));
    if (auto it = j.find("additional_special_tokens");
        it != j.end() && !it->is_null()) {
      if (!it->is_array())
        return JsonError(at.Child("additional_special_tokens"),
                         "expected an array");
      for (size_t i = 0; i < it->size(); ++i) {
        const Json& e = (*it)[i];
        if (e.is_string()) {
          cfg.additional_special_tokens.push_back(e.get<std::string>());
        } else {
          ASSIGN_OR_RETURN(
              std::string s,
              GetString(e, "content",
                        at.Child("additional_special_tokens").Index(i)));
          cfg.additional_special_tokens.push_back(s);
        }
      }
    }
    if (auto it = j.find("model_max_length"); it != j.end() && !it->is_null()) {
      if (!it->is_number())
        return JsonError(at.Child("model_max_length"), "expected a number");
      const double v = it->get<double>();
      if (v < 0)
        return JsonError(at.Child("model_max_length"),
                         "expected a non-negative number");
      if (v < 1e18) cfg.model_max_length = static_cast<int64_t>(v);
    }
    if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
      if (it->is_string()) {
        cfg.chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        for (size_t i = 0; i < it->size(); ++i) {
          const JsonPath p = at.Child("chat_template").Index(i);
          ASSIGN_OR_RETURN(std::string name, GetString((*it)[i], "name", p));
          ASSIGN_OR_RETURN(std::string tmpl,
                           GetString((*it)[i], "template", p));
          if (i == 0 || name == "default") cfg.chat_template = tmpl;
        }
      } else {
        return JsonError(at.Child("chat_template"),
                         "expected a string or a list of templates");
      }
    }
    if (auto it = j.find("added_tokens_decoder");
        it != j.end() && !it->is_null()) {
      if (!it->is_object())
        return JsonError(at.Child("added_tokens_decoder"),
                         "expected an object");
      for (auto e = it->begin(); e != it->end(); ++e) {
        const JsonPath p = at.Child("added_tokens_decoder").Child(e.key());
        AddedToken t;
        try {
          size_t used = 0;
          t.id = std::stoi(e.key(), &used);
          if (used != e.key().size() || t.id < 0)
            throw std::invalid_argument("id");
        } catch (const std::exception&) {
          return JsonError(p, "expected a non-negative integer id as key");
        }
        ASSIGN_OR_RETURN(t.content, GetString(e.value(), "content", p));
        ASSIGN_OR_RETURN(t.special, OptBool(e.value(), "special", p, false));
        ASSIGN_OR_RETURN(t.lstrip, OptBool(e.value(), "lstrip", p, false));
        ASSIGN_OR_RETURN(t.rstrip, OptBool(e.value(), "rstrip", p, false));
        ASSIGN_OR_RETURN(t.normalized,
                         OptBool(e.value(), "normalized", p, !t.special));
        ASSIGN_OR_RETURN(t.single_word,
                         OptBool(e.value(), "single_word", p, false));
        cfg.added_tokens_decoder.push_back(std::move(t));
      }
    }
  }
  const std::string map_path =
      (fs::path(dir) / "special_tokens_map.json").string();
  if (fs::exists(map_path, ec)) {
    ASSIGN_OR_RETURN(Json j, ReadJsonFile(map_path, "special_tokens_map.json"));
    const JsonPath at{"special_tokens_map.json", ""};
    if (!j.is_object()) return JsonError(at, "expected an object");
    auto fill = [&](std::optional<std::string>* slot,
                    std::string_view key) -> Status {
      if (slot->has_value() || config_json.contains(key)) return Status::Ok();
      ASSIGN_OR_RETURN(*slot, TokenString(j, key, at));
      return Status::Ok();
    };
    // Only fills what tokenizer_config.json leaves out.
    RETURN_IF_ERROR(fill(&cfg.bos_token, "bos_token"));
    RETURN_IF_ERROR(fill(&cfg.eos_token, "eos_token"));
    RETURN_IF_ERROR(fill(&cfg.unk_token, "unk_token"));
    RETURN_IF_ERROR(fill(&cfg.pad_token, "pad_token"));
  }
  return cfg;
}

}  // namespace loom::tok
