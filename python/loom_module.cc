// The Python module `loom._loom` (pybind11): a model loaded once and reused
// by every call; extraction through the pipeline of `loom extract` (settings,
// plan, backends, WindowRunner) into in-memory arrays handed to numpy without
// a copy; perplexity, plan, generate (python/generate.h), activation
// patching (src/eval/patch.h), tokenize and decode as the CLI computes them.
// The pure Python part of the package (python/loom/__init__.py) wraps this.
//
// Errors: every Status becomes a Python exception carrying Loom's message,
// with the CLI's flags renamed to the Python arguments ("--ctx" -> "ctx"),
// and its code name (`code`). Every argument is taken as a Python object and
// converted here: a wrong type is a TypeError naming the argument, never a
// pybind11 signature dump. No C++ exception crosses into Python (pybind11
// translates anything that would). The GIL is released around every load,
// plan and forward; Ctrl-C is polled before every forward (the `cancelled`
// hooks of WindowRunner, EvaluatePerplexity, GenerateOne and RunPatch; the
// GIL is taken for it at most every 20 ms) and re-raised as
// KeyboardInterrupt.
//
// Interventions (`interventions=` of extract, perplexity and generate) arrive
// as the JSON text of an intervention document (docs/interventions.md), built
// by python/loom/_args.py, and are parsed against the model's config as the
// CLI's --intervene file is (LoadInterventions; `vector_file` relative to the
// working directory); their errors name the entry and field.
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
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "python/generate.h"
#include "src/backend/registry.h"
#include "src/base/progress.h"
#include "src/base/status.h"
#include "src/eval/extract.h"
#include "src/eval/extract_outputs.h"
#include "src/eval/extract_rows.h"
#include "src/eval/extract_run.h"
#include "src/eval/extract_settings.h"
#include "src/eval/generate.h"
#include "src/eval/input.h"
#include "src/eval/job_plan.h"
#include "src/eval/patch.h"
#include "src/eval/perplexity.h"
#include "src/eval/plan_query.h"
#include "src/eval/row_selector.h"
#include "src/eval/session.h"
#include "src/eval/windows.h"
#include "src/model/hooks.h"
#include "src/model/interventions.h"
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

// The Python arguments that have a flag of the same name in the CLI: Loom's
// messages name the flag ("--ctx", "--max-memory"), the Python API the
// argument ("ctx", "max_memory").
bool IsPythonArgument(std::string_view name) {
  static const std::set<std::string_view, std::less<>> kArguments = {
      "add_bos",
      "answer",
      "assume_dtype",
      "batch_tokens",
      "capture_buffers",
      "capture_to",
      "chunk_rows",
      "commit_every",
      "ctx",
      "device",
      "dtype",
      "hf_bf16",
      "hooks",
      "kv_context",
      "kv_dtype",
      "layers",
      "layers_per_device",
      "logits",
      "logits_chunk",
      "max_memory",
      "max_row_tokens",
      "max_tokens",
      "max_windows",
      "mode",
      "offload",
      "on_error",
      "positions",
      "precision",
      "prefill_chunk",
      "protocol",
      "replace_invalid_utf8",
      "reserve",
      "seed",
      "select",
      "seqs_per_batch",
      "solve",
      "stop",
      "strategy",
      "streaming_chunk_size",
      "stride",
      "template",
      "temperature",
      "text",
      "threads",
      "tokens",
      "top_k",
      "top_p",
      "wrong"};
  return kArguments.count(name) > 0;
}

bool IsFlagChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
}

// `message` with every CLI flag that is a Python argument named as that
// argument: "use a smaller --ctx" -> "use a smaller ctx".
std::string WithPythonArgumentNames(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  size_t i = 0;
  while (i < message.size()) {
    const bool flag_start =
        message.compare(i, 2, "--") == 0 && i + 2 < message.size() &&
        message[i + 2] >= 'a' && message[i + 2] <= 'z' &&
        (i == 0 || !(IsFlagChar(message[i - 1]) ||
                     (message[i - 1] >= 'A' && message[i - 1] <= 'Z')));
    if (flag_start) {
      size_t j = i + 2;
      while (j < message.size() && IsFlagChar(message[j])) ++j;
      while (j > i + 2 && message[j - 1] == '-') --j;
      std::string name = message.substr(i + 2, j - i - 2);
      for (char& c : name)
        if (c == '-') c = '_';
      if (IsPythonArgument(name)) {
        out += name;
        i = j;
        continue;
      }
    }
    out += message[i++];
  }
  return out;
}

// Sets the Python error for `s` (not OK) and throws error_already_set, which
// pybind11 hands back to Python as that exception. Needs the GIL. A
// Cancelled status whose KeyboardInterrupt (or other signal handler error)
// is pending re-raises that error. CLI flags in the message are renamed to
// the Python arguments (WithPythonArgumentNames).
[[noreturn]] void Raise(const Status& s) {
  if (s.code() == StatusCode::kCancelled && PyErr_Occurred())
    throw py::error_already_set();
  PyObject* type = ErrorClassOf(s.code());
  // Messages are UTF-8 except where a byte of the input is quoted: replace.
  const std::string m = WithPythonArgumentNames(s.message());
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

// A str from UTF-8 (a byte that is not UTF-8: U+FFFD).
py::str Utf8ToPython(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(
      s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

// ---- Arguments --------------------------------------------------------------
//
// Every argument is taken as a Python object and converted here, so that a
// wrong type is a TypeError naming the argument ("ctx: expected an int, got
// str"), never pybind11's "incompatible function arguments" or a
// RuntimeError "Unable to cast".

std::string TypeNameOf(py::handle o) {
  return py::str(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(o.ptr())))
                     .attr("__name__"))
      .cast<std::string>();
}

[[noreturn]] void WrongType(const std::string& arg, const std::string& expected,
                            py::handle got) {
  throw py::type_error(arg + ": expected " + expected + ", got " +
                       TypeNameOf(got));
}

// The index and code point of the first surrogate of a str, which UTF-8
// cannot encode (os.fsdecode and errors="surrogateescape" leave U+DC80..U+DCFF
// for undecodable bytes).
std::string FirstSurrogate(py::handle s) {
  const Py_ssize_t n = PyUnicode_GetLength(s.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Py_UCS4 c = PyUnicode_ReadChar(s.ptr(), i);
    if (c >= 0xD800 && c <= 0xDFFF) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "U+%04X at index %zd",
                    static_cast<unsigned>(c), static_cast<ssize_t>(i));
      return buf;
    }
  }
  return "a surrogate";
}

// The UTF-8 bytes of a str; nullopt (no Python error left set) when it holds
// a lone surrogate. With `keep_surrogates` such a str gives the bytes that
// surrogateescape stands for (else surrogatepass's), for Loom's UTF-8 check
// to report or replace as invalid UTF-8.
std::optional<std::string> Utf8Of(py::handle s, bool keep_surrogates) {
  Py_ssize_t n = 0;
  if (const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n))
    return std::string(p, static_cast<size_t>(n));
  PyErr_Clear();
  if (!keep_surrogates) return std::nullopt;
  for (const char* errors : {"surrogateescape", "surrogatepass"}) {
    PyObject* b = PyUnicode_AsEncodedString(s.ptr(), "utf-8", errors);
    if (b != nullptr) {
      std::string out(PyBytes_AS_STRING(b),
                      static_cast<size_t>(PyBytes_GET_SIZE(b)));
      Py_DECREF(b);
      return out;
    }
    PyErr_Clear();
  }
  return std::nullopt;
}

[[noreturn]] void RaiseSurrogate(const std::string& arg, py::handle s,
                                 bool can_replace) {
  Raise(InvalidArgumentError(
      arg + ": the str holds a lone surrogate (" + FirstSurrogate(s) +
      "), which is not Unicode text and has no UTF-8 encoding" +
      (can_replace ? "; replace_invalid_utf8=True replaces it with U+FFFD "
                     "(an escaped undecodable byte as that byte would be)"
                   : "; pass the bytes instead")));
}

// A str argument (UTF-8).
std::string StrArg(const std::string& arg, py::handle o) {
  if (!PyUnicode_Check(o.ptr())) WrongType(arg, "a str", o);
  std::optional<std::string> s = Utf8Of(o, false);
  if (!s) RaiseSurrogate(arg, o, false);
  return *std::move(s);
}

// A str (UTF-8; see Utf8Of for `replace`) or bytes (as they are).
std::string TextArg(const std::string& arg, py::handle o, bool replace,
                    bool can_replace) {
  if (PyBytes_Check(o.ptr()))
    return std::string(PyBytes_AS_STRING(o.ptr()),
                       static_cast<size_t>(PyBytes_GET_SIZE(o.ptr())));
  if (!PyUnicode_Check(o.ptr())) WrongType(arg, "a str or bytes", o);
  std::optional<std::string> s = Utf8Of(o, replace);
  if (!s) RaiseSurrogate(arg, o, can_replace);
  return *std::move(s);
}

std::optional<std::string> OptStrArg(const std::string& arg, py::handle o) {
  if (o.is_none()) return std::nullopt;
  return StrArg(arg, o);
}

// `o` as a Python int (int, numpy integer; not bool, not float), else a
// TypeError naming `arg`.
py::object IndexArg(const std::string& arg, py::handle o) {
  if (PyBool_Check(o.ptr()) || PyFloat_Check(o.ptr()))
    WrongType(arg, "an int", o);
  py::object v = py::reinterpret_steal<py::object>(PyNumber_Index(o.ptr()));
  if (!v) {
    PyErr_Clear();
    WrongType(arg, "an int", o);
  }
  return v;
}

// An integer (int, numpy integer; not bool, not float).
int64_t IntArg(const std::string& arg, py::handle o) {
  const py::object v = IndexArg(arg, o);
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0)
    Raise(InvalidArgumentError(arg + ": " + py::str(v).cast<std::string>() +
                               " is out of range"));
  return static_cast<int64_t>(x);
}

// An int >= `min`.
int64_t IntArgAtLeast(const std::string& arg, py::handle o, int64_t min,
                      const char* meaning = "") {
  const int64_t v = IntArg(arg, o);
  if (v < min)
    Raise(InvalidArgumentError(arg + ": got " + std::to_string(v) +
                               ", expected an int >= " + std::to_string(min) +
                               meaning));
  return v;
}

// An unsigned 64-bit int (a seed).
uint64_t SeedArg(const std::string& arg, py::handle o) {
  const py::object v = IndexArg(arg, o);
  const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
  if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    Raise(InvalidArgumentError(arg + ": " + py::str(v).cast<std::string>() +
                               " is outside [0, 2^64)"));
  }
  return static_cast<uint64_t>(x);
}

// A bool (Python's or numpy's; 0 and 1 too).
bool BoolArg(const std::string& arg, py::handle o) {
  if (PyBool_Check(o.ptr())) return o.ptr() == Py_True;
  const std::string type = TypeNameOf(o);
  if (type == "bool_" || type == "bool") return PyObject_IsTrue(o.ptr()) == 1;
  if (PyLong_Check(o.ptr())) {
    const int64_t v = IntArg(arg, o);
    if (v == 0 || v == 1) return v == 1;
  }
  WrongType(arg, "a bool", o);
}

// A real number (int, float, numpy scalars; not bool, not str).
double FloatArg(const std::string& arg, py::handle o) {
  if (PyBool_Check(o.ptr()) || PyUnicode_Check(o.ptr()) ||
      PyBytes_Check(o.ptr()))
    WrongType(arg, "a number", o);
  const double d = PyFloat_AsDouble(o.ptr());
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    WrongType(arg, "a number", o);
  }
  return d;
}

// A str, or an iterable of str, as a list (None: empty).
std::vector<std::string> StrListArg(const std::string& arg, py::handle o) {
  if (o.is_none()) return {};
  if (PyUnicode_Check(o.ptr())) return {StrArg(arg, o)};
  if (PyBytes_Check(o.ptr())) WrongType(arg, "a str or a list of str", o);
  py::object it = py::reinterpret_steal<py::object>(PyObject_GetIter(o.ptr()));
  if (!it) {
    PyErr_Clear();
    WrongType(arg, "a str or a list of str", o);
  }
  std::vector<std::string> out;
  for (const py::handle item : py::iter(o))
    out.push_back(StrArg(arg + "[" + std::to_string(out.size()) + "]", item));
  return out;
}

// Token ids: an iterable of ints (numpy integers too) in [0, 2^31).
std::vector<int32_t> TokenIdsArg(const std::string& arg, py::handle o) {
  if (PyUnicode_Check(o.ptr()) || PyBytes_Check(o.ptr()))
    WrongType(arg, "a sequence of token ids (ints)", o);
  py::object it = py::reinterpret_steal<py::object>(PyObject_GetIter(o.ptr()));
  if (!it) {
    PyErr_Clear();
    WrongType(arg, "a sequence of token ids (ints)", o);
  }
  std::vector<int32_t> ids;
  for (const py::handle t : py::iter(o)) {
    const std::string name = arg + "[" + std::to_string(ids.size()) + "]";
    const int64_t v = IntArg(name, t);
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      Raise(InvalidArgumentError(name + ": token id " + std::to_string(v) +
                                 " is out of range"));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// `device`: "auto" (the CLI's default: this machine's RAM), one device
// ("cpu", "cpu=24GiB", "cuda:0=80GiB", "disk") or a list of them.
std::vector<std::string> DeviceList(py::handle o) {
  std::vector<std::string> d = StrListArg("device", o);
  if (d.size() == 1 && d[0] == "auto") return {};
  return d;
}

// One prompt: a str, or a sequence of token ids. A str that is not Unicode
// text (a lone surrogate) goes on as the bytes it escapes, for the row's
// UTF-8 check (replace_invalid_utf8, on_error) to decide.
InputRow ToInputRow(const py::handle& item, int64_t index) {
  InputRow row;
  row.index = index;
  row.id = index;
  const std::string name = "prompts[" + std::to_string(index) + "]";
  if (PyUnicode_Check(item.ptr())) {
    std::optional<std::string> text = Utf8Of(item, true);
    if (!text) RaiseSurrogate(name, item, false);
    row.text = *std::move(text);
    return row;
  }
  if (PyBytes_Check(item.ptr()))
    throw py::type_error(name +
                         ": bytes; give a str or a sequence of token ids");
  py::object iter =
      py::reinterpret_steal<py::object>(PyObject_GetIter(item.ptr()));
  if (!iter) {
    PyErr_Clear();
    WrongType(name, "a str or a sequence of token ids", item);
  }
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

// Model.patch's positions: "all", "last", an int or a sequence of ints
// (negative from the end), as `loom patch --positions` takes them.
InterventionPositions PatchPositionsArg(py::handle o) {
  InterventionPositions p;
  const char* kExpected =
      "\"all\", \"last\", \"A:B\", a slice or a list of ints";
  if (PyUnicode_Check(o.ptr())) {
    // "all", "last", "1,3,-1" or a span "A:B", as `loom patch --positions`.
    StatusOr<InterventionPositions> text =
        ParsePositionsText(StrArg("positions", o));
    if (!text.ok()) Raise(text.status().WithContext("positions"));
    return *std::move(text);
  }
  if (PySlice_Check(o.ptr())) {  // positions[a:b], b exclusive
    const py::slice s = py::reinterpret_borrow<py::slice>(o);
    const py::object start = s.attr("start"), stop = s.attr("stop");
    if (!s.attr("step").is_none())
      Raise(InvalidArgumentError("positions: a slice with a step"));
    p.kind = InterventionPositions::Kind::kSpan;
    p.span_begin = start.is_none() ? 0 : IntArg("positions.start", start);
    p.span_to_end = stop.is_none();
    p.span_end = stop.is_none() ? 0 : IntArg("positions.stop", stop);
    return p;
  }
  p.kind = InterventionPositions::Kind::kList;
  if (PyBytes_Check(o.ptr()) || PyBool_Check(o.ptr()) || PyFloat_Check(o.ptr()))
    WrongType("positions", kExpected, o);
  if (!py::hasattr(o, "__iter__")) {  // one position (an int)
    if (!PyIndex_Check(o.ptr())) WrongType("positions", kExpected, o);
    p.list.push_back(IntArg("positions", o));
    return p;
  }
  for (const py::handle item : py::iter(o))
    p.list.push_back(
        IntArg("positions[" + std::to_string(p.list.size()) + "]", item));
  if (p.list.empty())
    Raise(
        InvalidArgumentError("positions: an empty list (give \"all\", "
                             "\"last\" or at least one position)"));
  return p;
}

// One prompt of Model.patch: text (a str or bytes, encoded as extract encodes
// a text row: special tokens added) or token ids, as `loom patch --clean` /
// `--clean-tokens` take it.
struct PatchPrompt {
  std::string name;  // "clean", "corrupted"
  bool from_text = false;
  std::string text;
  std::vector<int32_t> ids;
};

PatchPrompt PatchPromptArg(const std::string& name, py::handle o) {
  PatchPrompt p;
  p.name = name;
  p.from_text = PyUnicode_Check(o.ptr()) || PyBytes_Check(o.ptr());
  if (p.from_text) {
    p.text = TextArg(name, o, false, false);
  } else {
    if (!py::hasattr(o, "__iter__"))
      WrongType(name, "a str or a sequence of token ids", o);
    p.ids = TokenIdsArg(name, o);
  }
  return p;
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
  // The intervention document (docs/interventions.md) as JSON text, built
  // by python/loom/_args.py from `interventions=[...]`; "" = none.
  std::string interventions;
  bool progress = false;  // a bar on stderr, prompts committed of all
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
  PyModel(const py::object& path, const py::object& device,
          const py::object& precision, const py::object& max_memory,
          const py::object& reserve, const py::object& threads,
          const py::object& hf_bf16) {
    path_ = StrArg("path", path);
    plan_.devices = DeviceList(device);
    plan_.max_memory = OptStrArg("max_memory", max_memory).value_or("");
    plan_.reserve = OptStrArg("reserve", reserve).value_or("");
    threads_ = static_cast<int>(
        IntArgAtLeast("threads", threads, 0, " (0: all cores)"));
    hf_bf16_ = BoolArg("hf_bf16", hf_bf16);
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
    // Vector files are relative to the working directory.
    o.interventions_json = a.interventions;
    o.interventions_dir = ".";
    StatusOr<ExtractOutput> out = WithoutGil([&]() -> StatusOr<ExtractOutput> {
      std::lock_guard<std::mutex> lock(mu_);
      UseThreadsHere();
      return RunInMemory(o, std::move(rows),
                         MakeProgressBar(a.progress, "extract", "prompts"));
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

  // `text`: a str or bytes (a file's bytes, as `--text FILE` reads them);
  // `tokens`: token ids.
  py::object Perplexity(const py::object& text, const py::object& tokens,
                        const py::object& protocol_arg,
                        const py::object& ctx_obj, const py::object& stride_obj,
                        const py::object& max_windows_obj,
                        const py::object& add_bos_arg,
                        const py::object& chunk_rows_obj,
                        const py::object& interventions_obj) {
    if (text.is_none() == tokens.is_none())
      Raise(InvalidArgumentError("give exactly one of text and tokens"));
    const eval::Protocol protocol =
        ValueOrRaise(eval::ParseProtocol(StrArg("protocol", protocol_arg)));
    const eval::AddBos add_bos =
        ValueOrRaise(eval::ParseAddBos(StrArg("add_bos", add_bos_arg)));
    const int64_t ctx_arg = IntArgAtLeast("ctx", ctx_obj, 0, " (0: default)");
    if (ctx_arg == 1)
      Raise(InvalidArgumentError(
          "ctx: got 1, expected an int >= 2 (0: default)"));
    const int64_t stride =
        IntArgAtLeast("stride", stride_obj, 0, " (0: the protocol's default)");
    const int64_t max_windows =
        IntArgAtLeast("max_windows", max_windows_obj, 0, " (0: all)");
    const int64_t chunk_rows = IntArgAtLeast("chunk_rows", chunk_rows_obj, 1);
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
    r.max_new_tokens = IntArgAtLeast("max_tokens", max_tokens, 0);
    r.sampling.temperature =
        static_cast<float>(FloatArg("temperature", temperature));
    r.sampling.top_k = IntArgAtLeast("top_k", top_k, 0, " (0: off)");
    r.sampling.top_p = static_cast<float>(FloatArg("top_p", top_p));
    r.sampling.seed = SeedArg("seed", seed);
    r.stop_strings = StrListArg("stop", stop);
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
          // devices (one device holds the cache).
          RETURN_IF_ERROR(session_->Replan(
              InterventionsFromJson(interventions_json),
              [&](const Session& s) -> StatusOr<JobSpec> {
                ASSIGN_OR_RETURN(const eval::Generator::Options go,
                                 eval::Generator::Resolve(
                                     s.config(), GeneratorOptionsOf(
                                                     s.config(), r, nullptr)));
                return eval::Generator::Job(s.config(), go);
              }));
          if (!session_->interventions().empty())
            r.interventions = &session_->interventions();
          ASSIGN_OR_RETURN(Backend * backend, session_->OneBackend("generate"));
          ASSIGN_OR_RETURN(r.stop_ids, eval::LoadStopIds(session_->model()));
          r.cancelled = InterruptPoll();
          return GenerateOne(session_->model(), tokenizer, backend, r);
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

 private:
  const tok::Tokenizer& TokenizerOrRaise() const {
    if (session_->tokenizer() == nullptr)
      Raise(FailedPreconditionError("no tokenizer: " +
                                    session_->tokenizer_error()));
    return *session_->tokenizer();
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
  std::vector<std::string> placed_devices_;  // computing devices at load
  // One call at a time per model (its host backend and tokenizer are
  // shared); waited for without the GIL.
  std::mutex mu_;
};

// `loom plan`'s query (and --json) as a function: nothing is loaded.
py::object Plan(const py::object& model_dir, const py::object& device,
                const py::object& max_memory, const py::object& reserve,
                const py::object& offload, const py::object& hooks,
                const py::object& layers, const py::object& select,
                const py::object& mode, const py::object& batch_tokens,
                const py::object& ctx, const py::object& seqs_per_batch,
                const py::object& dtype, const py::object& capture_to,
                const py::object& capture_buffers, const py::object& logits,
                const py::object& logits_chunk, const py::object& kv_dtype,
                const py::object& kv_context, const py::object& assume_dtype,
                const py::object& strategy, const py::object& layers_per_device,
                const py::object& solve) {
  PlanQuery q;
  q.model_dir = StrArg("path", model_dir);
  q.devices.devices = DeviceList(device);
  q.devices.max_memory = OptStrArg("max_memory", max_memory).value_or("");
  q.devices.reserve = OptStrArg("reserve", reserve).value_or("");
  q.devices.offload = BoolArg("offload", offload);
  q.hooks = StrListArg("hooks", hooks);
  if (!layers.is_none()) q.layers = StrListArg("layers", layers);
  q.select = StrArg("select", select);
  q.mode = StrArg("mode", mode);
  const char* kDefault = " (0: default)";
  q.batch_tokens = IntArgAtLeast("batch_tokens", batch_tokens, 0, kDefault);
  q.ctx = IntArgAtLeast("ctx", ctx, 0, kDefault);
  q.seqs_per_batch =
      IntArgAtLeast("seqs_per_batch", seqs_per_batch, 0, kDefault);
  q.dtype = StrArg("dtype", dtype);
  q.capture_to = StrArg("capture_to", capture_to);
  q.capture_buffers = IntArgAtLeast("capture_buffers", capture_buffers, 1);
  q.logits = BoolArg("logits", logits);
  q.logits_chunk = IntArgAtLeast("logits_chunk", logits_chunk, 1);
  q.kv_dtype = OptStrArg("kv_dtype", kv_dtype).value_or("");
  q.kv_context = IntArgAtLeast("kv_context", kv_context, 0, kDefault);
  q.assume_dtype = OptStrArg("assume_dtype", assume_dtype).value_or("");
  q.strategy = StrArg("strategy", strategy);
  q.layers_per_device =
      OptStrArg("layers_per_device", layers_per_device).value_or("");
  q.solve = OptStrArg("solve", solve).value_or("");
  StatusOr<Json> j = WithoutGil([&]() -> StatusOr<Json> {
    ASSIGN_OR_RETURN(PlanQueryResult r, RunPlanQuery(q));
    Json out = r.ToJson();
    return out;
  });
  return JsonToPython(ValueOrRaise(std::move(j)));
}

// The hooks a pattern names ("blocks.{0.5}.hook_resid_post",
// "blocks.-1.attn.hook_q", "logits") in a model of `num_layers` layers
// (ParseHookPattern; existence in the architecture is not checked). The
// lookups of ExtractResult and Activations resolve user spellings with it.
py::list HookPatternNames(const py::object& pattern,
                          const py::object& num_layers) {
  const std::string p = StrArg("pattern", pattern);
  const int64_t n = IntArgAtLeast("num_layers", num_layers, 1);
  py::list l;
  for (const HookPoint& h : ValueOrRaise(ParseHookPattern(p, n)))
    l.append(HookName(h));
  return l;
}

// A selector's spec as written and its file-name part ("pos:0,-1" ->
// "pos_0_-1").
py::tuple SelectorNames(const py::object& spec) {
  const RowSelector s = ValueOrRaise(ParseRowSelector(StrArg("select", spec)));
  return py::make_tuple(s.spec, s.file_name);
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
             Obj progress) {
            ExtractArgs a;
            a.hooks = StrListArg("hooks", hooks);
            a.layers = StrListArg("layers", layers);
            a.selectors = StrListArg("select", select);
            a.dtype = OptStrArg("dtype", dtype);
            a.template_text = OptStrArg("template", template_text).value_or("");
            a.add_bos = StrArg("add_bos", add_bos);
            const char* kOff = " (0: default / off)";
            a.batch_tokens =
                IntArgAtLeast("batch_tokens", batch_tokens, 0, kOff);
            a.commit_every = IntArgAtLeast("commit_every", commit_every, 1);
            a.on_error = StrArg("on_error", on_error);
            a.streaming_chunk_size = IntArgAtLeast(
                "streaming_chunk_size", streaming_chunk_size, 0, kOff);
            a.max_row_tokens =
                IntArgAtLeast("max_row_tokens", max_row_tokens, 0, kOff);
            a.replace_invalid_utf8 =
                BoolArg("replace_invalid_utf8", replace_invalid_utf8);
            a.interventions =
                OptStrArg("interventions", interventions).value_or("");
            a.progress = BoolArg("progress", progress);
            return self.Extract(prompts, a);
          },
          py::arg("prompts"), py::arg("hooks"), py::arg("layers"),
          py::arg("select"), py::arg("dtype"), py::arg("template"),
          py::arg("add_bos"), py::arg("batch_tokens"), py::arg("commit_every"),
          py::arg("on_error"), py::arg("streaming_chunk_size"),
          py::arg("max_row_tokens"), py::arg("replace_invalid_utf8"),
          py::arg("interventions"), py::arg("progress"))
      .def("_perplexity", &PyModel::Perplexity, py::arg("text"),
           py::arg("tokens"), py::arg("protocol"), py::arg("ctx"),
           py::arg("stride"), py::arg("max_windows"), py::arg("add_bos"),
           py::arg("chunk_rows"), py::arg("interventions"))
      .def("_generate", &PyModel::Generate, py::arg("prompt"),
           py::arg("max_tokens"), py::arg("temperature"), py::arg("top_k"),
           py::arg("top_p"), py::arg("seed"), py::arg("stop"), py::arg("ctx"),
           py::arg("prefill_chunk"), py::arg("hooks"), py::arg("layers"),
           py::arg("select"), py::arg("interventions"))
      .def("_patch", &PyModel::Patch, py::arg("clean"), py::arg("corrupted"),
           py::arg("hooks"), py::arg("positions"), py::arg("answer"),
           py::arg("wrong"), py::arg("batch_tokens"), py::arg("per_head"),
           py::arg("progress"));

  m.def("_plan", &Plan, py::arg("model_dir"), py::arg("device"),
        py::arg("max_memory"), py::arg("reserve"), py::arg("offload"),
        py::arg("hooks"), py::arg("layers"), py::arg("select"), py::arg("mode"),
        py::arg("batch_tokens"), py::arg("ctx"), py::arg("seqs_per_batch"),
        py::arg("dtype"), py::arg("capture_to"), py::arg("capture_buffers"),
        py::arg("logits"), py::arg("logits_chunk"), py::arg("kv_dtype"),
        py::arg("kv_context"), py::arg("assume_dtype"), py::arg("strategy"),
        py::arg("layers_per_device"), py::arg("solve"));
  m.def("_hook_pattern_names", &HookPatternNames, py::arg("pattern"),
        py::arg("num_layers"));
  m.def("_selector_names", &SelectorNames, py::arg("spec"));
  m.def(
      "_load_count", [] { return g_loads.load(); },
      "Models loaded by this process (each loom.Model loads once).");
}
