// Generation requests parsed, and their replies (generation.h).
#include "src/serve/routes/generation.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "src/core/json_int.h"
#include "src/eval/generate.h"
#include "src/serve/routes/common.h"

namespace loom::serve::routes {
namespace {

// TheLoom's attention_weights: {key: {data (flat), shape [1, heads, keys],
// dtype}} in the request's array format and dtype; null for no layers.
json AttentionWeights(const GenFields& f, const GenResult& g) {
  if (f.attention.empty()) return nullptr;
  json out = json::object();
  const auto& blocks = f.request.attention_layers;
  for (const auto& [key, block] : f.attention) {
    const size_t i = static_cast<size_t>(
        std::find(blocks.begin(), blocks.end(), block) - blocks.begin());
    if (i >= g.attention_heads.size()) continue;  // nothing was fed
    const int64_t heads = g.attention_heads[i];
    json a = EncodeArray(g.attention[i].data(), 1, heads * g.attention_keys,
                         true, f.dtype, f.format);
    a["shape"] = {1, heads, g.attention_keys};
    out[key] = std::move(a);
  }
  return out;
}

}  // namespace

// Submits every request of `fields` to `e` at once (they share forwards);
// on a refusal the tickets already taken are cancelled and the error names
// the prompt.
StatusOr<std::vector<std::shared_ptr<Ticket>>> SubmitAll(
    Engine& e, const std::vector<GenFields>& fields) {
  std::vector<std::shared_ptr<Ticket>> tickets;
  for (size_t i = 0; i < fields.size(); ++i) {
    StatusOr<std::shared_ptr<Ticket>> t = e.Submit(fields[i].request);
    if (!t.ok()) {
      for (auto& s : tickets) s->Cancel();
      return t.status().WithContext("prompt " + std::to_string(i));
    }
    tickets.push_back(*t);
  }
  return tickets;
}

Status PromptTokenIdsAsPrompt(json* body) {
  auto ids = body->find("prompt_token_ids");
  if (ids == body->end() || ids->is_null()) return Status();
  if (body->contains("prompt") && !(*body)["prompt"].is_null())
    return InvalidArgumentError(
        "fields `prompt` and `prompt_token_ids`: give one of them, not both");
  if (!ids->is_array())
    return InvalidArgumentError(
        "field `prompt_token_ids`: expected a list of token ids, got " +
        std::string(ids->type_name()));
  json moved = std::move(*ids);
  body->erase("prompt_token_ids");
  (*body)["prompt"] = std::move(moved);
  return Status();
}

StatusOr<std::vector<int32_t>> Tokens(const ServerOptions& o, const Engine& e,
                                      const json& prompt, bool add_special,
                                      const std::string& field) {
  std::vector<int32_t> ids;
  if (prompt.is_string()) {
    // Refused as `loom extract` refuses an empty text row (and Python an
    // empty prompt), though BOS alone would give a token.
    if (prompt.get_ref<const std::string&>().empty())
      return InvalidArgumentError("field `" + field + "`: empty text");
    if (e.tokenizer() == nullptr)
      return InvalidArgumentError(
          "field `" + field + "`: text needs a tokenizer, and model " + e.id() +
          " has none (" + e.tokenizer_error() +
          "); send the prompt as token ids (a list of integers)");
    ASSIGN_OR_RETURN(
        tok::Encoding enc,
        e.tokenizer()->Encode(prompt.get<std::string>(), add_special));
    ids = std::move(enc.ids);
  } else if (prompt.is_array()) {
    for (const json& t : prompt) {
      if (!t.is_number_integer())
        return InvalidArgumentError(
            "field `" + field +
            "`: expected a string or a list of token ids, got "
            "an element " +
            Dump(t));
      const int64_t v = JsonInt64(t).value_or(-1);
      if (v < 0 || v >= e.model().config().vocab_size)
        return InvalidArgumentError(
            "field `" + field + "`: token id " + Dump(t) +
            " outside the vocabulary [0, " +
            std::to_string(e.model().config().vocab_size) + ")");
      ids.push_back(static_cast<int32_t>(v));
    }
  } else {
    return InvalidArgumentError(
        "field `" + field +
        "`: expected a string or a list of token ids, got " +
        std::string(prompt.type_name()));
  }
  if (ids.empty())
    return InvalidArgumentError("field `" + field + "` has no tokens");
  const int64_t limit = o.max_prompt_tokens > 0
                            ? std::min(o.max_prompt_tokens, e.context())
                            : e.context();
  if (static_cast<int64_t>(ids.size()) > limit)
    return InvalidArgumentError(
        "the prompt has " + std::to_string(ids.size()) +
        " tokens, more than the limit of " + std::to_string(limit) +
        (o.max_prompt_tokens > 0 ? " (server.max_prompt_tokens)"
                                 : " (the serving context)"));
  return ids;
}

StatusOr<GenFields> ParseGen(const ServerOptions& o, const Engine& e,
                             const json& b, std::vector<int32_t> prompt,
                             bool chat) {
  GenFields f;
  GenRequest& r = f.request;
  r.prompt = std::move(prompt);
  // TheLoom's defaults (max_tokens 256, temperature 0.7, top_p 0.9; chat
  // 1.0), the generation parameters' ranges, at most kMaxRequestTokens.
  const double temperature = 0.7, top_p = chat ? 1.0 : 0.9;
  r.max_new_tokens = 256;
  r.sampling.temperature = static_cast<float>(temperature);
  r.sampling.top_p = static_cast<float>(top_p);
  std::vector<eval::ParamField> params =
      eval::GenerationParams(&r.max_new_tokens, &r.sampling, &r.stop_strings);
  eval::FindParam(params, "max_tokens")->hi = kMaxRequestTokens;
  RETURN_IF_ERROR(ReadParams(b, params));
  // The values as given, unrounded (persisted experiments record them);
  // ReadParams checked their ranges.
  constexpr double kAny = std::numeric_limits<double>::max();
  ASSIGN_OR_RETURN(f.temperature,
                   GetNumber(b, "temperature", temperature, -kAny, kAny));
  ASSIGN_OR_RETURN(f.top_p, GetNumber(b, "top_p", top_p, -kAny, kAny));
  r.stop_ids = e.stop_ids();
  ASSIGN_OR_RETURN(bool ignore_eos, GetBool(b, "ignore_eos", false));
  if (ignore_eos) r.stop_ids.clear();
  ASSIGN_OR_RETURN(f.return_hidden, GetBool(b, "return_hidden_states", true));
  ASSIGN_OR_RETURN(f.full_sequence, GetBool(b, "return_full_sequence", false));
  ASSIGN_OR_RETURN(f.return_attention, GetBool(b, "return_attention", false));
  ASSIGN_OR_RETURN(std::string fmt,
                   GetString(b, "hidden_state_format", "list"));
  ASSIGN_OR_RETURN(f.format, ParseArrayFormat(fmt));
  f.dtype = o.hidden_dtype;
  ASSIGN_OR_RETURN(std::string dtype_name,
                   GetString(b, "hidden_state_dtype", ""));
  if (!dtype_name.empty()) {
    ASSIGN_OR_RETURN(f.dtype, ParseReturnDType(dtype_name));
  }
  // Layers: a list of ints, one int, or "all" (TheLoom: -n .. -1).
  std::vector<int64_t> layers = o.default_layers;
  const int64_t n = e.model().config().num_layers;
  if (b.contains("hidden_state_layers") &&
      !b["hidden_state_layers"].is_null()) {
    const json& l = b["hidden_state_layers"];
    layers.clear();
    if (l.is_string() && l.get<std::string>() == "all") {
      for (int64_t i = -n; i <= -1; ++i) layers.push_back(i);
    } else if (JsonInt64(l)) {
      layers.push_back(*JsonInt64(l));
    } else if (l.is_array()) {
      for (const json& x : l) {
        const std::optional<int64_t> layer = JsonInt64(x);
        if (!layer)
          return InvalidArgumentError(
              "field `hidden_state_layers`: expected integers or \"all\", "
              "got " +
              Dump(l));
        layers.push_back(*layer);
      }
    } else {
      return InvalidArgumentError(
          "field `hidden_state_layers`: expected integers or \"all\", got " +
          Dump(l));
    }
  }
  if (f.return_hidden)
    for (int64_t l : layers) {
      ASSIGN_OR_RETURN(HookPoint h, e.LayerHook(l));
      f.layers.emplace_back(std::to_string(l), h);
    }
  // TheLoom's attention keys: the same layer list; index i >= 0 is block
  // i, i < 0 block n + i (so -1 is the last block, as for hidden states).
  if (f.return_attention)
    for (int64_t l : layers) {
      const int64_t block = l < 0 ? n + l : l;
      if (block < 0 || block >= n)
        return InvalidArgumentError(
            "return_attention: layer " + std::to_string(l) +
            " of hidden_state_layers is outside [" + std::to_string(-n) + ", " +
            std::to_string(n - 1) +
            "]: attention layer i >= 0 is "
            "block i, i < 0 is block " +
            std::to_string(n) + " + i");
      f.attention.emplace_back(std::to_string(l), block);
      auto& blocks = r.attention_layers;
      if (std::find(blocks.begin(), blocks.end(), block) == blocks.end())
        blocks.push_back(block);
    }
  ASSIGN_OR_RETURN(std::vector<std::string> hooks, GetStrings(b, "hooks"));
  if (!hooks.empty()) {
    ASSIGN_OR_RETURN(HookSet set, ResolveHooks(hooks, {}, e.model().config()));
    f.hooks = set.hooks();
    ASSIGN_OR_RETURN(std::vector<std::string> sel, GetStrings(b, "select"));
    if (sel.empty()) sel = {"last"};
    for (const std::string& s : sel) {
      ASSIGN_OR_RETURN(RowSelector rs, ParseRowSelector(s));
      f.selectors.push_back(rs);
    }
  }
  // A selector no run of this request can satisfy is refused before it
  // generates anything.
  const int64_t most_rows = static_cast<int64_t>(r.prompt.size()) +
                            std::max<int64_t>(r.max_new_tokens - 1, 0);
  for (const RowSelector& s : f.selectors)
    RETURN_IF_ERROR(CheckSelectorCanFit(s, most_rows));
  bool all_rows = f.full_sequence;
  for (const RowSelector& s : f.selectors)
    all_rows |= s.kind != RowSelector::Kind::kLast;
  r.rows = all_rows ? CaptureRows::kAll : CaptureRows::kLast;
  for (const auto& [_, h] : f.layers)
    if (std::find(r.hooks.begin(), r.hooks.end(), h) == r.hooks.end())
      r.hooks.push_back(h);
  for (const HookPoint& h : f.hooks)
    if (std::find(r.hooks.begin(), r.hooks.end(), h) == r.hooks.end())
      r.hooks.push_back(h);
  return f;
}

// The request's `interventions` for `prompts` prompts, parsed once.
StatusOr<RequestInterventions> Interventions(const ServerOptions& o,
                                             const Engine& e, const json& b,
                                             int64_t prompts) {
  return ParseRequestInterventions(b, e.model().config(), prompts,
                                   o.max_intervention_floats);
}

// Gives prompt `row` of a request its interventions.
Status Attach(const RequestInterventions& ivs, int64_t row, GenRequest* r) {
  if (ivs.list.empty()) return Status();
  ASSIGN_OR_RETURN(
      r->interventions,
      InterventionsForPrompt(ivs, row, static_cast<int64_t>(r->prompt.size())));
  return Status();
}

// The capture of `hook` in a result: [rows, width].
const float* Capture(const GenFields& f, const GenResult& g,
                     const HookPoint& hook, int64_t* width) {
  const auto& hooks = f.request.hooks;
  const size_t i = static_cast<size_t>(
      std::find(hooks.begin(), hooks.end(), hook) - hooks.begin());
  *width = g.widths[i];
  return g.captures[i].data();
}

// TheLoom's generation response, plus Loom's fields; without `arrays`,
// the fields beside the arrays (a binary reply's metadata).
StatusOr<json> GenResponse(const Engine& e, const GenFields& f,
                           const GenResult& g, bool arrays) {
  json j;
  j["text"] = g.text;
  j["token_count"] = g.token_ids.size();
  j["token_ids"] = g.token_ids;
  j["stop_reason"] = g.stop_reason;
  if (!arrays) {
    if (!f.hooks.empty()) j["activation_rows"] = g.rows;
  } else if (f.return_hidden) {
    json hs = json::object(), seq = json::object();
    for (const auto& [key, hook] : f.layers) {
      int64_t w = 0;
      const float* rows = Capture(f, g, hook, &w);
      hs[key] =
          EncodeArray(rows + (g.rows - 1) * w, 1, w, true, f.dtype, f.format);
      if (f.full_sequence) {
        const int64_t first = static_cast<int64_t>(g.prompt_ids.size()) - 1;
        const int64_t count =
            std::min<int64_t>(std::max<int64_t>(g.rows - first, 0),
                              static_cast<int64_t>(g.token_ids.size()));
        seq[key] =
            EncodeArray(rows + first * w, count, w, false, f.dtype, f.format);
      }
    }
    j["hidden_states"] = std::move(hs);
    if (f.full_sequence) j["sequence_hidden_states"] = std::move(seq);
  }
  if (f.return_attention && arrays)
    j["attention_weights"] = AttentionWeights(f, g);
  if (!f.hooks.empty() && arrays) {
    json acts = json::object();
    for (const HookPoint& h : f.hooks) {
      int64_t w = 0;
      const float* rows = Capture(f, g, h, &w);
      json per = json::object();
      for (const RowSelector& s : f.selectors) {
        int64_t k = 0;
        ASSIGN_OR_RETURN(std::vector<float> sel,
                         SelectRows(s, rows, g.rows, w, &k));
        per[s.spec] = EncodeArray(sel.data(), k, w, false, f.dtype, f.format);
      }
      acts[HookName(h)] = std::move(per);
    }
    j["activations"] = std::move(acts);
    j["activation_rows"] = g.rows;
  }
  const double seconds = (g.queue_ms + g.run_ms) / 1000.0;
  j["metadata"] = {{"model", e.id()},
                   {"input_tokens", g.prompt_ids.size()},
                   {"output_tokens", g.token_ids.size()},
                   {"inference_time_ms", g.queue_ms + g.run_ms},
                   {"queue_time_ms", g.queue_ms},
                   {"tokens_per_second",
                    g.run_ms > 0 ? static_cast<double>(g.token_ids.size()) /
                                       (g.run_ms / 1000.0)
                                 : 0.0},
                   {"total_seconds", seconds}};
  return j;
}

// The arrays of a generation reply, named as its JSON fields:
// hidden_states.<layer>, sequence_hidden_states.<layer>,
// activations.<hook>.<selector>, attention_weights.<layer>.
std::vector<std::string> GenArrayNames(const GenFields& f) {
  std::vector<std::string> names;
  if (f.return_hidden) {
    for (const auto& [key, _] : f.layers)
      names.push_back("hidden_states." + key);
    if (f.full_sequence)
      for (const auto& [key, _] : f.layers)
        names.push_back("sequence_hidden_states." + key);
  }
  for (const HookPoint& h : f.hooks)
    for (const RowSelector& s : f.selectors)
      names.push_back("activations." + HookName(h) + "." + s.spec);
  for (const auto& [key, _] : f.attention)
    names.push_back("attention_weights." + key);
  return names;
}
// The arrays of GenArrayNames (values in `g`, or in *storage), with the
// shapes of the JSON reply.
StatusOr<std::vector<BinaryArray>> GenArrays(
    const GenFields& f, const GenResult& g,
    std::vector<std::vector<float>>* storage) {
  const std::vector<std::string> names = GenArrayNames(f);
  std::vector<BinaryArray> out;
  size_t next = 0;
  auto add = [&](std::vector<int64_t> shape, const float* values) {
    out.push_back({names[next++], std::move(shape), values});
  };
  if (f.return_hidden) {
    for (const auto& [_, hook] : f.layers) {
      int64_t w = 0;
      const float* rows = Capture(f, g, hook, &w);
      add({w}, rows + (g.rows - 1) * w);
    }
    if (f.full_sequence)
      for (const auto& [_, hook] : f.layers) {
        int64_t w = 0;
        const float* rows = Capture(f, g, hook, &w);
        const int64_t first = static_cast<int64_t>(g.prompt_ids.size()) - 1;
        const int64_t count =
            std::min<int64_t>(std::max<int64_t>(g.rows - first, 0),
                              static_cast<int64_t>(g.token_ids.size()));
        add({count, w}, rows + first * w);
      }
  }
  storage->reserve(f.hooks.size() * f.selectors.size());
  for (const HookPoint& h : f.hooks) {
    int64_t w = 0;
    const float* rows = Capture(f, g, h, &w);
    for (const RowSelector& s : f.selectors) {
      int64_t k = 0;
      ASSIGN_OR_RETURN(std::vector<float> sel,
                       SelectRows(s, rows, g.rows, w, &k));
      storage->push_back(std::move(sel));
      add({k, w}, storage->back().data());
    }
  }
  const auto& blocks = f.request.attention_layers;
  for (const auto& [_, block] : f.attention) {
    const size_t i = static_cast<size_t>(
        std::find(blocks.begin(), blocks.end(), block) - blocks.begin());
    if (i >= g.attention_heads.size())
      return InternalError("no attention rows were computed");
    add({1, g.attention_heads[i], g.attention_keys}, g.attention[i].data());
  }
  return out;
}

}  // namespace loom::serve::routes
