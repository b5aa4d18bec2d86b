#include "src/backend/cpu/isa.h"

#include <cpuid.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

namespace loom::cpu {
namespace {

uint64_t Xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  const bool osxsave = (c & (1u << 27)) != 0;
  if (!osxsave) return f;
  const uint64_t xcr0 = Xgetbv0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;                 // SSE + AVX state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  const bool avx = os_avx && (c & (1u << 28)) != 0;
  f.fma = avx && (c & (1u << 12)) != 0;
  f.f16c = avx && (c & (1u << 29)) != 0;
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  if (__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) == 0) return f;
  f.avx2 = avx && (b7 & (1u << 5)) != 0;
  f.avx512f = os_avx512 && (b7 & (1u << 16)) != 0;
  f.avx512dq = f.avx512f && (b7 & (1u << 17)) != 0;
  f.avx512bw = f.avx512f && (b7 & (1u << 30)) != 0;
  f.avx512vl = f.avx512f && (b7 & (1u << 31)) != 0;
  f.avx512_fp16 = f.avx512f && (d7 & (1u << 23)) != 0;
  f.amx_bf16 = os_amx && (d7 & (1u << 22)) != 0 && (d7 & (1u << 24)) != 0;
  unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  if (a7 >= 1 && __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71) != 0)
    f.avx512_bf16 = f.avx512f && (a71 & (1u << 5)) != 0;
  return f;
}

// Every level: its LOOM_CPU_ISA name and the oneDNN cap it sets (indexed by
// CpuIsa; avx512bf16 is also the "no cap" level, oneDNN then unrestricted).
struct Level {
  CpuIsa isa;
  std::string_view name;
  dnnl_cpu_isa_t onednn;
};
constexpr Level kLevels[] = {
    {CpuIsa::kBaseline, "baseline", dnnl_cpu_isa_sse41},
    {CpuIsa::kAvx2, "avx2", dnnl_cpu_isa_avx2},
    {CpuIsa::kAvx512, "avx512", dnnl_cpu_isa_avx512_core},
    {CpuIsa::kAvx512Bf16, "avx512bf16", dnnl_cpu_isa_all},
};

StatusOr<CpuIsa> ParseIsa(std::string_view v) {
  if (v.empty() || v == "native") return CpuIsa::kAvx512Bf16;
  for (const Level& l : kLevels)
    if (v == l.name) return l.isa;
  return InvalidArgumentError(
      "LOOM_CPU_ISA='" + std::string(v) +
      "': expected baseline, avx2, avx512, avx512bf16 or native");
}

}  // namespace

const CpuFeatures& DetectedCpuFeatures() {
  static const CpuFeatures f = Detect();
  return f;
}

CpuIsa DetectedIsa() {
  const CpuFeatures& f = DetectedCpuFeatures();
  if (!(f.avx2 && f.fma && f.f16c)) return CpuIsa::kBaseline;
  if (!(f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl))
    return CpuIsa::kAvx2;
  return f.avx512_bf16 ? CpuIsa::kAvx512Bf16 : CpuIsa::kAvx512;
}

StatusOr<CpuIsa> IsaCapFromEnvironment() {
  const char* env = std::getenv("LOOM_CPU_ISA");
  return ParseIsa(env == nullptr ? std::string_view() : std::string_view(env));
}

CpuIsa ActiveIsa() {
  static const CpuIsa active = [] {
    const StatusOr<CpuIsa> cap = IsaCapFromEnvironment();
    return cap.ok() ? std::min(*cap, DetectedIsa()) : DetectedIsa();
  }();
  return active;
}

std::string_view IsaName(CpuIsa isa) {
  return kLevels[static_cast<int>(isa)].name;
}

std::string FeatureList(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.amx_bf16, "amx_bf16");
  return s.empty() ? "sse2" : s;
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown";
}

void InitOneDnnIsa() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Fails only once a JIT kernel exists; the cap then applies to Loom's
    // own dispatch alone (nothing to report: oneDNN picks within the CPU).
    (void)dnnl_set_max_cpu_isa(kLevels[static_cast<int>(ActiveIsa())].onednn);
  });
}

std::string GemmPathDescription(DType compute) {
  switch (compute) {
    case DType::kF32:
      return "f32 weights, f32 multiply (oneDNN)";
    case DType::kBF16:
      return NativeGemmDType(DType::kBF16)
                 ? std::string(
                       "bf16 weights kept, bf16 x bf16 products "
                       "accumulated in f32 (oneDNN, ") +
                       (ActiveIsa() >= CpuIsa::kAvx512Bf16 ? "AVX512_BF16"
                                                           : "AVX-512") +
                       ")"
                 : "bf16 weights kept, activations rounded to bf16, "
                   "multiplied in f32 (weights widened per panel)";
    case DType::kF16:
      return NativeGemmDType(DType::kF16)
                 ? "f16 weights kept, f16 products accumulated in f32 "
                   "(oneDNN, AVX512_FP16)"
                 : "f16 weights kept, activations rounded to f16, multiplied "
                   "in f32 (weights widened per panel)";
    default:
      return "-";
  }
}

}  // namespace loom::cpu
