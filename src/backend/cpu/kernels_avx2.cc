// The portable per-row kernels compiled for AVX2 + FMA + F16C (this file
// alone gets -mavx2 -mfma -mf16c; called after ActiveIsa() >= kAvx2): the
// compiler vectorises them 8 floats wide and contracts to FMA.
#define LOOM_PORTABLE_NS avx2
#define LOOM_PORTABLE_KERNELS_ONLY
#include "src/backend/cpu/kernels_portable.cc"
