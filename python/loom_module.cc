// The Python module `loom._loom` (pybind11): a model loaded once and reused
// by every call; extraction through the pipeline of `loom extract` (settings,
// plan, backends, WindowRunner) into in-memory arrays handed to numpy without
// a copy; perplexity, plan and tokenize as the CLI computes them. The pure
// Python part of the package (python/loom/__init__.py) wraps this.
//
// Errors: every Status becomes a Python exception carrying Loom's message and
// its code name (`code`); no C++ exception crosses into Python (pybind11
// translates anything that would). The GIL is released around every load,
// plan and forward; Ctrl-C is polled before every forward (the `cancelled`
// hooks of WindowRunner and EvaluatePerplexity; the GIL is taken for it at
// most every 20 ms) and re-raised as KeyboardInterrupt.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/backend/registry.h"
#include "src/base/status.h"
#include "src/eval/extract.h"
#include "src/eval/extract_outputs.h"
#include "src/eval/extract_rows.h"
#include "src/eval/extract_run.h"
#include "src/eval/extract_settings.h"
#include "src/eval/input.h"
#include "src/eval/job_plan.h"
#include "src/eval/perplexity.h"
#include "src/eval/plan_query.h"
#include "src/eval/windows.h"
#include "src/model/registry.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"

namespace py = pybind11;

namespace loom::python {
namespace {

using Json = nlohmann::json;

// ---- Errors -----------------------------------------------------------------

// The exception classes, created at import (module init) and kept alive by
// the module's attributes.
struct Errors {
  PyObject* base = nullptr;                // LoomError(RuntimeError)
  PyObject* invalid_argument = nullptr;    // (LoomError, ValueError)
  PyObject* not_found = nullptr;           // (LoomError, FileNotFoundError)
  PyObject* resource_exhausted = nullptr;  // (LoomError, MemoryError)
};
Errors g_errors;

PyObject* ErrorClassOf(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return g_errors.invalid_argument;
    case StatusCode::kNotFound:
      return g_errors.not_found;
    case StatusCode::kResourceExhausted:
      return g_errors.resource_exhausted;
    default:
      return g_errors.base;
  }
}

// Sets the Python error for `s` (not OK) and throws error_already_set, which
// pybind11 hands back to Python as that exception. Needs the GIL. A
// Cancelled status whose KeyboardInterrupt (or other signal handler error)
// is pending re-raises that error.
[[noreturn]] void Raise(const Status& s) {
  if (s.code() == StatusCode::kCancelled && PyErr_Occurred())
    throw py::error_already_set();
  PyObject* type = ErrorClassOf(s.code());
  // Messages are UTF-8 except where a byte of the input is quoted: replace.
  const std::string& m = s.message();
  py::object message = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
      m.data(), static_cast<Py_ssize_t>(m.size()), "replace"));
  py::object exc = py::reinterpret_steal<py::object>(
      PyObject_CallOneArg(type, message.ptr()));
  if (!exc) throw py::error_already_set();
  exc.attr("code") = py::str(std::string(StatusCodeName(s.code())));
  PyErr_SetObject(type, exc.ptr());
  throw py::error_already_set();
}

template <typename T>
T ValueOrRaise(StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return std::move(v).value();
}

void CheckOrRaise(const Status& s) {
  if (!s.ok()) Raise(s);
}

// Runs `f` (returning Status or StatusOr) without the GIL; a C++ exception
// (none is expected: Loom reports errors as Status) becomes Internal.
template <typename F>
auto WithoutGil(F&& f) -> decltype(f()) {
  py::gil_scoped_release release;
  try {
    return f();
  } catch (const std::exception& e) {
    return InternalError(std::string("unexpected C++ exception: ") + e.what());
  } catch (...) {
    return InternalError("unexpected C++ exception");
  }
}

// The Ctrl-C poll, called without the GIL before every forward. It takes the
// GIL for the check only every kPollInterval (a busy Python thread would
// otherwise make every forward wait up to the interpreter's switch interval
// for the GIL); a pending signal whose handler raised (SIGINT:
// KeyboardInterrupt) stays set as the Python error and stops the call.
constexpr std::chrono::milliseconds kPollInterval{20};

std::function<bool()> InterruptPoll() {
  using Clock = std::chrono::steady_clock;
  return [last = Clock::now() - kPollInterval]() mutable {
    const Clock::time_point now = Clock::now();
    if (now - last < kPollInterval) return false;
    last = now;
    py::gil_scoped_acquire acquire;
    return PyErr_CheckSignals() != 0;
  };
}

// ---- Arrays handed to numpy -------------------------------------------------

// A C-contiguous array over `data`'s buffer, which the array's base (a
// capsule) then owns: no copy.
template <typename T>
py::array HandOver(std::vector<T> data, const py::dtype& dtype,
                   const std::vector<int64_t>& shape) {
  auto* owner = new std::vector<T>(std::move(data));
  if (owner->capacity() == 0) owner->reserve(1);  // a non-null buffer
  py::capsule base(owner,
                   [](void* p) { delete static_cast<std::vector<T>*>(p); });
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  std::vector<py::ssize_t> strides(dims.size());
  py::ssize_t stride = dtype.itemsize();
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= dims[i];
  }
  return py::array(dtype, dims, strides, owner->data(), base);
}

// numpy's dtype for an output dtype: bf16 has none, its raw bits are uint16.
py::dtype NumpyDType(DType d) {
  switch (d) {
    case DType::kF32:
      return py::dtype("float32");
    case DType::kF16:
      return py::dtype("float16");
    case DType::kBF16:
      return py::dtype("uint16");
    default:
      return py::dtype("uint8");
  }
}

py::object JsonToPython(const Json& j) {
  // (Not cached in a static: it would outlive the interpreter.)
  const py::object loads = py::module_::import("json").attr("loads");
  return loads(j.dump(-1, ' ', false, Json::error_handler_t::replace));
}

// ---- Arguments --------------------------------------------------------------

// A str, or a sequence of str, as a list (None: empty).
std::vector<std::string> StringList(const py::object& o) {
  if (o.is_none()) return {};
  if (py::isinstance<py::str>(o)) return {o.cast<std::string>()};
  return o.cast<std::vector<std::string>>();
}

// `device`: "auto" (the CLI's default: this machine's RAM), one device
// ("cpu", "cpu=24GiB", "cuda:0=80GiB", "disk") or a list of them.
std::vector<std::string> DeviceList(const py::object& o) {
  std::vector<std::string> d = StringList(o);
  if (d.size() == 1 && d[0] == "auto") return {};
  return d;
}

// One prompt: a str, or a sequence of token ids.
InputRow ToInputRow(const py::handle& item, int64_t index) {
  InputRow row;
  row.index = index;
  row.id = index;
  if (py::isinstance<py::str>(item)) {
    row.text = item.cast<std::string>();
    return row;
  }
  if (py::isinstance<py::bytes>(item))
    throw py::type_error("prompt " + std::to_string(index) +
                         ": bytes; give a str or a sequence of token ids");
  row.has_tokens = true;
  for (const py::handle t : py::iter(item)) {
    // Integers only (an index: numpy integers too, not floats).
    py::object v = py::reinterpret_steal<py::object>(PyNumber_Index(t.ptr()));
    if (!v) {
      PyErr_Clear();
      row.error = "'tokens' holds " + py::repr(t).cast<std::string>() +
                  ", expected integers";
      row.tokens.clear();
      return row;
    }
    int overflow = 0;
    const long long id = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0 || id < 0 || id > std::numeric_limits<int32_t>::max()) {
      row.error =
          "token id " + py::str(v).cast<std::string>() + " is out of range";
      row.tokens.clear();
      return row;
    }
    row.tokens.push_back(static_cast<int32_t>(id));
  }
  return row;
}

// ---- Model ------------------------------------------------------------------

// Models loaded by this process (the test that calls reuse the weights).
std::atomic<int64_t> g_loads{0};

struct ExtractArgs {
  std::vector<std::string> hooks, layers, selectors;
  std::optional<std::string> dtype;
  std::string template_text;
  std::string add_bos = "auto";
  int64_t batch_tokens = 0, commit_every = 256;
  int64_t streaming_chunk_size = 0, max_row_tokens = 0;
  std::string on_error = "fail";
  bool replace_invalid_utf8 = false;
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

class PyModel {
 public:
  PyModel(std::string path, const py::object& device, std::string precision,
          std::string max_memory, std::string reserve, int threads,
          bool hf_bf16)
      : path_(std::move(path)), threads_(threads), hf_bf16_(hf_bf16) {
    plan_.devices = DeviceList(device);
    plan_.max_memory = std::move(max_memory);
    plan_.reserve = std::move(reserve);
    precision_ = ValueOrRaise(ParsePrecision(precision));
    CheckOrRaise(WithoutGil([&]() -> Status { return Load(); }));
    ++g_loads;
  }

  const std::string& path() const { return path_; }
  std::string compute_dtype() const {
    return std::string(DTypeName(loaded_.model->compute_dtype()));
  }
  py::object config() const { return JsonToPython(ConfigJson()); }
  py::list devices() const {
    py::list l;
    for (const std::string& d : plan_.devices) l.append(d);
    return l;
  }

  std::vector<int32_t> Tokenize(const std::string& text,
                                bool add_special_tokens,
                                bool replace_invalid_utf8) {
    if (!loaded_.tokenizer)
      Raise(
          FailedPreconditionError("no tokenizer: " + loaded_.tokenizer_error));
    tok::EncodeOptions eo;
    eo.add_special_tokens = add_special_tokens;
    eo.invalid_utf8 = replace_invalid_utf8 ? tok::InvalidUtf8Policy::kReplace
                                           : tok::InvalidUtf8Policy::kError;
    StatusOr<tok::Encoding> enc = WithoutGil([&]() -> StatusOr<tok::Encoding> {
      return loaded_.tokenizer->Encode(text, eo);
    });
    return ValueOrRaise(std::move(enc)).ids;
  }

  py::dict Extract(const py::object& prompts, const ExtractArgs& a) {
    // The rows are read from Python objects with the GIL held.
    std::vector<InputRow> rows;
    if (py::isinstance<py::str>(prompts)) {
      rows.push_back(ToInputRow(prompts, 0));
    } else {
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
    o.add_bos = ValueOrRaise(eval::ParseAddBos(a.add_bos));
    if (a.dtype) o.dtype = ValueOrRaise(ParseOutputDType(*a.dtype));
    o.format = OutputFormat::kMemory;
    o.precision = precision_;
    o.threads = threads_;
    o.batch_tokens = a.batch_tokens;
    o.streaming_chunk_size = a.streaming_chunk_size;
    o.max_row_tokens = a.max_row_tokens;
    o.commit_every = a.commit_every;
    o.on_error = ValueOrRaise(ParseOnError(a.on_error));
    o.replace_invalid_utf8 = a.replace_invalid_utf8;
    o.plan = plan_;
    o.hf_bf16_activations = hf_bf16_;
    StatusOr<ExtractOutput> out = WithoutGil([&]() -> StatusOr<ExtractOutput> {
      std::lock_guard<std::mutex> lock(mu_);
      UseThreadsHere();
      return RunInMemory(o, std::move(rows));
    });
    ExtractOutput r = ValueOrRaise(std::move(out));

    py::dict result;
    py::list arrays;
    const py::dtype dtype = NumpyDType(r.dtype);
    for (OutputSet::MemoryArray& m : r.arrays) {
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

  py::object Perplexity(const py::object& text, const py::object& tokens,
                        const std::string& protocol_name, int64_t ctx_arg,
                        int64_t stride, int64_t max_windows,
                        const std::string& add_bos_name, int64_t chunk_rows) {
    if (text.is_none() == tokens.is_none())
      Raise(InvalidArgumentError("give exactly one of text and tokens"));
    const eval::Protocol protocol =
        ValueOrRaise(eval::ParseProtocol(protocol_name));
    const eval::AddBos add_bos = ValueOrRaise(eval::ParseAddBos(add_bos_name));
    if (ctx_arg < 0 || (ctx_arg > 0 && ctx_arg < 2))
      Raise(InvalidArgumentError("ctx: got " + std::to_string(ctx_arg) +
                                 ", expected an integer >= 2 (0: default)"));
    if (stride < 0 || max_windows < 0 || chunk_rows < 1)
      Raise(InvalidArgumentError(
          "stride and max_windows must be >= 0 (0: default), chunk_rows >= 1"));
    std::string text_value;
    std::vector<int32_t> ids;
    if (!text.is_none()) {
      text_value = text.cast<std::string>();
    } else {
      for (const int64_t v : tokens.cast<std::vector<int64_t>>()) {
        if (v < 0 || v > std::numeric_limits<int32_t>::max())
          Raise(InvalidArgumentError("tokens: token id " + std::to_string(v) +
                                     " is out of range"));
        ids.push_back(static_cast<int32_t>(v));
      }
    }
    const bool from_text = !text.is_none();
    StatusOr<Json> out = WithoutGil([&]() -> StatusOr<Json> {
      std::lock_guard<std::mutex> lock(mu_);
      UseThreadsHere();
      const ModelConfig& c = loaded_.model->config();
      // As `loom perplexity`: plan first (refusing what does not fit), the
      // input, the windows, then the evaluation.
      ASSIGN_OR_RETURN(JobSpec job,
                       EvalJob(path_, precision_, ctx_arg, chunk_rows));
      ASSIGN_OR_RETURN(MemoryPlan memory_plan,
                       PlanJobOrRefuse("perplexity", path_, job, plan_));
      ASSIGN_OR_RETURN(JobBackends backends,
                       CreateJobBackends(memory_plan, host_.get()));
      eval::EvalInput input;
      if (from_text) {
        ASSIGN_OR_RETURN(input,
                         eval::TokenizeText(text_value, path_, add_bos, c));
      } else {
        ASSIGN_OR_RETURN(input,
                         eval::TokenIdsInput(std::move(ids), add_bos, c));
      }
      const int64_t ctx =
          ctx_arg > 0 ? ctx_arg
                      : std::min<int64_t>(512, c.max_position_embeddings);
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
      eo.segments = backends.segments;
      eo.cancelled = InterruptPoll();
      ASSIGN_OR_RETURN(
          eval::PerplexityResult r,
          eval::EvaluatePerplexity(*loaded_.model, input.ids, plan, eo));
      // `loom perplexity --json`'s object, "model" being the path given.
      return eval::PerplexityJson(path_, loaded_.model->compute_dtype(),
                                  input.bos,
                                  static_cast<int64_t>(input.ids.size()), r);
    });
    return JsonToPython(ValueOrRaise(std::move(out)));
  }

 private:
  // OpenMP's thread count belongs to the calling thread: a call from another
  // Python thread than the one that loaded the model sets it again, so that
  // its plan (per-thread GEMM and attention workspaces) and its forward see
  // the same count.
  void UseThreadsHere() {
    if (threads_ > 0) host_->SetNumThreads(threads_);
  }

  Status Load() {
    RETURN_IF_ERROR(CheckCpuIsaCap());  // an unknown LOOM_CPU_ISA is refused
    ASSIGN_OR_RETURN(host_, CreateBackend("cpu"));
    if (threads_ > 0) host_->SetNumThreads(threads_);
    // The weights must fit the devices (a one-token job: each call plans its
    // own activations); the plan's GPUs fix the precision rules.
    ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(path_));
    ASSIGN_OR_RETURN(DType compute, PlannedComputeDType(config, precision_));
    JobSpec job;
    job.batch_tokens = 1;
    job.context = 1;
    job.weight_compute_dtype = compute;
    ASSIGN_OR_RETURN(MemoryPlan plan,
                     PlanJobOrRefuse("python", path_, job, plan_));
    ASSIGN_OR_RETURN(JobBackends backends,
                     CreateJobBackends(plan, host_.get()));
    ASSIGN_OR_RETURN(
        loaded_, LoadModelAndTokenizer(path_, precision_,
                                       backends.gpu_capability, "loom.Model"));
    return Status();
  }

  Json ConfigJson() const {
    const ModelConfig& c = loaded_.model->config();
    return Json{{"model_type", c.model_type},
                {"architecture", c.architecture},
                {"num_layers", c.num_layers},
                {"hidden_size", c.hidden_size},
                {"vocab_size", c.vocab_size},
                {"max_position_embeddings", c.max_position_embeddings}};
  }

  // `loom extract`'s pipeline with the rows of a list and the arrays kept in
  // memory: settings, plan (refused if it does not fit), backends, then
  // windows of commit_every rows through one WindowRunner.
  StatusOr<ExtractOutput> RunInMemory(const ExtractOptions& o,
                                      std::vector<InputRow> input) {
    ASSIGN_OR_RETURN(ExtractSettings settings, ResolveExtractSettings(o));
    ASSIGN_OR_RETURN(DType planned_compute,
                     PlannedComputeDType(settings.config, o.precision));
    ASSIGN_OR_RETURN(
        MemoryPlan plan,
        PlanJobOrRefuse("extract", o.model_dir,
                        ExtractJobSpec(o, settings, planned_compute), o.plan));
    ASSIGN_OR_RETURN(JobBackends backends,
                     CreateJobBackends(plan, host_.get()));
    if (settings.streaming()) RETURN_IF_ERROR(CheckStreamingBackends(backends));
    // Every row is prepared first: a bad row fails the call before any
    // forward (on_error="fail"), or is recorded and skipped.
    const RowPreparer preparer = MakeRowPreparer(o, settings, loaded_);
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
    out.dtype = o.dtype.value_or(loaded_.model->compute_dtype());
    out.hooks = settings.hook_names;
    OutputSet outputs(settings, out.dtype, OutputFormat::kMemory, "",
                      host_.get());
    outputs.ReserveMemory(rows);
    ASSIGN_OR_RETURN(
        std::unique_ptr<WindowRunner> runner,
        WindowRunner::Create(settings, o.hf_bf16_activations, *loaded_.model,
                             backends.segments, &outputs));
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
      RETURN_IF_ERROR(outputs.CommitArrays(
          static_cast<int64_t>(window.size()),
          static_cast<int64_t>(begin) / o.commit_every,
          static_cast<int64_t>(begin), &progress, &files));
      for (PreparedRow& p : window) {
        out.row_tokens.push_back(p.size());
        p.ids = {};
        out.rows.push_back(std::move(p));
      }
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
  std::unique_ptr<Backend> host_;
  LoadedModel loaded_;
  // One call at a time per model (its host backend and tokenizer are
  // shared); waited for without the GIL.
  std::mutex mu_;
};

// `loom plan`'s query (and --json) as a function: nothing is loaded.
py::object Plan(const std::string& model_dir, const py::object& device,
                const std::string& max_memory, const std::string& reserve,
                bool offload, const py::object& hooks, const py::object& layers,
                const std::string& select, const std::string& mode,
                int64_t batch_tokens, int64_t ctx, int64_t seqs_per_batch,
                const std::string& dtype, const std::string& capture_to,
                int64_t capture_buffers, bool logits, int64_t logits_chunk,
                const std::string& kv_dtype, int64_t kv_context,
                const std::string& assume_dtype, const std::string& strategy,
                const std::string& layers_per_device,
                const std::string& solve) {
  PlanQuery q;
  q.model_dir = model_dir;
  q.devices.devices = DeviceList(device);
  q.devices.max_memory = max_memory;
  q.devices.reserve = reserve;
  q.devices.offload = offload;
  q.hooks = StringList(hooks);
  if (!layers.is_none()) q.layers = StringList(layers);
  q.select = select;
  q.mode = mode;
  q.batch_tokens = batch_tokens;
  q.ctx = ctx;
  q.seqs_per_batch = seqs_per_batch;
  q.dtype = dtype;
  q.capture_to = capture_to;
  q.capture_buffers = capture_buffers;
  q.logits = logits;
  q.logits_chunk = logits_chunk;
  q.kv_dtype = kv_dtype;
  q.kv_context = kv_context;
  q.assume_dtype = assume_dtype;
  q.strategy = strategy;
  q.layers_per_device = layers_per_device;
  q.solve = solve;
  for (const int64_t v : {batch_tokens, ctx, seqs_per_batch, kv_context})
    if (v < 0)
      Raise(InvalidArgumentError(
          "batch_tokens, ctx, seqs_per_batch and kv_context must be >= 0 (0: "
          "default)"));
  if (capture_buffers < 1 || logits_chunk < 1)
    Raise(
        InvalidArgumentError("capture_buffers and logits_chunk must be >= 1"));
  StatusOr<Json> j = WithoutGil([&]() -> StatusOr<Json> {
    ASSIGN_OR_RETURN(PlanQueryResult r, RunPlanQuery(q));
    Json out = r.ToJson();
    return out;
  });
  return JsonToPython(ValueOrRaise(std::move(j)));
}

PyObject* NewError(py::module_& m, const char* name, PyObject* bases,
                   const char* doc) {
  const std::string qualified = std::string("loom.") + name;
  PyObject* type =
      PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

PyObject* Bases(std::initializer_list<PyObject*> types) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(types.size()));
  Py_ssize_t i = 0;
  for (PyObject* type : types) {
    Py_INCREF(type);
    PyTuple_SET_ITEM(t, i++, type);
  }
  return t;
}

}  // namespace
}  // namespace loom::python

PYBIND11_MODULE(_loom, m) {
  using namespace loom;          // NOLINT: the module's one scope
  using namespace loom::python;  // NOLINT
  m.doc() = "Loom's engine (the C++ part of the `loom` package)";
  {
    PyObject* b = Bases({PyExc_RuntimeError});
    g_errors.base = NewError(m, "LoomError", b,
                             "An error reported by Loom; `code` names its "
                             "status code (\"INVALID_ARGUMENT\", ...).");
    Py_DECREF(b);
    b = Bases({g_errors.base, PyExc_ValueError});
    g_errors.invalid_argument = NewError(
        m, "InvalidArgumentError", b,
        "Bad input: an option, a hook name, a prompt (INVALID_ARGUMENT, "
        "OUT_OF_RANGE).");
    Py_DECREF(b);
    b = Bases({g_errors.base, PyExc_FileNotFoundError});
    g_errors.not_found = NewError(m, "NotFoundError", b,
                                  "A missing file or directory (NOT_FOUND).");
    Py_DECREF(b);
    b = Bases({g_errors.base, PyExc_MemoryError});
    g_errors.resource_exhausted =
        NewError(m, "ResourceExhaustedError", b,
                 "The plan does not fit the devices' memory "
                 "(RESOURCE_EXHAUSTED).");
    Py_DECREF(b);
  }

  py::class_<PyModel>(m, "Model")
      .def(py::init<std::string, const py::object&, std::string, std::string,
                    std::string, int, bool>(),
           py::arg("path"), py::arg("device") = "auto",
           py::arg("precision") = "auto", py::arg("max_memory") = "",
           py::arg("reserve") = "", py::arg("threads") = 0,
           py::arg("hf_bf16") = false)
      .def_property_readonly("path", &PyModel::path)
      .def_property_readonly("compute_dtype", &PyModel::compute_dtype)
      .def_property_readonly("config", &PyModel::config)
      .def_property_readonly("devices", &PyModel::devices)
      .def("tokenize", &PyModel::Tokenize, py::arg("text"),
           py::arg("add_special_tokens") = true,
           py::arg("replace_invalid_utf8") = false)
      .def(
          "_extract",
          [](PyModel& self, const py::object& prompts, const py::object& hooks,
             const py::object& layers, const py::object& select,
             const py::object& dtype, const std::string& template_text,
             const std::string& add_bos, int64_t batch_tokens,
             int64_t commit_every, const std::string& on_error,
             int64_t streaming_chunk_size, int64_t max_row_tokens,
             bool replace_invalid_utf8) {
            ExtractArgs a;
            a.hooks = StringList(hooks);
            a.layers = StringList(layers);
            a.selectors = StringList(select);
            if (!dtype.is_none()) a.dtype = dtype.cast<std::string>();
            a.template_text = template_text;
            a.add_bos = add_bos;
            if (batch_tokens < 0 || streaming_chunk_size < 0 ||
                max_row_tokens < 0)
              Raise(InvalidArgumentError(
                  "batch_tokens, streaming_chunk_size and max_row_tokens must "
                  "be >= 0 (0: default / off)"));
            a.batch_tokens = batch_tokens;
            a.commit_every = commit_every;
            a.on_error = on_error;
            a.streaming_chunk_size = streaming_chunk_size;
            a.max_row_tokens = max_row_tokens;
            a.replace_invalid_utf8 = replace_invalid_utf8;
            return self.Extract(prompts, a);
          },
          py::arg("prompts"), py::arg("hooks"), py::arg("layers"),
          py::arg("select"), py::arg("dtype"), py::arg("template"),
          py::arg("add_bos"), py::arg("batch_tokens"), py::arg("commit_every"),
          py::arg("on_error"), py::arg("streaming_chunk_size"),
          py::arg("max_row_tokens"), py::arg("replace_invalid_utf8"))
      .def("_perplexity", &PyModel::Perplexity, py::arg("text"),
           py::arg("tokens"), py::arg("protocol"), py::arg("ctx"),
           py::arg("stride"), py::arg("max_windows"), py::arg("add_bos"),
           py::arg("chunk_rows"));

  m.def("_plan", &Plan, py::arg("model_dir"), py::arg("device"),
        py::arg("max_memory"), py::arg("reserve"), py::arg("offload"),
        py::arg("hooks"), py::arg("layers"), py::arg("select"), py::arg("mode"),
        py::arg("batch_tokens"), py::arg("ctx"), py::arg("seqs_per_batch"),
        py::arg("dtype"), py::arg("capture_to"), py::arg("capture_buffers"),
        py::arg("logits"), py::arg("logits_chunk"), py::arg("kv_dtype"),
        py::arg("kv_context"), py::arg("assume_dtype"), py::arg("strategy"),
        py::arg("layers_per_device"), py::arg("solve"));
  m.def(
      "_load_count", [] { return g_loads.load(); },
      "Models loaded by this process (each loom.Model loads once).");
}
