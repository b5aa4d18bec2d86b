// The Python module `loom._loom` (pybind11): a model loaded once and reused
// by every call; extraction through the pipeline of `loom extract` (settings,
// plan, backends, WindowRunner) into in-memory arrays handed to numpy without
// a copy; perplexity, plan, generate (python/generate.h), activation
// patching (src/eval/patch.h), tokenize and decode as the CLI computes them.
// The pure Python part of the package (python/loom/__init__.py) wraps this.
// This file registers the module; its parts: python/convert.h (errors,
// arrays handed to numpy, argument conversion), python/model.h (loom.Model)
// and python/generate.h (Model.generate).
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
// working directory); their errors name the entry and field.#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <initializer_list>
#include <string>

#include "python/convert.h"
#include "python/model.h"
#include "python/sae.h"
#include "src/eval/plan_query.h"
#include "src/eval/row_selector.h"
#include "src/model/hooks.h"

namespace loom::python {
namespace {

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
  ReadPlacement(&q.devices, device, max_memory, reserve, offload);
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

  AddModelClass(m);
  AddSaeClass(m);
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
}
