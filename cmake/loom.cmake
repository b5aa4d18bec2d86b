# Helpers shared by every module's CMakeLists.txt.

# Source root for includes of the form "src/base/status.h".
set(LOOM_ROOT ${CMAKE_SOURCE_DIR})
# Directory of test data bundled in the repo, and the optional shared data beside it.
set(LOOM_TESTDATA_DIR ${CMAKE_SOURCE_DIR}/tests/data)
set(LOOM_MODELS_DIR ${CMAKE_SOURCE_DIR}/models)
get_filename_component(LOOM_SHARED_DIR ${CMAKE_SOURCE_DIR}/../shared ABSOLUTE)

# loom_library(NAME SRCS ... DEPS ... PRIVATE_DEPS ...): a static library for
# one module. DEPS are PUBLIC: only what the library's own headers include
# (a consumer of those headers needs them too). Everything its .cc files alone
# use goes in PRIVATE_DEPS. Which module may use which is the table in
# docs/design/architecture.md (Layering), checked by tests/layering_test.cc.
# The include root is the repository root ("src/base/status.h"): every
# consumer of a library's headers needs it, so it is PUBLIC; being one root,
# it cannot tell layers apart, which is why the layering test exists.
function(loom_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  # Linked into the Python module's shared object too (cmake/python.cmake).
  if(LOOM_PYTHON_ENABLED)
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
  target_include_directories(${name} PUBLIC ${LOOM_ROOT})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  set(uses_omp OFF)
  if("OpenMP::OpenMP_CXX" IN_LIST ARG_DEPS OR
     "OpenMP::OpenMP_CXX" IN_LIST ARG_PRIVATE_DEPS)
    set(uses_omp ON)
  endif()
  set(has_cuda OFF)
  foreach(src IN LISTS ARG_SRCS)
    if(src MATCHES "\\.cu$")
      set(has_cuda ON)
    endif()
  endforeach()
  if(NOT has_cuda)
    loom_library_pch(${name} ${uses_omp})
  endif()
endfunction()

# With GCC, the libraries share a precompiled header of JSON and the standard
# library (its parsing is a second or two of every file), made by the first
# loom_library call that needs it, once the project-wide settings are final.
# GCC refuses a header made without _OPENMP in a compile that defines it, so
# the libraries that use OpenMP share a second one. A source compiled for
# another ISA sets SKIP_PRECOMPILE_HEADERS (GCC would refuse it too). Clang
# would fail the compile where flags differ, so its builds do without.
function(loom_library_pch name uses_omp)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  set(donor loom_library_pch)
  if(uses_omp)
    set(donor loom_library_pch_omp)
  endif()
  if(NOT TARGET ${donor})
    add_library(${donor} STATIC ${CMAKE_SOURCE_DIR}/cmake/pch_donor.cc)
    if(LOOM_PYTHON_ENABLED)
      set_target_properties(${donor} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    endif()
    target_link_libraries(${donor} PRIVATE nlohmann_json::nlohmann_json)
    if(uses_omp)
      target_link_libraries(${donor} PRIVATE OpenMP::OpenMP_CXX)
    endif()
    target_precompile_headers(${donor} PRIVATE
      <nlohmann/json.hpp> <algorithm> <cstdint> <cstring> <functional>
      <map> <memory> <optional> <string> <unordered_map> <vector>)
  endif()
  target_precompile_headers(${name} REUSE_FROM ${donor})
endfunction()

# The compile settings every test binary shares (loom_test, and the donor of
# the tests' precompiled header, whose flags must be the same).
function(loom_test_settings name)
  target_link_libraries(${name} PRIVATE GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    LOOM_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    LOOM_MODELS_DIR="${LOOM_MODELS_DIR}"
    LOOM_TESTDATA_DIR="${LOOM_TESTDATA_DIR}"
    LOOM_SHARED_DIR="${LOOM_SHARED_DIR}"
    LOOM_BINARY="${CMAKE_BINARY_DIR}/loom")
  # Test code is assertions and fixtures: -O1 builds it in about 2/3 of
  # -O3's time (the code under test is in the libraries, built as configured).
  target_compile_options(${name} PRIVATE $<$<CONFIG:Release>:-O1>)
endfunction()

# With GCC, test binaries share one precompiled header of GoogleTest, JSON and
# the standard library (about 4 s of parsing per file otherwise), made by the
# first loom_test call (after the project-wide settings such as position
# independence are final). GCC checks a precompiled header against each
# compile and, where a test's own flags differ (a library's definitions),
# parses the headers as usual instead; clang would refuse the compile, so its
# builds (the sanitizer build) do without.
function(loom_test_pch name)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  if(NOT TARGET loom_test_pch)
    add_executable(loom_test_pch ${CMAKE_SOURCE_DIR}/cmake/pch_donor.cc)
    loom_test_settings(loom_test_pch)
    target_link_libraries(loom_test_pch PRIVATE nlohmann_json::nlohmann_json)
    target_precompile_headers(loom_test_pch PRIVATE
      <gtest/gtest.h> <nlohmann/json.hpp> <algorithm> <cstdint> <cstdio>
      <filesystem> <fstream> <map> <memory> <string> <vector>)
    loom_test_pch(loom_test_pch)
  endif()
  if(NOT name STREQUAL "loom_test_pch")
    target_precompile_headers(${name} REUSE_FROM loom_test_pch)
  endif()
  # Says so in the build log where a test's flags make GCC parse instead.
  target_compile_options(${name} PRIVATE -Winvalid-pch)
endfunction()

# The environment of every test: OpenMP threads sleep when idle, as in `loom`
# and the Python package (docs/design/cpu-backend.md, "Threads on a shared
# machine"); the GoogleTest binaries would otherwise spin, and CTest runs
# `-j nproc` of them side by side.
set(LOOM_TEST_ENV "OMP_WAIT_POLICY=passive")

# loom_test_environment(): LOOM_TEST_ENV on every test add_test made in the
# calling directory so far (call it at the end of a CMakeLists.txt).
function(loom_test_environment)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${LOOM_TEST_ENV})
  endforeach()
endfunction()

# loom_test(NAME SRCS ... DEPS ... LABELS ...): a GoogleTest binary registered with CTest.
function(loom_test name)
  if(NOT LOOM_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  loom_test_settings(${name})
  loom_test_pch(${name})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  # Test names are the suite, test and parameter names only: a parameterised
  # suite gives every INSTANTIATE_TEST_SUITE_P a name generator, and CTest
  # does not append the printed GetParam() (raw bytes for a struct, padding
  # included, so names would change between builds).
  gtest_discover_tests(${name} NO_PRETTY_VALUES
    PROPERTIES LABELS "${ARG_LABELS}" ENVIRONMENT "${LOOM_TEST_ENV}"
    DISCOVERY_TIMEOUT 60)
endfunction()

# loom_isa_test(NAME COMMAND ... [SHARDS n] [SANITIZED_ARGS ...]): NAME again
# under every ISA cap below the CPU's own level (scripts/isa_cap.sh sets
# LOOM_CPU_ISA and skips, exit 77, the caps that would be the native run),
# labelled `isa`. With SHARDS, each cap runs as n gtest shards (CTest runs
# them in parallel). SANITIZED_ARGS are appended in a LOOM_SANITIZE build;
# NOT_SANITIZED leaves the capped runs out of it (the plain build runs them).
function(loom_isa_test name)
  if(NOT LOOM_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "NOT_SANITIZED" "SHARDS;TIMEOUT"
    "COMMAND;SANITIZED_ARGS" ${ARGN})
  if(LOOM_SANITIZE AND ARG_NOT_SANITIZED)
    return()
  endif()
  if(LOOM_SANITIZE)
    list(APPEND ARG_COMMAND ${ARG_SANITIZED_ARGS})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 1500)
  endif()
  # Every level below the CPU's own (isa_cap.sh skips the others). Under the
  # sanitizers the two lowest, whose per-row kernels are written apart
  # (kernels_portable.cc, kernels_avx2.cc); avx512's run uncapped on an
  # AVX-512 machine, the GEMM is one source per level (gemm_kernels.inc), and
  # the plain build runs every level.
  set(levels baseline avx2 avx512 avx512bf16)
  if(LOOM_SANITIZE)
    set(levels baseline avx2)
  endif()
  foreach(level ${levels})
    if(ARG_SHARDS)
      math(EXPR last "${ARG_SHARDS} - 1")
      foreach(shard RANGE ${last})
        add_test(NAME ${name}_isa_${level}_${shard}
          COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/isa_cap.sh ${level} ${ARG_COMMAND})
        set_tests_properties(${name}_isa_${level}_${shard} PROPERTIES
          ENVIRONMENT "GTEST_TOTAL_SHARDS=${ARG_SHARDS};GTEST_SHARD_INDEX=${shard};${LOOM_TEST_ENV}"
          SKIP_RETURN_CODE 77 LABELS isa TIMEOUT ${ARG_TIMEOUT})
      endforeach()
    else()
      add_test(NAME ${name}_isa_${level}
        COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/isa_cap.sh ${level} ${ARG_COMMAND})
      set_tests_properties(${name}_isa_${level} PROPERTIES
        ENVIRONMENT "${LOOM_TEST_ENV}"
        SKIP_RETURN_CODE 77 LABELS isa TIMEOUT ${ARG_TIMEOUT})
    endif()
  endforeach()
endfunction()
