#include "src/runtime/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/backend/cpu/kernels.h"
#include "src/base/float16.h"
#include "src/model/rope.h"

namespace loom {

// Pointers to the planned regions (null where the plan has none). Regions
// share bytes when their lifetimes do not overlap, so each is touched only
// within the steps the planner gave it.
struct Executor::Regions {
  int32_t* positions = nullptr;  // [T]
  float* residual = nullptr;     // [T, H]
  float* pos_embed = nullptr;    // [T, H] (GPT-2)
  float* inv_freq = nullptr;     // [R/2]
  float* cos = nullptr;          // [T, R/2]
  float* sin = nullptr;          // [T, R/2]
  float* attn_in = nullptr;      // [T, H] ln1 output
  float* qkv = nullptr;          // [T, Q + 2 KV]
  float* pattern = nullptr;      // [heads, L, L]
  float* z = nullptr;            // [T, Q]
  float* attn_out = nullptr;     // [T, H]
  float* mlp_in = nullptr;       // [T, H] ln2 output
  float* mlp_a = nullptr;        // [T, 2I] gate | up, or [T, I] fc (GPT-2)
  float* mlp_act = nullptr;      // [T, I]
  float* mlp_out = nullptr;      // [T, H]
  float* final_norm = nullptr;   // [T, H]
  float* logits = nullptr;       // [C, V]
  void* gemm_ws = nullptr;
  void* attn_ws = nullptr;
  int64_t qkv_ld = 0;
  int64_t mlp_a_ld = 0;
  int64_t half = 0;
};

namespace {

cpu::Activation ToCpu(ActKind a) {
  switch (a) {
    case ActKind::kSilu:
      return cpu::Activation::kSilu;
    case ActKind::kGeluTanh:
      return cpu::Activation::kGeluTanh;
    case ActKind::kGeluExact:
      return cpu::Activation::kGeluExact;
    case ActKind::kRelu:
      return cpu::Activation::kRelu;
  }
  return cpu::Activation::kSilu;
}

}  // namespace

Executor::Executor(const Model& model, const HookSet& hooks,
                   const ExecutorOptions& options)
    : model_(model), c_(model.config()), hooks_(hooks), options_(options) {}

Executor::~Executor() = default;

void ComputeLogits(const Model& model, cpu::GemmContext& gemm,
                   const float* hidden, int64_t rows, float* logits,
                   void* workspace) {
  const TensorView& w = model.weights().Require(WeightRole::kLmHead);
  const bool out_in =
      model.weights().Layout(WeightRole::kLmHead) == MatrixLayout::kOutIn;
  const ModelConfig& c = model.config();
  cpu::GemmArgs a;
  a.x = hidden;
  a.w = w.data;
  a.w_dtype = w.dtype;
  a.layout = out_in ? cpu::WeightLayout::kOutIn : cpu::WeightLayout::kInOut;
  a.n = out_in ? w.shape[0] : w.shape[1];
  a.k = out_in ? w.shape[1] : w.shape[0];
  LOOM_CHECK(a.n == c.vocab_size && a.k == c.hidden_size)
      << "lm_head shape " << a.n << "x" << a.k;
  a.m = rows;
  a.y = logits;
  a.ldy = c.vocab_size;
  a.workspace = workspace;
  gemm.Gemm(a);
  if (c.final_softcap > 0)
    cpu::Softcap(logits, rows * c.vocab_size, c.final_softcap);
}

namespace {
int64_t CpuGemmScratchpad(int64_t m, int64_t n, int64_t k, DType w_dtype,
                          bool k_major) {
  return cpu::GemmScratchpadBytes(
      m, n, k, w_dtype,
      k_major ? cpu::WeightLayout::kInOut : cpu::WeightLayout::kOutIn);
}
}  // namespace

KernelCosts Executor::CpuKernelCosts() {
  KernelCosts k;
  k.gemm_workspace = &cpu::GemmWorkspaceBytes;
  k.gemm_scratchpad = &CpuGemmScratchpad;
  k.attention_workspace = &cpu::AttentionWorkspaceBytes;
  k.num_threads = cpu::NumThreads();
  k.activation_dtype = DType::kF32;
  return k;
}

JobSpec Executor::MakeJob(const Model& model, const HookSet& hooks,
                          const ExecutorOptions& o) {
  JobSpec job;
  job.mode = JobMode::kAnalysis;
  job.batch_tokens = o.max_tokens;
  job.context =
      o.max_seq_len > 0 ? std::min(o.max_seq_len, o.max_tokens) : o.max_tokens;
  job.hooks = hooks;
  job.logits = hooks.NeedsLogits();
  job.logits_chunk_rows = o.logits_chunk_rows;
  job.weight_compute_dtype = model.compute_dtype();
  return job;
}

StatusOr<std::unique_ptr<Executor>> Executor::Create(
    const Model& model, const HookSet& hooks, const ExecutorOptions& options) {
  const ModelConfig& c = model.config();
  ExecutorOptions o = options;
  if (o.max_tokens <= 0)
    return InvalidArgumentError("executor: max_tokens must be > 0");
  if (o.max_seq_len <= 0) o.max_seq_len = o.max_tokens;
  o.max_seq_len = std::min(o.max_seq_len, o.max_tokens);
  if (o.logits_chunk_rows <= 0)
    return InvalidArgumentError("executor: logits_chunk_rows must be > 0");
  for (const auto& h : hooks.hooks()) RETURN_IF_ERROR(CheckHookExists(h, c));
  auto ex = std::unique_ptr<Executor>(new Executor(model, hooks, o));
  ex->last_layer_ = hooks.NeedsFinalNorm()
                        ? c.num_layers - 1
                        : hooks.LastLayerNeeded(c.num_layers);
  ex->layout_ = PlanActivations(c, MakeJob(model, hooks, o), CpuKernelCosts());
  ASSIGN_OR_RETURN(ex->act_, Arena::Allocate(ex->layout_.activations));
  ASSIGN_OR_RETURN(ex->ws_, Arena::Allocate(ex->layout_.workspace));
  ASSIGN_OR_RETURN(ex->logits_, Arena::Allocate(ex->layout_.logits));
  auto r = std::make_unique<Regions>();
  const Arena& a = ex->act_;
  r->positions = a.as<int32_t>("positions");
  r->residual = a.as<float>("residual");
  r->pos_embed = a.as<float>("position embeddings");
  r->inv_freq = a.as<float>("rope inv_freq");
  r->cos = a.as<float>("rope cos");
  r->sin = a.as<float>("rope sin");
  r->attn_in = a.as<float>("attention input");
  r->qkv = a.as<float>("qkv");
  r->pattern = a.as<float>("attention pattern");
  r->z = a.as<float>("attention z");
  r->attn_out = a.as<float>("attention out");
  r->mlp_in = a.as<float>("mlp input");
  r->mlp_a = a.as<float>(c.mlp == MlpKind::kPlain ? "mlp fc" : "mlp gate|up");
  r->mlp_act = a.as<float>("mlp activated");
  r->mlp_out = a.as<float>("mlp out");
  r->final_norm = a.as<float>("final norm");
  r->logits = ex->logits_.as<float>("logits chunk");
  r->gemm_ws = ex->ws_.region("gemm input copy");
  r->attn_ws = ex->ws_.region("attention workspace");
  r->qkv_ld = c.q_dim() + 2 * c.kv_dim();
  r->mlp_a_ld =
      c.mlp == MlpKind::kPlain ? c.intermediate_size : 2 * c.intermediate_size;
  r->half = c.rope.type == RopeConfig::Type::kNone ? 0 : c.rope.rotary_dim / 2;
  LOOM_CHECK(r->positions && r->residual && r->qkv && r->z && r->attn_out &&
             r->mlp_a && r->mlp_out)
      << "planned layout lacks a core region";
  LOOM_CHECK(r->half == 0 || (r->inv_freq && r->cos && r->sin));
  ex->r_ = std::move(r);
  model.weights().FaultIn(ex->last_layer_, hooks.NeedsFinalNorm());
  ex->gemm_ = std::make_unique<cpu::GemmContext>();
  if (const int i = ex->layout_.workspace.Find("gemm scratchpad"); i >= 0)
    ex->gemm_->SetScratchpad(ex->ws_.region("gemm scratchpad"),
                             ex->layout_.workspace.regions[i].bytes);
  return ex;
}

void Executor::RoundActivations(float* data, int64_t rows, int64_t cols,
                                int64_t ld) const {
  if (!options_.hf_bf16_activations) return;
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j)
      data[r * ld + j] = RoundBf16(data[r * ld + j]);
}

Status Executor::Emit(HookSite site, int64_t layer, const Batch& batch,
                      int64_t cols, int64_t ld, const float* data,
                      HookSink* sink) {
  if (sink == nullptr || !hooks_.Contains(site, layer)) return Status();
  return sink->OnActivation(HookPoint{site, layer}, batch, -1, 0,
                            batch.num_tokens(), cols, ld, data);
}

void Executor::Linear(const float* x, int64_t m, WeightRole wrole,
                      WeightRole brole, int64_t layer, float* y, int64_t ldy,
                      bool accumulate, bool same_x) {
  const TensorView& w = model_.weights().Require(wrole, layer);
  const MatrixLayout layout = model_.weights().Layout(wrole, layer);
  const TensorView* b = model_.weights().Get(brole, layer);
  cpu::GemmArgs a;
  a.x = x;
  a.w = w.data;
  a.w_dtype = w.dtype;
  a.layout = layout == MatrixLayout::kOutIn ? cpu::WeightLayout::kOutIn
                                            : cpu::WeightLayout::kInOut;
  a.n = layout == MatrixLayout::kOutIn ? w.shape[0] : w.shape[1];
  a.k = layout == MatrixLayout::kOutIn ? w.shape[1] : w.shape[0];
  a.m = m;
  if (b != nullptr) {
    a.bias = b->data;
    a.bias_dtype = b->dtype;
  }
  a.y = y;
  a.ldy = ldy;
  a.accumulate = accumulate;
  a.workspace = r_->gemm_ws;
  a.reuse_x_workspace = same_x;
  gemm_->Gemm(a);
}

void Executor::Norm(WeightRole wrole, WeightRole brole, int64_t layer,
                    const float* x, float* y, int64_t rows, int64_t dim) {
  const TensorView* w = model_.weights().Get(wrole, layer);
  const TensorView* b = model_.weights().Get(brole, layer);
  const DType wd = w ? w->dtype : DType::kF32;
  switch (c_.norm) {
    case NormKind::kRms:
      if (options_.hf_bf16_activations && w != nullptr &&
          c_.norm_offset == 0.0f && w->dtype == DType::kBF16) {
        // HF's Llama-style RMSNorm: weight * normalized.to(bf16), two
        // roundings.
        cpu::RmsNorm(x, nullptr, wd, 0.0f, c_.norm_eps, y, rows, dim);
        const uint16_t* g = static_cast<const uint16_t*>(w->data);
#pragma omp parallel for schedule(static) if (rows * dim > 16384)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < dim; ++j)
            y[r * dim + j] =
                RoundBf16(Bf16ToF32(g[j]) * RoundBf16(y[r * dim + j]));
      } else {
        cpu::RmsNorm(x, w ? w->data : nullptr, wd, c_.norm_offset, c_.norm_eps,
                     y, rows, dim);
      }
      break;
    case NormKind::kLayer:
      cpu::LayerNorm(x, w ? w->data : nullptr, b ? b->data : nullptr, wd,
                     c_.norm_eps, y, rows, dim);
      break;
    case NormKind::kLayerNoAffine:
      cpu::LayerNorm(x, nullptr, nullptr, wd, c_.norm_eps, y, rows, dim);
      break;
  }
}

void Executor::ComputeRope(const Batch& batch) {
  // inv_freq is recomputed every forward: its region is dead after the blocks
  // and may share bytes with the final norm.
  if (c_.rope.type != RopeConfig::Type::kDynamic)
    ComputeInvFreq(c_.rope, c_.max_position_embeddings, 0, r_->inv_freq);
  for (int64_t s = 0; s < batch.num_seqs(); ++s) {
    const int64_t b = batch.seq_start[s], len = batch.seq_start[s + 1] - b;
    if (c_.rope.type == RopeConfig::Type::kDynamic)
      ComputeInvFreq(c_.rope, c_.max_position_embeddings, len, r_->inv_freq);
    cpu::RopeTables(r_->positions + b, len, r_->inv_freq, r_->half,
                    c_.rope.attention_scaling, r_->cos + b * r_->half,
                    r_->sin + b * r_->half);
  }
}

Status Executor::Forward(const Batch& batch, HookSink* sink) {
  const int64_t T = batch.num_tokens(), H = c_.hidden_size;
  if (batch.num_seqs() < 1 || batch.seq_start[0] != 0 ||
      batch.seq_start[batch.num_seqs()] != T)
    return InvalidArgumentError(
        "batch: seq_start must run from 0 to the token count " +
        std::to_string(T));
  if (T > options_.max_tokens)
    return OutOfRangeError("batch of " + std::to_string(T) +
                           " tokens exceeds the planned capacity of " +
                           std::to_string(options_.max_tokens));
  int32_t* pos = r_->positions;
  for (int64_t s = 0; s < batch.num_seqs(); ++s) {
    const int64_t b = batch.seq_start[s], e = batch.seq_start[s + 1];
    if (e <= b)
      return InvalidArgumentError("batch: sequence " + std::to_string(s) +
                                  " is empty");
    if (e - b > options_.max_seq_len)
      return OutOfRangeError("sequence " + std::to_string(s) + " has " +
                             std::to_string(e - b) +
                             " tokens, more than the planned maximum " +
                             std::to_string(options_.max_seq_len));
    if (e - b > c_.max_position_embeddings)
      return OutOfRangeError("sequence " + std::to_string(s) + " has " +
                             std::to_string(e - b) +
                             " tokens, more than max_position_embeddings = " +
                             std::to_string(c_.max_position_embeddings));
    for (int64_t t = b; t < e; ++t) pos[t] = static_cast<int32_t>(t - b);
  }
  for (int64_t t = 0; t < T; ++t)
    if (batch.ids[t] < 0 || batch.ids[t] >= c_.vocab_size)
      return OutOfRangeError("token id " + std::to_string(batch.ids[t]) +
                             " at position " + std::to_string(t) +
                             " is outside the vocabulary [0, " +
                             std::to_string(c_.vocab_size) + ")");

  // Embeddings: x [T, H].
  float* x = r_->residual;
  const TensorView& embed = model_.weights().Require(WeightRole::kEmbed);
  cpu::Gather(embed.data, embed.dtype, batch.ids.data(), T, H, x);
  RoundActivations(x, T, H, H);
  if (c_.embedding_scale != 1.0f) {
    // HF multiplies by the scale held in the activation dtype.
    const float scale = model_.compute_dtype() == DType::kBF16
                            ? RoundBf16(c_.embedding_scale)
                            : c_.embedding_scale;
    cpu::Scale(x, T * H, scale);
    RoundActivations(x, T, H, H);
  }
  RETURN_IF_ERROR(Emit(HookSite::kEmbed, -1, batch, H, H, x, sink));
  if (c_.learned_positions) {
    float* h = r_->pos_embed;
    const TensorView& wpe = model_.weights().Require(WeightRole::kPosEmbed);
    cpu::Gather(wpe.data, wpe.dtype, pos, T, H, h);
    RETURN_IF_ERROR(Emit(HookSite::kPosEmbed, -1, batch, H, H, h, sink));
    cpu::Add(h, x, T * H);
    RoundActivations(x, T, H, H);
  }
  if (r_->half > 0) ComputeRope(batch);

  for (int64_t layer = 0; layer <= last_layer_; ++layer)
    RETURN_IF_ERROR(RunLayer(layer, batch, sink));

  if (!hooks_.NeedsFinalNorm()) return Status();
  float* h = r_->final_norm;
  Norm(WeightRole::kFinalNorm, WeightRole::kFinalNormBias, -1, x, h, T, H);
  RoundActivations(h, T, H, H);
  RETURN_IF_ERROR(Emit(HookSite::kFinalNorm, -1, batch, H, H, h, sink));
  if (!hooks_.NeedsLogits()) return Status();
  float* logits = r_->logits;
  const int64_t V = c_.vocab_size;
  for (int64_t r0 = 0; r0 < T; r0 += options_.logits_chunk_rows) {
    const int64_t rows = std::min(options_.logits_chunk_rows, T - r0);
    ComputeLogits(model_, *gemm_, h + r0 * H, rows, logits, r_->gemm_ws);
    RoundActivations(logits, rows, c_.vocab_size, c_.vocab_size);
    if (sink)
      RETURN_IF_ERROR(sink->OnActivation(HookPoint{HookSite::kLogits, -1},
                                         batch, -1, r0, rows, V, V, logits));
  }
  return Status();
}

Status Executor::RunLayer(int64_t l, const Batch& batch, HookSink* sink) {
  const int64_t T = batch.num_tokens(), H = c_.hidden_size,
                I = c_.intermediate_size;
  const int64_t Q = c_.q_dim(), KV = c_.kv_dim(), hd = c_.head_dim;
  float* x = r_->residual;
  float* qkv = r_->qkv;
  float* z = r_->z;
  float* o = r_->attn_out;
  const int64_t ld = r_->qkv_ld;

  RETURN_IF_ERROR(Emit(HookSite::kResidPre, l, batch, H, H, x, sink));

  // ---- Attention ----
  const float* attn_in = x;  // [T, H]
  if (c_.pre_attn_norm) {
    float* h = r_->attn_in;
    Norm(WeightRole::kAttnNorm, WeightRole::kAttnNormBias, l, x, h, T, H);
    RoundActivations(h, T, H, H);
    RETURN_IF_ERROR(Emit(HookSite::kLn1, l, batch, H, H, h, sink));
    attn_in = h;
  }
  float* q = qkv;           // [T, Q]  row stride ld
  float* k = qkv + Q;       // [T, KV] row stride ld
  float* v = qkv + Q + KV;  // [T, KV] row stride ld
  if (c_.fused_qkv) {
    Linear(attn_in, T, WeightRole::kQkv, WeightRole::kQkvBias, l, qkv, ld);
    RoundActivations(qkv, T, ld, ld);
  } else {
    Linear(attn_in, T, WeightRole::kQ, WeightRole::kQBias, l, q, ld);
    Linear(attn_in, T, WeightRole::kK, WeightRole::kKBias, l, k, ld, false,
           /*same_x=*/true);
    Linear(attn_in, T, WeightRole::kV, WeightRole::kVBias, l, v, ld, false,
           /*same_x=*/true);
    RoundActivations(qkv, T, ld, ld);
  }
  if (c_.clip_qkv > 0) {
    const float cl = c_.clip_qkv;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < ld; ++j)
        qkv[t * ld + j] = std::clamp(qkv[t * ld + j], -cl, cl);
  }
  if (c_.qk_norm != QkNormKind::kNone) {
    const TensorView& qn = model_.weights().Require(WeightRole::kQNorm, l);
    const TensorView& kn = model_.weights().Require(WeightRole::kKNorm, l);
    const bool per_head = c_.qk_norm == QkNormKind::kPerHead;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      cpu::RmsNorm(q + t * ld, qn.data, qn.dtype, 0.0f, c_.norm_eps, q + t * ld,
                   per_head ? c_.num_heads : 1, per_head ? hd : Q);
      cpu::RmsNorm(k + t * ld, kn.data, kn.dtype, 0.0f, c_.norm_eps, k + t * ld,
                   per_head ? c_.num_kv_heads : 1, per_head ? hd : KV);
    }
    RoundActivations(qkv, T, Q + KV, ld);
  }
  RETURN_IF_ERROR(Emit(HookSite::kQ, l, batch, Q, ld, q, sink));
  RETURN_IF_ERROR(Emit(HookSite::kK, l, batch, KV, ld, k, sink));
  RETURN_IF_ERROR(Emit(HookSite::kV, l, batch, KV, ld, v, sink));
  if (r_->half > 0) {
    const float* cos = r_->cos;
    const float* sin = r_->sin;
    cpu::ApplyRope(q, T, c_.num_heads, hd, ld, cos, sin, r_->half);
    cpu::ApplyRope(k, T, c_.num_kv_heads, hd, ld, cos, sin, r_->half);
    RoundActivations(qkv, T, Q + KV, ld);
    RETURN_IF_ERROR(Emit(HookSite::kRotQ, l, batch, Q, ld, q, sink));
    RETURN_IF_ERROR(Emit(HookSite::kRotK, l, batch, KV, ld, k, sink));
  }
  cpu::AttentionArgs aa;
  aa.q = q;
  aa.q_rs = ld;
  aa.k = k;
  aa.k_rs = ld;
  aa.v = v;
  aa.v_rs = ld;
  aa.z = z;
  aa.seq_start = batch.seq_start.data();
  aa.num_seqs = batch.num_seqs();
  aa.q_heads = c_.num_heads;
  aa.kv_heads = c_.num_kv_heads;
  aa.head_dim = hd;
  aa.scale = c_.attn_scale;
  if (c_.attn_scale_by_inverse_layer) aa.scale /= static_cast<float>(l + 1);
  aa.softcap = c_.attn_softcap;
  aa.window = c_.sliding_window[l];
  aa.workspace = r_->attn_ws;
  if (sink != nullptr && hooks_.Contains(HookSite::kPattern, l)) {
    // One sequence at a time so each sequence's probabilities can be delivered.
    float* probs = r_->pattern;
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      cpu::AttentionArgs one = aa;
      one.seq_start = batch.seq_start.data() + s;
      one.num_seqs = 1;
      one.probs = probs;
      one.probs_seq = 0;
      cpu::Attention(*gemm_, one);
      const int64_t len = batch.seq_start[s + 1] - batch.seq_start[s];
      RETURN_IF_ERROR(sink->OnActivation(HookPoint{HookSite::kPattern, l},
                                         batch, s, batch.seq_start[s],
                                         c_.num_heads * len, len, len, probs));
    }
  } else {
    cpu::Attention(*gemm_, aa);
  }
  RoundActivations(z, T, Q, Q);
  RETURN_IF_ERROR(Emit(HookSite::kZ, l, batch, Q, Q, z, sink));
  Linear(z, T, WeightRole::kO, WeightRole::kOBias, l, o, H);
  RoundActivations(o, T, H, H);
  RETURN_IF_ERROR(Emit(HookSite::kAttnOut, l, batch, H, H, o, sink));
  if (c_.post_attn_norm) {
    Norm(WeightRole::kPostAttnNorm, WeightRole::kOther, l, o, o, T, H);
    RoundActivations(o, T, H, H);
    RETURN_IF_ERROR(Emit(HookSite::kLn1Post, l, batch, H, H, o, sink));
  }
  cpu::Add(o, x, T * H);
  RoundActivations(x, T, H, H);
  RETURN_IF_ERROR(Emit(HookSite::kResidMid, l, batch, H, H, x, sink));

  // ---- MLP ----
  const float* mlp_in = x;
  if (c_.pre_mlp_norm) {
    float* h = r_->mlp_in;
    Norm(WeightRole::kMlpNorm, WeightRole::kMlpNormBias, l, x, h, T, H);
    RoundActivations(h, T, H, H);
    RETURN_IF_ERROR(Emit(HookSite::kLn2, l, batch, H, H, h, sink));
    mlp_in = h;
  }
  float* a = r_->mlp_a;
  float* b = r_->mlp_act;
  const int64_t lda = r_->mlp_a_ld;
  if (c_.mlp == MlpKind::kPlain) {
    Linear(mlp_in, T, WeightRole::kUp, WeightRole::kUpBias, l, a, lda);
    RoundActivations(a, T, I, lda);
    RETURN_IF_ERROR(Emit(HookSite::kMlpPre, l, batch, I, lda, a, sink));
    cpu::ApplyActivation(ToCpu(c_.act), a, T * I);  // lda == I: a is dense
    RoundActivations(a, T, I, I);
    b = a;
  } else {
    if (c_.mlp == MlpKind::kGatedFused) {
      Linear(mlp_in, T, WeightRole::kGateUp, WeightRole::kOther, l, a, lda);
      RoundActivations(a, T, 2 * I, lda);
    } else {
      Linear(mlp_in, T, WeightRole::kGate, WeightRole::kGateBias, l, a, lda);
      Linear(mlp_in, T, WeightRole::kUp, WeightRole::kUpBias, l, a + I, lda,
             false, /*same_x=*/true);
      RoundActivations(a, T, 2 * I, lda);
    }
    RETURN_IF_ERROR(Emit(HookSite::kMlpPre, l, batch, I, lda, a, sink));
    cpu::GatedActivation(ToCpu(c_.act), a, lda, a + I, lda, b, T, I);
    RoundActivations(b, T, I, I);
  }
  RETURN_IF_ERROR(Emit(HookSite::kMlpPost, l, batch, I, I, b, sink));
  o = r_->mlp_out;
  Linear(b, T, WeightRole::kDown, WeightRole::kDownBias, l, o, H);
  RoundActivations(o, T, H, H);
  RETURN_IF_ERROR(Emit(HookSite::kMlpOut, l, batch, H, H, o, sink));
  if (c_.post_mlp_norm) {
    Norm(WeightRole::kPostMlpNorm, WeightRole::kOther, l, o, o, T, H);
    RoundActivations(o, T, H, H);
    RETURN_IF_ERROR(Emit(HookSite::kLn2Post, l, batch, H, H, o, sink));
  }
  cpu::Add(o, x, T * H);
  RoundActivations(x, T, H, H);
  return Emit(HookSite::kResidPost, l, batch, H, H, x, sink);
}

}  // namespace loom
