# Helpers shared by every module's CMakeLists.txt.

# Source root for includes of the form "src/base/status.h".
set(LOOM_ROOT ${CMAKE_SOURCE_DIR})
# Directory of test data bundled in the repo, and the optional shared data beside it.
set(LOOM_TESTDATA_DIR ${CMAKE_SOURCE_DIR}/tests/data)
set(LOOM_MODELS_DIR ${CMAKE_SOURCE_DIR}/models)
get_filename_component(LOOM_SHARED_DIR ${CMAKE_SOURCE_DIR}/../shared ABSOLUTE)

# loom_library(NAME SRCS ... DEPS ...): a static library for one module.
function(loom_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  target_include_directories(${name} PUBLIC ${LOOM_ROOT})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# loom_test(NAME SRCS ... DEPS ... LABELS ...): a GoogleTest binary registered with CTest.
function(loom_test name)
  if(NOT LOOM_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    LOOM_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    LOOM_MODELS_DIR="${LOOM_MODELS_DIR}"
    LOOM_TESTDATA_DIR="${LOOM_TESTDATA_DIR}"
    LOOM_SHARED_DIR="${LOOM_SHARED_DIR}"
    LOOM_BINARY="${CMAKE_BINARY_DIR}/loom")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${name} PROPERTIES LABELS "${ARG_LABELS}" DISCOVERY_TIMEOUT 60)
endfunction()
