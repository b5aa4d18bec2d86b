# LOOM_CUDA=auto|on|off: the CUDA backend (src/backend/cuda). auto builds it
# when nvcc is found (on PATH, CUDACXX, or /usr/local/cuda/bin); on requires
# it. Without it the project builds and tests exactly as before.
#
# Targets: sm_80 (A100) and sm_90 (H100/H200) as real code, plus compute_90
# PTX for newer GPUs. Nothing uses sm_90a-only instructions (wgmma), so no
# 90a target is built.
set(LOOM_CUDA auto CACHE STRING "Build the CUDA backend: auto, on or off")
set_property(CACHE LOOM_CUDA PROPERTY STRINGS auto on off)
set(LOOM_HAVE_CUDA OFF)
if(NOT LOOM_CUDA STREQUAL "off")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(LOOM_NVCC nvcc)
    if(NOT LOOM_NVCC)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake 3.25 knows no C++20 flag for nvcc (13 has one): tell it.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(LOOM_HAVE_CUDA ON)
    # The CUDA backend is a shared plugin (src/backend/cuda/plugin.h) that
    # links the project's static libraries: they are built position
    # independent.
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
    message(STATUS "loom: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(LOOM_CUDA STREQUAL "on")
    message(FATAL_ERROR "LOOM_CUDA=on but no CUDA compiler (nvcc) was found; "
                        "install the CUDA toolkit or set CUDACXX")
  else()
    message(STATUS "loom: CUDA backend off (no nvcc found)")
  endif()
endif()
