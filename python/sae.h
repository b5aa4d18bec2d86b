// loom.Sae, the Python module's SAE class (sae.cc): an SAE or transcoder
// loaded from its published files (src/model/sae.h), run on numpy arrays of
// activations (src/backend/cpu/sae_cpu.h).
#ifndef LOOM_PYTHON_SAE_H_
#define LOOM_PYTHON_SAE_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "src/model/sae.h"

namespace loom::python {

// The SAE a loom.Sae holds (shared, not copied), or null when `obj` is no
// loom.Sae.
std::shared_ptr<const Sae> LoadedSae(const pybind11::handle& obj);

// Adds the class `Sae` to the module.
void AddSaeClass(pybind11::module_& m);

}  // namespace loom::python

#endif  // LOOM_PYTHON_SAE_H_
