// Harness: chat templates (the Jinja subset of tokenizer_config.json's
// chat_template) and the conversations rendered through them.
//   mode even: the input is a template, rendered with a fixed conversation;
//   mode odd: the input is a JSON rendering context (messages, tools, ...)
//     given to one of the bundled real templates (the next byte picks it).
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/tokenizer/chat_template.h"

namespace loom::fuzz {
namespace {

const nlohmann::ordered_json& Conversation() {
  static const auto* c = new nlohmann::ordered_json(nlohmann::ordered_json::parse(
      R"({"messages":[{"role":"system","content":"Be brief."},)"
      R"({"role":"user","content":"Hi <b> & 'q'"},)"
      R"({"role":"assistant","content":"Hello!","tool_calls":[{"type":"function",)"
      R"("function":{"name":"f","arguments":{"x":1}}}]},)"
      R"({"role":"tool","content":"42"},{"role":"user","content":"More?"}],)"
      R"("add_generation_prompt":true,"bos_token":"<s>","eos_token":"</s>",)"
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}]})"));
  return *c;
}

const std::vector<tok::ChatTemplate>& Bundled() {
  static const auto* all = [] {
    auto* v = new std::vector<tok::ChatTemplate>;
    for (const char* name : {"gemma3", "gpt-oss", "llama3.1", "llama3",
                             "mistral-instruct", "qwen3"}) {
      std::ifstream f(SourcePath(std::string("tests/data/chat_templates/") +
                                 name + ".jinja"));
      std::stringstream ss;
      ss << f.rdbuf();
      auto t = tok::ChatTemplate::Parse(ss.str());
      if (!t.ok()) Fail(std::string(name) + ": " + t.status().ToString());
      v->push_back(std::move(*t));
    }
    return v;
  }();
  return *all;
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::fuzz;
  const auto in = TakeMode(data, size);
  if (in.mode % 2 == 0) {
    auto t = loom::tok::ChatTemplate::Parse(in.rest);
    if (t.ok()) (void)t->Render(Conversation());
    return 0;
  }
  if (in.rest.empty()) return 0;
  const auto& all = Bundled();
  const auto& t = all[static_cast<uint8_t>(in.rest[0]) % all.size()];
  auto context =
      nlohmann::ordered_json::parse(in.rest.substr(1), nullptr, false);
  if (context.is_discarded() || !context.is_object()) return 0;
  (void)t.Render(context);
  return 0;
}
