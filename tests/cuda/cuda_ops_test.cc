// PLACEHOLDER: tests to be written.
#include "tests/cuda/cuda_test_util.h"
