// The host CPU's instruction sets, detected once per process, and the level
// Loom's kernel dispatch is allowed to use.
//
// Levels are ordered: a kernel written for level L runs on every CPU at or
// above L. LOOM_CPU_ISA=baseline|avx2|avx512|avx512bf16|amx|native caps the
// level (to exercise the lower paths on a bigger machine). A cap above what
// the CPU has is the CPU's level: nothing runs that the CPU lacks.
#ifndef LOOM_BACKEND_CPU_ISA_H_
#define LOOM_BACKEND_CPU_ISA_H_

#include <string>
#include <string_view>

#include "src/base/status.h"
#include "src/core/dtype.h"

namespace loom::cpu {

enum class CpuIsa : int {
  kBaseline = 0,    // x86-64 (SSE2): the portable kernels
  kAvx2 = 1,        // AVX2 + FMA + F16C (Haswell, Zen 1-3)
  kAvx512 = 2,      // AVX-512 F/BW/DQ/VL (Skylake-SP, Ice Lake, Zen 4)
  kAvx512Bf16 = 3,  // + AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4/5)
  kAmx = 4,         // + AMX-TILE and AMX-BF16, granted by the OS (Sapphire
                    // Rapids and later)
};

// What CPUID and XGETBV say (an instruction set counts only when the OS
// saves its registers; AMX only once the kernel granted this process its
// tile state, arch_prctl ARCH_REQ_XCOMP_PERM).
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_bf16 = false;  // AMX-TILE + AMX-BF16, usable
  bool amx_fp16 = false;  // AMX-FP16 (detected; no kernel uses it yet)
  bool amd = false;       // CPUID vendor AuthenticAMD
};

const CpuFeatures& DetectedCpuFeatures();
// The highest level the CPU supports.
CpuIsa DetectedIsa();
// The level in use: min(DetectedIsa(), the LOOM_CPU_ISA cap).
CpuIsa ActiveIsa();
// The cap LOOM_CPU_ISA asks for (native: none); InvalidArgument naming the
// variable, its value and the accepted ones. An invalid value is ignored by
// ActiveIsa() (no cap); commands check it with this first.
StatusOr<CpuIsa> IsaCapFromEnvironment();

std::string_view IsaName(CpuIsa isa);  // "baseline", "avx2", ...
// "avx2 fma f16c" ...: the detected features, space separated.
std::string FeatureList(const CpuFeatures& f);
// /proc/cpuinfo's "model name" ("unknown" when there is none): printed with
// every measured figure.
std::string CpuModelName();

// Whether a GEMM computing in `dtype` multiplies its weights' type natively
// at the active level (f32; bf16 with AVX512_BF16 or AMX), or widens them to
// f32 as it packs them (bf16 below avx512bf16; f16 everywhere).
bool NativeGemmDType(DType dtype);

// The GEMM path a compute dtype runs at the active level: "amx",
// "avx512bf16", "avx512", "avx2" or "baseline" (the fma family's level).
std::string_view GemmPathName(DType compute);

// The peak multiply-add rate of the GEMM path of `compute` at the active
// level, in FLOP (2 per multiply-add) per cycle of one core: amx 1024 (one
// 16 x 16 x 32 tdpbf16ps per 16 cycles), avx512bf16 128 (two 16-lane
// vdpbf16ps, two products each, per cycle), avx512 64 and avx2 32 (two FMA
// pipes of 16 / 8 lanes), baseline 8 (one 4-lane multiply and one add per
// cycle). Cores with one 512-bit FMA pipe reach half the avx512 figures.
int64_t GemmPeakFlopsPerCycle(DType compute);

// This core's clock in Hz, measured (a chain of dependent one-cycle integer
// adds, timed; the fastest of a few runs of about 10 ms): the frequency it
// runs at now, turbo included, which a VM's nominal figure may not tell.
double MeasureCoreClockHz();

// One line per compute precision: how a GEMM runs in it on this host at the
// active level ("bf16 weights kept, bf16 products accumulated in f32 (AMX
// tiles)").
std::string GemmPathDescription(DType compute);

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_ISA_H_
