// POST /v1/steer/completion and /v1/steer/completion-chat (steer.h).
#include "src/serve/routes/steer.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/eval/generate.h"
#include "src/model/interventions.h"
#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"
#include "src/serve/routes/neuronpedia.h"
#include "src/serve/sae_set.h"

namespace loom::serve::routes {

namespace {

// One steering direction: its hook, its vector and its strength.
struct Direction {
  HookPoint hook;
  std::vector<float> vector;
  double strength = 0;
};

// `features[i]`: the decoder row of a served SAE, at the hook it writes
// (a transcoder's estimated hook).
StatusOr<Direction> FeatureDirection(const ServerContext& ctx,
                                     const ModelConfig& c, const json& f,
                                     const std::string& at) {
  if (!f.is_object())
    return InvalidArgumentError("field `" + at +
                                "`: expected {source, index, strength}");
  ASSIGN_OR_RETURN(std::string source, NpRequiredString(f, "source"));
  const ServedSae* s = ctx.saes.Find(source);
  if (s == nullptr)
    return InvalidArgumentError("field `" + at + ".source`: no SAE `" + source +
                                "` is served");
  ASSIGN_OR_RETURN(const HookPoint read, SaeSet::HookOn(*s, c));
  Direction d;
  d.hook = read;
  if (IsTranscoder(s->sae->architecture)) {
    ASSIGN_OR_RETURN(std::vector<HookPoint> out,
                     ParseModelHookPattern(s->sae->hook_out, c));
    if (out.size() != 1)
      return InvalidArgumentError("field `" + at + ".source`: " +
                                  s->sae->hook_out + " names no one hook");
    d.hook = out[0];
  }
  ASSIGN_OR_RETURN(const int64_t index,
                   GetInt(f, "index", -1, 0, s->sae->d_sae - 1));
  if (index < 0)
    return InvalidArgumentError("field `" + at + ".index`: required");
  ASSIGN_OR_RETURN(d.strength, GetNumber(f, "strength", 0, -1e9, 1e9));
  const float* row = s->sae->w_dec.data() + index * s->sae->d_out;
  d.vector.assign(row, row + s->sae->d_out);
  return d;
}

// `vectors[i]`: {steeringVector, strength, hook}.
StatusOr<Direction> VectorDirection(const ModelConfig& c, const json& v,
                                    const std::string& at) {
  if (!v.is_object())
    return InvalidArgumentError("field `" + at +
                                "`: expected {steeringVector, strength, hook}");
  ASSIGN_OR_RETURN(std::string hook, NpRequiredString(v, "hook"));
  StatusOr<std::vector<HookPoint>> hooks = ParseModelHookPattern(hook, c);
  if (!hooks.ok()) return hooks.status().WithContext("field `" + at + ".hook`");
  if (hooks->size() != 1)
    return InvalidArgumentError("field `" + at + ".hook`: `" + hook +
                                "` must name one hook");
  Direction d;
  d.hook = hooks->front();
  const std::string key = NpKey(v, "steeringVector", "steering_vector");
  if (!v.contains(key) || !v[key].is_array())
    return InvalidArgumentError("field `" + at + "." + key +
                                "`: expected a list of numbers");
  for (const json& x : v[key]) {
    if (!x.is_number() || !std::isfinite(x.get<double>()))
      return InvalidArgumentError("field `" + at + "." + key +
                                  "`: expected finite numbers, got " + Dump(x));
    d.vector.push_back(x.get<float>());
  }
  ASSIGN_OR_RETURN(d.strength, GetNumber(v, "strength", 0, -1e9, 1e9));
  return d;
}

// The STEERED generation's interventions: every direction, each checked
// against the model (an editable hook of its width), normalized when asked,
// times strengthMultiplier, at every position of the prompt (with
// `skip_prompt_special`: its non-special ones) and of the generation.
StatusOr<std::vector<Intervention>> Steering(const ServerContext& ctx,
                                             const Engine& e, const json& b,
                                             const std::vector<int32_t>& prompt,
                                             bool skip_prompt_special) {
  const ModelConfig& c = e.model().config();
  const bool has_features = b.contains("features") && !b["features"].is_null();
  const bool has_vectors = b.contains("vectors") && !b["vectors"].is_null();
  if (has_features == has_vectors)
    return InvalidArgumentError(
        "exactly one of `features` and `vectors` must be given");
  const std::string list = has_features ? "features" : "vectors";
  if (!b[list].is_array())
    return InvalidArgumentError("field `" + list + "`: expected a list");
  ASSIGN_OR_RETURN(
      std::string method,
      GetString(b, NpKey(b, "steerMethod", "steer_method"), "SIMPLE_ADDITIVE"));
  if (method != "SIMPLE_ADDITIVE")
    return InvalidArgumentError(
        "field `" + NpKey(b, "steerMethod", "steer_method") + "`: `" + method +
        "` is not supported by this server (SIMPLE_ADDITIVE is)");
  ASSIGN_OR_RETURN(
      const bool normalize,
      GetBool(b, NpKey(b, "normalizeSteering", "normalize_steering"), false));
  ASSIGN_OR_RETURN(
      const double multiplier,
      GetNumber(b, NpKey(b, "strengthMultiplier", "strength_multiplier"), 1.0,
                -1e9, 1e9));
  InterventionPositions prompt_positions;
  if (skip_prompt_special) {
    prompt_positions.kind = InterventionPositions::Kind::kList;
    for (size_t p = 0; p < prompt.size(); ++p)
      if (!IsSpecialToken(e, prompt[p]))
        prompt_positions.list.push_back(static_cast<int64_t>(p));
  }
  std::vector<Intervention> out;
  for (size_t i = 0; i < b[list].size(); ++i) {
    const std::string at = list + "[" + std::to_string(i) + "]";
    ASSIGN_OR_RETURN(Direction d, has_features
                                      ? FeatureDirection(ctx, c, b[list][i], at)
                                      : VectorDirection(c, b[list][i], at));
    if (!IsInterventionSite(d.hook.site))
      return InvalidArgumentError("field `" + at + "`: " + HookName(d.hook) +
                                  " is not a hook that can be edited");
    ASSIGN_OR_RETURN(const int64_t width, HookWidth(d.hook, c));
    if (static_cast<int64_t>(d.vector.size()) != width)
      return InvalidArgumentError("field `" + at + "`: the direction has " +
                                  std::to_string(d.vector.size()) +
                                  " values, " + HookName(d.hook) + " is " +
                                  std::to_string(width) + " wide");
    double norm = 0;
    for (float x : d.vector) norm += static_cast<double>(x) * x;
    norm = std::sqrt(norm);
    if (normalize && norm == 0)
      return InvalidArgumentError("field `" + at +
                                  "`: a zero direction cannot be normalized");
    Intervention iv;
    iv.hook = d.hook;
    iv.mode = InterventionMode::kAdd;
    iv.vector = std::move(d.vector);
    if (normalize)
      for (float& x : iv.vector) x = static_cast<float>(x / norm);
    iv.scale = static_cast<float>(multiplier * d.strength);
    if (!skip_prompt_special) {
      out.push_back(std::move(iv));
      continue;
    }
    Intervention generated = iv;
    generated.apply_to = InterventionApplyTo::kGenerated;
    iv.apply_to = InterventionApplyTo::kPrompt;
    iv.positions = prompt_positions;
    if (!iv.positions.list.empty()) out.push_back(std::move(iv));
    out.push_back(std::move(generated));
  }
  return out;
}

// `types`: STEERED and/or DEFAULT, distinct, at least one.
StatusOr<std::vector<std::string>> Types(const json& b) {
  ASSIGN_OR_RETURN(std::vector<std::string> types, GetStrings(b, "types"));
  if (types.empty())
    return InvalidArgumentError(
        "field `types`: expected a non-empty list of STEERED and DEFAULT");
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "STEERED" && types[i] != "DEFAULT")
      return InvalidArgumentError("field `types[" + std::to_string(i) +
                                  "]`: expected STEERED or DEFAULT, got `" +
                                  types[i] + "`");
    for (size_t j = 0; j < i; ++j)
      if (types[j] == types[i])
        return InvalidArgumentError("field `types`: `" + types[i] +
                                    "` is listed twice");
  }
  return types;
}

// One generation of `types`: its type and the generated text.
struct SteerOutput {
  std::string type, text;
};

// Each of `types` (in their order) generated for `prompt`.
StatusOr<std::vector<SteerOutput>> SteerGenerate(
    const ServerContext& ctx, Engine& e, const json& b,
    const std::vector<int32_t>& prompt, bool skip_prompt_special) {
  ASSIGN_OR_RETURN(std::vector<std::string> types, Types(b));
  ASSIGN_OR_RETURN(std::vector<Intervention> steering,
                   Steering(ctx, e, b, prompt, skip_prompt_special));
  ASSIGN_OR_RETURN(
      const int64_t n,
      GetInt(b, NpKey(b, "nCompletionTokens", "n_completion_tokens"), 16, 1,
             kMaxRequestTokens));
  ASSIGN_OR_RETURN(
      const double temperature,
      GetNumber(b, "temperature", 1.0, 0.0, eval::kMaxTemperature));
  ASSIGN_OR_RETURN(const double seed,
                   GetNumber(b, "seed", 0, 0, 9007199254740992.0));
  if (seed != std::floor(seed))
    return InvalidArgumentError("field `seed`: expected an integer, got " +
                                Dump(b["seed"]));
  // Fields Neuronpedia accepts and its backends ignore: refused rather than
  // silently ignored, unless they ask for nothing.
  for (const auto& [camel, snake] : {std::pair{"freqPenalty", "freq_penalty"},
                                     std::pair{"nLogprobs", "n_logprobs"}}) {
    const std::string key = NpKey(b, camel, snake);
    ASSIGN_OR_RETURN(const double v, GetNumber(b, key, 0, -1e9, 1e9));
    if (v != 0)
      return InvalidArgumentError("field `" + key + "`: " + Dump(b[key]) +
                                  " is not supported by this server (0 is)");
  }
  ASSIGN_OR_RETURN(const bool stream, GetBool(b, "stream", false));
  if (stream)
    return InvalidArgumentError(
        "field `stream`: streamed steering is not supported by this server "
        "yet; send stream: false");
  std::vector<std::shared_ptr<Ticket>> tickets;
  for (const std::string& type : types) {
    GenRequest r;
    r.prompt = prompt;
    r.max_new_tokens = n;
    r.sampling.temperature = static_cast<float>(temperature);
    r.sampling.seed = static_cast<uint64_t>(seed);
    r.stop_ids = e.stop_ids();
    if (type == "STEERED") r.interventions = steering;
    StatusOr<std::shared_ptr<Ticket>> t = e.Submit(std::move(r));
    if (!t.ok()) {
      for (auto& other : tickets) other->Cancel();
      return t.status().WithContext(type);
    }
    tickets.push_back(*t);
  }
  std::vector<SteerOutput> out;
  for (size_t i = 0; i < tickets.size(); ++i) {
    ASSIGN_OR_RETURN(GenResult g, tickets[i]->Wait());
    out.push_back({types[i], std::move(g.text)});
  }
  return out;
}

Status Completion(ServerContext& ctx, const httplib::Request& req,
                  httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, NpEngine(ctx, b));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   NpTokens(ctx.options, *e, Prompt(b), "prompt"));
  ASSIGN_OR_RETURN(std::vector<SteerOutput> generated,
                   SteerGenerate(ctx, *e, b, ids, false));
  json outputs = json::array();
  for (const SteerOutput& g : generated)
    outputs.push_back({{"type", g.type}, {"output", g.text}});
  Reply(res, 200, {{"outputs", outputs}});
  return Status();
}

Status CompletionChat(ServerContext& ctx, const httplib::Request& req,
                      httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, NpEngine(ctx, b));
  if (e->chat_template() == nullptr)
    return InvalidArgumentError(
        "model " + e->id() +
        " has no chat template; use /v1/steer/completion with a text prompt");
  ASSIGN_OR_RETURN(nlohmann::ordered_json messages, NpMessages(b, "prompt"));
  nlohmann::ordered_json render = {{"messages", messages},
                                   {"add_generation_prompt", true}};
  ASSIGN_OR_RETURN(std::string text, e->chat_template()->Render(render));
  // The template writes the special tokens itself.
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   Tokens(ctx.options, *e, json(text), false));
  ASSIGN_OR_RETURN(
      const bool steer_special,
      GetBool(b, NpKey(b, "steerSpecialTokens", "steer_special_tokens"), true));
  ASSIGN_OR_RETURN(std::vector<SteerOutput> generated,
                   SteerGenerate(ctx, *e, b, ids, !steer_special));
  const std::string& raw = text;  // the rendered prompt, special tokens too
  const json input_messages = json::parse(messages.dump());
  json outputs = json::array();
  for (const SteerOutput& g : generated) {
    json chat = input_messages;
    chat.push_back({{"role", "assistant"}, {"content", g.text}});
    outputs.push_back(
        {{"type", g.type}, {"chatTemplate", chat}, {"raw", raw + g.text}});
  }
  Reply(res, 200,
        {{"outputs", outputs},
         {"input", {{"chatTemplate", input_messages}, {"raw", raw}}}});
  return Status();
}

}  // namespace

void RegisterSteerRoutes(HttpListeners& http, ServerContext& ctx) {
  NpPost(http, ctx, "/v1/steer/completion", Completion);
  NpPost(http, ctx, "/v1/steer/completion-chat", CompletionChat);
}

}  // namespace loom::serve::routes
