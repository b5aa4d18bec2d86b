// POST /embed, /embed/batch and /analyze* (embed.h).
#include "src/serve/routes/embed.h"

#include <chrono>
#include <optional>
#include <utility>

#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"
#include "src/serve/theloom_analysis.h"

namespace loom::serve::routes {

// Vectors of one width as the rows of one array.
std::vector<float> Rows(const std::vector<std::vector<float>>& v) {
  std::vector<float> out;
  for (const std::vector<float>& row : v)
    out.insert(out.end(), row.begin(), row.end());
  return out;
}

// Each input (a text or token ids; errors name `field` and the input's
// index) as a prompt-only request capturing one layer, the inputs sharing
// forwards, pooled. `layer`, `pooling`, `normalize` and
// `add_special_tokens` come from `b`, defaulting to hidden_states.
// embedding_* of the configuration.
StatusOr<Embedded> EmbedInputs(const ServerOptions& o, Engine& e, const json& b,
                               const std::vector<json>& inputs,
                               const std::string& field) {
  Embedded out;
  ASSIGN_OR_RETURN(out.pooling, GetString(b, "pooling", o.embedding_pooling));
  ASSIGN_OR_RETURN(Pooling pooling, ParsePooling(out.pooling));
  ASSIGN_OR_RETURN(out.normalize,
                   GetBool(b, "normalize", o.embedding_normalize));
  ASSIGN_OR_RETURN(out.layer,
                   GetInt(b, "layer", o.embedding_layer, -100000, 100000));
  ASSIGN_OR_RETURN(HookPoint hook, e.LayerHook(out.layer));
  ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
  ASSIGN_OR_RETURN(RequestInterventions ivs,
                   Interventions(o, e, b, static_cast<int64_t>(inputs.size())));
  std::vector<std::shared_ptr<Ticket>> tickets;
  auto fail = [&](const Status& s, size_t i) {
    for (auto& t : tickets) t->Cancel();
    // "text 2: ..." on /embed/batch as on /embed, "input 2: ..."
    return s.WithContext((field == "texts" ? "text" : field) + " " +
                         std::to_string(i));
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    StatusOr<std::vector<int32_t>> ids =
        Tokens(o, e, inputs[i], special, field);
    if (!ids.ok()) return fail(ids.status(), i);
    out.tokens += static_cast<int64_t>(ids->size());
    GenRequest r;
    r.prompt = std::move(ids).value();
    r.max_new_tokens = 0;
    r.hooks = {hook};
    r.rows =
        pooling == Pooling::kLastToken ? CaptureRows::kLast : CaptureRows::kAll;
    if (Status s = Attach(ivs, static_cast<int64_t>(i), &r); !s.ok())
      return fail(s, i);
    StatusOr<std::shared_ptr<Ticket>> t = e.Submit(std::move(r));
    if (!t.ok()) return fail(t.status(), i);
    tickets.push_back(*t);
  }
  for (auto& t : tickets) {
    ASSIGN_OR_RETURN(GenResult g, t->Wait());
    out.width = g.widths[0];
    out.vectors.push_back(
        Pool(g.captures[0].data(), g.rows, out.width, pooling, out.normalize));
  }
  return out;
}

namespace {

// POST /analyze in either form: TheLoom's (`text`: the statistics of its
// embedding, computed as /embed computes it but never normalised, with
// TheLoom's field names and the embed metadata) or Loom's (`embedding`,
// `vector` or `data`: the statistics of that vector).
Status Analyze(ServerContext& ctx, const httplib::Request& req,
               httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  if (b.contains("text") && !b["text"].is_null()) {
    ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
    json raw = b;
    raw["normalize"] = false;  // TheLoom ignores `normalize` here
    const Clock::time_point t0 = Clock::now();
    ASSIGN_OR_RETURN(Embedded m,
                     EmbedInputs(ctx.options, *e, raw, {b["text"]}, "text"));
    json out = theloom::HiddenStateStatistics(m.vectors[0]);
    out["layer"] = m.layer;
    out["pooling"] = m.pooling;
    out["inference_time_ms"] =
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    out["input_tokens"] = m.tokens;
    out["model_id"] = e->id();
    Reply(res, 200, out);
    return Status();
  }
  const char* key = b.contains("embedding") ? "embedding"
                    : b.contains("vector")  ? "vector"
                                            : "data";
  if (!b.contains(key) || !b[key].is_array())
    return InvalidArgumentError(
        "field `embedding`: expected a list of numbers (or `text` and "
        "`model`: the statistics of the text's embedding)");
  std::vector<double> v;
  for (const json& x : b[key]) {
    if (!x.is_number())
      return InvalidArgumentError("field `embedding`: expected numbers, got " +
                                  Dump(x));
    v.push_back(x.get<double>());
  }
  ASSIGN_OR_RETURN(json out, AnalyzeVector(v));
  Reply(res, 200, out);
  return Status();
}

// POST /analyze/geometry (theloom_analysis.h): `vectors`, 3 to
// theloom::kMaxVectors rows; `seed` (Loom's) for the random draws.
Status AnalyzeGeometry(ServerContext& ctx, const httplib::Request& req,
                       httplib::Response& res) {
  const Clock::time_point t0 = Clock::now();
  ASSIGN_OR_RETURN(theloom::AnalysisBody b,
                   theloom::ParseAnalysisBody(req.body, {"vectors"}, 3,
                                              theloom::kMaxVectors));
  ASSIGN_OR_RETURN(uint32_t seed, theloom::SeedOf(b.rest));
  json out = theloom::GeometryJson(theloom::AnalyzeGeometry(
      b.matrices[0], seed, ctx.options.engine.threads));
  out["analysis_time_ms"] =
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  Reply(res, 200, out);
  return Status();
}

// POST /analyze/bilateral: `sender_vectors` and `receiver_vectors` of the
// same width; `seed` as above (both sides' Wolf draws use it).
Status AnalyzeBilateral(ServerContext& ctx, const httplib::Request& req,
                        httplib::Response& res) {
  const Clock::time_point t0 = Clock::now();
  ASSIGN_OR_RETURN(theloom::AnalysisBody b,
                   theloom::ParseAnalysisBody(
                       req.body, {"sender_vectors", "receiver_vectors"}, 3,
                       theloom::kMaxVectors));
  ASSIGN_OR_RETURN(uint32_t seed, theloom::SeedOf(b.rest));
  const theloom::Matrix &s = b.matrices[0], &r = b.matrices[1];
  if (s.cols != r.cols)
    return InvalidArgumentError("Dimension mismatch: sender has " +
                                std::to_string(s.cols) + ", receiver has " +
                                std::to_string(r.cols));
  json out = theloom::BilateralJson(
      theloom::AnalyzeBilateral(s, r, seed, ctx.options.engine.threads));
  out["analysis_time_ms"] =
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  Reply(res, 200, out);
  return Status();
}

// The inputs of /embed/batch (`texts`) and /embed (`text`).
StatusOr<std::vector<json>> EmbedTexts(ServerContext& ctx, const json& b,
                                       bool batch) {
  if (!batch) {
    if (!b.contains("text"))
      return InvalidArgumentError("field `text` is required");
    return std::vector<json>{b["text"]};
  }
  if (!b.contains("texts") || !b["texts"].is_array() || b["texts"].empty())
    return InvalidArgumentError(
        "field `texts`: expected a non-empty list of strings");
  if (static_cast<int64_t>(b["texts"].size()) > ctx.options.max_batch_prompts)
    return InvalidArgumentError(
        "field `texts`: " + std::to_string(b["texts"].size()) +
        " texts, more than server.max_batch_prompts = " +
        std::to_string(ctx.options.max_batch_prompts));
  return std::vector<json>(b["texts"].begin(), b["texts"].end());
}

Status Embed(ServerContext& ctx, const httplib::Request& req,
             httplib::Response& res, bool batch) {
  std::optional<BodyFormat> format = Accepted(req, res);
  if (!format) return Status();
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(DType binary_dtype, BinaryDType(ctx.options, b));
  ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
  ASSIGN_OR_RETURN(std::vector<json> texts, EmbedTexts(ctx, b, batch));
  const Clock::time_point t0 = Clock::now();
  ASSIGN_OR_RETURN(Embedded m, EmbedInputs(ctx.options, *e, b, texts,
                                           batch ? "texts" : "text"));
  const json meta = {
      {"model", e->id()},
      {"pooling", m.pooling},
      {"normalized", m.normalize},
      {"layer", m.layer},
      {"input_tokens", m.tokens},
      {"inference_time_ms",
       std::chrono::duration<double, std::milli>(Clock::now() - t0).count()}};
  if (*format != BodyFormat::kJson) {
    const std::vector<float> all = Rows(m.vectors);
    const int64_t n = static_cast<int64_t>(m.vectors.size());
    return ReplyBinary(
        req, res, *format,
        {{batch ? "embeddings" : "embedding",
          batch ? std::vector<int64_t>{n, m.width}
                : std::vector<int64_t>{m.width},
          all.data()}},
        binary_dtype,
        {{"shape", batch ? json::array({n, m.width}) : json::array({m.width})},
         {"metadata", meta}});
  }
  if (batch) {
    Reply(res, 200,
          {{"embeddings", m.vectors},
           {"shape", {m.vectors.size(), m.width}},
           {"metadata", meta}});
  } else {
    Reply(res, 200,
          {{"embedding", m.vectors[0]},
           {"shape", {m.width}},
           {"metadata", meta}});
  }
  return Status();
}

}  // namespace

void RegisterEmbedRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Post("/embed",
            JsonRoute(ctx, "/embed", [&ctx](const auto& req, auto& res) {
              return Embed(ctx, req, res, false);
            }));
  http.Post("/embed/batch",
            JsonRoute(ctx, "/embed/batch", [&ctx](const auto& req, auto& res) {
              return Embed(ctx, req, res, true);
            }));
}

void RegisterAnalyzeRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Post("/analyze",
            JsonRoute(ctx, "/analyze", [&ctx](const auto& req, auto& res) {
              return Analyze(ctx, req, res);
            }));
  http.Post(
      "/analyze/geometry",
      JsonRoute(ctx, "/analyze/geometry", [&ctx](const auto& req, auto& res) {
        return AnalyzeGeometry(ctx, req, res);
      }));
  http.Post(
      "/analyze/bilateral",
      JsonRoute(ctx, "/analyze/bilateral", [&ctx](const auto& req, auto& res) {
        return AnalyzeBilateral(ctx, req, res);
      }));
}

}  // namespace loom::serve::routes
