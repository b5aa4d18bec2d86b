// loom.Sae, the Python module's SAE class (sae.cc): an SAE or transcoder
// loaded from its published files (src/model/sae.h), run on numpy arrays of
// activations (src/backend/cpu/sae_cpu.h).
#ifndef LOOM_PYTHON_SAE_H_
#define LOOM_PYTHON_SAE_H_

#include <pybind11/pybind11.h>

namespace loom::python {

// Adds the class `Sae` to the module.
void AddSaeClass(pybind11::module_& m);

}  // namespace loom::python

#endif  // LOOM_PYTHON_SAE_H_
