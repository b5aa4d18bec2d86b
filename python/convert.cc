// The Python module's conversions (convert.h).
#include "python/convert.h"

#include <chrono>
#include <limits>
#include <set>
#include <type_traits>
#include <variant>

#include "src/base/check.h"

namespace loom::python {

// ---- Errors -----------------------------------------------------------------

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

void CheckOrRaise(const Status& s) {
  if (!s.ok()) Raise(s);
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

// numpy's dtype for an output dtype: bf16 has none, its raw bits are uint16.
py::dtype NumpyDType(DType d) {
  switch (d) {
    case DType::kF32:
      return py::dtype("float32");
    case DType::kF16:
      return py::dtype("float16");
    case DType::kBF16:
      return py::dtype("uint16");
    case DType::kI32:
      return py::dtype("int32");
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
                      const char* meaning) {
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

void ReadPyParams(std::span<const eval::ParamField> fields,
                  std::span<const py::handle> values) {
  LOOM_CHECK_EQ(fields.size(), values.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    const eval::ParamField& f = fields[i];
    const py::handle o = values[i];
    if (o.is_none()) continue;
    const std::string name(f.spec->name);
    std::visit(
        [&](auto* field) {
          using T = std::remove_pointer_t<decltype(field)>;
          if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            *field = StrListArg(name, o);
          } else if constexpr (std::is_same_v<T, bool>) {
            *field = BoolArg(name, o);
          } else if constexpr (std::is_same_v<T, std::string>) {
            *field = StrArg(name, o);
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            *field = SeedArg(name, o);
          } else {
            const double v = std::is_integral_v<T>
                                 ? static_cast<double>(IntArg(name, o))
                                 : FloatArg(name, o);
            if (!eval::InParamRange(f, v))
              Raise(InvalidArgumentError(
                  name + ": got " + py::str(o).cast<std::string>() +
                  ", expected " + eval::ParamRangeText(f)));
            *field = static_cast<T>(v);
          }
        },
        f.target);
  }
}

void ReadPyParams(
    std::span<const eval::ParamField> fields,
    std::initializer_list<std::pair<std::string_view, py::handle>> values) {
  for (const auto& [name, value] : values) {
    const eval::ParamField* f = nullptr;
    for (const eval::ParamField& g : fields)
      if (g.spec->name == name) f = &g;
    LOOM_CHECK(f != nullptr) << "no parameter " << name;
    const py::handle one[] = {value};
    ReadPyParams(std::span(f, 1), one);
  }
}

std::vector<float> FloatRows(const std::string& arg, const py::object& o,
                             int64_t width, const std::string& taker,
                             int64_t* rows) {
  using FloatArray =
      py::array_t<float, py::array::c_style | py::array::forcecast>;
  FloatArray a;
  try {
    a = FloatArray::ensure(o);
  } catch (const py::error_already_set&) {
    a = FloatArray();
  }
  if (!a) WrongType(arg, "an array of numbers", o);
  if (a.ndim() != 1 && a.ndim() != 2)
    Raise(InvalidArgumentError(arg + ": has " + std::to_string(a.ndim()) +
                               " dimensions, expected [rows, " +
                               std::to_string(width) + "] or [" +
                               std::to_string(width) + "]"));
  const int64_t cols = a.shape(a.ndim() - 1);
  if (cols != width)
    Raise(InvalidArgumentError(arg + ": rows of " + std::to_string(cols) +
                               " values, " + taker + " " +
                               std::to_string(width)));
  *rows = a.ndim() == 2 ? a.shape(0) : 1;
  return std::vector<float>(a.data(), a.data() + *rows * width);
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

void ReadPlacement(JobPlanOptions* p, py::handle device, py::handle max_memory,
                   py::handle reserve, py::handle offload) {
  ReadPyParams(eval::PlacementParamFields(p), {{"device", device},
                                               {"max_memory", max_memory},
                                               {"reserve", reserve},
                                               {"offload", offload}});
  if (p->devices.size() == 1 && p->devices[0] == "auto") p->devices.clear();
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

}  // namespace loom::python
