#include "src/runtime/backward.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "src/backend/registry.h"
#include "src/base/check.h"

namespace loom {
namespace {

// The 64-byte aligned start of a workspace sized 64 bytes over its need.
void* Aligned64(std::vector<float>& v) {
  return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 63) /
                                 64 * 64);
}

std::string LayerPrefix(int64_t l) {
  return "backward: layer " + std::to_string(l) + ": ";
}

// A norm's gain role's layer-free facts.
bool IsLayerNorm(NormKind k) { return k != NormKind::kRms; }

}  // namespace

StatusOr<GradMetricKind> ParseGradMetric(std::string_view text,
                                         std::string_view flag) {
  if (text == "logit-diff") return GradMetricKind::kLogitDiff;
  if (text == "logprob") return GradMetricKind::kLogProb;
  return InvalidArgumentError(std::string(flag) + ": '" + std::string(text) +
                              "' is not a metric (logit-diff, logprob)");
}

std::string_view GradMetricName(GradMetricKind kind) {
  return kind == GradMetricKind::kLogProb ? "logprob" : "logit-diff";
}

Status ParseFreeze(const std::vector<std::string>& items, std::string_view flag,
                   bool* attn_pattern, bool* norm_scale) {
  for (const std::string& f : items) {
    if (f == "attn_pattern")
      *attn_pattern = true;
    else if (f == "norm_scale")
      *norm_scale = true;
    else
      return InvalidArgumentError(std::string(flag) + ": '" + f +
                                  "' is not frozen here (attn_pattern, "
                                  "norm_scale)");
  }
  return Status();
}

bool IsGradientSite(HookSite site) {
  switch (site) {
    case HookSite::kLogits:
    case HookSite::kPattern:
    case HookSite::kRouterLogits:
    case HookSite::kExpertIds:
    case HookSite::kExpertWeights:
      return false;
    default:
      return IsFloatRowSite(site);
  }
}

Status CheckBackwardSupported(const ModelConfig& c, const BackwardOptions& o) {
  for (const HookPoint& h : o.grad_hooks.hooks())
    if (!IsGradientSite(h.site))
      return InvalidArgumentError("backward: " + HookName(h) +
                                  " has no gradient here (gradients are taken "
                                  "at token-major activation hooks)");
  for (const LayerConfig& lc : MakeLayerConfigs(c)) {
    const std::string at = LayerPrefix(lc.layer);
    if (lc.moe() && ((lc.router != RouterKind::kSoftmaxTopK &&
                      lc.router != RouterKind::kTopKSoftmax) ||
                     lc.shared_expert()))
      return UnimplementedError(
          at +
          "the backward of this mixture-of-experts layer (a router other "
          "than softmax top-k or top-k softmax, or a shared expert) is not "
          "written yet");
    if (lc.is_mla())
      return UnimplementedError(at + "the backward of MLA is not written yet");
    if (lc.qk_norm != QkNormKind::kNone && lc.fused_qkv)
      return UnimplementedError(at +
                                "the backward of q/k norms after a fused qkv "
                                "projection is not written yet");
    if (lc.qk_norm != QkNormKind::kNone &&
        (lc.qk_norm_type != NormKind::kRms ||
         lc.qk_norm == QkNormKind::kPerHeadOwn))
      return UnimplementedError(at +
                                "the backward of q/k LayerNorms (StableLM, "
                                "Persimmon) is not written yet");
    if (lc.alibi || c.embed_norm)
      return UnimplementedError(at +
                                "the backward of ALiBi attention and of the "
                                "embedding norm (BLOOM) is not written yet");
    if (lc.clip_qkv > 0)
      return UnimplementedError(at +
                                "the backward of clip_qkv is not written "
                                "yet");
    if (lc.fused_qkv && lc.qkv_layout != QkvLayout::kConcat &&
        lc.qkv_layout != QkvLayout::kPerHead)
      return UnimplementedError(at +
                                "the backward of this fused qkv layout is not "
                                "written yet");
    if (!lc.moe() && lc.mlp != MlpKind::kGated &&
        lc.mlp != MlpKind::kGatedFused && lc.mlp != MlpKind::kPlain)
      return UnimplementedError(at +
                                "the backward of this MLP kind is not "
                                "written yet");
  }
  return Status();
}

// Every buffer of the backward, sized once at Create (BufferCounts).
struct Backward::Buffers {
  std::vector<float> saved;      // [L + 1, T, H] residual at layer boundaries
  std::vector<float> g;          // [T, H] d metric / d residual (current)
  std::vector<float> branch;     // [T, H] d of a branch output
  std::vector<float> d_in;       // [T, H] d of a branch's norm output
  std::vector<float> hidden;     // [T, H] final-norm output
  std::vector<float> resid_mid;  // [T, H] tape: residual after attention
  std::vector<float> attn_out;   // [T, H] tape: o_proj out before post-norm
  std::vector<float> mlp_out;    // [T, H] tape: MLP out before post-norm
  std::vector<float> qkv;        // [T, qkv] tape: rotated q | k | v
  std::vector<float> mlp_pre;    // [T, 2I] tape: gate | up (plain: fc)
  std::vector<float> cos;        // [T, half] tape: the RoPE tables
  std::vector<float> neg_sin;    // [T, half] (the transpose's rotation)
  std::vector<float> dqkv;       // [T, qkv] d q | d k | d v
  std::vector<float> dfused;     // [T, qkv] the fused projection's order
  std::vector<float> dz;         // [T, z]
  std::vector<float> dmlp;       // [T, 2I] d gate | d up (plain: d fc)
  std::vector<float> dact;       // [T, I] d of the MLP's activation out
  std::vector<float> emit;       // [T, max(qkv, I)] a strided gradient, dense
  std::vector<float> logits;     // [C, V] one chunk (its gradient in place)
  std::vector<float> gemm_ws;    // GemmBackwardInput's decoded rows
  std::vector<float> attn_ws;    // AttentionBackward's rows
  std::vector<float> head_ws;    // the lm_head GEMM's (forward) workspace
  // q/k norms: the projection's input and q, k before their norm.
  std::vector<float> qk_in;    // [T, H] tape
  std::vector<float> q_pre;    // [T, Q]
  std::vector<float> k_pre;    // [T, KV]
  std::vector<float> dnorm;    // [T, max(Q, KV)] a norm's dense gradient
  std::vector<float> proj_ws;  // the q/k GEMMs' (forward) workspace
  // MoE layers (routed rows grouped by expert, as the forward's).
  std::vector<float> router_logits;     // [T, E] tape
  std::vector<float> row_weights;       // [T k] tape
  std::vector<float> expert_gu;         // [T k, 2 Ie] tape
  std::vector<float> expert_out;        // [T k, H] tape (before weighting)
  std::vector<float> d_rows;            // [T k, H] d out, then d in, per row
  std::vector<float> d_eact;            // [T k, Ie]
  std::vector<float> d_egu;             // [T k, 2 Ie]
  std::vector<float> d_route;           // [T, E] d router logits
  std::vector<float> d_weight;          // [T k] d of each row's weight
  std::vector<float> last_logits;       // [V] logit-diff: the last row's
  std::vector<int32_t> expert_offsets;  // [E + 1] tape
  std::vector<int32_t> expert_rows;     // [T k] tape: each row's token

  std::vector<std::vector<float>*> members() {
    return {&saved,      &g,          &branch,        &d_in,        &hidden,
            &resid_mid,  &attn_out,   &mlp_out,       &qkv,         &mlp_pre,
            &cos,        &neg_sin,    &dqkv,          &dfused,      &dz,
            &dmlp,       &dact,       &emit,          &logits,      &gemm_ws,
            &attn_ws,    &head_ws,    &qk_in,         &q_pre,       &k_pre,
            &dnorm,      &proj_ws,    &router_logits, &row_weights, &expert_gu,
            &expert_out, &d_rows,     &d_eact,        &d_egu,       &d_route,
            &d_weight,   &last_logits};
  }
};

namespace {

// The element counts of Buffers::members() for sequences of T tokens; the
// two workspaces as `be` sizes them.
std::vector<int64_t> BufferCounts(const ModelConfig& c, int64_t T,
                                  int64_t chunk, const Backend& be) {
  const int64_t H = c.hidden_size, L = c.num_layers, I = c.intermediate_size;
  const int64_t half = c.rope.rotary_dim / 2;
  int64_t qkv = 0, z = 0, E = 0, K = 0, Ie = 0;
  for (const LayerConfig& lc : MakeLayerConfigs(c)) {
    qkv = std::max(qkv, lc.qkv_width());
    z = std::max(z, lc.z_width());
    E = std::max(E, lc.num_experts);
    K = std::max(K, lc.experts_per_token);
    Ie = std::max(Ie, lc.expert_intermediate_size);
  }
  const int64_t R = T * K;  // routed rows
  int64_t gemm_ws = 0;
  // Every weight input (k) a backward GEMM reads, with at most T rows (an
  // expert's: at most T k).
  for (int64_t k : {H, I, z, Ie}) {
    WeightOperand w;
    w.n = std::max({c.vocab_size, H, 2 * I, qkv, 2 * Ie, E});
    w.k = k;
    gemm_ws =
        std::max(gemm_ws, be.GemmBackwardWorkspaceBytes(w, std::max(T, R)));
  }
  int64_t proj_ws = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    proj_ws = std::max(proj_ws, be.Costs().gemm_workspace(T, H, t) + 64);
  AttentionOp a;
  a.max_seq_len = T;
  const int64_t attn_ws = be.AttentionBackwardWorkspaceBytes(a);
  const int64_t C = std::min(chunk, T);
  int64_t head_ws = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    head_ws = std::max(head_ws, be.Costs().gemm_workspace(C, H, t) + 64);
  auto floats = [](int64_t bytes) { return (bytes + 3) / 4; };
  return {(L + 1) * T * H,
          T * H,
          T * H,
          T * H,
          T * H,
          T * H,
          T * H,
          T * H,
          T * qkv,
          T * 2 * I,
          T * half,
          T * half,
          T * qkv,
          T * qkv,
          T * z,
          T * 2 * I,
          T * I,
          T * std::max(qkv, I),
          C * c.vocab_size,
          floats(gemm_ws),
          floats(attn_ws),
          floats(head_ws),
          T * H,
          T * qkv,
          T * qkv,
          T * qkv,
          floats(proj_ws),
          T * E,
          R,
          R * 2 * Ie,
          R * H,
          R * H,
          R * Ie,
          R * 2 * Ie,
          T * E,
          R,
          c.vocab_size};
}

}  // namespace

int64_t BackwardBytes(const ModelConfig& c, int64_t tokens,
                      int64_t logits_chunk_rows, const Backend& be) {
  int64_t n = 0;
  for (int64_t v : BufferCounts(c, tokens, logits_chunk_rows, be)) n += v;
  int64_t E = 0, K = 0;
  for (const LayerConfig& lc : MakeLayerConfigs(c)) {
    E = std::max(E, lc.num_experts);
    K = std::max(K, lc.experts_per_token);
  }
  n += E + 1 + tokens * K;  // expert offsets and rows (i32)
  n += 2 * tokens;          // the routing sums (f64)
  return n * static_cast<int64_t>(sizeof(float));
}

HookSet BackwardTappedHooks(const ModelConfig& c, const HookSet& captured) {
  HookSet tapped;
  auto add = [&](const HookPoint& h) {
    if (!captured.Contains(h)) tapped.Add(h);
  };
  for (int64_t l = 0; l < c.num_layers; ++l)
    add(HookPoint{HookSite::kResidPre, l});
  add(HookPoint{HookSite::kResidPost, c.num_layers - 1});
  return tapped;
}

int64_t PlannedBackwardBytes(const ModelConfig& c, int64_t tokens,
                             int64_t logits_chunk_rows) {
  StatusOr<std::unique_ptr<Backend>> cpu = CreateBackend("cpu");
  LOOM_CHECK(cpu.ok()) << cpu.status().ToString();
  return BackwardBytes(c, tokens, logits_chunk_rows, **cpu);
}

// Copies what the layer's backward reads, after the steps that wrote it.
class Backward::Tape : public StepTap {
 public:
  Tape(const ModelConfig& c, Buffers* b) : c_(c), b_(b) {}
  void set_layer(const LayerConfig* lc) { lc_ = lc; }
  Status AfterStep(const ProgramStep& step, int64_t /*layer*/,
                   const Batch& batch, const Arena& a) override {
    const int64_t T = batch.num_tokens(), H = c_.hidden_size;
    const LayerConfig& lc = *lc_;
    auto copy = [&](BufferId id, std::vector<float>& to, int64_t n) {
      const float* from = a.as<float>(id);
      std::copy(from, from + n, to.begin());
    };
    switch (step.id) {
      case StepId::kAttention:  // q and k rotated in place by now
        copy(BufferId::kQkv, b_->qkv, T * lc.qkv_width());
        if (lc.rope_half > 0) {
          const int64_t half = c_.rope.rotary_dim / 2;
          const int64_t table = lc.rope_table * T * half;  // rope_local's
          const float* cos = a.as<float>(BufferId::kRopeCos) + table;
          std::copy(cos, cos + T * half, b_->cos.begin());
          const float* sin = a.as<float>(BufferId::kRopeSin) + table;
          for (int64_t i = 0; i < T * half; ++i) b_->neg_sin[i] = -sin[i];
        }
        break;
      case StepId::kQkvProj:  // the input, for q/k before their norms
        if (lc.qk_norm != QkNormKind::kNone)
          copy(step.reads[0], b_->qk_in, T * H);
        break;
      case StepId::kOProj:
        if (lc.post_attn_norm) copy(BufferId::kAttnOut, b_->attn_out, T * H);
        break;
      case StepId::kRouter:
        copy(BufferId::kRouterLogits, b_->router_logits, T * lc.num_experts);
        break;
      case StepId::kExpertGather: {
        const int64_t R = T * lc.experts_per_token;
        copy(BufferId::kExpertRowWeights, b_->row_weights, R);
        const int32_t* off = a.as<int32_t>(BufferId::kExpertOffsets);
        std::copy(off, off + lc.num_experts + 1, b_->expert_offsets.begin());
        const int32_t* rows = a.as<int32_t>(BufferId::kExpertRows);
        std::copy(rows, rows + R, b_->expert_rows.begin());
        break;
      }
      case StepId::kExpertGateUp:
        copy(BufferId::kExpertGateUp, b_->expert_gu,
             T * lc.experts_per_token * 2 * lc.expert_intermediate_size);
        break;
      case StepId::kExpertDown:
        copy(BufferId::kExpertOut, b_->expert_out,
             T * lc.experts_per_token * H);
        break;
      case StepId::kExpertScatterAdd:
        if (lc.post_mlp_norm) copy(BufferId::kMlpOut, b_->mlp_out, T * H);
        break;
      case StepId::kAttnResidualAdd:
        copy(BufferId::kResidual, b_->resid_mid, T * H);
        break;
      case StepId::kUpProj:
        copy(step.writes[0], b_->mlp_pre,
             T * c_.intermediate_size * (lc.mlp == MlpKind::kPlain ? 1 : 2));
        break;
      case StepId::kDownProj:
        if (lc.post_mlp_norm) copy(BufferId::kMlpOut, b_->mlp_out, T * H);
        break;
      default:
        break;
    }
    return Status();
  }

 private:
  const ModelConfig& c_;
  Buffers* b_;
  const LayerConfig* lc_ = nullptr;
};

Backward::Backward(const Model& model, const BackwardOptions& options)
    : model_(model), c_(model.config()), options_(options) {}

Backward::~Backward() = default;

std::span<const float> Backward::last_logits() const {
  return buf_->last_logits;
}

int64_t Backward::buffer_bytes() const {
  int64_t n = 0;
  for (const std::vector<float>* v : buf_->members())
    n += static_cast<int64_t>(v->size());
  n += static_cast<int64_t>(buf_->expert_offsets.size() +
                            buf_->expert_rows.size());
  n += 2 * static_cast<int64_t>(route_sums_.size());  // f64
  return n * 4;                                       // f32 and i32
}

StatusOr<std::unique_ptr<Backward>> Backward::Create(
    const Model& model, const BackwardOptions& options) {
  const ModelConfig& c = model.config();
  if (model.compute_dtype() != DType::kF32)
    return UnimplementedError(
        "backward: gradients run at f32 (--precision f32); this model loaded "
        "at " +
        std::string(DTypeName(model.compute_dtype())));
  if (options.max_tokens < 1)
    return InvalidArgumentError("backward: max_tokens must be positive");
  RETURN_IF_ERROR(CheckBackwardSupported(c, options));
  std::unique_ptr<Backward> b(new Backward(model, options));
  ASSIGN_OR_RETURN(b->be_, CreateBackend("cpu"));
  HookSet hooks = options.act_hooks;
  const HookSet tapped = BackwardTappedHooks(c, hooks);
  for (const HookPoint& h : tapped.hooks()) hooks.Add(h);
  ExecutorOptions eo;
  eo.max_tokens = options.max_tokens;
  eo.max_seq_len = options.max_tokens;
  eo.logits_chunk_rows = options.logits_chunk_rows;
  eo.backend = b->be_.get();
  ASSIGN_OR_RETURN(b->executor_, Executor::Create(model, hooks, eo));
  b->buf_ = std::make_unique<Buffers>();
  const std::vector<int64_t> counts =
      BufferCounts(c, options.max_tokens, options.logits_chunk_rows, *b->be_);
  const std::vector<std::vector<float>*> members = b->buf_->members();
  for (size_t i = 0; i < members.size(); ++i)
    members[i]->assign(static_cast<size_t>(counts[i]), 0.0f);
  int64_t E = 0, K = 0;
  for (const LayerConfig& lc : MakeLayerConfigs(c)) {
    E = std::max(E, lc.num_experts);
    K = std::max(K, lc.experts_per_token);
  }
  b->buf_->expert_offsets.assign(static_cast<size_t>(E + 1), 0);
  b->route_sums_.assign(static_cast<size_t>(options.max_tokens), 0.0);
  b->buf_->expert_rows.assign(static_cast<size_t>(options.max_tokens * K), 0);
  return b;
}

Status Backward::Emit(GradientSink* grads, HookSite site, int64_t layer,
                      const float* rows, int64_t width, int64_t ld) {
  const HookPoint h{site, IsLayerSite(site) ? layer : -1};
  // Inject: a seed at this hook joins the gradient flowing on from here
  // (`rows` is the live buffer the backward continues with).
  if (seeds_ != nullptr)
    for (const GradInjection& seed : *seeds_) {
      if (!(seed.hook == h)) continue;
      float* live = const_cast<float*>(rows);
      for (int64_t t = 0; t < T_; ++t)
        for (int64_t j = 0; j < width; ++j)
          live[t * ld + j] += seed.rows[static_cast<size_t>(t * width + j)];
    }
  if (grads == nullptr || !options_.grad_hooks.Contains(h)) return Status();
  if (ld == width) return grads->OnGradient(h, rows, T_, width);
  // A strided part (q of q | k | v, gate of gate | up): a dense copy.
  float* dense = buf_->emit.data();
  for (int64_t t = 0; t < T_; ++t)
    std::copy(rows + t * ld, rows + t * ld + width, dense + t * width);
  return grads->OnGradient(h, dense, T_, width);
}

Status Backward::LinearBack(WeightRole w, int64_t layer, int64_t m,
                            const float* dy, int64_t ldy, float* dx,
                            int64_t ldx, bool accumulate) {
  GemmBackwardOp op;
  op.w = WeightOperandOf(model_.weights(), w, layer);
  op.dy = dy;
  op.ldy = ldy;
  op.m = m;
  op.dx = dx;
  op.ldx = ldx;
  op.accumulate = accumulate;
  op.workspace = buf_->gemm_ws.data();
  return be_->GemmBackwardInput(op);
}

Status Backward::NormBack(NormKind kind, float eps, float offset, WeightRole w,
                          int64_t layer, const float* x, const float* dy,
                          float* dx, bool accumulate) {
  NormBackwardOp op;
  op.x = x;
  op.dy = dy;
  op.dx = dx;
  op.rows = T_;
  op.dim = c_.hidden_size;
  if (kind != NormKind::kLayerNoAffine) {
    const TensorView& t = model_.weights().Require(w, layer);
    op.w = t.data;
    op.w_dtype = t.dtype;
    op.offset = offset;
  }
  op.eps = eps;
  op.layer_norm = IsLayerNorm(kind);
  op.freeze_scale = options_.freeze_norm_scale;
  op.accumulate = accumulate;
  return be_->NormBackward(op);
}

namespace {

// Keeps the residual stream at every layer boundary and hands the requested
// activations on.
class SaveSink : public HookSink {
 public:
  SaveSink(float* saved, int64_t T, int64_t H, int64_t L, const HookSet& acts,
           HookSink* next)
      : saved_(saved), T_(T), H_(H), L_(L), acts_(acts), next_(next) {}
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    int64_t slot = -1;
    if (hook.site == HookSite::kResidPre) slot = hook.layer;
    if (hook.site == HookSite::kResidPost && hook.layer == L_ - 1) slot = L_;
    if (slot >= 0) {
      const float* v = view.f32();
      for (int64_t r = 0; r < view.rows; ++r)
        std::copy(v + r * view.ld, v + r * view.ld + H_,
                  saved_ + (slot * T_ + row_begin + r) * H_);
    }
    if (next_ != nullptr && acts_.Contains(hook))
      return next_->OnActivation(hook, batch, seq, row_begin, view);
    return Status();
  }

 private:
  float* saved_;
  int64_t T_, H_, L_;
  const HookSet& acts_;
  HookSink* next_;
};

// logits = softcap(lm_head(h) / scaling): d raw = d logits * (1 - (l /
// cap)^2) / scaling, in place on `d` [rows, V] (l: the logits).
void HeadDerivative(const ModelConfig& c, const float* l, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = d[i];
    if (c.final_softcap > 0) {
      const float t = l[i] / c.final_softcap;
      v *= 1.0f - t * t;
    }
    d[i] = v / c.logits_scaling;
  }
}

}  // namespace

Status Backward::ForwardAndNorm(std::span<const int32_t> ids, HookSink* acts) {
  T_ = static_cast<int64_t>(ids.size());
  if (T_ < 1 || T_ > options_.max_tokens)
    return OutOfRangeError("backward: a sequence of " + std::to_string(T_) +
                           " tokens (planned for 1 to " +
                           std::to_string(options_.max_tokens) + ")");
  const int64_t H = c_.hidden_size, L = c_.num_layers;
  seq_start_[0] = 0;
  seq_start_[1] = T_;
  const Batch batch{ids, std::span<const int64_t>(seq_start_, 2)};
  SaveSink save(buf_->saved.data(), T_, H, L, options_.act_hooks, acts);
  RETURN_IF_ERROR(executor_->Forward(batch, &save));
  ComputeFinalNorm(c_, model_.weights(), *be_, false,
                   buf_->saved.data() + L * T_ * H, buf_->hidden.data(), T_);
  return Status();
}

StatusOr<Backward::Evaluation> Backward::Evaluate(std::span<const int32_t> ids,
                                                  bool with_logprob,
                                                  HookSink* acts) {
  RETURN_IF_ERROR(ForwardAndNorm(ids, acts));
  const int64_t H = c_.hidden_size, V = c_.vocab_size;
  Evaluation e;
  if (with_logprob) {
    if (T_ < 2)
      return InvalidArgumentError(
          "backward: the log-likelihood metric needs at least 2 tokens");
    ASSIGN_OR_RETURN(e.logprob, LogProb(ids, nullptr));
  }
  ComputeLogits(c_, model_.weights(), *be_, buf_->hidden.data() + (T_ - 1) * H,
                1, buf_->logits.data(), Aligned64(buf_->head_ws));
  e.last_logits.assign(buf_->logits.begin(), buf_->logits.begin() + V);
  return e;
}

StatusOr<double> Backward::Run(std::span<const int32_t> ids,
                               const GradMetric& metric, GradientSink* grads,
                               HookSink* acts, int64_t drop_layer) {
  if (metric.kind == GradMetricKind::kLogProb && ids.size() < 2)
    return InvalidArgumentError(
        "backward: the log-likelihood metric needs at least 2 tokens");
  if (drop_layer >= c_.num_layers)
    return InvalidArgumentError("backward: GradDrop layer " +
                                std::to_string(drop_layer) + " of " +
                                std::to_string(c_.num_layers));
  RETURN_IF_ERROR(ForwardAndNorm(ids, acts));
  drop_layer_ = drop_layer;
  StatusOr<double> value = BackwardFromSaved(ids, metric, grads);
  drop_layer_ = -1;
  return value;
}

StatusOr<double> Backward::BackwardFromSaved(std::span<const int32_t> ids,
                                             const GradMetric& metric,
                                             GradientSink* grads) {
  const int64_t H = c_.hidden_size;
  const Batch batch{ids, std::span<const int64_t>(seq_start_, 2)};
  double value = 0;
  if (seeds_ != nullptr) {  // no metric: the seeds alone, from the top
    float* dh = buf_->branch.data();
    std::fill(dh, dh + T_ * H, 0.0f);
    RETURN_IF_ERROR(Emit(grads, HookSite::kFinalNorm, -1, dh, H, H));
    RETURN_IF_ERROR(NormBack(c_.norm, c_.norm_eps, c_.norm_offset,
                             WeightRole::kFinalNorm, -1,
                             buf_->saved.data() + c_.num_layers * T_ * H, dh,
                             buf_->g.data(), false));
  } else {
    ASSIGN_OR_RETURN(value, SeedFromMetric(ids, metric, grads));
  }
  for (int64_t l = c_.num_layers - 1; l >= 0; --l)
    RETURN_IF_ERROR(LayerBackward(batch, l, grads));
  RETURN_IF_ERROR(Emit(grads, HookSite::kEmbed, -1, buf_->g.data(), H, H));
  if (c_.learned_positions)
    RETURN_IF_ERROR(Emit(grads, HookSite::kPosEmbed, -1, buf_->g.data(), H, H));
  return value;
}

Status Backward::Inject(std::span<const int32_t> ids,
                        const std::vector<std::vector<GradInjection>>& batches,
                        std::span<GradientSink* const> grads) {
  if (grads.size() != batches.size())
    return InvalidArgumentError("inject: " + std::to_string(batches.size()) +
                                " injections but " +
                                std::to_string(grads.size()) + " sinks");
  const int64_t T = static_cast<int64_t>(ids.size());
  for (size_t i = 0; i < batches.size(); ++i)
    for (const GradInjection& seed : batches[i]) {
      const std::string where =
          "inject[" + std::to_string(i) + "] at " + HookName(seed.hook) + ": ";
      if (!IsGradientSite(seed.hook.site))
        return InvalidArgumentError(where + "the hook has no gradient");
      RETURN_IF_ERROR(CheckHookExists(seed.hook, c_));
      ASSIGN_OR_RETURN(const int64_t width, HookWidth(seed.hook, c_));
      if (static_cast<int64_t>(seed.rows.size()) != T * width)
        return InvalidArgumentError(where + std::to_string(seed.rows.size()) +
                                    " values, expected " + std::to_string(T) +
                                    " tokens x " + std::to_string(width));
    }
  RETURN_IF_ERROR(ForwardAndNorm(ids, nullptr));
  for (size_t i = 0; i < batches.size(); ++i) {
    seeds_ = &batches[i];
    StatusOr<double> done = BackwardFromSaved(ids, GradMetric{}, grads[i]);
    seeds_ = nullptr;
    RETURN_IF_ERROR(done.status());
  }
  return Status();
}

namespace {

// Copies the residual stream after a layer's last step.
class LayerOutputTap : public StepTap {
 public:
  LayerOutputTap(const ProgramStep* last, float* out, int64_t n)
      : last_(last), out_(out), n_(n) {}
  Status AfterStep(const ProgramStep& step, int64_t /*layer*/,
                   const Batch& /*batch*/, const Arena& a) override {
    if (&step != last_) return Status();
    const float* x = a.as<float>(BufferId::kResidual);
    std::copy(x, x + n_, out_);
    return Status();
  }

 private:
  const ProgramStep* last_;
  float* out_;
  int64_t n_;
};

// Gauss-Legendre nodes and weights of `n` points on [0, 1] (Newton's
// iteration on the Legendre polynomial's roots, in double).
void GaussLegendre(int64_t n, std::vector<double>* x, std::vector<double>* w) {
  x->assign(static_cast<size_t>(n), 0.0);
  w->assign(static_cast<size_t>(n), 0.0);
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < n; ++i) {
    double t = std::cos(pi * (static_cast<double>(i) + 0.75) /
                        (static_cast<double>(n) + 0.5));
    double dp = 1.0;
    for (int it = 0; it < 100; ++it) {
      double p0 = 1.0, p1 = t;  // P_0, P_1
      for (int64_t k = 2; k <= n; ++k) {
        const double p2 = ((2.0 * k - 1) * t * p1 - (k - 1.0) * p0) / k;
        p0 = p1;
        p1 = p2;
      }
      const double pn = n == 1 ? t : p1, pn1 = n == 1 ? 1.0 : p0;
      dp = n * (t * pn - pn1) / (t * t - 1.0);
      const double step = pn / dp;
      t -= step;
      if (std::fabs(step) < 1e-15) break;
    }
    (*x)[static_cast<size_t>(i)] = (1.0 - t) / 2.0;  // [-1, 1] -> [0, 1]
    (*w)[static_cast<size_t>(i)] = 1.0 / ((1.0 - t * t) * dp * dp);
  }
}

}  // namespace

Status Backward::ForwardFromBlockInput(std::span<const int32_t> ids) {
  const int64_t T = T_, H = c_.hidden_size, L = c_.num_layers;
  const Batch batch{ids, std::span<const int64_t>(seq_start_, 2)};
  for (int64_t l = 0; l < L; ++l) {
    LayerOutputTap tap(&executor_->program().LayerSteps(l).back(),
                       buf_->saved.data() + (l + 1) * T * H, T * H);
    RETURN_IF_ERROR(executor_->ForwardLayer(
        batch, l, buf_->saved.data() + l * T * H, &tap));
  }
  ComputeFinalNorm(c_, model_.weights(), *be_, false,
                   buf_->saved.data() + L * T * H, buf_->hidden.data(), T);
  return Status();
}

StatusOr<Backward::IgResult> Backward::IntegratedGradients(
    std::span<const int32_t> ids, const GradMetric& metric, int64_t steps,
    int32_t baseline_id) {
  if (steps < 1 || steps > 4096)
    return InvalidArgumentError("integrated gradients: steps " +
                                std::to_string(steps) + " outside [1, 4096]");
  if (baseline_id < 0 || baseline_id >= c_.vocab_size)
    return OutOfRangeError(
        "integrated gradients: baseline token " + std::to_string(baseline_id) +
        " outside the vocabulary of " + std::to_string(c_.vocab_size));
  if (metric.kind == GradMetricKind::kLogProb && ids.size() < 2)
    return InvalidArgumentError(
        "backward: the log-likelihood metric needs at least 2 tokens");
  // The baseline's and the input's block inputs, and the path integral of
  // the gradient: one job's host copies, made before the path's forwards.
  const std::vector<int32_t> base_ids(ids.size(), baseline_id);
  RETURN_IF_ERROR(ForwardAndNorm(base_ids, nullptr));
  const int64_t T = T_, H = c_.hidden_size;
  IgResult r;
  ASSIGN_OR_RETURN(r.metric_baseline, SeedFromMetric(ids, metric, nullptr));
  const std::vector<float> x0(buf_->saved.begin(), buf_->saved.begin() + T * H);
  RETURN_IF_ERROR(ForwardAndNorm(ids, nullptr));
  const std::vector<float> x(buf_->saved.begin(), buf_->saved.begin() + T * H);
  ASSIGN_OR_RETURN(r.metric_input, SeedFromMetric(ids, metric, nullptr));
  std::vector<double> integral(static_cast<size_t>(T * H), 0.0);
  std::vector<double> alpha, weight;
  GaussLegendre(steps, &alpha, &weight);
  for (size_t k = 0; k < alpha.size(); ++k) {
    const float a = static_cast<float>(alpha[k]);
    for (int64_t i = 0; i < T * H; ++i)
      buf_->saved[i] = x0[i] + a * (x[i] - x0[i]);
    RETURN_IF_ERROR(ForwardFromBlockInput(ids));
    RETURN_IF_ERROR(BackwardFromSaved(ids, metric, nullptr).status());
    for (int64_t i = 0; i < T * H; ++i)
      integral[static_cast<size_t>(i)] += weight[k] * buf_->g[i];
  }
  r.attributions.resize(static_cast<size_t>(T * H));
  r.per_token.assign(static_cast<size_t>(T), 0.0);
  for (int64_t i = 0; i < T * H; ++i) {
    const size_t u = static_cast<size_t>(i);
    const double v = (static_cast<double>(x[u]) - x0[u]) * integral[u];
    r.attributions[u] = static_cast<float>(v);
    r.per_token[static_cast<size_t>(i / H)] += v;
  }
  return r;
}

StatusOr<double> Backward::LogProb(std::span<const int32_t> ids,
                                   float* d_hidden) {
  const int64_t T = T_, H = c_.hidden_size, V = c_.vocab_size;
  const int64_t C = static_cast<int64_t>(buf_->logits.size()) / V;
  float* logits = buf_->logits.data();
  double value = 0.0;
  for (int64_t r0 = 0; r0 < T - 1; r0 += C) {
    const int64_t rows = std::min(C, T - 1 - r0);
    ComputeLogits(c_, model_.weights(), *be_, buf_->hidden.data() + r0 * H,
                  rows, logits, Aligned64(buf_->head_ws));
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits + r * V;
      const int32_t target = ids[static_cast<size_t>(r0 + r + 1)];
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
      const double lse = mx + std::log(sum);
      value += row[target] - lse;
      if (d_hidden == nullptr) continue;
      // d = onehot(target) - softmax, through the head's softcap (which
      // reads the logit: each value is read before it is replaced).
      for (int64_t v = 0; v < V; ++v) {
        const float l = row[v];
        float d =
            (v == target ? 1.0f : 0.0f) - static_cast<float>(std::exp(l - lse));
        HeadDerivative(c_, &l, &d, 1);
        row[v] = d;
      }
    }
    if (d_hidden != nullptr)
      RETURN_IF_ERROR(LinearBack(WeightRole::kLmHead, -1, rows, logits, V,
                                 d_hidden + r0 * H, H, false));
  }
  return value;
}

StatusOr<double> Backward::SeedFromMetric(std::span<const int32_t> ids,
                                          const GradMetric& metric,
                                          GradientSink* grads) {
  const int64_t T = T_, H = c_.hidden_size, V = c_.vocab_size;
  const float* xL = buf_->saved.data() + c_.num_layers * T * H;
  const float* h = buf_->hidden.data();
  float* dh = buf_->branch.data();  // [T, H]
  float* logits = buf_->logits.data();
  std::fill(dh, dh + T * H, 0.0f);
  double value = 0.0;
  resolved_ = metric;
  if (metric.kind == GradMetricKind::kLogitDiff) {
    const int32_t wrong_checked = metric.wrong_from_argmax ? 0 : metric.wrong;
    if (metric.answer < 0 || metric.answer >= V || wrong_checked < 0 ||
        wrong_checked >= V)
      return OutOfRangeError("backward: answer " +
                             std::to_string(metric.answer) + " / wrong " +
                             std::to_string(metric.wrong) +
                             " outside the vocabulary of " + std::to_string(V));
    ComputeLogits(c_, model_.weights(), *be_, h + (T - 1) * H, 1, logits,
                  Aligned64(buf_->head_ws));
    std::copy(logits, logits + V, buf_->last_logits.begin());
    if (metric.wrong_from_argmax) {
      int32_t best = -1, runner = -1;  // ties to the lower id
      for (int32_t v = 0; v < V; ++v) {
        if (best < 0 || logits[v] > logits[best]) {
          runner = best;
          best = v;
        } else if (runner < 0 || logits[v] > logits[runner]) {
          runner = v;
        }
      }
      resolved_.wrong = best == metric.answer ? runner : best;
      resolved_.wrong_from_argmax = false;
    }
    const int32_t answer = resolved_.answer, wrong = resolved_.wrong;
    value = static_cast<double>(logits[answer]) - logits[wrong];
    // d logits = e_answer - e_wrong, then through the head's softcap.
    const float la = logits[answer], lw = logits[wrong];
    std::fill(logits, logits + V, 0.0f);
    float ga = 1.0f, gw = -1.0f;
    HeadDerivative(c_, &la, &ga, 1);
    HeadDerivative(c_, &lw, &gw, 1);
    logits[answer] += ga;
    logits[wrong] += gw;
    RETURN_IF_ERROR(LinearBack(WeightRole::kLmHead, -1, 1, logits, V,
                               dh + (T - 1) * H, H, false));
  } else {
    ASSIGN_OR_RETURN(value, LogProb(ids, dh));
  }
  RETURN_IF_ERROR(Emit(grads, HookSite::kFinalNorm, -1, dh, H, H));
  RETURN_IF_ERROR(NormBack(c_.norm, c_.norm_eps, c_.norm_offset,
                           WeightRole::kFinalNorm, -1, xL, dh, buf_->g.data(),
                           false));
  return value;
}

Status Backward::LayerBackward(const Batch& batch, int64_t l,
                               GradientSink* grads) {
  const LayerConfig& lc = executor_->program().layers[static_cast<size_t>(l)];
  const int64_t T = T_, H = c_.hidden_size;
  Tape tape(c_, buf_.get());
  tape.set_layer(&lc);
  const float* x = buf_->saved.data() + l * T * H;  // resid_pre
  RETURN_IF_ERROR(executor_->ForwardLayer(batch, l, x, &tape));
  float* g = buf_->g.data();  // d resid_post, then d resid_pre
  float* db = buf_->branch.data();
  float* din = buf_->d_in.data();
  // GradDrop: the branches' output gradient is 0 (the skip path only).
  const float m = l == drop_layer_ ? 0.0f : lc.residual_multiplier;
  RETURN_IF_ERROR(Emit(grads, HookSite::kResidPost, l, g, H, H));
  auto scaled = [&](const float* from) {
    for (int64_t i = 0; i < T * H; ++i) db[i] = m * from[i];
  };
  if (lc.parallel()) {
    // x + attn(ln1(x)) + mlp(ln2(x) or ln1(x)): both branches see d resid.
    scaled(g);
    RETURN_IF_ERROR(MlpBranch(l, db, din, grads));
    const bool shared = !lc.pre_mlp_norm;
    if (!shared) {
      RETURN_IF_ERROR(Emit(grads, HookSite::kLn2, l, din, H, H));
      RETURN_IF_ERROR(NormBack(lc.norm, lc.norm_eps, lc.norm_offset,
                               WeightRole::kMlpNorm, l, x, din, g, true));
      RETURN_IF_ERROR(AttentionBranch(batch, l, db, din, grads, false));
    } else {
      RETURN_IF_ERROR(AttentionBranch(batch, l, db, din, grads, true));
    }
    RETURN_IF_ERROR(Emit(grads, HookSite::kLn1, l, din, H, H));
    RETURN_IF_ERROR(NormBack(lc.norm, lc.norm_eps, lc.norm_offset,
                             WeightRole::kAttnNorm, l, x, din, g, true));
    return Emit(grads, HookSite::kResidPre, l, g, H, H);
  }
  // x1 = x + m post(attn(ln1(x))); x2 = x1 + m post(mlp(ln2(x1))).
  scaled(g);
  if (lc.post_mlp_norm) {
    RETURN_IF_ERROR(Emit(grads, HookSite::kLn2Post, l, db, H, H));
    RETURN_IF_ERROR(NormBack(lc.norm, lc.norm_eps, lc.norm_offset,
                             WeightRole::kPostMlpNorm, l, buf_->mlp_out.data(),
                             db, din, false));
    std::copy(din, din + T * H, db);
  }
  RETURN_IF_ERROR(MlpBranch(l, db, din, grads));
  if (lc.pre_mlp_norm) {
    RETURN_IF_ERROR(Emit(grads, HookSite::kLn2, l, din, H, H));
    RETURN_IF_ERROR(NormBack(lc.norm, lc.norm_eps, lc.norm_offset,
                             WeightRole::kMlpNorm, l, buf_->resid_mid.data(),
                             din, g, true));
  } else {
    for (int64_t i = 0; i < T * H; ++i) g[i] += din[i];
  }
  RETURN_IF_ERROR(Emit(grads, HookSite::kResidMid, l, g, H, H));
  scaled(g);
  if (lc.post_attn_norm) {
    RETURN_IF_ERROR(Emit(grads, HookSite::kLn1Post, l, db, H, H));
    RETURN_IF_ERROR(NormBack(lc.norm, lc.norm_eps, lc.norm_offset,
                             WeightRole::kPostAttnNorm, l,
                             buf_->attn_out.data(), db, din, false));
    std::copy(din, din + T * H, db);
  }
  RETURN_IF_ERROR(AttentionBranch(batch, l, db, din, grads, false));
  if (lc.pre_attn_norm) {
    RETURN_IF_ERROR(Emit(grads, HookSite::kLn1, l, din, H, H));
    RETURN_IF_ERROR(NormBack(lc.norm, lc.norm_eps, lc.norm_offset,
                             WeightRole::kAttnNorm, l, x, din, g, true));
  } else {
    for (int64_t i = 0; i < T * H; ++i) g[i] += din[i];
  }
  return Emit(grads, HookSite::kResidPre, l, g, H, H);
}

Status Backward::MlpBranch(int64_t l, const float* d_out, float* d_in,
                           GradientSink* grads) {
  const LayerConfig& lc = executor_->program().layers[static_cast<size_t>(l)];
  const int64_t T = T_, H = c_.hidden_size, I = c_.intermediate_size;
  RETURN_IF_ERROR(Emit(grads, HookSite::kMlpOut, l, d_out, H, H));
  if (lc.moe()) return MoeBranch(lc, d_out, d_in);
  float* dact = buf_->dact.data();  // [T, I]
  RETURN_IF_ERROR(
      LinearBack(WeightRole::kDown, l, T, d_out, H, dact, I, false));
  RETURN_IF_ERROR(Emit(grads, HookSite::kMlpPost, l, dact, I, I));
  const ActivationFn fn = ToActivationFn(lc.act);
  float* dm = buf_->dmlp.data();
  const float* pre = buf_->mlp_pre.data();
  if (lc.mlp == MlpKind::kPlain) {
    RETURN_IF_ERROR(be_->ActivationBackward(fn, pre, dact, dm, T * I));
    RETURN_IF_ERROR(Emit(grads, HookSite::kMlpPre, l, dm, I, I));
    return LinearBack(WeightRole::kUp, l, T, dm, I, d_in, H, false);
  }
  RETURN_IF_ERROR(be_->GatedActivationBackward(
      fn, pre, 2 * I, pre + I, 2 * I, dact, dm, 2 * I, dm + I, 2 * I, T, I));
  RETURN_IF_ERROR(Emit(grads, HookSite::kMlpPre, l, dm, I, 2 * I));
  if (lc.mlp == MlpKind::kGatedFused)
    return LinearBack(WeightRole::kGateUp, l, T, dm, 2 * I, d_in, H, false);
  RETURN_IF_ERROR(
      LinearBack(WeightRole::kGate, l, T, dm, 2 * I, d_in, H, false));
  return LinearBack(WeightRole::kUp, l, T, dm + I, 2 * I, d_in, H, true);
}

Status Backward::AttentionBranch(const Batch& batch, int64_t l,
                                 const float* d_out, float* d_in,
                                 GradientSink* grads, bool accumulate) {
  const LayerConfig& lc = executor_->program().layers[static_cast<size_t>(l)];
  const int64_t T = T_, H = c_.hidden_size;
  const int64_t Q = lc.q_width(), KV = lc.k_width(), ld = lc.qkv_width();
  const int64_t Z = lc.z_width(), hd = lc.head_dim;
  RETURN_IF_ERROR(Emit(grads, HookSite::kAttnOut, l, d_out, H, H));
  float* dz = buf_->dz.data();
  RETURN_IF_ERROR(LinearBack(WeightRole::kO, l, T, d_out, H, dz, Z, false));
  RETURN_IF_ERROR(Emit(grads, HookSite::kZ, l, dz, Z, Z));
  const float* q = buf_->qkv.data();
  float* dq = buf_->dqkv.data();
  AttentionBackwardOp op;
  AttentionOp& f = op.fwd;
  f.q = q;
  f.k = q + Q;
  f.v = q + Q + KV;
  f.q_rs = f.k_rs = f.v_rs = ld;
  f.seq_start = batch.seq_start.data();
  f.num_seqs = batch.num_seqs();
  f.max_seq_len = T;
  f.q_heads = lc.q_heads;
  f.kv_heads = lc.kv_heads;
  f.head_dim = hd;
  f.v_head_dim = lc.v_head_dim;
  f.scale = lc.attn_scale;
  f.softcap = lc.attn_softcap;
  f.window = lc.window;
  if (lc.attn_sinks) {
    const TensorView& sinks =
        model_.weights().Require(WeightRole::kAttnSinks, l);
    f.sinks = sinks.data;
    f.sinks_dtype = sinks.dtype;
  }
  op.dz = dz;
  op.dq = dq;
  op.dk = dq + Q;
  op.dv = dq + Q + KV;
  op.freeze_pattern = options_.freeze_attn_pattern;
  op.workspace = buf_->attn_ws.data();
  RETURN_IF_ERROR(be_->AttentionBackward(op));
  RETURN_IF_ERROR(Emit(grads, HookSite::kV, l, dq + Q + KV, KV, ld));
  if (lc.rope_half > 0) {
    RETURN_IF_ERROR(Emit(grads, HookSite::kRotQ, l, dq, Q, ld));
    RETURN_IF_ERROR(Emit(grads, HookSite::kRotK, l, dq + Q, KV, ld));
    // A rotation's transpose is the rotation by -theta.
    const float* cos = buf_->cos.data();
    const float* nsin = buf_->neg_sin.data();
    const int64_t r0 = lc.rope_offset;
    if (lc.rope.rotate_pairs) {
      RETURN_IF_ERROR(be_->ApplyRopePairs(dq + r0, T, lc.q_heads, hd, ld, cos,
                                          nsin, lc.rope_half));
      RETURN_IF_ERROR(be_->ApplyRopePairs(dq + Q + r0, T, lc.kv_heads, hd, ld,
                                          cos, nsin, lc.rope_half));
    } else {
      be_->ApplyRope(dq + r0, T, lc.q_heads, hd, ld, cos, nsin, lc.rope_half);
      be_->ApplyRope(dq + Q + r0, T, lc.kv_heads, hd, ld, cos, nsin,
                     lc.rope_half);
    }
  }
  RETURN_IF_ERROR(Emit(grads, HookSite::kQ, l, dq, Q, ld));
  RETURN_IF_ERROR(Emit(grads, HookSite::kK, l, dq + Q, KV, ld));
  if (lc.qk_norm != QkNormKind::kNone) RETURN_IF_ERROR(QkNormBack(lc));
  if (lc.fused_qkv && lc.qkv_layout == QkvLayout::kPerHead) {
    // The forward regrouped per-head [q_h | k_h | v_h] into q | k | v; the
    // inverse regrouping (parts and groups swapped) restores that order.
    float* fused = buf_->dfused.data();
    be_->DeinterleaveBlocks(dq, ld, T, 3, lc.q_heads, hd, fused, ld);
    return LinearBack(WeightRole::kQkv, l, T, fused, ld, d_in, H, accumulate);
  }
  if (lc.fused_qkv)
    return LinearBack(WeightRole::kQkv, l, T, dq, ld, d_in, H, accumulate);
  RETURN_IF_ERROR(
      LinearBack(WeightRole::kQ, l, T, dq, ld, d_in, H, accumulate));
  RETURN_IF_ERROR(LinearBack(WeightRole::kK, l, T, dq + Q, ld, d_in, H, true));
  return LinearBack(WeightRole::kV, l, T, dq + Q + KV, ld, d_in, H, true);
}

Status Backward::QkNormBack(const LayerConfig& lc) {
  // q = norm(x Wq^T + bq) per head (or over the whole row); its VJP needs
  // q before the norm: the projection again from its taped input.
  const int64_t T = T_, H = c_.hidden_size, l = lc.layer;
  const int64_t Q = lc.q_width(), KV = lc.k_width(), ld = lc.qkv_width();
  const bool per_head = lc.qk_norm == QkNormKind::kPerHead;
  const struct {
    WeightRole w, bias, norm;
    float* pre;
    float* d;  // in dqkv, row stride ld
    int64_t width, heads;
  } parts[] = {{WeightRole::kQ, WeightRole::kQBias, WeightRole::kQNorm,
                buf_->q_pre.data(), buf_->dqkv.data(), Q, lc.q_heads},
               {WeightRole::kK, WeightRole::kKBias, WeightRole::kKNorm,
                buf_->k_pre.data(), buf_->dqkv.data() + Q, KV, lc.kv_heads}};
  for (const auto& p : parts) {
    GemmOp op;
    op.w = WeightOperandOf(model_.weights(), p.w, l);
    const BiasOperand b = BiasOf(model_.weights(), p.bias, l);
    op.bias = b.data;
    op.bias_dtype = b.dtype;
    op.x = buf_->qk_in.data();
    op.m = T;
    op.y = p.pre;
    op.ldy = p.width;
    op.workspace = Aligned64(buf_->proj_ws);
    be_->Gemm(op);
    float* dense = buf_->dnorm.data();  // [T, width]
    for (int64_t t = 0; t < T; ++t)
      std::copy(p.d + t * ld, p.d + t * ld + p.width, dense + t * p.width);
    const TensorView& w = model_.weights().Require(p.norm, l);
    NormBackwardOp n;
    n.x = p.pre;
    n.dy = dense;
    n.dx = dense;
    n.dim = per_head ? lc.head_dim : p.width;
    n.rows = T * p.width / n.dim;
    n.w = w.data;
    n.w_dtype = w.dtype;
    n.offset = lc.norm_offset;  // Gemma 3's (1 + w) q/k norms
    n.eps = lc.norm_eps;
    n.freeze_scale = options_.freeze_norm_scale;
    RETURN_IF_ERROR(be_->NormBackward(n));
    for (int64_t t = 0; t < T; ++t)
      std::copy(dense + t * p.width, dense + (t + 1) * p.width, p.d + t * ld);
  }
  (void)H;
  return Status();
}

Status Backward::MoeBranch(const LayerConfig& lc, const float* d_out,
                           float* d_in) {
  // out[t] = sum over t's routed rows i of w_i E_e(i)(x[t]), w = s q with q
  // softmax(router logits) over the k chosen (norm_topk_prob) or over all.
  const int64_t T = T_, H = c_.hidden_size, l = lc.layer;
  const int64_t E = lc.num_experts, K = lc.experts_per_token;
  const int64_t Ie = lc.expert_intermediate_size, R = T * K;
  const int32_t* off = buf_->expert_offsets.data();
  const int32_t* rows = buf_->expert_rows.data();
  const float* w = buf_->row_weights.data();
  const float* out = buf_->expert_out.data();
  float* d_rows = buf_->d_rows.data();  // [R, H]
  float* dw = buf_->d_weight.data();    // [R]
  for (int64_t i = 0; i < R; ++i) {
    const float* g = d_out + static_cast<int64_t>(rows[i]) * H;
    double dot = 0.0;
    for (int64_t c = 0; c < H; ++c) {
      d_rows[i * H + c] = w[i] * g[c];
      dot += static_cast<double>(g[c]) * out[i * H + c];
    }
    dw[i] = static_cast<float>(dot);
  }
  // Each expert's rows: down, the gated activation, gate and up.
  const ActivationFn fn = ToActivationFn(lc.act);
  float* da = buf_->d_eact.data();  // [R, Ie]
  float* dgu = buf_->d_egu.data();  // [R, 2 Ie]
  const float* gu = buf_->expert_gu.data();
  auto expert_back = [&](WeightRole role, int64_t e, const float* dy,
                         int64_t ldy, float* dx, int64_t ldx, bool accumulate) {
    GemmBackwardOp op;
    op.w = WeightOperandOf(model_.weights(), role, l, e);
    op.dy = dy;
    op.ldy = ldy;
    op.m = off[e + 1] - off[e];
    op.dx = dx;
    op.ldx = ldx;
    op.accumulate = accumulate;
    op.workspace = buf_->gemm_ws.data();
    return be_->GemmBackwardInput(op);
  };
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    RETURN_IF_ERROR(expert_back(WeightRole::kExpertDown, e, d_rows + r0 * H, H,
                                da + r0 * Ie, Ie, false));
    if (lc.expert_act == ExpertActKind::kClampedSwigluInterleaved) {
      // gpt-oss: gate | up interleaved in one fused weight.
      RETURN_IF_ERROR(be_->ClampedSwigluBackward(
          gu + r0 * 2 * Ie, 2 * Ie, da + r0 * Ie, dgu + r0 * 2 * Ie, 2 * Ie, n,
          Ie, lc.swiglu_alpha, lc.swiglu_limit));
      RETURN_IF_ERROR(expert_back(WeightRole::kExpertGateUp, e,
                                  dgu + r0 * 2 * Ie, 2 * Ie, d_rows + r0 * H, H,
                                  false));
      continue;
    }
    RETURN_IF_ERROR(be_->GatedActivationBackward(
        fn, gu + r0 * 2 * Ie, 2 * Ie, gu + r0 * 2 * Ie + Ie, 2 * Ie,
        da + r0 * Ie, dgu + r0 * 2 * Ie, 2 * Ie, dgu + r0 * 2 * Ie + Ie, 2 * Ie,
        n, Ie));
    // d in rows (over d_rows, whose d out is no longer needed).
    RETURN_IF_ERROR(expert_back(WeightRole::kExpertGate, e, dgu + r0 * 2 * Ie,
                                2 * Ie, d_rows + r0 * H, H, false));
    RETURN_IF_ERROR(expert_back(WeightRole::kExpertUp, e,
                                dgu + r0 * 2 * Ie + Ie, 2 * Ie, d_rows + r0 * H,
                                H, true));
  }
  // d x = the rows' d in, scattered in expert order (a fixed order).
  std::fill(d_in, d_in + T * H, 0.0f);
  for (int64_t i = 0; i < R; ++i) {
    float* to = d_in + static_cast<int64_t>(rows[i]) * H;
    for (int64_t c = 0; c < H; ++c) to[c] += d_rows[i * H + c];
  }
  // The router: d q = s d w; d logits through the softmax.
  float* dl = buf_->d_route.data();  // [T, E]
  std::fill(dl, dl + T * E, 0.0f);
  const float s = lc.routed_scaling_factor;
  std::vector<double>& sums = route_sums_;  // [T], sized at Create
  std::fill(sums.begin(), sums.end(), 0.0);
  auto expert_of = [&](int64_t i) {
    return static_cast<int64_t>(std::upper_bound(off, off + E + 1, i) - off) -
           1;
  };
  for (int64_t i = 0; i < R; ++i)
    sums[static_cast<size_t>(rows[i])] +=
        static_cast<double>(w[i] / s) * (s * dw[i]);
  // q = softmax over the chosen logits (renormalised, or gpt-oss's top-k
  // then softmax: the same function of the chosen logits).
  if (lc.norm_topk_prob || lc.router == RouterKind::kTopKSoftmax) {
    for (int64_t i = 0; i < R; ++i) {
      const double q = w[i] / s;
      dl[rows[i] * E + expert_of(i)] = static_cast<float>(
          q * (s * dw[i] - sums[static_cast<size_t>(rows[i])]));
    }
  } else {  // q = softmax over every logit: p from the taped logits
    const float* lg = buf_->router_logits.data();
    for (int64_t t = 0; t < T; ++t) {
      double mx = lg[t * E];
      for (int64_t e = 1; e < E; ++e) mx = std::max<double>(mx, lg[t * E + e]);
      double z = 0.0;
      for (int64_t e = 0; e < E; ++e) z += std::exp(lg[t * E + e] - mx);
      for (int64_t e = 0; e < E; ++e)
        dl[t * E + e] = static_cast<float>(-std::exp(lg[t * E + e] - mx) / z *
                                           sums[static_cast<size_t>(t)]);
    }
    for (int64_t i = 0; i < R; ++i)
      dl[rows[i] * E + expert_of(i)] +=
          static_cast<float>(static_cast<double>(w[i] / s) * (s * dw[i]));
  }
  return LinearBack(WeightRole::kRouter, l, T, dl, E, d_in, H, true);
}

}  // namespace loom
