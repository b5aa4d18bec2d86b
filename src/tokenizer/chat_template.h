// Chat templates: the Jinja `chat_template` of a Hugging Face model, rendered
// by a small interpreter of our own for the subset of Jinja that real chat
// templates use (Llama 3, Qwen 2.5/3, Mistral, Gemma, gpt-oss harmony).
//
// Rendering follows transformers' apply_chat_template: jinja2's
// ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True and
// the loopcontrols extension; `tojson` as HF defines it (ensure_ascii=False);
// `raise_exception(msg)` and `strftime_now(fmt)` globals. Anything outside the
// subset is an error Status naming the construct and its line:column; no
// input (template or context) can crash the interpreter: nesting depth, loop
// iterations and output size are bounded. See docs/design/tokenizers.md.
//
// Thread-safety: a parsed ChatTemplate is immutable; Render may be called
// concurrently from several threads.
#ifndef LOOM_SRC_TOKENIZER_CHAT_TEMPLATE_H_
#define LOOM_SRC_TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace loom::tok {

struct ChatTemplateProgram;  // The parsed template (defined in the .cc).

class ChatTemplate {
 public:
  // Context key for a fixed "now" (integer seconds since the Unix epoch,
  // formatted as UTC) used by strftime_now(); without it, the current local
  // time is used. Tests set it so renders are deterministic.
  static constexpr const char* kNowEpochKey = "__loom_now_epoch";

  // Parses `source`. Syntax errors and unsupported tags are InvalidArgument
  // naming the construct and its line:column.
  static StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders with `context` (an object: "messages", "add_generation_prompt",
  // "bos_token", "eos_token", "tools", any custom kwargs). Object key order
  // matters for `tojson` and iteration, as in Python: pass an ordered_json
  // to keep it (a plain json has its keys sorted). "bos_token"/"eos_token"
  // default to the tokens set with set_special_tokens (LoadChatTemplate sets
  // them from tokenizer_config.json). Errors (raise_exception, undefined
  // attribute access, type errors, limits) are InvalidArgument with the
  // line:column.
  StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;
  StatusOr<std::string> Render(const nlohmann::json& context) const;

  void set_special_tokens(std::string bos, std::string eos) {
    bos_token_ = std::move(bos);
    eos_token_ = std::move(eos);
  }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  const std::string& source() const;

 private:
  std::shared_ptr<const ChatTemplateProgram> program_;
  std::string bos_token_;
  std::string eos_token_;
};

// Loads the chat template of a model directory: `chat_template.jinja` when
// present, else tokenizer_config.json's "chat_template" (a string, or a list
// of {"name", "template"} from which "default" is taken); bos/eos token
// strings come from tokenizer_config.json (strings or {"content": ...}).
// NotFound when the model has no chat template.
StatusOr<ChatTemplate> LoadChatTemplate(const std::string& model_dir);

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_CHAT_TEMPLATE_H_
