// loom.Model, the Python module's model class (model.cc): a model loaded
// once and reused by every call.
#ifndef LOOM_PYTHON_MODEL_H_
#define LOOM_PYTHON_MODEL_H_

#include <pybind11/pybind11.h>

namespace loom::python {

// Adds the class `Model` (and `_load_count`, the models this process has
// loaded) to the module.
void AddModelClass(pybind11::module_& m);

}  // namespace loom::python

#endif  // LOOM_PYTHON_MODEL_H_
