#include "src/backend/cpu/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

#include "src/backend/cpu/kernels.h"

namespace loom::cpu {
namespace {

uint64_t Xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Asks the kernel for the AMX tile state (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA, Linux 5.16 and later); false where it is refused.
bool AmxRequestPermission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) != 0)
    f.amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "AuthenticAMD"
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
  const bool amx_tile = os_amx && (d7 & (1u << 24)) != 0;
  unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  if (a7 >= 1 && __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71) != 0) {
    f.avx512_bf16 = f.avx512f && (a71 & (1u << 5)) != 0;
    f.amx_fp16 = amx_tile && (a71 & (1u << 21)) != 0;
  }
  // The tile registers need the kernel's permission, asked once here;
  // without it every tile instruction faults.
  f.amx_bf16 = amx_tile && (d7 & (1u << 22)) != 0 &&
               AmxRequestPermission();
  f.amx_fp16 = f.amx_fp16 && f.amx_bf16;
  return f;
}

// Every level's LOOM_CPU_ISA name, indexed by CpuIsa.
constexpr std::string_view kLevelNames[] = {"baseline", "avx2", "avx512",
                                            "avx512bf16", "amx"};

StatusOr<CpuIsa> ParseIsa(std::string_view v) {
  if (v.empty() || v == "native") return CpuIsa::kAmx;
  for (int l = 0; l <= static_cast<int>(CpuIsa::kAmx); ++l)
    if (v == kLevelNames[l]) return static_cast<CpuIsa>(l);
  return InvalidArgumentError(
      "LOOM_CPU_ISA='" + std::string(v) +
      "': expected baseline, avx2, avx512, avx512bf16, amx or native");
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
  if (!f.avx512_bf16) return CpuIsa::kAvx512;
  return f.amx_bf16 ? CpuIsa::kAmx : CpuIsa::kAvx512Bf16;
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
  return kLevelNames[static_cast<int>(isa)];
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
  add(f.amx_fp16, "amx_fp16");
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

std::string_view GemmPathName(DType compute) {
  switch (GemmFamilyOf(compute)) {
    case GemmFamily::kAmx:
      return "amx";
    case GemmFamily::kDot:
      return "avx512bf16";
    case GemmFamily::kFma:
      break;
  }
  return ActiveIsa() >= CpuIsa::kAvx512 ? "avx512"
         : ActiveIsa() >= CpuIsa::kAvx2 ? "avx2"
                                        : "baseline";
}

int64_t GemmPeakFlopsPerCycle(DType compute) {
  const std::string_view path = GemmPathName(compute);
  if (path == "amx") return 1024;
  if (path == "avx512bf16") return 128;
  if (path == "avx512") return 64;
  if (path == "avx2") return 32;
  return 8;
}

double MeasureCoreClockHz() {
  constexpr int64_t kAdds = 20'000'000;  // about 10 ms at 2 GHz
  double best = 1e300;
  for (int run = 0; run < 5; ++run) {
    uint64_t v = 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kAdds / 8; ++i)
      // Eight dependent adds: one cycle each, whatever the pipeline width.
      __asm__ volatile(
          "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
          "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0"
          : "+r"(v));
    best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - t0)
                              .count());
  }
  return static_cast<double>(kAdds) / best;
}

std::string GemmPathDescription(DType compute) {
  const std::string path(GemmPathName(compute));
  switch (compute) {
    case DType::kF32:
      return "f32 weights, f32 products accumulated by FMA chains (" + path +
             ")";
    case DType::kBF16:
      switch (GemmFamilyOf(compute)) {
        case GemmFamily::kAmx:
          return "bf16 weights kept, bf16 x bf16 products accumulated in f32 "
                 "(AMX tiles)";
        case GemmFamily::kDot:
          return "bf16 weights kept, bf16 x bf16 products accumulated in f32 "
                 "(AVX512_BF16)";
        case GemmFamily::kFma:
          break;
      }
      return "bf16 weights kept, activations rounded to bf16, multiplied in "
             "f32 (weights widened as they are packed, " +
             path + ")";
    case DType::kF16:
      return "f16 weights kept, activations rounded to f16, multiplied in "
             "f32 (weights widened as they are packed, " +
             path + ")";
    default:
      return "-";
  }
}

}  // namespace loom::cpu
