# The Python module `loom` (python/): LOOM_PYTHON=AUTO builds it when the
# Python 3 development files and pybind11 (Debian: python3-dev,
# pybind11-dev) are found; ON requires them; OFF skips it. Never with
# LOOM_SANITIZE: an extension built with ASan cannot be loaded into an
# interpreter that is not. When it is built, every loom_library is compiled
# position-independent (the module links them into a shared object; the
# executables linking them are unaffected in speed: the linker resolves
# their calls and data directly).
set(LOOM_PYTHON AUTO CACHE STRING
    "Build the Python module loom: AUTO (when Python 3 development files and pybind11 are found), ON or OFF")
set_property(CACHE LOOM_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(LOOM_PYTHON_ENABLED OFF)
if(LOOM_PYTHON STREQUAL "OFF")
  message(STATUS "loom Python module: off (LOOM_PYTHON=OFF)")
elseif(LOOM_SANITIZE)
  if(LOOM_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "LOOM_PYTHON=ON with LOOM_SANITIZE: a sanitized "
                        "extension cannot load into an unsanitized interpreter")
  endif()
  message(STATUS "loom Python module: off (LOOM_SANITIZE)")
else()
  # The system interpreter, whose packages (numpy, pytest) the module and its
  # tests use, unless one is named with -DPython3_EXECUTABLE=...
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  if(Python3_FOUND)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(LOOM_PYTHON_ENABLED ON)
    message(STATUS "loom Python module: on (Python ${Python3_VERSION}, "
                   "pybind11 ${pybind11_VERSION})")
  elseif(LOOM_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "LOOM_PYTHON=ON: Python 3 development files or "
                        "pybind11 not found (Debian: python3-dev pybind11-dev)")
  else()
    message(STATUS "loom Python module: off (Python 3 development files or "
                   "pybind11 not found)")
  endif()
endif()
