// GEMMs of the CUDA backend on cuBLASLt (see gemm.h for the contract).
//
// Row-major trick: cuBLASLt is column-major, so we compute
// y^T [n, m] (column-major, ld = ldy) = W [n, k] x^T [k, m]:
//   - x (row-major [m, k], row stride k) is column-major [k, m], ld k: op N;
//   - kOutIn W (row-major [n, k]) is column-major [k, n], ld k: op T;
//   - kInOut W (row-major [k, n]) is column-major [n, k], ld n: op N;
//   - y (row-major [m, n], row stride ldy) is column-major [n, m], ld ldy.
// A/B are bf16 / f16 (x converted into the op's workspace first, as the CPU
// backend rounds it) or f32; C/D f32; CUBLAS_COMPUTE_32F with f32 scales.
// f32 weights run in true f32 (CUBLAS_COMPUTE_32F, never the TF32 compute
// type). accumulate = beta 1 (C = D = y).
//
// Bias: cuBLASLt's BIAS epilogue takes a bias of D's type (f32) for these
// kernels (the cuBLASLt header, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: only
// IMMA and FP8 kernels take another type), so an f32 bias goes through the
// epilogue (the default bias type, = D's) and a bf16 / f16 bias is added
// after the GEMM by AddBiasRows (kernels_gemm.cu): y = float(bias) + y in
// f32. Order of the f32 additions: y = (x W^T + y_old) + bias in both cases
// (cuBLASLt documents D = epilogue(alpha A B + beta C)); the CPU backend
// (oneDNN) adds the bias before its sum post-op, (x W^T + bias) + y_old: the
// two differ by at most one f32 rounding of that sum.
//
// Quantized weights: decoded panel by panel (kDecodePanelRows rows of W)
// into the decode workspace in the compute dtype by DecodeRows (the exact
// dequantized values of HF / the CPU backend, rounded once to the compute
// dtype), each panel multiplied as a dense kOutIn weight into y's columns
// [r0, r0 + rows). We deliberately do NOT use cuBLASLt's FP8 (or FP4)
// tensor-core path: it would quantize the activations to FP8 as well and
// change the numbers; weight-only decode keeps HF's dequantized semantics
// exactly.
//
// Caching: the matmul / layout descriptors and the heuristic's algorithm are
// cached per (m, n, k, dtype, op of A, lda, ldy, bias in the epilogue,
// accumulate, pointer alignments, workspace bytes). A new shape creates its
// descriptors and runs the heuristic on first use (a few host allocations
// inside cuBLASLt, no device allocation); everything is released in the
// destructor, or when the cache passes kMaxPlans entries.
#include "src/backend/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <unordered_map>

#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

// kernels_gemm.cu: y [rows, cols] (row stride ldy) += float(bias [cols]) in
// f32; bias in BF16 / F16 / F32.
void AddBiasRows(float* y, int64_t ldy, int64_t rows, int64_t cols,
                 const void* bias, DType bias_dtype, cudaStream_t s);

namespace {

// Past this many cached plans the cache is cleared (shapes of a model are
// few; this bounds growth with many distinct m).
constexpr size_t kMaxPlans = 4096;

bool IsGemmDType(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

cudaDataType_t CudaType(DType d) {
  switch (d) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// Largest power of two (at most 256) dividing the address: what the
// heuristic may assume about a buffer (null: no constraint).
uint32_t AlignmentOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), 256));
}

std::string LtStatus(cublasStatus_t st) {
  return std::string(cublasLtGetStatusName(st)) + " (" +
         cublasLtGetStatusString(st) + ")";
}

// One column-major cuBLASLt matmul: D [n, m] (ld ldd, f32) = op(A) [n, k] B
// [k, m] (+ bias [n]) (+ D).
struct Matmul {
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kF32;  // A and B
  bool a_trans = true;        // A stored column-major [k, n] (T) or [n, k] (N)
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;  // column-major [k, m], ld k
  float* d = nullptr;
  int64_t ldd = 0;
  const void* bias = nullptr;  // [n] in bias_dtype, or null
  DType bias_dtype = DType::kF32;
  bool accumulate = false;
};

using Key = std::array<int64_t, 15>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // The f32 bias is added by the epilogue (else by AddBiasRows).
  bool bias_in_epilogue = false;

  void Destroy() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    desc = nullptr;
    a = b = c = nullptr;
  }
};

std::string ShapeOf(const Matmul& mm) {
  return "m=" + std::to_string(mm.m) + " n=" + std::to_string(mm.n) +
         " k=" + std::to_string(mm.k) + " " + std::string(DTypeName(mm.dtype)) +
         (mm.a_trans ? " [n, k]" : " [k, n]") +
         " lda=" + std::to_string(mm.lda) + " ldy=" + std::to_string(mm.ldd) +
         (mm.bias != nullptr ? " bias " + std::string(DTypeName(mm.bias_dtype))
                             : std::string()) +
         (mm.accumulate ? " accumulate" : "");
}

}  // namespace

struct GemmRunner::State {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // cuBLASLt's, borrowed
  int64_t workspace_bytes = 0;
  void* decode = nullptr;  // one decoded panel of W, borrowed
  int64_t decode_bytes = 0;
  std::unordered_map<Key, Plan, KeyHash> plans;

  ~State() {
    Clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }
  void Clear() {
    for (auto& [key, plan] : plans) plan.Destroy();
    plans.clear();
  }

  StatusOr<Plan*> GetPlan(const Matmul& mm);
  // Whether quantized `w` decodes to `dtype` with the decode workspace set.
  Status CheckQuantized(const WeightOperand& w, DType dtype,
                        const std::string& shape) const;
  Status Run(const Matmul& mm, cudaStream_t stream);
};

StatusOr<Plan*> GemmRunner::State::GetPlan(const Matmul& mm) {
  const bool f32_bias = mm.bias != nullptr && mm.bias_dtype == DType::kF32;
  const Key key = {mm.m,
                   mm.n,
                   mm.k,
                   static_cast<int64_t>(mm.dtype),
                   mm.a_trans ? 1 : 0,
                   mm.lda,
                   mm.ldd,
                   f32_bias ? 1 : 0,
                   mm.accumulate ? 1 : 0,
                   AlignmentOf(mm.a),
                   AlignmentOf(mm.b),
                   AlignmentOf(mm.d),
                   f32_bias ? AlignmentOf(mm.bias) : 0,
                   workspace_bytes,
                   0};
  if (auto it = plans.find(key); it != plans.end()) return &it->second;
  if (plans.size() >= kMaxPlans) Clear();

  const std::string shape = ShapeOf(mm);
  Plan p;
  cublasLtMatmulPreference_t pref = nullptr;
  // Releases what was created so far and reports `what` failed.
  auto fail = [&](const char* what, cublasStatus_t st) -> Status {
    p.Destroy();
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    return InternalError(std::string("cuBLASLt ") + what +
                         " failed: " + LtStatus(st) + " (GEMM " + shape + ")");
  };
  cublasStatus_t st =
      cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("matmul descriptor", st);
  const cublasOperation_t op_a = mm.a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  st = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                      &op_a, sizeof(op_a));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                        &op_b, sizeof(op_b));
  if (st != CUBLAS_STATUS_SUCCESS) return fail("transpose attributes", st);

  const cudaDataType_t ab = CudaType(mm.dtype);
  // A as stored: [k, n] ld lda (op T) or [n, k] ld lda (op N).
  st = cublasLtMatrixLayoutCreate(&p.a, ab, mm.a_trans ? mm.k : mm.n,
                                  mm.a_trans ? mm.n : mm.k, mm.lda);
  if (st == CUBLAS_STATUS_SUCCESS)  // B = x^T [k, m] ld k
    st = cublasLtMatrixLayoutCreate(&p.b, ab, mm.k, mm.m, mm.k);
  if (st == CUBLAS_STATUS_SUCCESS)  // C = D = y^T [n, m] ld ldy
    st = cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, mm.n, mm.m, mm.ldd);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("matrix layout", st);

  st = cublasLtMatmulPreferenceCreate(&pref);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("preference", st);
  const uint64_t max_ws = static_cast<uint64_t>(
      std::max<int64_t>(workspace != nullptr ? workspace_bytes : 0, 0));
  const uint32_t align_a = AlignmentOf(mm.a), align_b = AlignmentOf(mm.b),
                 align_d = AlignmentOf(mm.d);
  st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
        sizeof(align_a));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
        sizeof(align_b));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
        sizeof(align_d));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
        sizeof(align_d));
  if (st != CUBLAS_STATUS_SUCCESS) return fail("preference attributes", st);

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (f32_bias) {
    // The bias pointer's value tells the heuristic its alignment.
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    st = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                        &epi, sizeof(epi));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &mm.bias, sizeof(mm.bias));
    if (st != CUBLAS_STATUS_SUCCESS) return fail("bias epilogue", st);
    st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c,
                                        pref, 1, &result, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 &&
        result.state == CUBLAS_STATUS_SUCCESS) {
      p.bias_in_epilogue = true;
    } else {
      // No algorithm with the bias epilogue for this shape: plain GEMM, the
      // bias added by AddBiasRows.
      found = 0;
      const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
      st = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                          &none, sizeof(none));
      if (st != CUBLAS_STATUS_SUCCESS) return fail("epilogue reset", st);
    }
  }
  if (!p.bias_in_epilogue) {
    st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c,
                                        pref, 1, &result, &found);
    if (st != CUBLAS_STATUS_SUCCESS) return fail("heuristic", st);
    if (found <= 0 || result.state != CUBLAS_STATUS_SUCCESS)
      return fail("heuristic (no algorithm for this GEMM)",
                  found > 0 ? result.state : CUBLAS_STATUS_NOT_SUPPORTED);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  p.algo = result.algo;
  return &plans.emplace(key, p).first->second;
}

Status GemmRunner::State::Run(const Matmul& mm, cudaStream_t stream) {
  StatusOr<Plan*> plan_or = GetPlan(mm);
  if (!plan_or.ok()) return plan_or.status();
  Plan& p = **plan_or;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (p.bias_in_epilogue)
    st = cublasLtMatmulDescSetAttribute(
        p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &mm.bias, sizeof(mm.bias));
  const float alpha = 1.0f, beta = mm.accumulate ? 1.0f : 0.0f;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(
        handle, p.desc, &alpha, mm.a, p.a, mm.b, p.b, &beta, mm.d, p.c, mm.d,
        p.c, &p.algo, workspace,
        static_cast<size_t>(workspace != nullptr ? workspace_bytes : 0),
        stream);
  if (st != CUBLAS_STATUS_SUCCESS)
    return InternalError("cublasLtMatmul failed: " + LtStatus(st) + " (GEMM " +
                         ShapeOf(mm) + ")");
  if (mm.bias != nullptr && !p.bias_in_epilogue)
    AddBiasRows(mm.d, mm.ldd, mm.m, mm.n, mm.bias, mm.bias_dtype, stream);
  return Status();
}

Status GemmRunner::State::CheckQuantized(const WeightOperand& w, DType dtype,
                                         const std::string& shape) const {
  if (w.format.layout != MatrixLayout::kOutIn)
    return InvalidArgumentError("cuda gemm " + shape +
                                ": quantized weights are [n, k]");
  const FormatKind kind = w.format.kind;
  const bool fp4 = kind == FormatKind::kMxfp4 ||
                   kind == FormatKind::kNvfp4ModelOpt ||
                   kind == FormatKind::kNvfp4CompressedTensors;
  if (fp4) {
    const int64_t block = kind == FormatKind::kMxfp4 ? 32 : 16;
    if (w.k % block != 0 || w.scales == nullptr)
      return InvalidArgumentError("cuda gemm " + shape +
                                  ": FP4 weights need k a multiple of " +
                                  std::to_string(block) + " and block scales");
  } else if (kind == FormatKind::kFp8Block) {
    if (w.block_in <= 0 || w.block_out <= 0 || w.scales == nullptr)
      return InvalidArgumentError("cuda gemm " + shape +
                                  ": FP8 block weights need scales and a block "
                                  "[" +
                                  std::to_string(w.block_out) + ", " +
                                  std::to_string(w.block_in) + "]");
  } else if (kind != FormatKind::kFp8PerTensor) {
    return InvalidArgumentError("cuda gemm " + shape + ": unknown format");
  }
  const int64_t need = DecodeWorkspaceBytes(w.n, w.k, kind, dtype);
  if (decode == nullptr || decode_bytes < need)
    return FailedPreconditionError(
        "cuda gemm " + shape + " (decoded to " + std::string(DTypeName(dtype)) +
        "): weight decode workspace of " + std::to_string(decode_bytes) +
        " bytes, needs " + std::to_string(need) +
        " (planned by the weight decode term)");

  return Status();
}

StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create() {
  std::unique_ptr<GemmRunner> r(new GemmRunner());
  r->state_ = std::make_unique<State>();
  const cublasStatus_t st = cublasLtCreate(&r->state_->handle);
  if (st != CUBLAS_STATUS_SUCCESS) {
    r->state_->handle = nullptr;
    return FailedPreconditionError("cuBLASLt: cublasLtCreate failed: " +
                                   LtStatus(st));
  }
  return r;
}

GemmRunner::~GemmRunner() = default;

void GemmRunner::SetWorkspace(void* workspace, int64_t bytes) {
  // cuBLASLt wants a 256-byte aligned workspace; a planned region may only be
  // 64-byte aligned: use the aligned part (at most 192 bytes less).
  const auto a = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t skip = (256 - a % 256) % 256;
  if (workspace == nullptr || bytes <= static_cast<int64_t>(skip)) {
    state_->workspace = nullptr;
    state_->workspace_bytes = 0;
    return;
  }
  state_->workspace = static_cast<char*>(workspace) + skip;
  state_->workspace_bytes = bytes - static_cast<int64_t>(skip);
}

void GemmRunner::SetDecodeWorkspace(void* workspace, int64_t bytes) {
  state_->decode = workspace;
  state_->decode_bytes = workspace != nullptr ? std::max<int64_t>(bytes, 0) : 0;
}

Status GemmRunner::Run(const GemmOp& op, cudaStream_t stream) {
  const WeightOperand& w = op.w;
  const int64_t m = op.m, n = w.n, k = w.k;
  const int64_t ldy = op.ldy == 0 ? n : op.ldy;
  const DType dtype = w.gemm_dtype();
  const std::string shape =
      "m=" + std::to_string(m) + " n=" + std::to_string(n) +
      " k=" + std::to_string(k) + " " + std::string(FormatName(w.format.kind)) +
      " " + std::string(DTypeName(w.format.dtype));
  if (m < 0 || n <= 0 || k <= 0 || ldy < n)
    return InvalidArgumentError("cuda gemm: bad shape " + shape +
                                " ldy=" + std::to_string(ldy));
  if (m == 0) return Status();  // no rows (e.g. an empty batch)
  if (op.x == nullptr || op.y == nullptr || w.data == nullptr)
    return InvalidArgumentError("cuda gemm " + shape + ": null operand");
  if (!IsGemmDType(dtype))
    return InvalidArgumentError("cuda gemm " + shape + ": compute dtype " +
                                std::string(DTypeName(dtype)) +
                                " (F32, BF16 or F16 only)");
  if (op.bias != nullptr && !IsGemmDType(op.bias_dtype))
    return InvalidArgumentError("cuda gemm " + shape + ": bias dtype " +
                                std::string(DTypeName(op.bias_dtype)));

  if (w.quantized()) RETURN_IF_ERROR(state_->CheckQuantized(w, dtype, shape));
  // Repacked only for the CPU's kernels (host segments); a GPU reads the
  // checkpoint's layouts.
  if (w.format.layout == MatrixLayout::kStrips ||
      w.format.layout == MatrixLayout::kPanels)
    return InvalidArgumentError("cuda gemm " + shape +
                                ": a weight repacked for the CPU's kernels");
  if (dtype != DType::kF32 && op.workspace == nullptr)
    return InvalidArgumentError("cuda gemm " + shape +
                                ": 16-bit GEMM without a workspace");
  // B: x as is (f32), or its 16-bit copy in the op's workspace ([m, k] dense).
  const void* b = op.x;
  if (dtype != DType::kF32) {
    if (!op.reuse_x_workspace)
      ConvertRows(op.x, k, op.workspace, k, dtype, m, k, stream);
    b = op.workspace;
  }

  Matmul mm;
  mm.m = m;
  mm.k = k;
  mm.dtype = dtype;
  mm.b = b;
  mm.ldd = ldy;
  mm.bias_dtype = op.bias_dtype;
  mm.accumulate = op.accumulate;

  if (!w.quantized()) {
    mm.n = n;
    mm.a = w.data;
    mm.a_trans = w.format.layout == MatrixLayout::kOutIn;
    mm.lda = mm.a_trans ? k : n;
    mm.d = op.y;
    mm.bias = op.bias;
    return state_->Run(mm, stream);
  }

  // ---- Quantized (validated above): decode and multiply panel by panel.
  const QuantMatrix q = QuantMatrixOf(w);
  const int64_t bias_size = op.bias != nullptr ? DTypeSize(op.bias_dtype) : 0;
  mm.a = state_->decode;  // [rows, k] row-major = column-major [k, rows]
  mm.a_trans = true;
  mm.lda = k;
  for (int64_t r0 = 0; r0 < n; r0 += kDecodePanelRows) {
    const int64_t rows = std::min(kDecodePanelRows, n - r0);
    // Stream order: this decode starts after the previous panel's GEMM has
    // read the workspace.
    DecodeRows(q, r0, rows, state_->decode, dtype, stream);
    mm.n = rows;
    mm.d = op.y + r0;
    mm.bias = op.bias != nullptr
                  ? static_cast<const uint8_t*>(op.bias) + r0 * bias_size
                  : nullptr;
    RETURN_IF_ERROR(state_->Run(mm, stream));
  }
  return Status();
}

}  // namespace loom::cuda
