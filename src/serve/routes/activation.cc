// POST /v1/activation/topk-by-token, /v1/activation/all and
// /v1/activation/single (activation.h).
#include "src/serve/routes/activation.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"
#include "src/serve/routes/neuronpedia.h"
#include "src/serve/sae_set.h"

namespace loom::serve::routes {

namespace {

// The hidden states of a prompt at `hooks`, every position [T, width].
StatusOr<GenResult> CaptureAll(Engine& e, std::vector<int32_t> ids,
                               std::vector<HookPoint> hooks) {
  GenRequest r;
  r.prompt = std::move(ids);
  r.hooks = std::move(hooks);
  r.rows = CaptureRows::kAll;
  ASSIGN_OR_RETURN(std::shared_ptr<Ticket> t, e.Submit(std::move(r)));
  return t->Wait();
}

// The served SAE a field names (400 listing the served ones otherwise).
StatusOr<const ServedSae*> FindSource(const ServerContext& ctx,
                                      const std::string& field,
                                      const std::string& id) {
  if (const ServedSae* s = ctx.saes.Find(id)) return s;
  std::string served;
  for (const ServedSae& s : ctx.saes.all())
    served += (served.empty() ? "" : ", ") + s.id;
  return InvalidArgumentError(
      "field `" + field + "`: no SAE `" + id + "` is served (" +
      (served.empty() ? "none is: configure interp.saes or --sae"
                      : "served: " + served) +
      ")");
}

// The rows [T, d_in] SAE `s` reads on the prompt `ids`.
StatusOr<GenResult> SaeInput(Engine& e, const ServedSae& s,
                             const std::vector<int32_t>& ids) {
  ASSIGN_OR_RETURN(HookPoint h, SaeSet::HookOn(s, e.model().config()));
  return CaptureAll(e, ids, {h});
}

// The feature activations [T, d_sae] of `s` on the prompt `ids`.
StatusOr<std::vector<float>> FeatureActs(ServerContext& ctx, Engine& e,
                                         const ServedSae& s,
                                         const std::vector<int32_t>& ids) {
  ASSIGN_OR_RETURN(GenResult g, SaeInput(e, s, ids));
  std::vector<float> acts(static_cast<size_t>(g.rows * s.sae->d_sae));
  SaeOutputs o;
  o.feature_acts = acts.data();
  RETURN_IF_ERROR(ctx.saes.Run(*s.sae, g.captures[0].data(), g.rows, o));
  return acts;
}

// POST /v1/activation/topk-by-token: the top_k features of one SAE at
// every position (ignoreBos, default true: without the leading BOS).
Status TopkByToken(ServerContext& ctx, const httplib::Request& req,
                   httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, NpEngine(ctx, b));
  ASSIGN_OR_RETURN(std::string source, NpRequiredString(b, "source"));
  ASSIGN_OR_RETURN(const ServedSae* s, FindSource(ctx, "source", source));
  ASSIGN_OR_RETURN(const int64_t k,
                   GetInt(b, NpKey(b, "topK", "top_k"), 5, 1, s->sae->d_sae));
  ASSIGN_OR_RETURN(const bool ignore_bos,
                   GetBool(b, NpKey(b, "ignoreBos", "ignore_bos"), true));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   NpTokens(ctx.options, *e, Prompt(b), "prompt"));
  ASSIGN_OR_RETURN(GenResult g, SaeInput(*e, *s, ids));
  std::vector<int32_t> idx(static_cast<size_t>(g.rows * k));
  std::vector<float> val(idx.size());
  SaeOutputs o;
  o.topk = k;
  o.topk_indices = idx.data();
  o.topk_values = val.data();
  RETURN_IF_ERROR(ctx.saes.Run(*s->sae, g.captures[0].data(), g.rows, o));
  const std::vector<std::string> strs = TokenStrings(*e, ids);
  json results = json::array(), tokens = json::array();
  const int64_t first = ignore_bos && StartsWithBos(*e, ids) ? 1 : 0;
  for (int64_t t = first; t < g.rows; ++t) {
    json top = json::array();
    for (int64_t j = 0; j < k; ++j)
      top.push_back({{"featureIndex", idx[t * k + j]},
                     {"activationValue", val[t * k + j]}});
    results.push_back({{"tokenPosition", t},
                       {"token", strs[t]},
                       {"isSpecial", IsSpecialToken(*e, ids[t])},
                       {"topFeatures", std::move(top)}});
    tokens.push_back(strs[t]);
  }
  Reply(res, 200, {{"results", results}, {"tokens", tokens}});
  return Status();
}

// The SAEs /v1/activation/all reads: `selectedSources` of `sourceSet`
// (every SAE of the set when empty), in the order given.
StatusOr<std::vector<const ServedSae*>> SelectedSources(
    const ServerContext& ctx, const json& b, const std::string& set) {
  const std::string key = NpKey(b, "selectedSources", "selected_sources");
  ASSIGN_OR_RETURN(std::vector<std::string> names, GetStrings(b, key));
  std::vector<const ServedSae*> out;
  for (const ServedSae& s : ctx.saes.all())
    if (names.empty() && s.set == set) out.push_back(&s);
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(
        const ServedSae* s,
        FindSource(ctx, key + "[" + std::to_string(i) + "]", names[i]));
    if (s->set != set)
      return InvalidArgumentError("field `" + key + "[" + std::to_string(i) +
                                  "]`: `" + names[i] + "` is in source set `" +
                                  s->set + "`, not `" + set + "`");
    out.push_back(s);
  }
  if (out.empty())
    return InvalidArgumentError("field `" +
                                NpKey(b, "sourceSet", "source_set") +
                                "`: no SAE of set `" + set + "` is served");
  return out;
}

struct Ranked {
  double score;
  size_t source;  // into the selected sources
  int64_t feature;
};

// POST /v1/activation/all: the numResults features of the selected SAEs
// with the largest activation over the prompt (or, with
// sortByTokenIndexes, the largest sum at those positions); ties: the
// earlier source, then the lower index.
Status ActivationAll(ServerContext& ctx, const httplib::Request& req,
                     httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, NpEngine(ctx, b));
  ASSIGN_OR_RETURN(std::string set,
                   NpRequiredString(b, NpKey(b, "sourceSet", "source_set")));
  ASSIGN_OR_RETURN(std::vector<const ServedSae*> saes,
                   SelectedSources(ctx, b, set));
  ASSIGN_OR_RETURN(
      const int64_t n,
      GetInt(b, NpKey(b, "numResults", "num_results"), 25, 1, 1000));
  ASSIGN_OR_RETURN(const bool ignore_bos,
                   GetBool(b, NpKey(b, "ignoreBos", "ignore_bos"), true));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   NpTokens(ctx.options, *e, Prompt(b), "prompt"));
  const int64_t T = static_cast<int64_t>(ids.size());
  const std::string sort_key =
      NpKey(b, "sortByTokenIndexes", "sort_by_token_indexes");
  std::vector<int64_t> sort_by;
  if (b.contains(sort_key) && !b[sort_key].is_null()) {
    if (!b[sort_key].is_array())
      return InvalidArgumentError("field `" + sort_key +
                                  "`: expected a list of token positions");
    for (const json& p : b[sort_key]) {
      if (!p.is_number_integer() || p.get<int64_t>() < 0 ||
          p.get<int64_t>() >= T)
        return InvalidArgumentError("field `" + sort_key + "`: " + Dump(p) +
                                    " is no token position of the prompt's " +
                                    std::to_string(T) + " tokens (BOS at 0)");
      sort_by.push_back(p.get<int64_t>());
    }
  }
  std::vector<std::vector<float>> acts;
  std::vector<Ranked> ranked;
  for (size_t si = 0; si < saes.size(); ++si) {
    ASSIGN_OR_RETURN(std::vector<float> a,
                     FeatureActs(ctx, *e, *saes[si], ids));
    const int64_t F = saes[si]->sae->d_sae;
    if (ignore_bos && StartsWithBos(*e, ids))
      std::fill(a.begin(), a.begin() + F, 0.0f);
    for (int64_t f = 0; f < F; ++f) {
      double score = 0;
      if (sort_by.empty()) {
        score = -INFINITY;
        for (int64_t t = 0; t < T; ++t)
          score = std::max<double>(score, a[t * F + f]);
      }
      for (int64_t t : sort_by) score += a[t * F + f];
      ranked.push_back({score, si, f});
    }
    acts.push_back(std::move(a));
  }
  const size_t keep = std::min(ranked.size(), static_cast<size_t>(n));
  std::partial_sort(ranked.begin(), ranked.begin() + keep, ranked.end(),
                    [](const Ranked& x, const Ranked& y) {
                      if (x.score != y.score) return x.score > y.score;
                      if (x.source != y.source) return x.source < y.source;
                      return x.feature < y.feature;
                    });
  json out = json::array();
  for (size_t r = 0; r < keep; ++r) {
    const Ranked& k = ranked[r];
    const int64_t F = saes[k.source]->sae->d_sae;
    const std::vector<float>& a = acts[k.source];
    json values = json::array();
    int64_t at = 0;
    for (int64_t t = 0; t < T; ++t) {
      values.push_back(a[t * F + k.feature]);
      if (a[t * F + k.feature] > a[at * F + k.feature]) at = t;
    }
    double sum = 0;
    for (int64_t t : sort_by) sum += a[t * F + k.feature];
    out.push_back({{"source", saes[k.source]->id},
                   {"index", k.feature},
                   {"values", std::move(values)},
                   {"sumValues", sum},
                   {"maxValue", a[at * F + k.feature]},
                   {"maxValueIndex", at},
                   {"dfaValues", nullptr},
                   {"dfaTargetIndex", nullptr},
                   {"dfaMaxValue", nullptr}});
  }
  const std::vector<std::string> strs = TokenStrings(*e, ids);
  Reply(res, 200,
        {{"activations", out}, {"tokens", strs}, {"counts", nullptr}});
  return Status();
}

// The per-position values of /v1/activation/single: feature `index` of
// `source`, or the dot product of the hook's rows with `vector`.
StatusOr<std::vector<float>> SingleValues(ServerContext& ctx, Engine& e,
                                          const json& b,
                                          const std::vector<int32_t>& ids) {
  const bool by_feature = b.contains("source") && !b["source"].is_null();
  const bool by_vector = b.contains("vector") && !b["vector"].is_null();
  if (by_feature == by_vector)
    return InvalidArgumentError(
        "exactly one of `source` + `index` (a feature) or `vector` + `hook` "
        "(a direction) must be given");
  if (by_feature) {
    ASSIGN_OR_RETURN(std::string source, NpRequiredString(b, "source"));
    ASSIGN_OR_RETURN(const ServedSae* s, FindSource(ctx, "source", source));
    // Neuronpedia sends the index as a string ("14057"); a number is read too.
    json index = b.contains("index") ? b["index"] : json();
    if (index.is_string()) {
      const std::string& text = index.get_ref<const std::string&>();
      if (text.empty() || text.size() > 18 ||
          text.find_first_not_of("0123456789") != std::string::npos)
        return InvalidArgumentError(
            "field `index`: expected a feature index, "
            "got " +
            Dump(index));
      index = std::stoll(text);
    }
    ASSIGN_OR_RETURN(const int64_t f, GetInt(json{{"index", index}}, "index",
                                             -1, 0, s->sae->d_sae - 1));
    if (f < 0)
      return InvalidArgumentError("field `index`: required with `source`");
    ASSIGN_OR_RETURN(std::vector<float> a, FeatureActs(ctx, e, *s, ids));
    std::vector<float> v(ids.size());
    for (size_t t = 0; t < ids.size(); ++t)
      v[t] = a[t * static_cast<size_t>(s->sae->d_sae) + static_cast<size_t>(f)];
    return v;
  }
  ASSIGN_OR_RETURN(std::string hook_name, NpRequiredString(b, "hook"));
  ASSIGN_OR_RETURN(std::vector<HookPoint> hooks,
                   ParseModelHookPattern(hook_name, e.model().config()));
  if (hooks.size() != 1)
    return InvalidArgumentError("field `hook`: `" + hook_name +
                                "` must name one hook");
  ASSIGN_OR_RETURN(GenResult g, CaptureAll(e, ids, hooks));
  const int64_t w = g.widths[0];
  if (!b["vector"].is_array() || static_cast<int64_t>(b["vector"].size()) != w)
    return InvalidArgumentError("field `vector`: expected " +
                                std::to_string(w) + " numbers (the width of " +
                                hook_name + ")");
  std::vector<double> dir;
  for (const json& x : b["vector"]) {
    if (!x.is_number() || !std::isfinite(x.get<double>()))
      return InvalidArgumentError(
          "field `vector`: expected finite numbers, "
          "got " +
          Dump(x));
    dir.push_back(x.get<double>());
  }
  std::vector<float> v(static_cast<size_t>(g.rows));
  for (int64_t t = 0; t < g.rows; ++t) {
    double dot = 0;
    for (int64_t j = 0; j < w; ++j) dot += g.captures[0][t * w + j] * dir[j];
    v[t] = static_cast<float>(dot);
  }
  return v;
}

// POST /v1/activation/single. A feature's values are 0 at BOS and drop the
// leading BOS (as Neuronpedia's); a direction's keep every position.
Status ActivationSingle(ServerContext& ctx, const httplib::Request& req,
                        httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, NpEngine(ctx, b));
  const bool by_feature = b.contains("source") && !b["source"].is_null();
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   by_feature ? NpTokens(ctx.options, *e, Prompt(b), "prompt")
                              : Tokens(ctx.options, *e, Prompt(b), true));
  ASSIGN_OR_RETURN(std::vector<float> v, SingleValues(ctx, *e, b, ids));
  size_t first = 0;
  if (by_feature) {
    const int32_t bos = e->tokenizer() ? e->tokenizer()->bos_id() : -1;
    for (size_t t = 0; t < ids.size(); ++t)
      if (bos >= 0 && ids[t] == bos) v[t] = 0;
    first = StartsWithBos(*e, ids) ? 1 : 0;
  }
  const std::vector<std::string> strs = TokenStrings(*e, ids);
  json values = json::array(), tokens = json::array(), special = json::array();
  size_t at = first;
  for (size_t t = first; t < ids.size(); ++t) {
    values.push_back(v[t]);
    tokens.push_back(strs[t]);
    special.push_back(IsSpecialToken(*e, ids[t]));
    if (v[t] > v[at]) at = t;
  }
  const json max_value = at < v.size() ? json(v[at]) : json(0.0);
  Reply(res, 200,
        {{"activation",
          {{"values", values},
           {"maxValue", max_value},
           {"maxValueIndex", at - first},
           {"dfaValues", nullptr},
           {"dfaMaxValue", nullptr},
           {"dfaTargetIndex", nullptr}}},
         {"tokens", tokens},
         {"tokensIsSpecial", special}});
  return Status();
}

}  // namespace

void RegisterActivationRoutes(HttpListeners& http, ServerContext& ctx) {
  NpPost(http, ctx, "/v1/activation/topk-by-token", TopkByToken);
  NpPost(http, ctx, "/v1/activation/all", ActivationAll);
  NpPost(http, ctx, "/v1/activation/single", ActivationSingle);
}

}  // namespace loom::serve::routes
