#include "src/serve/patching.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "src/backend/registry.h"
#include "src/core/json_int.h"
#include "src/eval/attribute.h"
#include "src/eval/patch.h"
#include "src/serve/api.h"

namespace loom::serve {
namespace {

using Clock = std::chrono::steady_clock;

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string NewUuid() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  uint64_t hi = 0, lo = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    hi = rng();
    lo = rng();
  }
  hi = (hi & ~uint64_t{0xF000}) | 0x4000;                  // version 4
  lo = (lo & ~(uint64_t{3} << 62)) | (uint64_t{2} << 62);  // variant 10
  char b[40];
  std::snprintf(b, sizeof(b), "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xFFFF),
                static_cast<unsigned long long>(hi & 0xFFFF),
                static_cast<unsigned long long>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFull));
  return b;
}

// A TheLoom component: its TransformerLens hook suffix (hook_name) and the
// Loom hook suffix patched ("" = cannot be patched by Loom).
struct Component {
  const char* name;
  const char* tl_suffix;
  const char* loom_suffix;
};
constexpr Component kComponents[] = {
    {"resid_pre", "hook_resid_pre", "hook_resid_pre"},
    {"resid_post", "hook_resid_post", "hook_resid_post"},
    {"attn", "attn.hook_result", "hook_attn_out"},
    {"attn_q", "attn.hook_q", ""},
    {"attn_k", "attn.hook_k", ""},
    {"attn_v", "attn.hook_v", ""},
    {"attn_pattern", "attn.hook_pattern", ""},
    {"mlp_pre", "mlp.hook_pre", ""},
    {"mlp_post", "mlp.hook_post", "mlp.hook_post"},
    // Loom's further intervention sites.
    {"resid_mid", "hook_resid_mid", "hook_resid_mid"},
    {"mlp_out", "hook_mlp_out", "hook_mlp_out"},
    {"attn_z", "attn.hook_z", "attn.hook_z"},
};

StatusOr<const Component*> FindComponent(const std::string& given) {
  std::string lower = given;
  for (char& c : lower)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Component& c : kComponents) {
    if (lower != c.name) continue;
    if (*c.loom_suffix == '\0')
      return UnimplementedError(
          "field `components`: '" + given + "' (" + c.tl_suffix +
          ") cannot be patched by Loom (patchable: resid_pre, resid_post, "
          "resid_mid, attn, attn_z, mlp_post, mlp_out)");
    return &c;
  }
  return InvalidArgumentError(
      "field `components`: unknown component '" + given +
      "' (resid_pre, resid_post, resid_mid, attn, attn_z, mlp_post, mlp_out)");
}

// A list of integers; *out stays nullopt when the field is missing or null.
Status GetInts(const json& b, const char* name,
               std::optional<std::vector<int64_t>>* out) {
  if (!b.contains(name) || b[name].is_null()) return Status();
  const json& v = b[name];
  if (!v.is_array())
    return InvalidArgumentError(std::string("field `") + name +
                                "`: expected a list of integers, got " +
                                Dump(v));
  out->emplace();
  for (const json& x : v) {
    const std::optional<int64_t> i = JsonInt64(x);
    if (!i || !x.is_number_integer())
      return InvalidArgumentError(std::string("field `") + name +
                                  "`: expected integers, got " + Dump(x));
    (*out)->push_back(*i);
  }
  return Status();
}

Status GetComponents(const json& b,
                     std::optional<std::vector<std::string>>* out) {
  if (!b.contains("components") || b["components"].is_null()) return Status();
  if (!b["components"].is_array())
    return InvalidArgumentError(
        "field `components`: expected a list of strings, got " +
        Dump(b["components"]));
  ASSIGN_OR_RETURN(*out, GetStrings(b, "components"));
  return Status();
}

// Loom's `positions`: "all", "last" or a list of integers.
StatusOr<InterventionPositions> ParsePositions(const json& p) {
  InterventionPositions out;
  if (p.is_string() && p.get<std::string>() == "all") return out;
  if (p.is_string() && p.get<std::string>() == "last") {
    out.kind = InterventionPositions::Kind::kLast;
    return out;
  }
  if (p.is_array() && !p.empty()) {
    out.kind = InterventionPositions::Kind::kList;
    for (const json& x : p) {
      if (!x.is_number_integer())
        return InvalidArgumentError(
            "field `positions`: expected integers, got " + Dump(x));
      out.list.push_back(*JsonInt64(x));
    }
    return out;
  }
  return InvalidArgumentError(
      "field `positions`: expected \"all\", \"last\" or a non-empty list of "
      "integers, got " +
      Dump(p));
}

// Loom's `answer_token_ids`: {"A": id, "B": id}, either optional.
Status ParseAnswerIds(const json& b, int64_t* answer, int64_t* wrong) {
  if (!b.contains("answer_token_ids") || b["answer_token_ids"].is_null())
    return Status();
  const json& a = b["answer_token_ids"];
  if (!a.is_object())
    return InvalidArgumentError(
        "field `answer_token_ids`: expected an object {\"A\": id, \"B\": id}, "
        "got " +
        Dump(a));
  ASSIGN_OR_RETURN(*answer, GetInt(a, "A", -1, 0, int64_t{1} << 40));
  ASSIGN_OR_RETURN(*wrong, GetInt(a, "B", -1, 0, int64_t{1} << 40));
  return Status();
}

Status CheckMetric(const json& b) {
  ASSIGN_OR_RETURN(std::string m, GetString(b, "metric_type", "logit_diff"));
  if (m == "logit_diff") return Status();
  if (m == "token_diff" || m == "custom")
    return UnimplementedError(
        "field `metric_type`: '" + m +
        "' is not computed by Loom (its patched paths are single forwards; "
        "use logit_diff)");
  return InvalidArgumentError(
      "field `metric_type`: expected logit_diff, got '" + m + "'");
}

// One grid row: a layer as given, a component, and the hooks.
struct Row {
  int64_t layer = 0;
  std::string component, hook_name, loom_hook;
};

StatusOr<std::vector<Row>> GridRows(const std::vector<int64_t>& given_layers,
                                    const std::vector<std::string>& components,
                                    int64_t n) {
  std::vector<int64_t> layers = given_layers;
  if (layers.empty()) layers = {0, n / 2, n - 1};
  if (components.empty())
    return InvalidArgumentError("field `components`: empty list");
  std::vector<Row> rows;
  for (const int64_t l : layers) {
    if (l < -n || l >= n)
      return InvalidArgumentError("field `layers`: layer " + std::to_string(l) +
                                  " is outside [-" + std::to_string(n) + ", " +
                                  std::to_string(n) + ") for a model with " +
                                  std::to_string(n) + " layers");
    const std::string block = "blocks." + std::to_string(l < 0 ? n + l : l);
    for (const std::string& name : components) {
      ASSIGN_OR_RETURN(const Component* c, FindComponent(name));
      Row r{l, c->name, block + "." + c->tl_suffix,
            block + "." + c->loom_suffix};
      const bool seen = std::any_of(rows.begin(), rows.end(), [&](auto& x) {
        return x.loom_hook == r.loom_hook;
      });
      if (!seen) rows.push_back(std::move(r));
    }
  }
  return rows;
}

// (m_patched - m_corrupted) / (m_clean - m_corrupted); null when the
// denominator is ~0 and the effect is not (0 when both are).
json Recovery(double effect, double delta) {
  if (std::fabs(delta) < 1e-10)
    return std::fabs(effect) < 1e-10 ? json(0.0) : json(nullptr);
  return effect / delta;
}

// compute_patch_impact's classification of a recovery rate.
std::string RecoveryClass(const json& r) {
  if (r.is_null()) return "undefined";
  const double x = r.get<double>();
  if (std::fabs(x) < 0.05) return "no_effect";
  if (x < 0) return "harmful";
  if (x > 1) return "overcorrection";
  if (x >= 0.95) return "full_recovery";
  if (x >= 0.7) return "strong_recovery";
  if (x >= 0.3) return "moderate_recovery";
  return "weak_recovery";
}

std::string TokenText(const Engine& e, int32_t id) {
  const int32_t ids[] = {id};
  if (e.tokenizer() == nullptr) return "";  // a token-id-only model
  StatusOr<std::string> s = e.tokenizer()->Decode(ids, false);
  return s.ok() ? *s : "";
}

int32_t Argmax(const float* logits, int64_t V) {
  return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
}

// What a run asks for, after the experiment's defaults.
struct RunSpec {
  std::vector<Row> rows;
  std::vector<int32_t> clean, corrupted;
  InterventionPositions positions;
  int64_t cells = 0;
  int64_t answer = -1, wrong = -1;
};

// The response of a run and the record kept for the results route.
void BuildRunJson(const Engine& e, const RunSpec& spec,
                  const eval::PatchResult& r, json* out, json* record) {
  const bool approximate = r.patched_logits_last.empty();
  const int64_t V = e.model().config().vocab_size;
  const int64_t P = static_cast<int64_t>(r.positions.size());
  const int32_t clean_tok = Argmax(r.clean_logits_last.data(), V);
  const int32_t corr_tok = Argmax(r.corrupted_logits_last.data(), V);
  const double delta = r.clean_logit_diff - r.corrupted_logit_diff;
  json patched = json::array(), effects = json::array(),
       recovery = json::array();
  std::vector<std::string> comps;
  std::vector<int64_t> layers;
  for (const Row& row : spec.rows) {
    if (std::find(comps.begin(), comps.end(), row.component) == comps.end())
      comps.push_back(row.component);
    if (std::find(layers.begin(), layers.end(), row.layer) == layers.end())
      layers.push_back(row.layer);
    const size_t h = static_cast<size_t>(
        std::find(r.hooks.begin(), r.hooks.end(), row.loom_hook) -
        r.hooks.begin());
    json rec_row = json::array();
    for (int64_t p = 0; p < P; ++p) {
      const size_t k = h * static_cast<size_t>(P) + static_cast<size_t>(p);
      const double ld = r.logit_diff[k];
      const double effect = ld - r.corrupted_logit_diff;
      const json rate = Recovery(effect, delta);
      // AtP (approximate: "atp") has no patched run, hence no token.
      const bool run = !r.patched_logits_last.empty();
      const json tok =
          run ? json(Argmax(r.patched_logits_last.data() + k * V, V)) : json();
      const json where = {{"layer", row.layer},
                          {"component", row.component},
                          {"hook_name", row.hook_name},
                          {"loom_hook", row.loom_hook},
                          {"position", r.positions[static_cast<size_t>(p)]}};
      json pr = where;
      pr.update({{"patched_output",
                  run ? json(TokenText(e, tok.get<int32_t>())) : json()},
                 {"patched_token_id", tok},
                 {"logit_diff", ld},
                 {"causal_effect", effect},
                 {"recovery_rate", rate},
                 {"execution_time_ms", nullptr},
                 {"shape_matched", true}});
      patched.push_back(std::move(pr));
      json ce = where;
      ce.update({{"causal_effect", effect},
                 {"recovery_rate", rate},
                 {"recovery_class", RecoveryClass(rate)},
                 {"clean_baseline", r.clean_logit_diff},
                 {"corrupted_metric", r.corrupted_logit_diff},
                 {"patched_metric", ld}});
      effects.push_back(std::move(ce));
      rec_row.push_back(rate);
    }
    recovery.push_back(std::move(rec_row));
  }
  auto path = [&](const char* type, int32_t tok, double ld, int64_t cached) {
    return json{{"path_type", type},
                {"output_text", TokenText(e, tok)},
                {"generation_time_ms", nullptr},
                {"num_cached_activations", cached},
                {"metadata",
                 {{"token_count", spec.clean.size()},
                  {"next_token_id", tok},
                  {"logit_diff", ld}}}};
  };
  json meta = {
      {"model", e.id()},
      {"num_patched_runs", patched.size()},
      {"metric_type", "logit_diff"},
      {"answer_token_ids", {{"A", r.answer}, {"B", r.wrong}}},
      {"clean_logit_diff", r.clean_logit_diff},
      {"corrupted_logit_diff", r.corrupted_logit_diff},
      {"hooks", r.hooks},
      {"positions", r.positions},
      {"recovery", recovery},
      {"forwards", r.forwards},
      {"evaluation",
       approximate ? "approximate: atp: each cell's logit_diff is the "
                     "corrupted one plus its attribution-patching estimate "
                     "(one backward, no patched run; patched_output null)"
                   : "one forward per path; outputs are the greedy next "
                     "token"}};
  if (approximate) meta["approximate"] = "atp";
  *out = {{"status", "completed"},
          {"clean_path", path("clean", clean_tok, r.clean_logit_diff,
                              static_cast<int64_t>(r.hooks.size()))},
          {"corrupted_path",
           path("corrupted", corr_tok, r.corrupted_logit_diff, 0)},
          {"patched_results", std::move(patched)},
          {"duration_ms", r.seconds * 1000.0},
          {"layers_patched", layers},
          {"components_patched", comps},
          {"metadata", meta}};
  *record = {{"clean_output", TokenText(e, clean_tok)},
             {"corrupted_output", TokenText(e, corr_tok)},
             {"causal_effects", std::move(effects)},
             {"metadata", std::move(meta)}};
}

// approximate: "atp": the grid estimated by attribution patching
// (eval::RunAttribute, one backward; the model at f32) in a PatchResult's
// shape: logit_diff = corrupted + atp, no patched logits.
StatusOr<eval::PatchResult> RunApproximate(const Engine& engine,
                                           const RunSpec& spec,
                                           const eval::PatchOptions& po) {
  if (engine.model().compute_dtype() != DType::kF32)
    return UnimplementedError(
        "field `approximate`: atp runs a backward at f32; model " +
        engine.id() + " is served at another precision (--precision f32)");
  eval::AttributeOptions o;
  o.hooks = po.hooks;
  o.positions = spec.positions;
  o.answer = spec.answer;
  o.wrong = spec.wrong;
  ASSIGN_OR_RETURN(
      eval::AttributeResult a,
      eval::RunAttribute(engine.model(), spec.clean, spec.corrupted, o));
  eval::PatchResult r;
  r.hooks = a.hooks;
  r.heads.assign(a.hooks.size(), -1);
  r.positions = a.positions;
  r.answer = a.answer;
  r.wrong = a.wrong;
  r.clean_logit_diff = a.metric_clean;
  r.corrupted_logit_diff = a.metric_corrupted;
  for (const std::vector<double>& row : a.atp)
    for (double v : row) r.logit_diff.push_back(a.metric_corrupted + v);
  r.clean_logits_last = std::move(a.clean_logits_last);
  r.corrupted_logits_last = std::move(a.corrupted_logits_last);
  r.forwards = 0;  // the backward's forwards are not patched runs
  r.seconds = a.seconds;
  return r;
}

}  // namespace

Status Patching::Insert(Experiment e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(lru_.size()) >= o_.max_experiments) {
    auto victim = std::find_if(lru_.rbegin(), lru_.rend(), [](const auto& x) {
      return x.status != "running";
    });
    if (victim == lru_.rend())
      return ResourceExhaustedError(
          "patching: " + std::to_string(o_.max_experiments) +
          " experiments are kept (the server's limit) and every one is "
          "running");
    lru_.erase(std::next(victim).base());
  }
  lru_.push_front(std::move(e));
  return Status();
}

Patching::Experiment* Patching::Touch(const std::string& id) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it)
    if (it->id == id) {
      lru_.splice(lru_.begin(), lru_, it);
      return &lru_.front();
    }
  return nullptr;
}

void Patching::SetStatus(const std::string& id, const std::string& status,
                         json record) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Experiment& e : lru_)
    if (e.id == id) {
      e.status = status;
      if (!record.is_null()) e.record = std::move(record);
    }
}

StatusOr<json> Patching::Configure(const json& b) {
  if (!b.is_object()) return InvalidArgumentError("the body must be an object");
  Experiment e;
  ASSIGN_OR_RETURN(e.name, GetString(b, "experiment_name", ""));
  if (!b.contains("experiment_name") || !b["experiment_name"].is_string())
    return InvalidArgumentError("field `experiment_name` is required");
  std::optional<std::vector<int64_t>> layers;
  RETURN_IF_ERROR(GetInts(b, "layers", &layers));
  if (layers) e.layers = *layers;
  std::optional<std::vector<std::string>> comps;
  RETURN_IF_ERROR(GetComponents(b, &comps));
  e.components = comps ? *comps : std::vector<std::string>{"resid_pre"};
  for (const std::string& c : e.components) {
    ASSIGN_OR_RETURN(const Component* found, FindComponent(c));
    (void)found;
  }
  ASSIGN_OR_RETURN(e.validate_shapes, GetBool(b, "validate_shapes", true));
  ASSIGN_OR_RETURN(e.cleanup_on_completion,
                   GetBool(b, "cleanup_on_completion", true));
  RETURN_IF_ERROR(CheckMetric(b));
  if (b.contains("positions") && !b["positions"].is_null()) {
    ASSIGN_OR_RETURN(InterventionPositions p, ParsePositions(b["positions"]));
    (void)p;
    e.positions = b["positions"];
  }
  RETURN_IF_ERROR(ParseAnswerIds(b, &e.answer, &e.wrong));
  e.id = NewUuid();
  json out = {
      {"experiment_id", e.id},
      {"experiment_name", e.name},
      {"layers", e.layers},
      {"components", e.components},
      {"status", "configured"},
      {"message", "Experiment configured with " +
                      std::to_string(e.layers.size()) + " layers and " +
                      std::to_string(e.components.size()) + " components"}};
  RETURN_IF_ERROR(Insert(std::move(e)));
  return out;
}

StatusOr<json> Patching::Run(const json& b, const Engine& engine,
                             const PromptIdsFn& prompt_ids,
                             const std::function<bool()>& stopping) {
  if (!b.is_object()) return InvalidArgumentError("the body must be an object");
  for (const char* f : {"clean_input", "corrupted_input"})
    if (!b.contains(f) || b[f].is_null())
      return InvalidArgumentError(std::string("field `") + f + "` is required");
  // TheLoom's generation fields: validated, not used (single forwards).
  RETURN_IF_ERROR(GetInt(b, "max_tokens", 256, 1, 8192).status());
  RETURN_IF_ERROR(GetNumber(b, "temperature", 0.7, 0.0, 2.0).status());
  RETURN_IF_ERROR(CheckMetric(b));
  ASSIGN_OR_RETURN(const std::string approx, GetString(b, "approximate", ""));
  if (!approx.empty() && approx != "atp")
    return InvalidArgumentError("field `approximate`: '" + approx +
                                "' is not a method (atp, or leave it out for "
                                "the true patched runs)");
  const bool approximate = approx == "atp";
  ASSIGN_OR_RETURN(std::string id, GetString(b, "experiment_id", ""));
  std::optional<std::vector<int64_t>> layers;
  RETURN_IF_ERROR(GetInts(b, "layers", &layers));
  std::optional<std::vector<std::string>> comps;
  RETURN_IF_ERROR(GetComponents(b, &comps));
  std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
  if (!run.owns_lock())
    return ResourceExhaustedError(
        "patching: another run is in progress (one at a time per server)");
  Experiment x;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Experiment* found = Touch(id)) {
      x = *found;
      known = true;
    }
  }
  if (!known) {  // TheLoom: an unknown or missing id is a new experiment
    x.id = NewUuid();
    x.name = "ad_hoc_experiment_" + std::to_string(std::time(nullptr));
    x.layers = layers.value_or(std::vector<int64_t>{});
    x.components = comps.value_or(std::vector<std::string>{"resid_pre"});
    x.cleanup_on_completion = false;
  }
  RunSpec spec;
  spec.answer = x.answer;
  spec.wrong = x.wrong;
  RETURN_IF_ERROR(ParseAnswerIds(b, &spec.answer, &spec.wrong));
  const ModelConfig& c = engine.model().config();
  for (const int64_t t : {spec.answer, spec.wrong})
    if (t >= c.vocab_size)
      return InvalidArgumentError("field `answer_token_ids`: token " +
                                  std::to_string(t) +
                                  " is outside the vocabulary [0, " +
                                  std::to_string(c.vocab_size) + ")");
  ASSIGN_OR_RETURN(spec.rows,
                   GridRows(layers.value_or(x.layers),
                            comps.value_or(x.components), c.num_layers));
  ASSIGN_OR_RETURN(spec.clean, prompt_ids(b["clean_input"], "clean_input"));
  ASSIGN_OR_RETURN(spec.corrupted,
                   prompt_ids(b["corrupted_input"], "corrupted_input"));
  if (spec.clean.size() != spec.corrupted.size())
    return InvalidArgumentError("field `corrupted_input`: has " +
                                std::to_string(spec.corrupted.size()) +
                                " tokens but `clean_input` has " +
                                std::to_string(spec.clean.size()) +
                                "; patching needs prompts of one token length");
  const json& pos = b.contains("positions") && !b["positions"].is_null()
                        ? b["positions"]
                        : x.positions;
  ASSIGN_OR_RETURN(spec.positions, ParsePositions(pos));
  StatusOr<std::vector<int64_t>> cols =
      ResolvePositions(spec.positions, static_cast<int64_t>(spec.clean.size()));
  if (!cols.ok()) return cols.status().WithContext("field `positions`");
  spec.cells = static_cast<int64_t>(spec.rows.size() * cols->size());
  if (spec.cells > o_.max_cells)
    return OutOfRangeError(
        "field `layers`/`components`/`positions`: a grid of " +
        std::to_string(spec.rows.size()) + " hooks x " +
        std::to_string(cols->size()) +
        " positions = " + std::to_string(spec.cells) +
        " cells, more than the server's limit of " +
        std::to_string(o_.max_cells));
  if (!approximate && spec.cells * c.vocab_size * 4 > o_.max_logits_bytes)
    return OutOfRangeError(
        "field `layers`/`components`/`positions`: " +
        std::to_string(spec.cells) + " cells x " +
        std::to_string(c.vocab_size) +
        " logits x 4 bytes = " + std::to_string(spec.cells * c.vocab_size * 4) +
        " bytes, more than the server's limit of " +
        std::to_string(o_.max_logits_bytes));
  if (!known) RETURN_IF_ERROR(Insert(x));
  SetStatus(x.id, "running", nullptr);

  eval::PatchOptions po;
  po.hooks.clear();
  for (const Row& r : spec.rows) po.hooks.push_back(r.loom_hook);
  po.positions = spec.positions;
  po.answer = spec.answer;
  po.wrong = spec.wrong;
  po.batch_tokens = o_.batch_tokens;
  StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  if (!backend.ok()) {
    SetStatus(x.id, "failed", nullptr);
    return backend.status();
  }
  (*backend)->SetNumThreads(o_.threads);  // this thread's OpenMP count
  po.segments = {{backend->get(), 0, c.num_layers - 1}};
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(o_.max_seconds));
  bool timed_out = false;
  po.cancelled = [&] {
    timed_out = Clock::now() > deadline;
    return timed_out || (stopping && stopping());
  };
  std::shared_ptr<const eval::PatchBaselines> reuse;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const Cache* kept = FindCache(x.id, engine.id())) reuse = kept->runs;
  }
  po.reuse = reuse.get();
  StatusOr<eval::PatchResult> r =
      approximate
          ? RunApproximate(engine, spec, po)
          : eval::RunPatch(engine.model(), spec.clean, spec.corrupted, po);
  if (!r.ok()) {
    SetStatus(x.id, "failed", nullptr);
    if (r.status().code() != StatusCode::kCancelled) return r.status();
    if (timed_out)
      return ResourceExhaustedError(
          "patching: the run passed the server's limit of " +
          std::to_string(o_.max_seconds) + " s and was stopped");
    return FailedPreconditionError("the server is shutting down");
  }
  json out, record;
  BuildRunJson(engine, spec, *r, &out, &record);
  out["metadata"]["reused_baselines"] = r->reused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (x.cleanup_on_completion)
      caches_.clear();                    // TheLoom clears every cache
    else if (!r->reused && !approximate)  // a reused cache is kept as is
      Keep(x.id, engine.id(), std::move(r->baselines));
  }
  out["experiment_id"] = x.id;
  out["experiment_name"] = x.name;
  record["experiment_name"] = x.name;
  SetStatus(x.id, "completed", std::move(record));
  return out;
}

StatusOr<json> Patching::Results(const std::string& id,
                                 const std::string& metric_type,
                                 bool include_causal_effects) {
  if (!metric_type.empty())
    RETURN_IF_ERROR(CheckMetric({{"metric_type", metric_type}}));
  std::lock_guard<std::mutex> lock(mu_);
  Experiment* e = Touch(id);
  if (e == nullptr || e->record.is_null())
    return NotFoundError("Experiment not found: " + id);
  const json& r = e->record;
  return json{{"experiment_id", e->id},
              {"experiment_name", e->name},
              {"status", "completed"},
              {"has_all_paths", !r["causal_effects"].empty()},
              {"clean_output", r["clean_output"]},
              {"corrupted_output", r["corrupted_output"]},
              {"num_patched_paths", r["causal_effects"].size()},
              {"causal_effects",
               include_causal_effects ? r["causal_effects"] : json::array()},
              {"metadata", r["metadata"]}};
}

json Patching::Experiments() {
  std::lock_guard<std::mutex> lock(mu_);
  json list = json::array();
  for (const Experiment& e : lru_)
    list.push_back({{"experiment_id", e.id},
                    {"experiment_name", e.name},
                    {"layers", e.layers},
                    {"components", e.components},
                    {"status", e.status}});
  return {{"experiments", list},
          {"total_count", list.size()},
          {"max_experiments", o_.max_experiments}};
}

void Patching::Keep(const std::string& experiment, const std::string& model,
                    eval::PatchBaselines runs) {
  caches_.remove_if([&](const Cache& k) { return k.experiment == experiment; });
  Cache kept{experiment, model,
             std::make_shared<const eval::PatchBaselines>(std::move(runs))};
  if (kept.bytes() > o_.max_cache_bytes) return;  // never fits
  caches_.push_front(std::move(kept));
  int64_t total = 0;
  for (const Cache& k : caches_) total += k.bytes();
  while (total > o_.max_cache_bytes) {
    total -= caches_.back().bytes();
    caches_.pop_back();
  }
}

Patching::Cache* Patching::FindCache(const std::string& experiment,
                                     const std::string& model) {
  for (auto it = caches_.begin(); it != caches_.end(); ++it)
    if (it->experiment == experiment && it->model == model) {
      caches_.splice(caches_.begin(), caches_, it);
      return &caches_.front();
    }
  return nullptr;
}

json Patching::CacheStatus() {
  std::lock_guard<std::mutex> lock(mu_);
  json ids = json::array(), details = json::object();
  int64_t total = 0;
  for (const Cache& k : caches_) {
    if (k.runs->has_clean()) {
      ids.push_back(k.experiment + "_clean");
      details[k.experiment + "_clean"] = k.runs->clean_bytes();
    }
    if (k.runs->has_corrupted()) {
      ids.push_back(k.experiment + "_corrupted");
      details[k.experiment + "_corrupted"] = k.runs->corrupted_bytes();
    }
    total += k.bytes();
  }
  const double mib = 1024.0 * 1024.0;
  return {{"num_caches", ids.size()},
          {"total_size_mb", static_cast<double>(total) / mib},
          {"max_size_mb", static_cast<double>(o_.max_cache_bytes) / mib},
          {"utilization", o_.max_cache_bytes > 0
                              ? static_cast<double>(total) /
                                    static_cast<double>(o_.max_cache_bytes)
                              : 0.0},
          {"cache_ids", ids},
          {"cache_details", details}};
}

StatusOr<json> Patching::DeleteCache(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = caches_.begin(); it != caches_.end(); ++it) {
    const bool clean = id == it->experiment + "_clean" && it->runs->has_clean();
    const bool corrupted =
        id == it->experiment + "_corrupted" && it->runs->has_corrupted();
    if (!clean && !corrupted) continue;
    // A copy without that part (a run may be reading the kept one).
    auto rest = std::make_shared<eval::PatchBaselines>(*it->runs);
    if (clean) {
      rest->clean_rows.clear();
      rest->clean_logits_last.clear();
    } else {
      rest->corrupted_logits_last.clear();
    }
    if (rest->has_clean() || rest->has_corrupted())
      it->runs = std::move(rest);
    else
      caches_.erase(it);
    return json{{"status", "deleted"},
                {"cache_id", id},
                {"message", "Cache " + id + " deleted successfully"}};
  }
  return NotFoundError("Cache not found: " + id);
}

json Patching::ClearCache() {
  std::lock_guard<std::mutex> lock(mu_);
  // Entries: one per hook captured by a clean run, one per kept logits.
  int64_t entries = 0;
  for (const Cache& k : caches_)
    entries += static_cast<int64_t>(k.runs->clean_rows.size()) +
               (k.runs->has_clean() ? 1 : 0) +
               (k.runs->has_corrupted() ? 1 : 0);
  caches_.clear();
  return {{"status", "cleared"},
          {"entries_cleared", entries},
          {"message", "Cleared " + std::to_string(entries) + " cache entries"}};
}

}  // namespace loom::serve
