// `loom` flags from a parameter group (src/eval/params.h): each ParamField
// becomes one option, --top-p for top_p, with the spec's help, the field's
// value as the shown default and the spec's range as the check (a value
// outside it is a usage error naming the flag, flag_ranges.h).
#ifndef LOOM_TOOLS_CLI_PARAM_FLAGS_H_
#define LOOM_TOOLS_CLI_PARAM_FLAGS_H_

#include <CLI/CLI.hpp>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "src/eval/params.h"
#include "tools/cli/flag_ranges.h"

namespace loom::cli {

// --name for one field; `help`, when given, replaces the spec's (a command
// that says what the option does there). An integer whose 0 asks for a
// computed default (zero_is_default) takes no 0 here and shows no default; a
// kBool is a flag without a value.
inline CLI::Option* AddParamFlag(CLI::App& cmd, const eval::ParamField& f,
                                 const std::string& help = "") {
  const eval::ParamSpec& s = *f.spec;
  const std::string flag = eval::ParamFlag(s);
  const std::string text = help.empty() ? std::string(s.help) : help;
  const bool open = f.upper() >= eval::kNoUpperBound;
  return std::visit(
      [&](auto* field) -> CLI::Option* {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, bool>) {
          return cmd.add_flag(flag, *field, text);
        } else {
          CLI::Option* o = cmd.add_option(flag, *field, text);
          switch (s.kind) {
            case eval::ParamKind::kInt:
              o->check(open ? IntRange(static_cast<int64_t>(s.lo))
                            : IntRange(static_cast<int64_t>(s.lo),
                                       static_cast<int64_t>(f.upper())));
              if (s.zero_is_default) return o;
              break;
            case eval::ParamKind::kSeed:
              o->check(Unsigned64());
              break;
            case eval::ParamKind::kFloat:
              o->check(NumberRange(s.lo, s.lo_open, open ? kNoLimit : f.upper(),
                                   false));
              break;
            case eval::ParamKind::kString:
            case eval::ParamKind::kBool:
              break;
            case eval::ParamKind::kStrings:
              if (s.comma_list) o->delimiter(',');
              return o;
          }
          // A list shows no default ("=[]" says nothing).
          if constexpr (std::is_same_v<T, std::vector<std::string>>) return o;
          return o->capture_default_str();
        }
      },
      f.target);
}

// Every field of `fields`, in order.
inline void AddParamFlags(CLI::App& cmd,
                          std::span<const eval::ParamField> fields) {
  for (const eval::ParamField& f : fields) AddParamFlag(cmd, f);
}

// The fields of `fields` named in `names`, in the table's order.
inline void AddParamFlags(CLI::App& cmd,
                          std::span<const eval::ParamField> fields,
                          std::initializer_list<std::string_view> names) {
  for (const eval::ParamField& f : fields)
    for (std::string_view n : names)
      if (f.spec->name == n) AddParamFlag(cmd, f);
}

// --threads of every command that computes on the CPU.
inline CLI::Option* AddThreadsFlag(CLI::App& cmd, int* threads) {
  return AddParamFlag(cmd, {&eval::ModelParam("threads"), threads, {}});
}

// --model: one checkpoint directory (the command marks it required where
// it is).
inline CLI::Option* AddModelFlag(CLI::App& cmd, std::string* model_dir,
                                 const std::string& help = "") {
  return AddParamFlag(cmd, {&eval::ModelParam("model"), model_dir, {}}, help);
}

// --hf-bf16 of every command that computes.
inline CLI::Option* AddHfBf16Flag(CLI::App& cmd, bool* hf_bf16) {
  return AddParamFlag(cmd, {&eval::ModelParam("hf_bf16"), hf_bf16, {}});
}

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_PARAM_FLAGS_H_
