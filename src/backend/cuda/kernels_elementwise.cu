// Elementwise kernels of the CUDA backend (see kernels.h). Each reproduces
// the CPU backend's scalar arithmetic (src/backend/cpu/kernels_portable.cc,
// kernels.cc, kernels_moe.cc): the same formula evaluated in the same order,
// with the same f32 intermediates. Products that the CPU rounds before an
// addition are written with __fmul_rn / __fadd_rn so that nvcc cannot fuse
// them into an FMA; transcendentals use CUDA's precise expf / tanhf / erfcf
// (this file is never built with fast math).
#include <cuda_fp16.h>

#include <cstdint>

#include "src/backend/cuda/device_util.cuh"
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {


// ---- Activations (the CPU's portable formulas) ----------------------------

__device__ __forceinline__ float ActOf(Act fn, float x) {
  switch (fn) {
    case Act::kSilu:
      // x / (1 + exp(-x))
      return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
    case Act::kGeluTanh: {
      // u = sqrt(2/pi) (x + 0.044715 x^3); gelu = x / (1 + exp(-2u)), the
      // cube as ((0.044715 x) x) x, each product rounded.
      const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
      const float u = __fmul_rn(0.7978845608028654f, __fadd_rn(x, cube));
      return __fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(-2.0f, u))));
    }
    case Act::kGeluExact:
      // 0.5 x erfc(-x / sqrt 2)
      return __fmul_rn(__fmul_rn(0.5f, x),
                       erfcf(__fmul_rn(-x, 0.70710678118654752f)));
    case Act::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Act::kReluSquared: {
      const float r = x > 0.0f ? x : 0.0f;
      return __fmul_rn(r, r);
    }
  }
  return x;
}

__device__ __forceinline__ float SigmoidOf(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// ---- Kernels --------------------------------------------------------------

// y [n] += x [n]
__global__ void AddKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __fadd_rn(y[i], x[i]);
}

// x [n] *= s
__global__ void ScaleKernel(float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __fmul_rn(x[i], s);
}

// x [n] = cap * tanh(x * (1 / cap))
__global__ void SoftcapKernel(float* x, int64_t n, float cap) {
  const float inv = __fdiv_rn(1.0f, cap);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __fmul_rn(cap, tanhf(__fmul_rn(x[i], inv)));
}

// x [n] = 0
__global__ void SetZeroKernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = 0.0f;
}

// x [rows, cols] (row stride ld): std::clamp(x, lo, hi) (NaN passes).
__global__ void ClampKernel(float* x, int64_t rows, int64_t cols, int64_t ld,
                            float lo, float hi) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float* p = x + (i / cols) * ld + i % cols;
    const float v = *p;
    *p = v < lo ? lo : (hi < v ? hi : v);
  }
}

// x [rows, cols] (row stride ld) = bf16(x)
__global__ void RoundToBf16Kernel(float* x, int64_t rows, int64_t cols,
                                  int64_t ld) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float* p = x + (i / cols) * ld + i % cols;
    *p = RoundBf16(*p);
  }
}

// x [n] = fn(x)
__global__ void ActivationKernel(Act fn, float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = ActOf(fn, x[i]);
}

// out [rows, n] dense = fn(gate) * up; gate/up [rows, n] row strides
// gate_rs / up_rs.
__global__ void GatedKernel(Act fn, const float* gate, int64_t gate_rs,
                            const float* up, int64_t up_rs, float* out,
                            int64_t rows, int64_t n) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    out[i] = __fmul_rn(ActOf(fn, gate[r * gate_rs + c]), up[r * up_rs + c]);
  }
}

// gate_up [rows, 2n] interleaved (row stride gu_rs), out [rows, n] dense:
// g = min(gate, limit), u = clamp(up, -limit, limit),
// out = (u + 1) * (g * sigmoid(g * alpha)).
__global__ void ClampedSwigluKernel(const float* gate_up, int64_t gu_rs,
                                    float* out, int64_t rows, int64_t n,
                                    float alpha, float limit) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    const float* gu = gate_up + r * gu_rs + 2 * c;
    const float gate = gu[0], up = gu[1];
    const float g = limit < gate ? limit : gate;  // std::min(gate, limit)
    const float u = up < -limit ? -limit : (limit < up ? limit : up);
    const float glu = __fmul_rn(g, SigmoidOf(__fmul_rn(g, alpha)));
    out[i] = __fmul_rn(__fadd_rn(u, 1.0f), glu);
  }
}

// y[r, :] (row stride ldy) += sigmoid(gate_logit[r]) * x[r, :] (x [rows,
// cols] dense).
__global__ void SigmoidGateAddKernel(const float* x, const float* gate_logit,
                                     int64_t rows, int64_t cols, float* y,
                                     int64_t ldy) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float s = SigmoidOf(gate_logit[r]);
    float* p = y + r * ldy + c;
    *p = __fadd_rn(*p, __fmul_rn(s, x[i]));
  }
}

// dst [rows, cols] (row stride ldd, in dtype) = src [rows, cols] f32 (row
// stride lds), rounded to nearest even. Plain conversions are one row.
__global__ void FromF32Kernel(const float* src, int64_t lds, void* dst,
                              int64_t ldd, DType dtype, int64_t rows,
                              int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float v = src[r * lds + c];
    const int64_t o = r * ldd + c;
    if (dtype == DType::kBF16)
      static_cast<uint16_t*>(dst)[o] = F32ToBf16(v);
    else if (dtype == DType::kF16)
      static_cast<uint16_t*>(dst)[o] = F32ToF16(v);
    else
      static_cast<float*>(dst)[o] = v;
  }
}

// dst [n] f32 = src [n] in dtype (exact widening).
__global__ void ToF32Kernel(const void* src, DType dtype, float* dst,
                            int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (dtype == DType::kBF16)
      dst[i] = Bf16ToF32(static_cast<const uint16_t*>(src)[i]);
    else if (dtype == DType::kF16)
      dst[i] = F16ToF32(static_cast<const uint16_t*>(src)[i]);
    else
      dst[i] = static_cast<const float*>(src)[i];
  }
}

}  // namespace

void Add(const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  AddKernel<<<GridFor(n), kThreads, 0, s>>>(x, y, n);
}

void Scale(float* x, int64_t n, float scale, cudaStream_t s) {
  if (n <= 0) return;
  ScaleKernel<<<GridFor(n), kThreads, 0, s>>>(x, n, scale);
}

void Softcap(float* x, int64_t n, float cap, cudaStream_t s) {
  if (n <= 0) return;
  SoftcapKernel<<<GridFor(n), kThreads, 0, s>>>(x, n, cap);
}

void SetZero(float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  SetZeroKernel<<<GridFor(n), kThreads, 0, s>>>(x, n);
}

void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo, float hi,
           cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  ClampKernel<<<GridFor(rows * cols), kThreads, 0, s>>>(x, rows, cols, ld, lo,
                                                        hi);
}

void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld,
                 cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  RoundToBf16Kernel<<<GridFor(rows * cols), kThreads, 0, s>>>(x, rows, cols,
                                                              ld);
}

void Activation(Act fn, float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  ActivationKernel<<<GridFor(n), kThreads, 0, s>>>(fn, x, n);
}

void GatedActivation(Act fn, const float* gate, int64_t gate_rs,
                     const float* up, int64_t up_rs, float* out, int64_t rows,
                     int64_t n, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  GatedKernel<<<GridFor(rows * n), kThreads, 0, s>>>(fn, gate, gate_rs, up,
                                                     up_rs, out, rows, n);
}

void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                   int64_t rows, int64_t n, float alpha, float limit,
                   cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  ClampedSwigluKernel<<<GridFor(rows * n), kThreads, 0, s>>>(
      gate_up, gu_rs, out, rows, n, alpha, limit);
}

void SigmoidGateAddRows(const float* x, const float* gate_logit, int64_t rows,
                        int64_t cols, float* y, int64_t ldy, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  SigmoidGateAddKernel<<<GridFor(rows * cols), kThreads, 0, s>>>(
      x, gate_logit, rows, cols, y, ldy);
}

void ConvertFromF32(const float* src, void* dst, DType dtype, int64_t n,
                    cudaStream_t s) {
  if (n <= 0) return;
  FromF32Kernel<<<GridFor(n), kThreads, 0, s>>>(src, n, dst, n, dtype, 1, n);
}

void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n,
                  cudaStream_t s) {
  if (n <= 0) return;
  ToF32Kernel<<<GridFor(n), kThreads, 0, s>>>(src, dtype, dst, n);
}

void ConvertRows(const float* x, int64_t ldx, void* y, int64_t ldy, DType dtype,
                 int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  FromF32Kernel<<<GridFor(rows * cols), kThreads, 0, s>>>(x, ldx, y, ldy, dtype,
                                                          rows, cols);
}

}  // namespace loom::cuda
