// PLACEHOLDER: bodies to be written (see kernels.h).
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

void DecodeRows(const QuantMatrix& m, int64_t row0, int64_t rows, void* out, DType dtype, cudaStream_t s) {}

}  // namespace loom::cuda
