#include "src/eval/params.h"

#include <cmath>
#include <limits>

namespace loom::eval {
namespace {

// "2", "0.5": a bound as written in a range.
std::string BoundText(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15)
    return std::to_string(static_cast<int64_t>(x));
  std::string s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  return s;
}

constexpr ParamSpec kGenerationSpecs[] = {
    {"max_tokens", ParamKind::kInt, 0, 1 << 30, false,
     "Most tokens to generate (0: none)"},
    {"temperature", ParamKind::kFloat, 0, kMaxTemperature, false,
     "0 = greedy; > 0 samples"},
    {"top_k", ParamKind::kInt, 0, 1 << 30, false,
     "Keep the k most likely tokens (0 = off)"},
    {"top_p", ParamKind::kFloat, 0, 1, true, "Nucleus mass (1 = off)"},
    {"seed", ParamKind::kSeed, 0, 0, false, "Sampling seed"},
    {"stop", ParamKind::kStrings, 0, 0, false,
     "Stop once the generated text contains this (repeatable)"},
};

}  // namespace

std::string ParamFlag(const ParamSpec& spec) {
  std::string flag = "--" + std::string(spec.name);
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

std::string ParamRangeText(const ParamField& f) {
  const ParamSpec& s = *f.spec;
  switch (s.kind) {
    case ParamKind::kInt:
      return "an integer in [" + BoundText(s.lo) + ", " + BoundText(f.upper()) +
             "]";
    case ParamKind::kSeed:
      return "an integer in [0, " +
             std::to_string(std::numeric_limits<uint64_t>::max()) + "]";
    case ParamKind::kFloat:
      return std::string("a number in ") + (s.lo_open ? "(" : "[") +
             BoundText(s.lo) + ", " + BoundText(f.upper()) + "]";
    case ParamKind::kStrings:
      return "a string or a list of strings";
  }
  return "";
}

bool InParamRange(const ParamField& f, double v) {
  const ParamSpec& s = *f.spec;
  if (!std::isfinite(v)) return false;
  if (s.kind == ParamKind::kSeed) return v >= 0;
  return (s.lo_open ? v > s.lo : v >= s.lo) && v <= f.upper();
}

ParamField* FindParam(std::span<ParamField> fields, std::string_view name) {
  for (ParamField& f : fields)
    if (f.spec->name == name) return &f;
  return nullptr;
}

std::span<const ParamSpec> GenerationParamSpecs() { return kGenerationSpecs; }

std::vector<ParamField> GenerationParams(int64_t* max_tokens,
                                         SamplingOptions* sampling,
                                         std::vector<std::string>* stop) {
  const ParamTarget targets[] = {max_tokens,       &sampling->temperature,
                                 &sampling->top_k, &sampling->top_p,
                                 &sampling->seed,  stop};
  static_assert(std::size(kGenerationSpecs) == std::size(targets));
  std::vector<ParamField> fields;
  for (size_t i = 0; i < std::size(kGenerationSpecs); ++i)
    fields.push_back({&kGenerationSpecs[i], targets[i], std::nullopt});
  return fields;
}

}  // namespace loom::eval
