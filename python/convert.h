// The Python module's conversions (python/loom_module.cc): Loom's Status as
// Python exceptions (CLI flags renamed to the Python arguments), results
// handed to numpy without a copy, and every argument taken as a Python
// object and converted here, a wrong type a TypeError naming the argument.
#ifndef LOOM_PYTHON_CONVERT_H_
#define LOOM_PYTHON_CONVERT_H_

#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/eval/extract_rows.h"
#include "src/eval/job_plan.h"
#include "src/eval/params.h"
#include "src/model/interventions.h"

namespace loom::python {

namespace py = pybind11;
using Json = nlohmann::json;

// The exception classes, created at import (module init) and kept alive by
// the module's attributes.
struct Errors {
  PyObject* base = nullptr;                // LoomError(RuntimeError)
  PyObject* invalid_argument = nullptr;    // (LoomError, ValueError)
  PyObject* not_found = nullptr;           // (LoomError, FileNotFoundError)
  PyObject* resource_exhausted = nullptr;  // (LoomError, MemoryError)
};

extern Errors g_errors;

PyObject* ErrorClassOf(StatusCode code);

// The Python arguments that have a flag of the same name in the CLI: Loom's
// messages name the flag ("--ctx", "--max-memory"), the Python API the
// argument ("ctx", "max_memory").
bool IsPythonArgument(std::string_view name);

bool IsFlagChar(char c);

// `message` with every CLI flag that is a Python argument named as that
// argument: "use a smaller --ctx" -> "use a smaller ctx".
std::string WithPythonArgumentNames(const std::string& message);

// Sets the Python error for `s` (not OK) and throws error_already_set, which
// pybind11 hands back to Python as that exception. Needs the GIL. A
// Cancelled status whose KeyboardInterrupt (or other signal handler error)
// is pending re-raises that error. CLI flags in the message are renamed to
// the Python arguments (WithPythonArgumentNames).
[[noreturn]] void Raise(const Status& s);

template <typename T>
T ValueOrRaise(StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return std::move(v).value();
}

void CheckOrRaise(const Status& s);

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

std::function<bool()> InterruptPoll();

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
py::dtype NumpyDType(DType d);

py::object JsonToPython(const Json& j);

// A str from UTF-8 (a byte that is not UTF-8: U+FFFD).
py::str Utf8ToPython(const std::string& s);

std::string TypeNameOf(py::handle o);

[[noreturn]] void WrongType(const std::string& arg, const std::string& expected,
                            py::handle got);

// The index and code point of the first surrogate of a str, which UTF-8
// cannot encode (os.fsdecode and errors="surrogateescape" leave U+DC80..U+DCFF
// for undecodable bytes).
std::string FirstSurrogate(py::handle s);

// The UTF-8 bytes of a str; nullopt (no Python error left set) when it holds
// a lone surrogate. With `keep_surrogates` such a str gives the bytes that
// surrogateescape stands for (else surrogatepass's), for Loom's UTF-8 check
// to report or replace as invalid UTF-8.
std::optional<std::string> Utf8Of(py::handle s, bool keep_surrogates);

[[noreturn]] void RaiseSurrogate(const std::string& arg, py::handle s,
                                 bool can_replace);

// A str argument (UTF-8).
std::string StrArg(const std::string& arg, py::handle o);

// A str (UTF-8; see Utf8Of for `replace`) or bytes (as they are).
std::string TextArg(const std::string& arg, py::handle o, bool replace,
                    bool can_replace);

std::optional<std::string> OptStrArg(const std::string& arg, py::handle o);

// `o` as a Python int (int, numpy integer; not bool, not float), else a
// TypeError naming `arg`.
py::object IndexArg(const std::string& arg, py::handle o);

// An integer (int, numpy integer; not bool, not float).
int64_t IntArg(const std::string& arg, py::handle o);

// An int >= `min`.
int64_t IntArgAtLeast(const std::string& arg, py::handle o, int64_t min,
                      const char* meaning = "");

// An unsigned 64-bit int (a seed).
uint64_t SeedArg(const std::string& arg, py::handle o);

// A bool (Python's or numpy's; 0 and 1 too).
bool BoolArg(const std::string& arg, py::handle o);

// A real number (int, float, numpy scalars; not bool, not str).
double FloatArg(const std::string& arg, py::handle o);

// A str, or an iterable of str, as a list (None: empty).
std::vector<std::string> StrListArg(const std::string& arg, py::handle o);

// `o` (any array of numbers) as rows of `width` f32 values: [rows, width],
// or one row [width]. InvalidArgumentError naming the argument and both
// widths otherwise ("x: rows of 12 values, `taker` 64").
std::vector<float> FloatRows(const std::string& arg, const py::object& o,
                             int64_t width, const std::string& taker,
                             int64_t* rows);

// The fields of a parameter group (src/eval/params.h) from the keyword
// arguments `values` (values[i] for fields[i]; None leaves the field's
// value): the kind's converter above, then the spec's range ("top_p: got 0,
// expected a number in (0, 1]").
void ReadPyParams(std::span<const eval::ParamField> fields,
                  std::span<const py::handle> values);
// The fields of `fields` named in `values` ({"device", device}, ...): each
// read as above; a name not in the group is an internal error.
void ReadPyParams(
    std::span<const eval::ParamField> fields,
    std::initializer_list<std::pair<std::string_view, py::handle>> values);

// Token ids: an iterable of ints (numpy integers too) in [0, 2^31).
std::vector<int32_t> TokenIdsArg(const std::string& arg, py::handle o);

// The placement keywords (eval::PlacementParamFields) into `p`, None leaving
// a field as it is. `device`: "auto" (the CLI's default: this machine's RAM),
// one device ("cpu", "cpu=24GiB", "cuda:0=80GiB", "disk") or a list of them.
void ReadPlacement(JobPlanOptions* p, py::handle device, py::handle max_memory,
                   py::handle reserve, py::handle offload = py::none());

// One prompt: a str, or a sequence of token ids. A str that is not Unicode
// text (a lone surrogate) goes on as the bytes it escapes, for the row's
// UTF-8 check (replace_invalid_utf8, on_error) to decide.
InputRow ToInputRow(const py::handle& item, int64_t index);

// Model.patch's positions: "all", "last", an int or a sequence of ints
// (negative from the end), as `loom patch --positions` takes them.
InterventionPositions PatchPositionsArg(py::handle o);

// One prompt of Model.patch: text (a str or bytes, encoded as extract encodes
// a text row: special tokens added) or token ids, as `loom patch --clean` /
// `--clean-tokens` take it.
struct PatchPrompt {
  std::string name;  // "clean", "corrupted"
  bool from_text = false;
  std::string text;
  std::vector<int32_t> ids;
};

PatchPrompt PatchPromptArg(const std::string& name, py::handle o);

}  // namespace loom::python

#endif  // LOOM_PYTHON_CONVERT_H_
