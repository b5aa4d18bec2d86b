// loom.Model of the Python module (model.h): a model loaded once, its
// extract, perplexity, generate, patch, tokenize and decode.
#include "python/model.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "python/convert.h"
#include "python/generate.h"
#include "python/sae.h"
#include "src/backend/registry.h"
#include "src/base/progress.h"
#include "src/base/status.h"
#include "src/eval/attribute.h"
#include "src/eval/extract.h"
#include "src/eval/extract_outputs.h"
#include "src/eval/extract_rows.h"
#include "src/eval/extract_run.h"
#include "src/eval/extract_settings.h"
#include "src/eval/generate.h"
#include "src/eval/input.h"
#include "src/eval/job_plan.h"
#include "src/eval/lens.h"
#include "src/eval/lens_job.h"
#include "src/eval/patch.h"
#include "src/eval/perplexity.h"
#include "src/eval/plan_query.h"
#include "src/eval/row_selector.h"
#include "src/eval/session.h"
#include "src/eval/windows.h"
#include "src/model/hooks.h"
#include "src/model/interventions.h"
#include "src/model/registry.h"
#include "src/runtime/backward.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::python {
namespace {

// ---- Model ------------------------------------------------------------------

// Models loaded by this process (the test that calls reuse the weights).
std::atomic<int64_t> g_loads{0};

struct ExtractArgs {
  std::vector<std::string> hooks, layers, selectors;
  std::optional<std::string> dtype;
  std::string template_text;
  eval::ExtractRowParams rows;    // add_bos ... max_row_tokens
  eval::AnalysisParams analysis;  // sae, sae_topk, lens, lens_topk
  bool replace_invalid_utf8 = false;
  // The intervention document (docs/interventions.md) as JSON text, built
  // by python/loom/_args.py from `interventions=[...]`; "" = none.
  std::string interventions;
  bool progress = false;  // a bar on stderr, prompts committed of all
  std::optional<GradMetric> grad_of;  // grad_of=, answer=, wrong=
};

// What one extract call produced, before it is turned into Python objects.
struct ExtractOutput {
  std::vector<OutputSet::MemoryArray> arrays;
  std::vector<OutputSet::MemoryOffsets> offsets;
  std::vector<PreparedRow> rows;  // ids dropped; reason kept
  std::vector<int64_t> row_tokens;
  std::vector<std::string> hooks;
  DType dtype = DType::kF32;
  int64_t tokens = 0;
};

// The gradients a backward delivers, kept to be handed to Python as
// {hook name: float32 [T, width]} (Take, with the GIL held).
struct GradRows : GradientSink {
  Status OnGradient(const HookPoint& h, const float* rows, int64_t tokens,
                    int64_t width) override {
    got.push_back({HookName(h), std::vector<float>(rows, rows + tokens * width),
                   tokens, width});
    return Status();
  }
  py::dict Take() {
    py::dict d;
    for (Got& g : got)
      d[py::str(g.name)] =
          HandOver(std::move(g.data), py::dtype("float32"), {g.rows, g.cols});
    got.clear();
    return d;
  }
  struct Got {
    std::string name;
    std::vector<float> data;
    int64_t rows, cols;
  };
  std::vector<Got> got;
};

// extract's grad_of= with answer= / wrong= (`loom extract --grad-of`'s rule,
// ParseGradOf): every argument converted (named type errors) whether or
// not it is used.
std::optional<GradMetric> GradOfArg(const py::object& grad_of,
                                    const py::object& answer,
                                    const py::object& wrong) {
  const std::optional<std::string> kind = OptStrArg("grad_of", grad_of);
  const int64_t a = answer.is_none() ? -1 : IntArgAtLeast("answer", answer, 0);
  const int64_t w = wrong.is_none() ? -1 : IntArgAtLeast("wrong", wrong, 0);
  return ValueOrRaise(ParseGradOf(kind.value_or(""), a, w));
}

// extract's saes= (a list from python/loom's _path_list): the loom.Sae
// objects go to `loaded`, the rest is returned for the `sae` field.
py::object SaePaths(const py::object& saes,
                    std::vector<std::shared_ptr<const Sae>>* loaded) {
  if (!py::isinstance<py::list>(saes)) return saes;
  py::list paths;
  for (const py::handle item : saes.cast<py::list>()) {
    if (std::shared_ptr<const Sae> sae = LoadedSae(item))
      loaded->push_back(std::move(sae));
    else
      paths.append(item);
  }
  return std::move(paths);
}

class PyModel {
 public:
  PyModel(const py::object& path, const py::object& device,
          const py::object& precision, const py::object& max_memory,
          const py::object& reserve, const py::object& threads,
          const py::object& hf_bf16) {
    path_ = StrArg("path", path);
    ReadPlacement(&plan_, device, max_memory, reserve);
    const eval::ParamField fields[] = {
        {&eval::ModelParam("threads"), &threads_, {}},
        {&eval::ModelParam("hf_bf16"), &hf_bf16_, {}}};
    const py::handle values[] = {threads, hf_bf16};
    ReadPyParams(fields, values);
    precision_ = ValueOrRaise(ParsePrecision(StrArg("precision", precision)));
    CheckOrRaise(WithoutGil([&]() -> Status { return Load(); }));
    ++g_loads;
  }

  const std::string& path() const { return path_; }
  std::string compute_dtype() const {
    return std::string(DTypeName(session_->model().compute_dtype()));
  }
  py::object config() const { return JsonToPython(ConfigJson()); }
  // The devices the model's layers were placed on when it loaded, by name
  // ("cpu", "cuda:0"), as `loom plan` lists them.
  py::list devices() const {
    py::list l;
    for (const std::string& d : placed_devices_) l.append(d);
    return l;
  }
  // The placement asked for (`device=`), which Model.plan passes on.
  py::list device_flags() const {
    py::list l;
    for (const std::string& d : plan_.devices) l.append(d);
    return l;
  }
  // Every hook of this model (ModelHooks), in execution order.
  py::list hook_names() const {
    py::list l;
    for (const HookPoint& h : ModelHooks(session_->config()))
      l.append(HookName(h));
    return l;
  }
  int64_t num_layers() const { return session_->config().num_layers; }

  std::vector<int32_t> Tokenize(const py::object& text,
                                const py::object& add_special_tokens,
                                const py::object& replace_invalid_utf8) {
    const bool replace = BoolArg("replace_invalid_utf8", replace_invalid_utf8);
    const std::string t = TextArg("text", text, replace, true);
    tok::EncodeOptions eo;
    eo.add_special_tokens = BoolArg("add_special_tokens", add_special_tokens);
    eo.invalid_utf8 = replace ? tok::InvalidUtf8Policy::kReplace
                              : tok::InvalidUtf8Policy::kError;
    const tok::Tokenizer& tokenizer = TokenizerOrRaise();
    StatusOr<tok::Encoding> enc = WithoutGil([&]() -> StatusOr<tok::Encoding> {
      StatusOr<tok::Encoding> e = tokenizer.Encode(t, eo);
      if (!e.ok()) return e.status().WithContext("text");
      return e;
    });
    return ValueOrRaise(std::move(enc)).ids;
  }

  // HF's decode(ids, skip_special_tokens).
  py::str Decode(const py::object& ids, const py::object& skip_special_tokens) {
    const std::vector<int32_t> v = TokenIdsArg("ids", ids);
    const bool skip = BoolArg("skip_special_tokens", skip_special_tokens);
    const tok::Tokenizer& tokenizer = TokenizerOrRaise();
    StatusOr<std::string> text = WithoutGil([&]() -> StatusOr<std::string> {
      StatusOr<std::string> t = tokenizer.Decode(v, skip);
      if (!t.ok()) return t.status().WithContext("ids");
      return t;
    });
    return Utf8ToPython(ValueOrRaise(std::move(text)));
  }

  // Each id decoded alone (special tokens kept, no clean-up of spaces), as
  // TransformerLens's to_str_tokens does with HF's tokenizer.
  py::list StrTokens(const py::object& ids) {
    const std::vector<int32_t> v = TokenIdsArg("text_or_ids", ids);
    const tok::Tokenizer& tokenizer = TokenizerOrRaise();
    StatusOr<std::vector<std::string>> pieces =
        WithoutGil([&]() -> StatusOr<std::vector<std::string>> {
          tok::DecodeOptions o;
          o.skip_special_tokens = false;
          o.clean_up_tokenization_spaces = false;
          std::vector<std::string> out;
          for (size_t i = 0; i < v.size(); ++i) {
            StatusOr<std::string> t =
                tokenizer.Decode(std::span<const int32_t>(&v[i], 1), o);
            if (!t.ok())
              return t.status().WithContext("text_or_ids[" + std::to_string(i) +
                                            "]");
            out.push_back(*std::move(t));
          }
          return out;
        });
    py::list l;
    for (const std::string& p : ValueOrRaise(std::move(pieces)))
      l.append(Utf8ToPython(p));
    return l;
  }

  py::dict Extract(const py::object& prompts, const ExtractArgs& a) {
    // The rows are read from Python objects with the GIL held.
    std::vector<InputRow> rows;
    if (py::isinstance<py::str>(prompts)) {
      rows.push_back(ToInputRow(prompts, 0));
    } else {
      py::object it =
          py::reinterpret_steal<py::object>(PyObject_GetIter(prompts.ptr()));
      if (!it || PyBytes_Check(prompts.ptr())) {
        PyErr_Clear();
        WrongType("prompts", "a str or a list of prompts", prompts);
      }
      int64_t i = 0;
      for (const py::handle item : py::iter(prompts))
        rows.push_back(ToInputRow(item, i++));
    }
    ExtractOptions o;
    o.model_dir = path_;
    o.hooks = a.hooks;
    o.layers = a.layers;
    o.selectors = a.selectors;
    o.template_text = a.template_text;
    if (a.dtype) o.dtype = ValueOrRaise(ParseOutputDType(*a.dtype));
    o.format = OutputFormat::kMemory;
    o.precision = precision_;
    o.threads = threads_;
    CheckOrRaise(ApplyRowParams(a.rows, &o));
    o.analysis = a.analysis;
    o.replace_invalid_utf8 = a.replace_invalid_utf8;
    o.plan = plan_;
    o.hf_bf16_activations = hf_bf16_;
    // Vector files are relative to the working directory.
    o.interventions_json = a.interventions;
    o.interventions_dir = ".";
    o.grad_of = a.grad_of;
    StatusOr<ExtractOutput> out = WithoutGil([&]() -> StatusOr<ExtractOutput> {
      std::lock_guard<std::mutex> lock(mu_);
      UseThreadsHere();
      return RunInMemory(o, std::move(rows),
                         MakeProgressBar(a.progress, "extract", "prompts"));
    });
    ExtractOutput r = ValueOrRaise(std::move(out));

    py::dict result;
    py::list arrays;
    for (OutputSet::MemoryArray& m : r.arrays) {
      const py::dtype dtype = NumpyDType(m.dtype);
      py::dict d;
      d["hook"] = m.hook;
      d["selector"] = m.selector;
      d["selector_file"] = m.selector_file;
      d["array"] = HandOver(std::move(m.data), dtype, m.shape);
      arrays.append(d);
    }
    py::list offsets;
    for (OutputSet::MemoryOffsets& m : r.offsets) {
      py::dict d;
      d["selector"] = m.selector;
      d["selector_file"] = m.selector_file;
      const std::vector<int64_t> shape = {
          static_cast<int64_t>(m.offsets.size())};
      d["offsets"] = HandOver(std::move(m.offsets), py::dtype("int64"), shape);
      offsets.append(d);
    }
    py::list records;
    for (size_t i = 0; i < r.rows.size(); ++i) {
      const PreparedRow& p = r.rows[i];
      py::dict rec;
      rec["row"] = p.index;
      rec["id"] = JsonToPython(p.id);
      rec["tokens"] = r.row_tokens[i];
      rec["status"] = p.ok() ? "ok" : "skipped";
      if (!p.ok()) rec["reason"] = p.reason;
      records.append(rec);
    }
    result["arrays"] = arrays;
    result["offsets"] = offsets;
    result["rows"] = records;
    result["hooks"] = r.hooks;
    result["dtype"] = std::string(DTypeLongName(r.dtype));
    result["tokens"] = r.tokens;
    return result;
  }

  // `text`: a str or bytes (a file's bytes, as `--text FILE` reads them);
  // `tokens`: token ids.
  // The logit lens, or the tuned lens at `tuned` (a path; loaded once per
  // model), of x [rows, H] read at `hook`: top-k token ids and logits, and
  // the [rows, V] logits when asked for.
  py::dict Lens(const py::object& x, const py::object& hook,
                const py::object& topk, const py::object& tuned,
                const py::object& logits) {
    const ModelConfig& c = session_->config();
    const std::string name = StrArg("hook", hook);
    const std::vector<HookPoint> points =
        ValueOrRaise(ParseModelHookPattern(name, c));
    if (points.size() != 1)
      Raise(InvalidArgumentError("hook: '" + name + "' names " +
                                 std::to_string(points.size()) +
                                 " hooks, the lens reads one"));
    const int64_t k = IntArg("topk", topk);
    CheckOrRaise(eval::CheckLensTopK(k, c.vocab_size, 0, "topk"));
    const bool keep = BoolArg("logits", logits);
    const std::string tuned_path =
        tuned.is_none() ? std::string() : StrArg("tuned", tuned);
    int64_t rows = 0;
    const std::vector<float> in =
        FloatRows("x", x, c.hidden_size, "the model's hidden size is", &rows);
    std::vector<float> all(keep ? rows * c.vocab_size : 0), values(rows * k);
    std::vector<int32_t> ids(rows * k);
    CheckOrRaise(WithoutGil([&]() -> Status {
      std::lock_guard<std::mutex> lock(mu_);
      const TunedLens* lens = nullptr;
      if (!tuned_path.empty()) {
        ASSIGN_OR_RETURN(lens, TunedLensAt(tuned_path));
      }
      UseThreadsHere();
      // Chunks of 64 rows: [64, V] logits at a time.
      ASSIGN_OR_RETURN(std::unique_ptr<eval::Lens> run,
                       eval::Lens::Create(session_->model(), lens,
                                          std::clamp<int64_t>(rows, 1, 64)));
      eval::LensOutputs out;
      out.topk = k;
      out.topk_ids = ids.data();
      out.topk_logits = values.data();
      out.logits = keep ? all.data() : nullptr;
      return run->Run(points[0], in.data(), rows, out);
    }));
    py::dict d;
    d["topk_ids"] = HandOver(std::move(ids), py::dtype("int32"), {rows, k});
    d["topk_logits"] =
        HandOver(std::move(values), py::dtype("float32"), {rows, k});
    if (keep)
      d["logits"] =
          HandOver(std::move(all), py::dtype("float32"), {rows, c.vocab_size});
    return d;
  }

  // `loom lens` on this model (src/eval/lens_job.h): one forward of
  // `prompt` (text or ids), planned on the model's devices, each residual
  // hook of the grid read through the logit or tuned lens.
  py::dict LensGrid(const py::object& prompt_obj, const py::object& hooks,
                    const py::object& layers, const py::object& topk,
                    const py::object& tuned, const py::object& kl) {
    PatchPrompt prompt = PatchPromptArg("prompt", prompt_obj);
    eval::LensGridOptions o;
    if (!hooks.is_none()) o.hooks = StrListArg("hooks", hooks);
    if (!layers.is_none()) o.layers = StrListArg("layers", layers);
    ReadPyParams(eval::LensGridParams(&o.topk, &o.kl),
                 {{"topk", topk}, {"kl", kl}});
    o.hf_bf16_activations = hf_bf16_;
    const std::string tuned_path =
        tuned.is_none() ? std::string() : StrArg("tuned", tuned);
    StatusOr<eval::LensGrid> out =
        WithoutGil([&]() -> StatusOr<eval::LensGrid> {
          std::lock_guard<std::mutex> lock(mu_);
          UseThreadsHere();
          RETURN_IF_ERROR(PatchPromptIds(&prompt));
          if (!tuned_path.empty()) {
            ASSIGN_OR_RETURN(o.tuned, TunedLensAt(tuned_path));
          }
          RETURN_IF_ERROR(session_->Replan({}, [&](const Session& s) {
            return eval::LensGridJob(
                s.config(), static_cast<int64_t>(prompt.ids.size()), o);
          }));
          o.segments = session_->segments();
          return eval::RunLensGrid(session_->model(), prompt.ids, o);
        });
    const eval::LensGrid g = ValueOrRaise(std::move(out));
    const nlohmann::json j =
        eval::LensGridJson(g, prompt.ids, session_->tokenizer());
    py::dict d;
    py::list names;
    for (const HookPoint& h : g.hooks) names.append(HookName(h));
    const int64_t L = static_cast<int64_t>(g.hooks.size());
    d["hooks"] = names;
    d["input_ids"] = prompt.ids;
    d["topk_ids"] = HandOver(std::vector<int32_t>(g.topk_ids),
                             py::dtype("int32"), {L, g.tokens, g.topk});
    d["topk_logits"] = HandOver(std::vector<float>(g.topk_logits),
                                py::dtype("float32"), {L, g.tokens, g.topk});
    if (o.kl)
      d["kl_to_final"] = HandOver(std::vector<float>(g.kl),
                                  py::dtype("float32"), {L, g.tokens});
    if (j.contains("tokens")) {
      d["tokens"] = JsonToPython(j["tokens"]);
      d["topk_tokens"] = JsonToPython(j["topk_tokens"]);
    }
    d["seconds"] = g.seconds;
    d["lens_seconds"] = g.lens_seconds;
    return d;
  }

  // The tuned lens at `path`, loaded once per model.
  StatusOr<const TunedLens*> TunedLensAt(const std::string& path) {
    auto it = tuned_lenses_.find(path);
    if (it == tuned_lenses_.end()) {
      ASSIGN_OR_RETURN(TunedLens t, LoadTunedLens(path));
      it = tuned_lenses_.emplace(path, std::move(t)).first;
    }
    return &it->second;
  }

  py::object Perplexity(const py::object& text, const py::object& tokens,
                        const py::object& protocol_arg,
                        const py::object& ctx_obj, const py::object& stride_obj,
                        const py::object& max_windows_obj,
                        const py::object& add_bos_arg,
                        const py::object& chunk_rows_obj,
                        const py::object& interventions_obj) {
    if (text.is_none() == tokens.is_none())
      Raise(InvalidArgumentError("give exactly one of text and tokens"));
    eval::WindowParams w;
    const py::handle given[] = {protocol_arg,    ctx_obj,     stride_obj,
                                max_windows_obj, add_bos_arg, chunk_rows_obj};
    ReadPyParams(eval::WindowParamFields(&w), given);
    const eval::Protocol protocol =
        ValueOrRaise(eval::ParseProtocol(w.protocol));
    const eval::AddBos add_bos = ValueOrRaise(eval::ParseAddBos(w.add_bos));
    const int64_t ctx_arg = w.ctx, stride = w.stride,
                  max_windows = w.max_windows, chunk_rows = w.chunk_rows;
    const std::string interventions_json =
        OptStrArg("interventions", interventions_obj).value_or("");
    std::string text_value;
    std::vector<int32_t> ids;
    if (!text.is_none()) {
      text_value = TextArg("text", text, false, false);
    } else {
      ids = TokenIdsArg("tokens", tokens);
    }
    const bool from_text = !text.is_none();
    StatusOr<Json> out = WithoutGil([&]() -> StatusOr<Json> {
      std::lock_guard<std::mutex> lock(mu_);
      UseThreadsHere();
      const ModelConfig& c = session_->config();
      // As `loom perplexity`: the interventions checked first, the plan
      // (refusing what does not fit), the input, the windows, then the
      // evaluation (each window one sequence: `rows` are window indices).
      RETURN_IF_ERROR(session_->Replan(
          InterventionsFromJson(interventions_json), [&](const Session& s) {
            return StatusOr<JobSpec>(
                EvalJobOf(s.config(), ctx_arg, chunk_rows));
          }));
      eval::EvalInput input;
      if (from_text) {
        ASSIGN_OR_RETURN(input,
                         eval::TokenizeText(text_value, path_, add_bos, c));
      } else {
        ASSIGN_OR_RETURN(input,
                         eval::TokenIdsInput(std::move(ids), add_bos, c));
      }
      const int64_t ctx =
          ctx_arg > 0 ? ctx_arg : DefaultContext(c, kEvalContext);
      if (ctx > c.max_position_embeddings)
        return OutOfRangeError("--ctx " + std::to_string(ctx) +
                               " exceeds the maximum context of " + path_ +
                               " (max_position_embeddings = " +
                               std::to_string(c.max_position_embeddings) + ")");
      ASSIGN_OR_RETURN(
          eval::WindowPlan plan,
          eval::PlanWindows(static_cast<int64_t>(input.ids.size()),
                            eval::MakeWindowOptions(protocol, ctx, stride,
                                                    max_windows, input)));
      eval::EvalOptions eo;
      eo.logits_chunk_rows = chunk_rows;
      eo.hf_bf16_activations = hf_bf16_;
      eo.segments = session_->segments();
      eo.cancelled = InterruptPoll();
      eo.interventions = &session_->interventions();
      ASSIGN_OR_RETURN(
          eval::PerplexityResult r,
          eval::EvaluatePerplexity(session_->model(), input.ids, plan, eo));
      // `loom perplexity --json`'s object, "model" being the path given.
      return eval::PerplexityJson(
          path_, session_->model().compute_dtype(), input.bos,
          static_cast<int64_t>(input.ids.size()), r, session_->interventions());
    });
    return JsonToPython(ValueOrRaise(std::move(out)));
  }

  // `loom generate` (--json; with hooks, --hooks/--layers/--select) on this
  // model: python/generate.h.
  py::dict Generate(const py::object& prompt, const py::object& max_tokens,
                    const py::object& temperature, const py::object& top_k,
                    const py::object& top_p, const py::object& seed,
                    const py::object& stop, const py::object& ctx,
                    const py::object& prefill_chunk, const py::object& hooks,
                    const py::object& layers, const py::object& select,
                    const py::object& interventions) {
    GenerateRequest r;
    const py::handle given[] = {max_tokens, temperature, top_k,
                                top_p,      seed,        stop};
    ReadPyParams(
        eval::GenerationParams(&r.max_new_tokens, &r.sampling, &r.stop_strings),
        given);
    r.context = IntArgAtLeast("ctx", ctx, 0,
                              " (0: min(2048, max_position_embeddings))");
    r.prefill_chunk = IntArgAtLeast("prefill_chunk", prefill_chunk, 1);
    const std::vector<std::string> hook_patterns = StrListArg("hooks", hooks);
    const std::vector<std::string> layer_specs = StrListArg("layers", layers);
    const std::vector<std::string> selector_specs =
        StrListArg("select", select);
    const std::string interventions_json =
        OptStrArg("interventions", interventions).value_or("");
    const bool from_text =
        PyUnicode_Check(prompt.ptr()) || PyBytes_Check(prompt.ptr());
    std::string text;
    if (from_text) {
      text = TextArg("prompt", prompt, false, false);
      // As `loom generate` refuses an empty --prompt (and extract an empty
      // text row).
      if (text.empty()) Raise(InvalidArgumentError("prompt: empty text"));
    } else {
      if (!py::hasattr(prompt, "__iter__"))
        WrongType("prompt", "a str or a sequence of token ids", prompt);
      // A list of prompts: generate continues one (the batch is the
      // caller's loop), said as such rather than as a bad token id.
      if (PySequence_Check(prompt.ptr()) && PySequence_Size(prompt.ptr()) > 0) {
        const py::object first = prompt[py::int_(0)];
        if (PyUnicode_Check(first.ptr()) || PyBytes_Check(first.ptr()) ||
            PyList_Check(first.ptr()) || PyTuple_Check(first.ptr()))
          throw py::type_error(
              "prompt: expected a str or a sequence of token ids, got a " +
              TypeNameOf(prompt) + " of " + std::to_string(py::len(prompt)) +
              " prompts (" + TypeNameOf(first) +
              " first); generate continues one prompt: call it once per "
              "prompt");
      }
      r.prompt = TokenIdsArg("prompt", prompt);
    }
    StatusOr<GenerateResult> out =
        WithoutGil([&]() -> StatusOr<GenerateResult> {
          std::lock_guard<std::mutex> lock(mu_);
          UseThreadsHere();
          const ModelConfig& c = session_->config();
          const tok::Tokenizer* tokenizer = session_->tokenizer();
          if (from_text) {
            if (tokenizer == nullptr)
              return FailedPreconditionError(
                  "prompt: a text prompt needs the model's tokenizer, which "
                  "did not load (" +
                  session_->tokenizer_error() + "); give token ids");
            StatusOr<tok::Encoding> enc = tokenizer->Encode(text, true);
            if (!enc.ok()) return enc.status().WithContext("prompt");
            r.prompt = std::move(enc->ids);
          }
          if (!hook_patterns.empty()) {
            ASSIGN_OR_RETURN(HookSet set,
                             ResolveHooks(hook_patterns, layer_specs, c));
            if (set.empty())
              return InvalidArgumentError("hooks: no hook selected");
            r.hooks = set.hooks();
            for (const std::string& s : selector_specs) {
              ASSIGN_OR_RETURN(RowSelector sel, ParseRowSelector(s));
              r.selectors.push_back(std::move(sel));
            }
            if (r.selectors.empty())
              return InvalidArgumentError("select: no selector given");
          } else if (!layer_specs.empty()) {
            return InvalidArgumentError(
                "layers: picks the layers of bare site names in hooks, and no "
                "hooks were given");
          }
          // The generator's KV cache and forwards, planned on the model's
          // devices (each layer's cache where it is computed).
          RETURN_IF_ERROR(session_->Replan(
              InterventionsFromJson(interventions_json),
              [&](const Session& s) -> StatusOr<JobSpec> {
                ASSIGN_OR_RETURN(
                    const eval::Generator::Options go,
                    eval::Generator::Resolve(
                        s.config(), GeneratorOptionsOf(s.config(), r, {})));
                return eval::Generator::Job(s.config(), go);
              }));
          if (!session_->interventions().empty())
            r.interventions = &session_->interventions();
          ASSIGN_OR_RETURN(r.stop_ids, eval::LoadStopIds(session_->model()));
          r.cancelled = InterruptPoll();
          return GenerateOne(session_->model(), tokenizer, session_->segments(),
                             r);
        });
    GenerateResult g = ValueOrRaise(std::move(out));
    py::dict result;
    result["prompt_ids"] = g.prompt_ids;
    result["token_ids"] = g.token_ids;
    result["text"] = Utf8ToPython(g.text);
    result["stop_reason"] = g.stop_reason;
    if (!r.hooks.empty()) {
      result["activation_rows"] = g.activation_rows;
      py::list arrays;
      for (SelectedRows& a : g.activations) {
        py::dict d;
        d["hook"] = HookName(a.hook);
        d["selector"] = a.selector.spec;
        d["selector_file"] = a.selector.file_name;
        d["array"] =
            HandOver(std::move(a.data), py::dtype("float32"), {a.rows, a.cols});
        arrays.append(d);
      }
      result["arrays"] = arrays;
    }
    return result;
  }

  // `loom patch` on this model (src/eval/patch.h): the (hook x position)
  // grid of a clean and a corrupted prompt, on the CPU backend (as the CLI:
  // nothing is planned against the devices).
  py::dict Patch(const py::object& clean_obj, const py::object& corrupted_obj,
                 const py::object& hooks, const py::object& positions,
                 const py::object& answer, const py::object& wrong,
                 const py::object& batch_tokens, bool per_head, bool progress) {
    PatchPrompt clean = PatchPromptArg("clean", clean_obj);
    PatchPrompt corrupted = PatchPromptArg("corrupted", corrupted_obj);
    eval::PatchOptions o;
    o.hooks = StrListArg("hooks", hooks);
    if (o.hooks.empty()) Raise(InvalidArgumentError("hooks: no hook given"));
    o.positions = PatchPositionsArg(positions);
    o.per_head = per_head;
    const char* kDefault = " (None: the default)";
    if (!answer.is_none()) o.answer = IntArgAtLeast("answer", answer, 0);
    if (!wrong.is_none()) o.wrong = IntArgAtLeast("wrong", wrong, 0);
    if (!batch_tokens.is_none())
      o.batch_tokens = IntArgAtLeast("batch_tokens", batch_tokens, 1, kDefault);
    o.hf_bf16_activations = hf_bf16_;
    o.cancelled = InterruptPoll();
    o.progress = MakeProgressBar(progress, "patch", "cells");
    StatusOr<eval::PatchResult> out =
        WithoutGil([&]() -> StatusOr<eval::PatchResult> {
          std::lock_guard<std::mutex> lock(mu_);
          UseThreadsHere();
          const int64_t V = session_->config().vocab_size;
          for (const auto& [name, id] :
               {std::pair<const char*, int64_t>{"answer", o.answer},
                {"wrong", o.wrong}})
            if (id >= V)
              return InvalidArgumentError(
                  std::string(name) + ": token id " + std::to_string(id) +
                  " is outside the vocabulary [0, " + std::to_string(V) + ")");
          RETURN_IF_ERROR(PatchPromptIds(&clean));
          RETURN_IF_ERROR(PatchPromptIds(&corrupted));
          RETURN_IF_ERROR(eval::CheckPatchInputs(clean.ids, corrupted.ids, o));
          // As `loom patch`: the grid's forwards planned on the model's
          // devices.
          RETURN_IF_ERROR(session_->Replan({}, [&](const Session& s) {
            return eval::PatchJob(
                s.config(), static_cast<int64_t>(clean.ids.size()),
                static_cast<int64_t>(corrupted.ids.size()), o);
          }));
          o.segments = session_->segments();
          return eval::RunPatch(session_->model(), clean.ids, corrupted.ids, o);
        });
    // A Ctrl-C ends the grid before its next forward (Cancelled).
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    return PatchDict(ValueOrRaise(std::move(out)),
                     session_->config().vocab_size);
  }

  // `loom attribute` on this model (src/eval/attribute.h): AtP from one
  // backward, on the host at f32 (a model loaded at another precision is
  // refused by the backward, saying so).
  py::dict Attribute(const py::object& clean_obj,
                     const py::object& corrupted_obj, const py::object& hooks,
                     const py::object& positions, const py::object& metric,
                     const py::object& answer, const py::object& wrong,
                     const py::object& freeze, const py::object& per_head_obj,
                     const py::object& check_top_obj,
                     const py::object& method_obj) {
    PatchPrompt clean = PatchPromptArg("clean", clean_obj);
    PatchPrompt corrupted = PatchPromptArg("corrupted", corrupted_obj);
    eval::AttributeOptions o;
    o.hooks = StrListArg("hooks", hooks);
    if (o.hooks.empty()) Raise(InvalidArgumentError("hooks: no hook given"));
    o.positions = PatchPositionsArg(positions);
    const bool per_head = BoolArg("per_head", per_head_obj);
    o.per_head = per_head;
    o.metric = MetricArg(StrArg("metric", metric));
    SetFreeze(StrListArg("freeze", freeze), &o.freeze_attn_pattern,
              &o.freeze_norm_scale);
    if (!answer.is_none()) o.answer = IntArgAtLeast("answer", answer, 0);
    if (!wrong.is_none()) o.wrong = IntArgAtLeast("wrong", wrong, 0);
    o.check_top = IntArgAtLeast("check_top", check_top_obj, 0);
    const std::string method = StrArg("method", method_obj);
    if (ValueOrRaise(eval::ParseAttributeMethod(method, "method")) ==
        eval::AttributeMethod::kIg)
      Raise(
          InvalidArgumentError("method: 'ig' is Model.integrated_gradients "
                               "(atp or atp-star here)"));
    o.grad_drop = method == "atp-star";
    StatusOr<eval::AttributeResult> out =
        WithoutGil([&]() -> StatusOr<eval::AttributeResult> {
          std::lock_guard<std::mutex> lock(mu_);
          UseThreadsHere();
          RETURN_IF_ERROR(PatchPromptIds(&clean));
          RETURN_IF_ERROR(PatchPromptIds(&corrupted));
          return eval::RunAttribute(session_->model(), clean.ids, corrupted.ids,
                                    o);
        });
    eval::AttributeResult r = ValueOrRaise(std::move(out));
    py::dict d;
    d["method"] = method;
    AddGrid(r.hooks, static_cast<int64_t>(r.positions.size()), r.atp,
            r.atp_head, per_head, "atp", &d);
    if (o.grad_drop)
      AddGrid(r.hooks, static_cast<int64_t>(r.positions.size()), r.atp_star,
              r.atp_star_head, per_head, "atp_star", &d);
    d["hooks"] = r.hooks;
    d["positions"] = r.positions;
    d["answer"] = r.answer;
    d["wrong"] = r.wrong;
    d["metric_clean"] = r.metric_clean;
    d["metric_corrupted"] = r.metric_corrupted;
    py::list checks;
    for (const eval::AttributeCheck& c : r.checks) {
      py::dict e;
      e["hook"] = c.hook;
      e["position"] = c.position;
      e["atp"] = c.atp;
      e["true_patch"] = c.true_patch;
      checks.append(e);
    }
    d["checks"] = checks;
    d["seconds"] = r.seconds;
    return d;
  }

  // d[key] = float64 [rows, P] of `grid`, and with per_head d[key +
  // "_head"] = {hook: float64 [P, heads]} for the attn.hook_z rows.
  static void AddGrid(const std::vector<std::string>& hooks, int64_t P,
                      const std::vector<std::vector<double>>& grid,
                      const std::vector<std::vector<std::vector<double>>>& head,
                      bool per_head, const std::string& key, py::dict* d) {
    std::vector<double> flat;
    for (const std::vector<double>& row : grid)
      flat.insert(flat.end(), row.begin(), row.end());
    (*d)[py::str(key)] = HandOver(std::move(flat), py::dtype("float64"),
                                  {static_cast<int64_t>(hooks.size()), P});
    if (!per_head) return;
    py::dict heads;
    for (size_t i = 0; i < hooks.size() && i < head.size(); ++i) {
      if (head[i].empty()) continue;
      const int64_t H = static_cast<int64_t>(head[i][0].size());
      std::vector<double> rows;
      for (const std::vector<double>& row : head[i])
        rows.insert(rows.end(), row.begin(), row.end());
      heads[py::str(hooks[i])] =
          HandOver(std::move(rows), py::dtype("float64"), {P, H});
    }
    (*d)[py::str(key + "_head")] = heads;
  }

  // Integrated gradients over one prompt's tokens (`loom attribute --method
  // ig`, src/eval/attribute.h), at f32.
  py::dict IntegratedGradients(const py::object& prompt_obj,
                               const py::object& metric,
                               const py::object& answer,
                               const py::object& wrong, const py::object& steps,
                               const py::object& baseline_token,
                               const py::object& freeze) {
    PatchPrompt prompt = PatchPromptArg("prompt", prompt_obj);
    eval::IgOptions o;
    o.metric = MetricArg(StrArg("metric", metric));
    if (!answer.is_none()) o.answer = IntArgAtLeast("answer", answer, 0);
    if (!wrong.is_none()) o.wrong = IntArgAtLeast("wrong", wrong, 0);
    o.steps = IntArgAtLeast("steps", steps, 1);
    o.baseline_token = IntArgAtLeast("baseline_token", baseline_token, 0);
    SetFreeze(StrListArg("freeze", freeze), &o.freeze_attn_pattern,
              &o.freeze_norm_scale);
    StatusOr<eval::IgAttribution> out =
        WithoutGil([&]() -> StatusOr<eval::IgAttribution> {
          std::lock_guard<std::mutex> lock(mu_);
          UseThreadsHere();
          RETURN_IF_ERROR(PatchPromptIds(&prompt));
          return eval::RunIntegratedGradients(session_->model(), prompt.ids, o);
        });
    eval::IgAttribution r = ValueOrRaise(std::move(out));
    const nlohmann::json j = eval::IgJson(r, o);
    py::dict d;
    const int64_t T = static_cast<int64_t>(r.per_token.size());
    d["ig"] =
        HandOver(std::vector<double>(r.per_token), py::dtype("float64"), {T});
    d["answer"] = r.answer;
    d["wrong"] = r.wrong;
    d["metric_input"] = r.metric_input;
    d["metric_baseline"] = r.metric_baseline;
    d["completeness_error"] = j["completeness_error"].get<double>();
    d["steps"] = o.steps;
    d["seconds"] = r.seconds;
    return d;
  }

  // The custom-gradient backward (Backward::Inject): one forward of the
  // prompt, then one backward per dict of `injections` ({hook: [T, width]}
  // d objective / d hook), each delivering {hook: float32 [T, width]} at
  // `hooks`. A dict in, a dict out; a list in, a list out.
  py::object InjectGrad(const py::object& prompt_obj,
                        const py::object& injections, const py::object& hooks,
                        const py::object& freeze) {
    PatchPrompt prompt = PatchPromptArg("prompt", prompt_obj);
    BackwardOptions o;
    SetFreeze(StrListArg("freeze", freeze), &o.freeze_attn_pattern,
              &o.freeze_norm_scale);
    const std::vector<std::string> patterns = StrListArg("hooks", hooks);
    const bool one = py::isinstance<py::dict>(injections);
    if (!one && !py::isinstance<py::list>(injections))
      WrongType("injections", "a dict {hook: array} or a list of them",
                injections);
    const ModelConfig& c = session_->config();
    std::vector<std::vector<GradInjection>> batches;
    const py::list items =
        one ? py::list(py::make_tuple(injections)) : py::list(injections);
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string arg = "injections[" + std::to_string(i) + "]";
      if (!py::isinstance<py::dict>(items[i]))
        WrongType(arg, "a dict {hook: array}", items[i]);
      std::vector<GradInjection> seeds;
      for (const auto& [key, value] : py::cast<py::dict>(items[i])) {
        const std::string name =
            StrArg(arg + " key", py::reinterpret_borrow<py::object>(key));
        const std::vector<HookPoint> points =
            ValueOrRaise(ParseModelHookPattern(name, c));
        if (points.size() != 1)
          Raise(InvalidArgumentError(arg + ": '" + name + "' names " +
                                     std::to_string(points.size()) +
                                     " hooks; a seed is at one"));
        const int64_t width = ValueOrRaise(HookWidth(points[0], c));
        int64_t rows = 0;
        seeds.push_back(
            {points[0], FloatRows(arg + "[" + name + "]",
                                  py::reinterpret_borrow<py::object>(value),
                                  width, "the hook's width is", &rows)});
      }
      batches.push_back(std::move(seeds));
    }
    std::vector<GradRows> sinks(batches.size());
    CheckOrRaise(WithoutGil([&]() -> Status {
      std::lock_guard<std::mutex> lock(mu_);
      UseThreadsHere();
      RETURN_IF_ERROR(PatchPromptIds(&prompt));
      ASSIGN_OR_RETURN(o.grad_hooks, ResolveExtractHooks(patterns, {}, c));
      o.max_tokens = static_cast<int64_t>(prompt.ids.size());
      ASSIGN_OR_RETURN(std::unique_ptr<Backward> bw,
                       Backward::Create(session_->model(), o));
      std::vector<GradientSink*> out;
      for (GradRows& sk : sinks) out.push_back(&sk);
      return bw->Inject(prompt.ids, batches, out);
    }));
    py::list results;
    for (GradRows& sk : sinks) results.append(sk.Take());
    if (one) return results[0];
    return results;
  }

  // d metric / d activation at `hooks` on one prompt (src/runtime/
  // backward.h): {hook: float32 [T, width]} and "metric" (its value).
  py::dict Grad(const py::object& prompt_obj, const py::object& hooks,
                const py::object& metric, const py::object& answer,
                const py::object& wrong, const py::object& freeze) {
    PatchPrompt prompt = PatchPromptArg("prompt", prompt_obj);
    BackwardOptions o;
    GradMetric m;
    m.kind = MetricArg(StrArg("metric", metric));
    SetFreeze(StrListArg("freeze", freeze), &o.freeze_attn_pattern,
              &o.freeze_norm_scale);
    // Checked whenever given (logprob ignores them).
    if (!answer.is_none())
      m.answer = static_cast<int32_t>(IntArgAtLeast("answer", answer, 0));
    if (!wrong.is_none())
      m.wrong = static_cast<int32_t>(IntArgAtLeast("wrong", wrong, 0));
    if (m.kind == GradMetricKind::kLogitDiff &&
        (answer.is_none() || wrong.is_none()))
      Raise(InvalidArgumentError(
          "answer, wrong: the logit-diff metric needs both token ids"));
    const std::vector<std::string> patterns = StrListArg("hooks", hooks);
    GradRows sink;
    StatusOr<double> value = WithoutGil([&]() -> StatusOr<double> {
      std::lock_guard<std::mutex> lock(mu_);
      UseThreadsHere();
      RETURN_IF_ERROR(PatchPromptIds(&prompt));
      ASSIGN_OR_RETURN(o.grad_hooks,
                       ResolveExtractHooks(patterns, {}, session_->config()));
      o.max_tokens = static_cast<int64_t>(prompt.ids.size());
      ASSIGN_OR_RETURN(std::unique_ptr<Backward> bw,
                       Backward::Create(session_->model(), o));
      return bw->Run(prompt.ids, m, &sink, nullptr);
    });
    const double v = ValueOrRaise(std::move(value));
    py::dict d = sink.Take();
    d["metric"] = v;
    return d;
  }

 private:
  const tok::Tokenizer& TokenizerOrRaise() const {
    if (session_->tokenizer() == nullptr)
      Raise(FailedPreconditionError("no tokenizer: " +
                                    session_->tokenizer_error()));
    return *session_->tokenizer();
  }

  static GradMetricKind MetricArg(const std::string& metric) {
    return ValueOrRaise(ParseGradMetric(metric, "metric"));
  }
  static void SetFreeze(const std::vector<std::string>& freeze, bool* pattern,
                        bool* norm) {
    if (Status s = ParseFreeze(freeze, "freeze", pattern, norm); !s.ok())
      Raise(s);
  }

  // The ids of a Model.patch prompt: its text encoded (special tokens
  // added), or its ids checked against the vocabulary. Without the GIL.
  Status PatchPromptIds(PatchPrompt* p) const {
    const int64_t V = session_->config().vocab_size;
    if (!p->from_text) {
      for (size_t i = 0; i < p->ids.size(); ++i)
        if (p->ids[i] >= V)
          return OutOfRangeError(p->name + "[" + std::to_string(i) +
                                 "]: token id " + std::to_string(p->ids[i]) +
                                 " is outside the vocabulary [0, " +
                                 std::to_string(V) + ")");
      return Status();
    }
    if (session_->tokenizer() == nullptr)
      return FailedPreconditionError(
          p->name + ": a text prompt needs the model's tokenizer, which did " +
          "not load (" + session_->tokenizer_error() + "); give token ids");
    StatusOr<tok::Encoding> enc = session_->tokenizer()->Encode(p->text, true);
    if (!enc.ok()) return enc.status().WithContext(p->name);
    p->ids = std::move(enc->ids);
    return Status();
  }

  // A PatchResult as Model.patch's dict: the grids and logits as numpy
  // arrays (handed over, no copy), the rest as Python values.
  static py::dict PatchDict(eval::PatchResult r, int64_t V) {
    const int64_t n = static_cast<int64_t>(r.hooks.size());
    const int64_t P = static_cast<int64_t>(r.positions.size());
    const py::dtype f64("float64"), f32("float32");
    py::dict d;
    d["hooks"] = r.hooks;
    d["heads"] = r.heads;
    d["positions"] = r.positions;
    d["answer"] = r.answer;
    d["wrong"] = r.wrong;
    d["clean_logit_diff"] = r.clean_logit_diff;
    d["corrupted_logit_diff"] = r.corrupted_logit_diff;
    d["logit_diff"] = HandOver(std::move(r.logit_diff), f64, {n, P});
    d["recovery"] = HandOver(std::move(r.recovery), f64, {n, P});
    d["patched_logits_last"] =
        HandOver(std::move(r.patched_logits_last), f32, {n, P, V});
    d["clean_logits_last"] = HandOver(std::move(r.clean_logits_last), f32, {V});
    d["corrupted_logits_last"] =
        HandOver(std::move(r.corrupted_logits_last), f32, {V});
    d["forwards"] = r.forwards;
    d["seconds"] = r.seconds;
    return d;
  }

  // OpenMP's thread count belongs to the calling thread: a call from another
  // Python thread than the one that loaded the model sets it again, so that
  // its plan (per-thread GEMM and attention workspaces) and its forward see
  // the same count.
  void UseThreadsHere() {
    if (threads_ > 0) session_->host()->SetNumThreads(threads_);
  }

  Status Load() {
    RETURN_IF_ERROR(CheckCpuIsaCap());  // an unknown LOOM_CPU_ISA is refused
    SessionParams sp;
    sp.command = "python";
    sp.speaker = "loom.Model";
    sp.model_dir = path_;
    sp.precision = precision_;
    sp.plan = plan_;
    sp.threads = threads_;
    sp.tokenizer = TokenizerUse::kOptional;
    // The weights must fit the devices (a one-token job: each call plans its
    // own activations, Session::Replan); the plan's GPUs fix the precision.
    ASSIGN_OR_RETURN(session_, Session::Open(sp, [](const Session&) {
                       JobSpec job;
                       job.batch_tokens = 1;
                       job.context = 1;
                       return StatusOr<JobSpec>(job);
                     }));
    for (const DevicePlan& d : session_->plan().devices)
      if (d.computes()) placed_devices_.push_back(d.device.name);
    return Status();
  }

  Json ConfigJson() const {
    const ModelConfig& c = session_->config();
    return Json{{"model_type", c.model_type},
                {"architecture", c.architecture},
                {"num_layers", c.num_layers},
                {"hidden_size", c.hidden_size},
                {"num_heads", c.num_heads},
                {"num_kv_heads", c.num_kv_heads},
                {"head_dim", c.head_dim},
                {"vocab_size", c.vocab_size},
                {"max_position_embeddings", c.max_position_embeddings}};
  }

  // `loom extract`'s pipeline with the rows of a list and the arrays kept in
  // memory: settings, plan (refused if it does not fit), backends, then
  // windows of commit_every rows through one WindowRunner.
  StatusOr<ExtractOutput> RunInMemory(
      const ExtractOptions& o, std::vector<InputRow> input,
      const std::function<void(int64_t, int64_t)>& bar) {
    ExtractSettings settings;
    RETURN_IF_ERROR(session_->Replan(
        InterventionsFromJson(o.interventions_json, o.interventions_dir),
        [&](const Session& s) -> StatusOr<JobSpec> {
          ASSIGN_OR_RETURN(settings, ResolveExtractSettings(o, s.config(),
                                                            s.interventions()));
          RETURN_IF_ERROR(CheckInterventionsApply(
              s.interventions(), static_cast<int64_t>(input.size()), "prompts",
              /*generates=*/false));
          // As `loom extract`: a short input's own tokens as the budget.
          settings.batch_tokens = ShortRowsBatchTokens(
              o, settings, input, s.tokenizer(), s.tokenizer_error());
          return ExtractJobSpec(o, settings, s.compute_dtype());
        }));
    if (settings.streaming())
      RETURN_IF_ERROR(CheckStreamingBackends(session_->segments()));
    // Every row is prepared first: a bad row fails the call before any
    // forward (on_error="fail"), or is recorded and skipped.
    const RowPreparer preparer = MakeRowPreparer(o, settings, *session_);
    ExtractOutput out;
    std::vector<PreparedRow> rows;
    rows.reserve(input.size());
    for (InputRow& row : input) {
      PreparedRow p = preparer.Prepare(std::move(row));
      if (!p.ok() && o.on_error == OnError::kFail)
        return InvalidArgumentError(
            "prompt " + std::to_string(p.index) + ": " + p.reason +
            " (on_error=\"skip\" records and skips bad prompts)");
      rows.push_back(std::move(p));
    }
    out.dtype = o.dtype.value_or(session_->model().compute_dtype());
    out.hooks = settings.hook_names;
    OutputSet outputs(settings, out.dtype, OutputFormat::kMemory, "",
                      session_->host());
    outputs.ReserveMemory(rows);
    ASSIGN_OR_RETURN(
        std::unique_ptr<WindowRunner> runner,
        WindowRunner::Create(settings, o.hf_bf16_activations, session_->model(),
                             session_->segments(), &outputs));
    ManifestProgress progress;
    std::vector<std::string> files;
    const std::function<bool()> cancelled = InterruptPoll();
    const size_t n = rows.size();
    for (size_t begin = 0; begin < n;
         begin += static_cast<size_t>(o.commit_every)) {
      const size_t end =
          std::min(n, begin + static_cast<size_t>(o.commit_every));
      std::vector<PreparedRow> window(
          std::make_move_iterator(rows.begin() + begin),
          std::make_move_iterator(rows.begin() + end));
      RETURN_IF_ERROR(runner->Run(window, &out.tokens, cancelled));
      RETURN_IF_ERROR(
          outputs.CommitArrays(static_cast<int64_t>(window.size()),
                               static_cast<int64_t>(begin) / o.commit_every,
                               static_cast<int64_t>(begin), &progress, &files));
      for (PreparedRow& p : window) {
        out.row_tokens.push_back(p.size());
        p.ids = {};
        out.rows.push_back(std::move(p));
      }
      if (bar) bar(static_cast<int64_t>(end), static_cast<int64_t>(n));
    }
    out.arrays = outputs.TakeMemoryArrays();
    out.offsets = outputs.TakeMemoryOffsets();
    return out;
  }

  std::string path_;
  JobPlanOptions plan_;
  Precision precision_ = Precision::kAuto;
  int threads_ = 0;
  bool hf_bf16_ = false;
  std::unique_ptr<Session> session_;
  std::map<std::string, TunedLens> tuned_lenses_;  // Lens(tuned=path)
  std::vector<std::string> placed_devices_;        // computing devices at load
  // One call at a time per model (its host backend and tokenizer are
  // shared); waited for without the GIL.
  std::mutex mu_;
};

}  // namespace

void AddModelClass(py::module_& m) {
  // Every argument is a Python object, converted (and type-checked, naming
  // the argument) by the helpers above; the public signatures with their
  // defaults are those of python/loom/__init__.py.
  using Obj = const py::object&;
  py::class_<PyModel>(m, "Model")
      .def(py::init<Obj, Obj, Obj, Obj, Obj, Obj, Obj>(), py::arg("path"),
           py::arg("device") = "auto", py::arg("precision") = "auto",
           py::arg("max_memory") = py::none(), py::arg("reserve") = py::none(),
           py::arg("threads") = 0, py::arg("hf_bf16") = false)
      .def_property_readonly("path", &PyModel::path)
      .def_property_readonly("compute_dtype", &PyModel::compute_dtype)
      .def_property_readonly("config", &PyModel::config)
      .def_property_readonly("devices", &PyModel::devices)
      .def_property_readonly("_device_flags", &PyModel::device_flags)
      .def_property_readonly("hook_names", &PyModel::hook_names)
      .def_property_readonly("_num_layers", &PyModel::num_layers)
      .def("_tokenize", &PyModel::Tokenize, py::arg("text"),
           py::arg("add_special_tokens"), py::arg("replace_invalid_utf8"))
      .def("_decode", &PyModel::Decode, py::arg("ids"),
           py::arg("skip_special_tokens"))
      .def("_str_tokens", &PyModel::StrTokens, py::arg("ids"))
      .def(
          "_extract",
          [](PyModel& self, Obj prompts, Obj hooks, Obj layers, Obj select,
             Obj dtype, Obj template_text, Obj add_bos, Obj batch_tokens,
             Obj commit_every, Obj on_error, Obj streaming_chunk_size,
             Obj max_row_tokens, Obj replace_invalid_utf8, Obj interventions,
             Obj progress, Obj sae, Obj sae_topk, Obj lens, Obj lens_topk,
             Obj grad_of, Obj answer, Obj wrong) {
            ExtractArgs a;
            a.hooks = StrListArg("hooks", hooks);
            a.layers = StrListArg("layers", layers);
            a.selectors = StrListArg("select", select);
            a.dtype = OptStrArg("dtype", dtype);
            a.template_text = OptStrArg("template", template_text).value_or("");
            const py::handle rows[] = {
                add_bos,  batch_tokens,         commit_every,
                on_error, streaming_chunk_size, max_row_tokens};
            ReadPyParams(eval::ExtractRowParamFields(&a.rows), rows);
            // (sae_dashboard: written by `loom extract` only.) loom.Sae
            // objects are run as loaded; paths are loaded by the job.
            const py::object paths = SaePaths(sae, &a.analysis.loaded_sae);
            ReadPyParams(eval::AnalysisParamFields(&a.analysis),
                         {{"sae", paths},
                          {"sae_topk", sae_topk},
                          {"lens", lens},
                          {"lens_topk", lens_topk}});
            a.replace_invalid_utf8 =
                BoolArg("replace_invalid_utf8", replace_invalid_utf8);
            a.interventions =
                OptStrArg("interventions", interventions).value_or("");
            a.progress = BoolArg("progress", progress);
            a.grad_of = GradOfArg(grad_of, answer, wrong);
            return self.Extract(prompts, a);
          },
          py::arg("prompts"), py::arg("hooks"), py::arg("layers"),
          py::arg("select"), py::arg("dtype"), py::arg("template"),
          py::arg("add_bos"), py::arg("batch_tokens"), py::arg("commit_every"),
          py::arg("on_error"), py::arg("streaming_chunk_size"),
          py::arg("max_row_tokens"), py::arg("replace_invalid_utf8"),
          py::arg("interventions"), py::arg("progress"), py::arg("sae"),
          py::arg("sae_topk"), py::arg("lens"), py::arg("lens_topk"),
          py::arg("grad_of"), py::arg("answer"), py::arg("wrong"))
      .def("_perplexity", &PyModel::Perplexity, py::arg("text"),
           py::arg("tokens"), py::arg("protocol"), py::arg("ctx"),
           py::arg("stride"), py::arg("max_windows"), py::arg("add_bos"),
           py::arg("chunk_rows"), py::arg("interventions"))
      .def("_generate", &PyModel::Generate, py::arg("prompt"),
           py::arg("max_tokens"), py::arg("temperature"), py::arg("top_k"),
           py::arg("top_p"), py::arg("seed"), py::arg("stop"), py::arg("ctx"),
           py::arg("prefill_chunk"), py::arg("hooks"), py::arg("layers"),
           py::arg("select"), py::arg("interventions"))
      .def("_lens", &PyModel::Lens, py::arg("x"), py::arg("hook"),
           py::arg("topk"), py::arg("tuned"), py::arg("logits"))
      .def("_lens_grid", &PyModel::LensGrid, py::arg("prompt"),
           py::arg("hooks"), py::arg("layers"), py::arg("topk"),
           py::arg("tuned"), py::arg("kl"))
      .def("_patch", &PyModel::Patch, py::arg("clean"), py::arg("corrupted"),
           py::arg("hooks"), py::arg("positions"), py::arg("answer"),
           py::arg("wrong"), py::arg("batch_tokens"), py::arg("per_head"),
           py::arg("progress"))
      .def("_attribute", &PyModel::Attribute, py::arg("clean"),
           py::arg("corrupted"), py::arg("hooks"), py::arg("positions"),
           py::arg("metric"), py::arg("answer"), py::arg("wrong"),
           py::arg("freeze"), py::arg("per_head"), py::arg("check_top"),
           py::arg("method"))
      .def("_integrated_gradients", &PyModel::IntegratedGradients,
           py::arg("prompt"), py::arg("metric"), py::arg("answer"),
           py::arg("wrong"), py::arg("steps"), py::arg("baseline_token"),
           py::arg("freeze"))
      .def("_inject_grad", &PyModel::InjectGrad, py::arg("prompt"),
           py::arg("injections"), py::arg("hooks"), py::arg("freeze"))
      .def("_grad", &PyModel::Grad, py::arg("prompt"), py::arg("hooks"),
           py::arg("metric"), py::arg("answer"), py::arg("wrong"),
           py::arg("freeze"));
  m.def(
      "_params",
      [](const std::string& group) {
        // A group of the parameter table with the library's defaults:
        // Model.generate's and Model.perplexity's keywords must be these.
        GenerateRequest r;
        eval::WindowParams w;
        eval::ExtractRowParams x;
        JobPlanOptions placement;
        eval::LensGridOptions lens;
        std::vector<eval::ParamField> fields;
        if (group == "generation") {
          fields = eval::GenerationParams(&r.max_new_tokens, &r.sampling,
                                          &r.stop_strings);
        } else if (group == "windows") {
          fields = eval::WindowParamFields(&w);
        } else if (group == "extract_rows") {
          fields = eval::ExtractRowParamFields(&x);
        } else if (group == "placement") {
          fields = eval::PlacementParamFields(&placement);
        } else if (group == "lens_grid") {
          fields = eval::LensGridParams(&lens.topk, &lens.kl);
        } else {
          Raise(InvalidArgumentError(
              "no parameter group '" + group +
              "' (generation, windows, extract_rows, placement, lens_grid)"));
        }
        py::dict out;
        for (const eval::ParamField& f : fields)
          std::visit(
              [&](auto* field) {
                out[py::str(std::string(f.spec->name))] = py::cast(*field);
              },
              f.target);
        return out;
      },
      py::arg("group"),
      "{name: default} of a parameter group (src/eval/params.h).");
  m.def(
      "_load_count", [] { return g_loads.load(); },
      "Models loaded by this process (each loom.Model loads once).");
}

}  // namespace loom::python
