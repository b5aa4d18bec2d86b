#include "src/runtime/executor.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "src/backend/registry.h"
#include "src/base/float16.h"
#include "src/model/rope.h"

namespace loom {
namespace {

// An f32 view of `rows` rows of `cols` values, `ld` apart, in the memory of
// backend `be`.
ActivationView F32View(const Backend& be, const float* data, int64_t rows,
                       int64_t cols, int64_t ld) {
  ActivationView v;
  v.data = data;
  v.dtype = DType::kF32;
  v.device = be.device();
  v.rows = rows;
  v.cols = cols;
  v.ld = ld;
  return v;
}

// The q (or k) norm of layer lc in place on x [T, heads * head_dim] (row
// stride ld), before RoPE: over each head with one shared weight, over each
// head with its own (StableLM, bound as expert h), or over the whole
// projection; RMSNorm, or LayerNorm with the bias role when lc has one.
void QkNorm(const BoundWeights& w, Backend& be, const LayerConfig& lc,
            WeightRole gain, WeightRole bias, float* x, int64_t T, int64_t ld,
            int64_t heads) {
  const int64_t hd = lc.head_dim, l = lc.layer;
  auto norm = [&](const TensorView& g, const TensorView* b, float* at,
                  int64_t groups, int64_t dim) {
    if (lc.qk_norm_type == NormKind::kLayer) {
      be.LayerNormRows(at, T, ld, groups, dim, g.data, b ? b->data : nullptr,
                       g.dtype, lc.norm_eps);
    } else {
      be.RmsNormRows(at, T, ld, groups, dim, g.data, g.dtype, lc.norm_offset,
                     lc.norm_eps);
    }
  };
  switch (lc.qk_norm) {
    case QkNormKind::kNone:
      return;
    case QkNormKind::kPerHeadOwn:
      for (int64_t h = 0; h < heads; ++h) {
        // Bound per head (StableLM), or row h of one [heads, hd] tensor
        // (Cohere).
        TensorView g;
        if (const TensorView* own = w.Get(gain, l, h)) {
          g = *own;
        } else {
          g = w.Require(gain, l);
          g.data = static_cast<char*>(g.data) + h * hd * DTypeSize(g.dtype);
        }
        norm(g, lc.qk_norm_bias ? &w.Require(bias, l, h) : nullptr, x + h * hd,
             1, hd);
      }
      return;
    case QkNormKind::kPerHead:
    case QkNormKind::kFull: {
      const bool per_head = lc.qk_norm == QkNormKind::kPerHead;
      norm(w.Require(gain, l), lc.qk_norm_bias ? &w.Require(bias, l) : nullptr,
           x, per_head ? heads : 1, per_head ? hd : heads * hd);
      return;
    }
  }
}

}  // namespace

Executor::Executor(const Model& model, const HookSet& hooks,
                   const ExecutorOptions& options)
    : model_(model), c_(model.config()), hooks_(hooks), options_(options) {}

Executor::~Executor() = default;

int64_t Executor::arena_bytes() const {
  int64_t total = 0;
  for (const Device& d : devices_) total += d.bytes();
  return total;
}

std::vector<Backend*> Executor::LayerBackends() const {
  std::vector<Backend*> out(static_cast<size_t>(last_layer_ + 1), nullptr);
  for (const Device& d : devices_)
    for (int64_t l = d.first_layer; l <= d.last_layer; ++l)
      out[static_cast<size_t>(l)] = d.backend;
  return out;
}

int64_t Executor::staged_weight_bytes() const {
  int64_t total = 0;
  for (const Device& d : devices_)
    if (d.uploaded) total += d.uploaded->staged_bytes();
  return total;
}

int64_t Executor::uploaded_weight_bytes() const {
  int64_t total = 0;
  for (const Device& d : devices_)
    if (d.uploaded) total += d.uploaded->bytes();
  return total;
}

void ComputeLogits(const ModelConfig& c, const BoundWeights& weights,
                   Backend& backend, const float* hidden, int64_t rows,
                   float* logits, void* workspace) {
  GemmOp op;
  op.w = WeightOperandOf(weights, WeightRole::kLmHead, -1);
  LOOM_CHECK(op.w.n == c.vocab_size && op.w.k == c.hidden_size)
      << "lm_head shape " << op.w.n << "x" << op.w.k;
  const BiasOperand bias = BiasOf(weights, WeightRole::kLmHeadBias, -1);
  op.bias = bias.data;  // [V] (Phi); null: none
  op.bias_dtype = bias.dtype;
  op.x = hidden;
  op.m = rows;
  op.y = logits;
  op.ldy = c.vocab_size;
  op.workspace = workspace;
  backend.Gemm(op);
  // Granite divides the logits by logits_scaling (here: times its reciprocal,
  // within an ulp of the quotient).
  if (c.logits_scaling != 1.0f)
    backend.Scale(logits, rows * c.vocab_size, 1.0f / c.logits_scaling);
  if (c.final_softcap > 0)
    backend.Softcap(logits, rows * c.vocab_size, c.final_softcap);
}

void ApplyNorm(NormKind kind, float eps, float offset, const TensorView* w,
               const TensorView* b, bool hf_bf16, Backend& be, const float* x,
               float* y, int64_t rows, int64_t dim) {
  const DType wd = w ? w->dtype : DType::kF32;
  switch (kind) {
    case NormKind::kRms:
      if (hf_bf16 && w != nullptr && offset == 0.0f &&
          w->dtype == DType::kBF16) {
        // HF's Llama-style RMSNorm: weight * normalized.to(bf16), two
        // roundings.
        be.RmsNormBf16(x, w->data, eps, y, rows, dim);
      } else {
        be.RmsNorm(x, w ? w->data : nullptr, wd, offset, eps, y, rows, dim);
      }
      break;
    case NormKind::kLayer:
      be.LayerNorm(x, w ? w->data : nullptr, b ? b->data : nullptr, wd, offset,
                   eps, y, rows, dim);
      break;
    case NormKind::kLayerNoAffine:
      be.LayerNorm(x, nullptr, nullptr, wd, 0.0f, eps, y, rows, dim);
      break;
  }
}

void ComputeFinalNorm(const ModelConfig& c, const BoundWeights& weights,
                      Backend& backend, bool hf_bf16, const float* x, float* y,
                      int64_t rows) {
  ApplyNorm(c.norm, c.norm_eps, c.norm_offset,
            weights.Get(WeightRole::kFinalNorm, -1),
            weights.Get(WeightRole::kFinalNormBias, -1), hf_bf16, backend, x, y,
            rows, c.hidden_size);
}

void AddSequenceEdits(const std::vector<Intervention>& list, int64_t row,
                      int64_t seq, int64_t length,
                      std::vector<SequenceEdit>* edits) {
  for (const Intervention& iv : list)
    if (AppliesToRow(iv, row) && iv.edits_prompt())
      edits->push_back({seq, length, &iv});
}

void AddGeneratedEdits(const std::vector<Intervention>& list, int64_t row,
                       int64_t seq, int64_t length,
                       std::vector<SequenceEdit>* edits) {
  for (const Intervention& iv : list)
    if (AppliesToRow(iv, row) && iv.edits_generated())
      edits->push_back({seq, length, &iv, /*every_position=*/true});
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
  ex->program_ = BuildProgram(c);

  // The segments: the given placement, or every layer on one backend.
  std::vector<ExecutorSegment> segments = o.segments;
  if (segments.empty()) {
    Backend* b = o.backend;
    if (b == nullptr) {
      ASSIGN_OR_RETURN(ex->owned_backend_, CreateBackend("cpu"));
      b = ex->owned_backend_.get();
    }
    segments.push_back({b, 0, c.num_layers - 1});
  }
  int64_t next = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ExecutorSegment& s = segments[i];
    if (s.backend == nullptr)
      return InvalidArgumentError("executor: segment " + std::to_string(i) +
                                  " has no backend");
    if (s.first_layer != next || s.last_layer < s.first_layer)
      return InvalidArgumentError(
          "executor: segment " + std::to_string(i) + " covers layers [" +
          std::to_string(s.first_layer) + ", " + std::to_string(s.last_layer) +
          "]; segments must be contiguous and non-empty from layer " +
          std::to_string(next));
    const int64_t max_experts = s.backend->Capabilities().max_route_experts;
    for (int64_t l = s.first_layer; l <= s.last_layer; ++l) {
      const LayerConfig& lc = ex->program_.layers[static_cast<size_t>(l)];
      if (lc.moe() && lc.num_experts > max_experts)
        return UnimplementedError(
            "executor: layer " + std::to_string(l) + " of " + c.model_type +
            " has " + std::to_string(lc.num_experts) + " experts; backend '" +
            std::string(s.backend->name()) + "' routes at most " +
            std::to_string(max_experts));
    }
    next = s.last_layer + 1;
  }
  if (next != std::max<int64_t>(c.num_layers, 1) && c.num_layers > 0)
    return InvalidArgumentError("executor: the segments cover layers [0, " +
                                std::to_string(next - 1) + "] of " +
                                std::to_string(c.num_layers));

  // Every device's arenas follow the one plan (the planner gives each
  // computing device the same activation and workspace arenas, and the
  // logits chunk to the device running the head). The costs are the first
  // device's: the placement is of one kind of backend.
  const KernelCosts costs = segments.front().backend->Costs();
  for (const ExecutorSegment& s : segments)
    if (s.backend->Costs().activation_dtype != costs.activation_dtype)
      return InvalidArgumentError(
          "executor: segments on backends with different activation dtypes");
  ex->layout_ = PlanActivations(c, MakeJob(model, hooks, o), costs);
  const bool runs_head = hooks.NeedsFinalNorm();
  for (size_t i = 0; i < segments.size(); ++i) {
    const ExecutorSegment& s = segments[i];
    if (s.first_layer > std::max<int64_t>(ex->last_layer_, 0)) break;
    Device d;
    d.backend = s.backend;
    d.first_layer = s.first_layer;
    d.last_layer = std::min(s.last_layer, ex->last_layer_);
    d.host_memory = d.backend->device().kind == DeviceKind::kCpu;
    d.offload = s.offload;
    if (d.offload) {
      WeightSelection sel;
      sel.first_layer = d.first_layer;
      sel.last_layer = d.last_layer;
      sel.embed = i == 0;
      sel.head = runs_head && (i + 1 == segments.size() ||
                               segments[i + 1].first_layer > ex->last_layer_);
      StatusOr<std::unique_ptr<Backend>> copier = d.backend->NewInstance();
      if (!copier.ok())
        return FailedPreconditionError(
            "executor: offload segment " + std::to_string(i) +
            ": cannot make the copier instance of '" +
            std::string(d.backend->name()) + "': " + copier.status().message());
      d.copier = std::move(*copier);
      ASSIGN_OR_RETURN(DeviceWeights w, DeviceWeights::UploadStreamed(
                                            model.weights(), sel, *d.backend));
      d.uploaded = std::make_unique<DeviceWeights>(std::move(w));
      d.weights = &d.uploaded->weights();
    } else if (d.host_memory) {
      d.weights = &model.weights();
    } else {
      WeightSelection sel;
      sel.first_layer = d.first_layer;
      sel.last_layer = d.last_layer;
      sel.embed = i == 0;
      sel.head = runs_head && (i + 1 == segments.size() ||
                               segments[i + 1].first_layer > ex->last_layer_);
      ASSIGN_OR_RETURN(DeviceWeights w,
                       DeviceWeights::Upload(model.weights(), sel, *d.backend));
      d.uploaded = std::make_unique<DeviceWeights>(std::move(w));
      d.weights = &d.uploaded->weights();
    }
    if (!ex->devices_.empty() && ex->devices_.back().backend == d.backend) {
      d.shares_arenas = true;
      d.activations = ex->devices_.back().activations;
      d.workspace = ex->devices_.back().workspace;
    } else {
      ASSIGN_OR_RETURN(d.activations,
                       Arena::Allocate(ex->layout_.activations, *d.backend));
      ASSIGN_OR_RETURN(d.workspace,
                       Arena::Allocate(ex->layout_.workspace, *d.backend));
    }
    if (const int i = ex->layout_.workspace.Find(BufferId::kGemmScratchpad);
        i >= 0)
      d.backend->SetGemmScratchpad(
          d.workspace.region(BufferId::kGemmScratchpad),
          ex->layout_.workspace.regions[static_cast<size_t>(i)].bytes);
    if (const int i = ex->layout_.workspace.Find(BufferId::kWeightDecode);
        i >= 0)
      d.backend->SetWeightDecodeWorkspace(
          d.workspace.region(BufferId::kWeightDecode),
          ex->layout_.workspace.regions[static_cast<size_t>(i)].bytes);
    // Host layers resident for the job: their GEMM weights in the layout the
    // backend reads best (the CPU's bf16 strips), once per model.
    if (d.host_memory && !d.offload && !s.from_disk) {
      const bool head =
          runs_head && (i + 1 == segments.size() ||
                        segments[i + 1].first_layer > ex->last_layer_);
      Backend* b = d.backend;
      RETURN_IF_ERROR(model.weights().Repack(
          d.first_layer, d.last_layer, head,
          [b](int64_t n, int64_t k, DType t) {
            return b->RepackedLayout(n, k, t);
          },
          [b](const void* data, int64_t n, int64_t k, DType t, void* out) {
            b->RepackWeight(data, n, k, t, out);
          }));
    }
    ex->devices_.push_back(std::move(d));
  }
  Device& last = ex->devices_.back();
  ASSIGN_OR_RETURN(last.logits,
                   Arena::Allocate(ex->layout_.logits, *last.backend));
  ex->host_positions_.resize(static_cast<size_t>(o.max_tokens));
  ex->host_seq_start_.resize(static_cast<size_t>(o.max_tokens) + 1);
  if (c.alibi) ex->alibi_slopes_ = AlibiSlopes(c.num_heads);
  if (c.rope.type != RopeConfig::Type::kNone)
    ex->host_inv_freq_.resize(
        static_cast<size_t>(c.rope_tables() * (c.rope.rotary_dim / 2)));
  int64_t max_experts = 0;
  for (const LayerConfig& lc : ex->program_.layers)
    max_experts = std::max(max_experts, lc.moe() ? lc.num_experts : 0);
  ex->host_expert_offsets_.resize(static_cast<size_t>(max_experts) + 1);
  ex->expert_gemms_.reserve(2 * static_cast<size_t>(max_experts));
  ex->edit_rows_.reserve(static_cast<size_t>(o.max_tokens));
  ex->source_rows_.resize(static_cast<size_t>(o.max_tokens));
  std::iota(ex->source_rows_.begin(), ex->source_rows_.end(), 0);
  const int64_t widest = MaxEditableWidth(c);
  ex->zero_row_.assign(static_cast<size_t>(widest), 0.0f);
  if (std::any_of(ex->devices_.begin(), ex->devices_.end(),
                  [](const Device& d) { return !d.host_memory; })) {
    ASSIGN_OR_RETURN(ex->host_edits_, CreateBackend("cpu"));
    ex->edit_stage_.assign(static_cast<size_t>(kEditStageRows * widest), 0.0f);
  }
  const Arena& a = ex->devices_.front().activations;
  LOOM_CHECK(a.region(BufferId::kPositions) && a.region(BufferId::kResidual) &&
             a.region(BufferId::kQkv) && a.region(BufferId::kZ) &&
             a.region(BufferId::kAttnOut) && a.region(BufferId::kMlpOut))
      << "planned layout lacks a core region";
  if (ex->devices_.front().host_memory)
    model.weights().FaultIn(ex->last_layer_, hooks.NeedsFinalNorm());
  return ex;
}

Status Executor::Deliver(HookSite site, int64_t layer, const Batch& batch,
                         Device& d, int64_t cols, int64_t ld, float* data,
                         HookSink* sink) {
  bool edited = false;
  for (const SequenceEdit& e : edits_) {
    if (e.edit->hook.site != site || e.edit->hook.layer != layer) continue;
    RETURN_IF_ERROR(ApplyEdit(e, batch, d, cols, ld, data));
    edited = true;
  }
  if (edited) RoundActivations(d, data, batch.num_tokens(), cols, ld);
  if (sink == nullptr || !hooks_.Contains(site, layer)) return Status();
  return sink->OnActivation(
      HookPoint{site, layer}, batch, -1, 0,
      F32View(*d.backend, data, batch.num_tokens(), cols, ld));
}

void Executor::Linear(Device& d, const float* x, int64_t m, WeightRole wrole,
                      WeightRole brole, int64_t layer, float* y, int64_t ldy,
                      bool same_x) {
  ExpertLinear(d, x, m, wrole, brole, layer, kNoExpert, y, ldy, same_x);
}

GemmOp Executor::ExpertGemmOp(Device& d, const float* x, int64_t m,
                              WeightRole wrole, WeightRole brole, int64_t layer,
                              int64_t expert, float* y, int64_t ldy) const {
  GemmOp op;
  op.w = WeightOperandOf(*d.weights, wrole, layer, expert);
  const BiasOperand b = BiasOf(*d.weights, brole, layer, expert);
  op.bias = b.data;
  op.bias_dtype = b.dtype;
  op.x = x;
  op.m = m;
  op.y = y;
  op.ldy = ldy;
  op.workspace = d.workspace.region(BufferId::kGemmInputCopy);
  return op;
}

void Executor::ExpertLinear(Device& d, const float* x, int64_t m,
                            WeightRole wrole, WeightRole brole, int64_t layer,
                            int64_t expert, float* y, int64_t ldy,
                            bool same_x) {
  GemmOp op = ExpertGemmOp(d, x, m, wrole, brole, layer, expert, y, ldy);
  op.reuse_x_workspace = same_x;
  TimedGemm([&] { d.backend->Gemm(op); });
}

void Executor::RunExpertGemms(Device& d, const float* x, int64_t rows) {
  GemmGroupOp g;
  g.x = x;
  g.rows = rows;
  g.items = expert_gemms_.data();
  g.count = static_cast<int64_t>(expert_gemms_.size());
  g.workspace = d.workspace.region(BufferId::kGemmInputCopy);
  TimedGemm([&] { d.backend->GemmGroup(g); });
  expert_gemms_.clear();
}

Status Executor::Norm(Device& d, NormKind kind, float eps, float offset,
                      WeightRole wrole, WeightRole brole, int64_t layer,
                      const float* x, float* y, HookSite site,
                      const Batch& batch, HookSink* sink) {
  const int64_t rows = batch.num_tokens(), dim = c_.hidden_size;
  ApplyNorm(kind, eps, offset, d.weights->Get(wrole, layer),
            d.weights->Get(brole, layer), options_.hf_bf16_activations,
            *d.backend, x, y, rows, dim);
  RoundActivations(d, y, rows, dim, dim);
  return Deliver(site, layer, batch, d, dim, dim, y, sink);
}

Status Executor::ComputeRope(Device& d, const Batch& batch) {
  // inv_freq is recomputed every forward: its region is dead after the blocks
  // and may share bytes with the final norm. It is computed on the host (into
  // the device's buffer when that is host memory, else copied there). Table
  // 1 (ModelConfig::rope_local: Gemma 3's sliding layers) follows table 0 in
  // inv_freq [tables, half] and cos / sin [tables, T, half].
  const Arena& a = d.activations;
  const int64_t half = c_.rope.rotary_dim / 2, T = batch.num_tokens();
  for (int64_t table = 0; table < c_.rope_tables(); ++table) {
    const RopeConfig& rope = table == 0 ? c_.rope : c_.rope_local;
    float* inv_freq = a.as<float>(BufferId::kRopeInvFreq) + table * half;
    float* host =
        d.host_memory ? inv_freq : host_inv_freq_.data() + table * half;
    const int32_t* positions = a.as<int32_t>(BufferId::kPositions);
    float* cos = a.as<float>(BufferId::kRopeCos) + table * T * half;
    float* sin = a.as<float>(BufferId::kRopeSin) + table * T * half;
    const bool dynamic = rope.type == RopeConfig::Type::kDynamic;
    auto upload = [&]() -> Status {
      if (d.host_memory) return Status();
      return d.backend->Copy(inv_freq, d.backend->device(), host, DeviceRef{},
                             half * int64_t{sizeof(float)});
    };
    if (!dynamic) {
      ComputeInvFreq(rope, c_.max_position_embeddings, 0, host);
      RETURN_IF_ERROR(upload());
    }
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      const int64_t b = batch.seq_start[s], len = batch.seq_start[s + 1] - b;
      if (dynamic) {
        // The previous sequence's tables read inv_freq: wait before
        // rewriting.
        if (!d.host_memory) RETURN_IF_ERROR(d.backend->Synchronize());
        // The sequence length the scaling sees: its last position + 1.
        ComputeInvFreq(rope, c_.max_position_embeddings, Pos0(s) + len, host);
        RETURN_IF_ERROR(upload());
      }
      d.backend->RopeTables(positions + b, len, inv_freq, half,
                            rope.attention_scaling, cos + b * half,
                            sin + b * half);
    }
  }
  return Status();
}

Status Executor::WriteBatchMetadata(const Batch& batch) {
  Device& d = devices_.front();
  const int64_t T = batch.num_tokens(), S = batch.num_seqs();
  int32_t* pos = d.activations.as<int32_t>(BufferId::kPositions);
  int64_t* seq = d.activations.as<int64_t>(BufferId::kSeqStart);
  int32_t* host_pos = d.host_memory ? pos : host_positions_.data();
  int64_t* host_seq = d.host_memory ? seq : host_seq_start_.data();
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = batch.seq_start[s]; t < batch.seq_start[s + 1]; ++t)
      host_pos[t] = static_cast<int32_t>(Pos0(s) + t - batch.seq_start[s]);
  std::copy(batch.seq_start.begin(), batch.seq_start.end(), host_seq);
  if (d.host_memory) return Status();
  // The previous batch's steps may still read these regions.
  RETURN_IF_ERROR(d.backend->Synchronize());
  RETURN_IF_ERROR(d.backend->Copy(pos, d.backend->device(), host_pos,
                                  DeviceRef{}, T * int64_t{sizeof(int32_t)}));
  return d.backend->Copy(seq, d.backend->device(), host_seq, DeviceRef{},
                         (S + 1) * int64_t{sizeof(int64_t)});
}

Status Executor::Transfer(const Device& from, Device& to, const Batch& batch) {
  const int64_t T = batch.num_tokens(), H = c_.hidden_size;
  const int64_t half =
      c_.rope.type == RopeConfig::Type::kNone ? 0 : c_.rope.rotary_dim / 2;
  struct Carried {
    BufferId id;
    int64_t bytes;
  };
  const Carried carried[] = {
      {BufferId::kResidual, T * H * int64_t{sizeof(float)}},
      {BufferId::kPositions, T * int64_t{sizeof(int32_t)}},
      {BufferId::kSeqStart, (batch.num_seqs() + 1) * int64_t{sizeof(int64_t)}},
      {BufferId::kRopeCos,
       c_.rope_tables() * T * half * int64_t{sizeof(float)}},
      {BufferId::kRopeSin,
       c_.rope_tables() * T * half * int64_t{sizeof(float)}},
  };
  // The copies run on `to`: they start after `from`'s work so far.
  RETURN_IF_ERROR(to.backend->WaitFor(*from.backend));
  for (const Carried& c : carried) {
    if (c.bytes == 0) continue;
    RETURN_IF_ERROR(to.backend->Copy(
        to.activations.region(c.id), to.backend->device(),
        from.activations.region(c.id), from.backend->device(), c.bytes));
  }
  return to.backend->Synchronize();
}

Status Executor::Forward(const Batch& batch, HookSink* sink) {
  return RunForward(batch, sink, nullptr, {});
}

Status Executor::Forward(const Batch& batch, HookSink* sink,
                         const KvBatch& kv) {
  return RunForward(batch, sink, &kv, {});
}

Status Executor::Forward(const Batch& batch, HookSink* sink, const KvBatch* kv,
                         std::span<const SequenceEdit> edits) {
  return RunForward(batch, sink, kv, edits);
}

Status Executor::ForwardLayer(const Batch& batch, int64_t layer,
                              const float* resid_in, StepTap* tap) {
  if (devices_.size() != 1 || !devices_.front().host_memory ||
      devices_.front().offload)
    return UnimplementedError(
        "executor: the per-layer recompute of a backward runs on one host "
        "device (this plan has " +
        std::to_string(devices_.size()) + " segments)");
  if (layer < 0 || layer > last_layer_)
    return OutOfRangeError("executor: ForwardLayer of layer " +
                           std::to_string(layer) + ", outside [0, " +
                           std::to_string(last_layer_) + "]");
  const int64_t T = batch.num_tokens();
  if (T > options_.max_tokens || batch.num_seqs() < 1 ||
      batch.seq_start[batch.num_seqs()] != T)
    return InvalidArgumentError("executor: ForwardLayer of a batch of " +
                                std::to_string(T) + " tokens (capacity " +
                                std::to_string(options_.max_tokens) + ")");
  RETURN_IF_ERROR(WriteBatchMetadata(batch));
  Device& d = devices_.front();
  for (const ProgramStep& step : program_.prologue)
    RETURN_IF_ERROR(RunStep(step, d, -1, batch, nullptr));
  float* x = d.activations.as<float>(BufferId::kResidual);
  std::copy(resid_in, resid_in + T * c_.hidden_size, x);
  for (const ProgramStep& step : program_.LayerSteps(layer)) {
    RETURN_IF_ERROR(RunStep(step, d, layer, batch, nullptr));
    RETURN_IF_ERROR(tap->AfterStep(step, layer, batch, d.activations));
  }
  return Status();
}

Status Executor::CheckKv(const Batch& batch, const KvBatch& kv) const {
  const KvCache* cache = kv.cache;
  if (cache == nullptr)
    return InvalidArgumentError("executor: KvBatch without a cache");
  const int64_t S = batch.num_seqs();
  if (static_cast<int64_t>(kv.slot.size()) != S ||
      static_cast<int64_t>(kv.pos0.size()) != S)
    return InvalidArgumentError(
        "executor: KvBatch has " + std::to_string(kv.slot.size()) +
        " slots and " + std::to_string(kv.pos0.size()) +
        " first positions for " + std::to_string(S) + " sequences");
  // The cache holds exactly the layers this forward runs: a layer it holds
  // but the forward skipped would keep stale rows for the new positions.
  if (cache->num_layers() != last_layer_ + 1)
    return InvalidArgumentError(
        "executor: the KV cache holds layers [0, " +
        std::to_string(cache->num_layers()) +
        "), this forward runs layers [0, " + std::to_string(last_layer_ + 1) +
        "); a cache must hold exactly the layers its forwards run (hook the "
        "final norm or the logits to run every layer)");
  auto name = [](DeviceRef r) {
    return r.kind == DeviceKind::kCuda ? "cuda:" + std::to_string(r.index)
                                       : std::string("the host");
  };
  for (const Device& d : devices_)
    for (int64_t l = d.first_layer; l <= d.last_layer; ++l)
      if (!(d.backend->device() == cache->device(l)))
        return InvalidArgumentError(
            "executor: layer " + std::to_string(l) + " runs on " +
            name(d.backend->device()) + ", its KV cache is on " +
            name(cache->device(l)) +
            " (a cache holds each layer on the device that computes it)");
  for (int64_t l = 0; l <= last_layer_; ++l)
    if (hooks_.Contains(HookSite::kPattern, l))
      return UnimplementedError(
          "executor: attention patterns cannot be hooked with a KV cache");
  for (int64_t s = 0; s < S; ++s) {
    const int64_t slot = kv.slot[static_cast<size_t>(s)];
    const int64_t p0 = kv.pos0[static_cast<size_t>(s)];
    const int64_t len = batch.seq_start[s + 1] - batch.seq_start[s];
    if (slot < 0 || slot >= cache->slots())
      return OutOfRangeError("sequence " + std::to_string(s) + ": KV slot " +
                             std::to_string(slot) + " outside [0, " +
                             std::to_string(cache->slots()) + ")");
    for (int64_t r = 0; r < s; ++r)
      if (kv.slot[static_cast<size_t>(r)] == slot)
        return InvalidArgumentError("sequences " + std::to_string(r) + " and " +
                                    std::to_string(s) + " share KV slot " +
                                    std::to_string(slot));
    if (p0 < 0 || p0 > cache->length(slot))
      return InvalidArgumentError(
          "sequence " + std::to_string(s) + " starts at position " +
          std::to_string(p0) + " but KV slot " + std::to_string(slot) +
          " holds positions [0, " + std::to_string(cache->length(slot)) + ")");
    // Going back (p0 < length) is exact unless a ring already overwrote
    // positions the new queries see.
    if (p0 < cache->length(slot))
      for (int64_t l = 0; l < cache->num_layers(); ++l)
        if (cache->positions(l) < cache->length(slot))
          return InvalidArgumentError(
              "sequence " + std::to_string(s) + " restarts at position " +
              std::to_string(p0) + " of KV slot " + std::to_string(slot) +
              ", whose sliding-window ring of layer " + std::to_string(l) +
              " has moved past it; Reset the slot instead");
    if (p0 + len > cache->context())
      return OutOfRangeError(
          "sequence " + std::to_string(s) + " needs " +
          std::to_string(p0 + len) + " positions, more than the KV cache's " +
          std::to_string(cache->context()) + " per sequence");
    if (p0 + len > cache->reserved_positions(slot))
      return FailedPreconditionError(
          "sequence " + std::to_string(s) + " needs " +
          std::to_string(p0 + len) + " positions of KV slot " +
          std::to_string(slot) + ", whose " +
          std::to_string(cache->reserved_pages(slot)) + " reserved pages of " +
          std::to_string(cache->page_size()) + " positions cover only " +
          std::to_string(cache->reserved_positions(slot)) +
          " (KvCache::Reserve)");
    if (p0 + len > c_.max_position_embeddings)
      return OutOfRangeError(
          "sequence " + std::to_string(s) + " needs " +
          std::to_string(p0 + len) +
          " positions, more than max_position_embeddings = " +
          std::to_string(c_.max_position_embeddings));
  }
  return Status();
}

Status Executor::RunForward(const Batch& batch, HookSink* sink,
                            const KvBatch* kv,
                            std::span<const SequenceEdit> edits) {
  const int64_t T = batch.num_tokens();
  if (batch.num_seqs() < 1 || batch.seq_start[0] != 0 ||
      batch.seq_start[batch.num_seqs()] != T)
    return InvalidArgumentError(
        "batch: seq_start must run from 0 to the token count " +
        std::to_string(T));
  if (T > options_.max_tokens)
    return OutOfRangeError("batch of " + std::to_string(T) +
                           " tokens exceeds the planned capacity of " +
                           std::to_string(options_.max_tokens));
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
  }
  for (int64_t t = 0; t < T; ++t)
    if (batch.ids[t] < 0 || batch.ids[t] >= c_.vocab_size)
      return OutOfRangeError("token id " + std::to_string(batch.ids[t]) +
                             " at position " + std::to_string(t) +
                             " is outside the vocabulary [0, " +
                             std::to_string(c_.vocab_size) + ")");
  if (kv != nullptr) RETURN_IF_ERROR(CheckKv(batch, *kv));
  // kv_ and edits_ are this forward's only.
  struct Clear {
    const KvBatch*& kv;
    std::span<const SequenceEdit>& edits;
    ~Clear() {
      kv = nullptr;
      edits = {};
    }
  } clear{kv_, edits_};
  kv_ = kv;
  RETURN_IF_ERROR(CheckEdits(batch, edits));
  edits_ = edits;
  if (kv != nullptr && kv->cache->paged()) {
    const int64_t S = batch.num_seqs(), n = kv->cache->pages_per_seq();
    kv_page_rows_.resize(static_cast<size_t>(S * n));
    for (int64_t s = 0; s < S; ++s) {
      const int32_t* row =
          kv->cache->page_table(kv->slot[static_cast<size_t>(s)]);
      std::copy(row, row + n, kv_page_rows_.begin() + s * n);
    }
  }
  RETURN_IF_ERROR(WriteBatchMetadata(batch));

  for (const ProgramStep& step : program_.prologue)
    RETURN_IF_ERROR(RunStep(step, devices_.front(), -1, batch, sink));
  for (size_t i = 0; i < devices_.size(); ++i) {
    Device& d = devices_[i];
    if (i > 0 && !d.shares_arenas)
      RETURN_IF_ERROR(Transfer(devices_[i - 1], d, batch));
    if (d.offload) RETURN_IF_ERROR(StartStream(d));
    for (int64_t layer = d.first_layer; layer <= d.last_layer; ++layer) {
      for (const ProgramStep& step : program_.LayerSteps(layer))
        RETURN_IF_ERROR(RunStep(step, d, layer, batch, sink));
      if (d.offload) RETURN_IF_ERROR(AdvanceStream(d, layer));
    }
  }
  for (const ProgramStep& step : program_.epilogue) {
    if (step.id == StepId::kFinalNorm && !hooks_.NeedsFinalNorm()) break;
    if (step.id == StepId::kLogits && !hooks_.NeedsLogits()) break;
    RETURN_IF_ERROR(RunStep(step, devices_.back(), -1, batch, sink));
  }
  RETURN_IF_ERROR(devices_.back().backend->Synchronize());
  if (kv != nullptr)
    for (int64_t s = 0; s < batch.num_seqs(); ++s)
      kv->cache->set_length(
          kv->slot[static_cast<size_t>(s)],
          Pos0(s) + batch.seq_start[s + 1] - batch.seq_start[s]);
  return Status();
}

Status Executor::BranchResidualAdd(Device& d, const LayerConfig& lc,
                                   bool post_norm, WeightRole post_norm_role,
                                   HookSite post_site, HookSite resid_site,
                                   int64_t l, float* branch, float* x,
                                   const Batch& batch, HookSink* sink) {
  const int64_t T = batch.num_tokens(), H = c_.hidden_size;
  if (post_norm)
    RETURN_IF_ERROR(Norm(d, lc.norm, lc.norm_eps, lc.norm_offset,
                         post_norm_role, WeightRole::kOther, l, branch, branch,
                         post_site, batch, sink));
  if (lc.residual_multiplier != 1.0f) {  // Granite: x + m * branch
    d.backend->Scale(branch, T * H, lc.residual_multiplier);
    RoundActivations(d, branch, T, H, H);
  }
  d.backend->Add(branch, x, T * H);
  RoundActivations(d, x, T, H, H);
  return Deliver(resid_site, l, batch, d, H, H, x, sink);
}

Status Executor::RunStep(const ProgramStep& step, Device& d, int64_t l,
                         const Batch& batch, HookSink* sink) {
  // One member per StepId, in the enum's order.
  static constexpr StepFn kSteps[] = {
      &Executor::StepEmbed,
      &Executor::StepLn1,
      &Executor::StepQkvProj,
      &Executor::StepMlaProj,
      &Executor::StepAttention,
      &Executor::StepOProj,
      &Executor::StepAttnResidualAdd,
      &Executor::StepLn2,
      &Executor::StepUpProj,
      &Executor::StepActivation,
      &Executor::StepDownProj,
      &Executor::StepRouter,
      &Executor::StepExpertGather,
      &Executor::StepExpertGateUp,
      &Executor::StepExpertActivation,
      &Executor::StepExpertDown,
      &Executor::StepExpertScatterAdd,
      &Executor::StepSharedExpert,
      &Executor::StepMlpResidualAdd,
      &Executor::StepParallelResidualAdd,
      &Executor::StepFinalNorm,
      &Executor::StepLogits,
  };
  static_assert(std::size(kSteps) == static_cast<size_t>(StepId::kLogits) + 1);
  const size_t i = static_cast<size_t>(step.id);
  if (i >= std::size(kSteps)) return InternalError("executor: unknown step");
  const Arena& a = d.activations;
  const StepArgs args{
      step,
      d,
      l,
      batch,
      sink,
      l >= 0 ? &program_.layers[static_cast<size_t>(l)] : nullptr,
      batch.num_tokens(),
      c_.hidden_size,
      a,
      *d.backend,
      a.as<float>(BufferId::kResidual)};
  return (this->*kSteps[i])(args);
}

Status Executor::StepEmbed(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const TensorView& embed = d.weights->Require(WeightRole::kEmbed);
  be.Gather(embed.data, embed.dtype, batch.ids.data(), T, H, x);
  RoundActivations(d, x, T, H, H);
  if (c_.embedding_scale != 1.0f) {
    // HF multiplies by the scale held in the activation dtype.
    const float scale = model_.compute_dtype() == DType::kBF16
                            ? RoundBf16(c_.embedding_scale)
                            : c_.embedding_scale;
    be.Scale(x, T * H, scale);
    RoundActivations(d, x, T, H, H);
  }
  RETURN_IF_ERROR(Deliver(HookSite::kEmbed, -1, batch, d, H, H, x, sink));
  if (c_.learned_positions) {
    float* h = s.buf(BufferId::kPosEmbed);
    const TensorView& wpe = d.weights->Require(WeightRole::kPosEmbed);
    // Row p + position_offset (OPT): the table from that row on.
    const void* table = static_cast<const char*>(wpe.data) +
                        c_.position_offset * H * DTypeSize(wpe.dtype);
    be.Gather(table, wpe.dtype, a.as<int32_t>(BufferId::kPositions), T, H, h);
    RETURN_IF_ERROR(Deliver(HookSite::kPosEmbed, -1, batch, d, H, H, h, sink));
    be.Add(h, x, T * H);
    RoundActivations(d, x, T, H, H);
  }
  if (c_.embed_norm) {  // BLOOM's word_embeddings_layernorm, in place
    ApplyNorm(c_.norm, c_.norm_eps, c_.norm_offset,
              d.weights->Get(WeightRole::kEmbedNorm, -1),
              d.weights->Get(WeightRole::kEmbedNormBias, -1),
              options_.hf_bf16_activations, be, x, x, T, H);
    RoundActivations(d, x, T, H, H);
  }
  if (a.region(BufferId::kRopeCos) != nullptr) return ComputeRope(d, batch);
  return Status();
}

Status Executor::StepLn1(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  RETURN_IF_ERROR(Deliver(HookSite::kResidPre, l, batch, d, H, H, x, sink));
  if (!lc->pre_attn_norm) return Status();
  return Norm(d, lc->norm, lc->norm_eps, lc->norm_offset, WeightRole::kAttnNorm,
              WeightRole::kAttnNormBias, l, x, s.buf(BufferId::kAttnIn),
              HookSite::kLn1, batch, sink);
}

Status Executor::StepQkvProj(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t Q = c_.q_dim(), KV = c_.kv_dim(), ld = Q + 2 * KV;
  const float* in = s.buf(step.reads[0]);  // [T, H]
  float* qkv = s.buf(BufferId::kQkv);      // [T, Q + 2 KV]
  float* q = qkv;                          // [T, Q]  row stride ld
  float* k = qkv + Q;                      // [T, KV] row stride ld
  float* v = qkv + Q + KV;                 // [T, KV] row stride ld
  if (lc->fused_qkv && lc->qkv_layout == QkvLayout::kPerHead) {
    // Per head [q_h | k_h | v_h] (heads = kv heads): the GEMM into its own
    // buffer, then one exact copy regrouping it to q | k | v.
    float* fused = s.buf(BufferId::kQkvPerHead);  // [T, Q + 2 KV]
    Linear(d, in, T, WeightRole::kQkv, WeightRole::kQkvBias, l, fused, ld);
    be.DeinterleaveBlocks(fused, ld, T, c_.num_heads, 3, c_.head_dim, qkv, ld);
  } else if (lc->fused_qkv && lc->qkv_layout == QkvLayout::kGroupedQvk) {
    // qkv_groups chunks of [q | v | k] (kv heads = heads): regrouped part-
    // major into q | v | k, then v and k swapped through the fused buffer
    // (every copy exact).
    float* fused = s.buf(BufferId::kQkvPerHead);  // [T, Q + 2 KV]
    Linear(d, in, T, WeightRole::kQkv, WeightRole::kQkvBias, l, fused, ld);
    const int64_t g = c_.qkv_groups;
    be.DeinterleaveBlocks(fused, ld, T, g, 3, Q / g, qkv, ld);
    be.StridedCopy(qkv + Q, ld, 0, 1, fused, ld, 0, 1, T, 1, 2 * KV);
    be.StridedCopy(fused + KV, ld, 0, 1, k, ld, 0, 1, T, 1, KV);
    be.StridedCopy(fused, ld, 0, 1, v, ld, 0, 1, T, 1, KV);
  } else if (lc->fused_qkv && lc->qkv_layout == QkvLayout::kPerKvGroup) {
    // Per kv group [q heads of the group | k | v]: three exact strided
    // copies regroup it.
    float* fused = s.buf(BufferId::kQkvPerHead);  // [T, Q + 2 KV]
    Linear(d, in, T, WeightRole::kQkv, WeightRole::kQkvBias, l, fused, ld);
    const int64_t g = c_.num_kv_heads, hd = c_.head_dim, qg = Q / g;
    const int64_t group = qg + 2 * hd;  // columns of one kv group
    be.StridedCopy(fused, ld, group, 1, q, ld, qg, 1, T, g, qg);
    be.StridedCopy(fused + qg, ld, group, 1, k, ld, hd, 1, T, g, hd);
    be.StridedCopy(fused + qg + hd, ld, group, 1, v, ld, hd, 1, T, g, hd);
  } else if (lc->fused_qkv) {
    Linear(d, in, T, WeightRole::kQkv, WeightRole::kQkvBias, l, qkv, ld);
  } else {
    Linear(d, in, T, WeightRole::kQ, WeightRole::kQBias, l, q, ld);
    Linear(d, in, T, WeightRole::kK, WeightRole::kKBias, l, k, ld,
           /*same_x=*/true);
    Linear(d, in, T, WeightRole::kV, WeightRole::kVBias, l, v, ld,
           /*same_x=*/true);
  }
  RoundActivations(d, qkv, T, ld, ld);
  if (lc->clip_qkv > 0) be.Clamp(qkv, T, ld, ld, -lc->clip_qkv, lc->clip_qkv);
  if (lc->qk_norm != QkNormKind::kNone) {
    QkNorm(*d.weights, be, *lc, WeightRole::kQNorm, WeightRole::kQNormBias, q,
           T, ld, c_.num_heads);
    QkNorm(*d.weights, be, *lc, WeightRole::kKNorm, WeightRole::kKNormBias, k,
           T, ld, c_.num_kv_heads);
    RoundActivations(d, qkv, T, Q + KV, ld);
  }
  RETURN_IF_ERROR(Deliver(HookSite::kQ, l, batch, d, Q, ld, q, sink));
  RETURN_IF_ERROR(Deliver(HookSite::kK, l, batch, d, KV, ld, k, sink));
  return Deliver(HookSite::kV, l, batch, d, KV, ld, v, sink);
}

Status Executor::StepMlaProj(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const MlaConfig& m = lc->mla;
  const int64_t heads = lc->q_heads, hd = lc->head_dim,
                nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim,
                vd = lc->v_head_dim;
  const int64_t Q = lc->q_width(), KV = lc->k_width(), ld = lc->qkv_width();
  const int64_t kva_w = m.kv_lora_rank + rope, kv_w = heads * (nope + vd);
  const float* in = s.buf(step.reads[0]);         // [T, H]
  float* mq = s.buf(BufferId::kMlaQ);             // [T, heads hd]
  float* kva = s.buf(BufferId::kMlaKvA);          // [T, kv_lora + rope]
  float* latent = s.buf(BufferId::kMlaKvLatent);  // [T, kv_lora]
  float* kv = s.buf(BufferId::kMlaKv);            // [T, heads (nope + vd)]
  float* v = s.buf(BufferId::kMlaV);              // [T, heads vd]
  float* qkv = s.buf(BufferId::kQkv);             // [T, ld]
  // Named copies for the lambdas below (clang 14 cannot capture structured
  // bindings).
  Device& dev = s.d;
  Backend& backend = s.be;
  const int64_t layer = s.l, rows = s.T;
  auto latent_norm = [&](WeightRole role, float* y, int64_t dim) {
    const TensorView& w = dev.weights->Require(role, layer);
    backend.RmsNormRows(y, rows, dim, 1, dim, w.data, w.dtype, 0.0f,
                        s.lc->latent_norm_eps);
    RoundActivations(dev, y, rows, dim, dim);
  };
  // q = q_b(rmsnorm(q_a(x))) (or q_proj(x)): [T, heads, nope | rope].
  if (m.q_lora_rank > 0) {
    float* ql = s.buf(BufferId::kMlaQLatent);  // [T, q_lora]
    Linear(d, in, T, WeightRole::kQA, WeightRole::kOther, l, ql, m.q_lora_rank);
    RoundActivations(d, ql, T, m.q_lora_rank, m.q_lora_rank);
    latent_norm(WeightRole::kQANorm, ql, m.q_lora_rank);
    Linear(d, ql, T, WeightRole::kQB, WeightRole::kOther, l, mq, Q);
  } else {
    Linear(d, in, T, WeightRole::kQ, WeightRole::kOther, l, mq, Q);
  }
  RoundActivations(d, mq, T, Q, Q);
  // kv_a(x) = [latent | k_rope]; k_nope | v = kv_b(rmsnorm(latent)).
  Linear(d, in, T, WeightRole::kKvA, WeightRole::kOther, l, kva, kva_w,
         /*same_x=*/m.q_lora_rank == 0);
  RoundActivations(d, kva, T, kva_w, kva_w);
  be.StridedCopy(kva, kva_w, 0, 1, latent, m.kv_lora_rank, 0, 1, T, 1,
                 m.kv_lora_rank);
  latent_norm(WeightRole::kKvANorm, latent, m.kv_lora_rank);
  Linear(d, latent, T, WeightRole::kKvB, WeightRole::kOther, l, kv, kv_w);
  RoundActivations(d, kv, T, kv_w, kv_w);
  // Assemble q | k | v in qkv (every column is written).
  // The rope part in the order HF rotates it: interleaved pairs split into
  // their even then odd elements.
  const int64_t rope_step = lc->rope.interleaved ? 2 : 1,
                rope_n = lc->rope.interleaved ? rope / 2 : rope;
  auto copy_rope = [&](const float* src, int64_t ldx, int64_t gsx, float* dst) {
    for (int64_t part = 0; part < rope / rope_n; ++part)
      backend.StridedCopy(src + part, ldx, gsx, rope_step, dst + part * rope_n,
                          ld, hd, 1, rows, heads, rope_n);
  };
  be.StridedCopy(mq, Q, hd, 1, qkv, ld, hd, 1, T, heads, nope);  // q nope
  copy_rope(mq + nope, Q, hd, qkv + nope);
  be.StridedCopy(kv, kv_w, nope + vd, 1, qkv + Q, ld, hd, 1, T, heads,
                 nope);  // k nope
  // The one rope key head, broadcast to every head (source stride 0).
  copy_rope(kva + m.kv_lora_rank, kva_w, 0, qkv + Q + nope);
  be.StridedCopy(kv + nope, kv_w, nope + vd, 1, v, heads * vd, vd, 1, T, heads,
                 vd);
  RETURN_IF_ERROR(Deliver(HookSite::kQ, l, batch, d, Q, ld, qkv, sink));
  RETURN_IF_ERROR(Deliver(HookSite::kK, l, batch, d, KV, ld, qkv + Q, sink));
  RETURN_IF_ERROR(
      Deliver(HookSite::kV, l, batch, d, heads * vd, heads * vd, v, sink));
  // v (after any edit of hook_v) into qkv.
  be.StridedCopy(v, heads * vd, 0, 1, qkv + Q + KV, ld, 0, 1, T, 1, heads * vd);
  return Status();
}

Status Executor::StepAttention(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t Q = lc->q_width(), KV = lc->k_width(), ld = lc->qkv_width(),
                hd = lc->head_dim;
  float* q = s.buf(BufferId::kQkv);
  float* k = q + Q;
  float* v = q + Q + KV;
  float* z = s.buf(BufferId::kZ);
  if (lc->rope_half > 0) {
    // The layer's table of [tables, T, half] (ModelConfig::rope_local).
    const int64_t table = lc->rope_table * T * lc->rope_half;
    const float* cos = s.buf(BufferId::kRopeCos) + table;
    const float* sin = s.buf(BufferId::kRopeSin) + table;
    // The rotated columns start at rope_offset in each head (MLA: after
    // the nope part).
    const int64_t r0 = lc->rope_offset;
    if (lc->rope.rotate_pairs) {
      RETURN_IF_ERROR(be.ApplyRopePairs(q + r0, T, lc->q_heads, hd, ld, cos,
                                        sin, lc->rope_half));
      RETURN_IF_ERROR(be.ApplyRopePairs(k + r0, T, lc->kv_heads, hd, ld, cos,
                                        sin, lc->rope_half));
    } else {
      be.ApplyRope(q + r0, T, lc->q_heads, hd, ld, cos, sin, lc->rope_half);
      be.ApplyRope(k + r0, T, lc->kv_heads, hd, ld, cos, sin, lc->rope_half);
    }
    RoundActivations(d, q, T, Q + KV, ld);
    RETURN_IF_ERROR(Deliver(HookSite::kRotQ, l, batch, d, Q, ld, q, sink));
    RETURN_IF_ERROR(Deliver(HookSite::kRotK, l, batch, d, KV, ld, k, sink));
  }
  AttentionOp op;
  if (lc->attn_sinks) {  // [num_heads] sink logits (gpt-oss)
    const TensorView& sinks = d.weights->Require(WeightRole::kAttnSinks, l);
    op.sinks = sinks.data;
    op.sinks_dtype = sinks.dtype;
  }
  if (lc->alibi) op.alibi_slopes = alibi_slopes_.data();  // BLOOM
  op.q = q;
  op.q_rs = ld;
  op.k = k;
  op.k_rs = ld;
  op.v = v;
  op.v_rs = ld;
  op.z = z;
  const int64_t* seq_device = a.as<int64_t>(BufferId::kSeqStart);
  op.seq_start = batch.seq_start.data();
  op.seq_start_device = seq_device;
  op.num_seqs = batch.num_seqs();
  for (int64_t s = 0; s < batch.num_seqs(); ++s)
    op.max_seq_len =
        std::max(op.max_seq_len, batch.seq_start[s + 1] - batch.seq_start[s]);
  op.q_heads = lc->q_heads;
  op.kv_heads = lc->kv_heads;
  op.head_dim = hd;
  op.v_head_dim = lc->v_head_dim;
  op.scale = lc->attn_scale;
  op.compute = model_.compute_dtype();
  op.softcap = lc->attn_softcap;
  op.window = lc->window;
  op.workspace = d.workspace.region(BufferId::kAttnWorkspace);
  if (kv_ != nullptr) {
    // New K/V rows go to the cache; queries see the cached prefix.
    op.k_cache = kv_->cache->k(l);
    op.v_cache = kv_->cache->v(l);
    op.kv_capacity = kv_->cache->positions(l);
    op.kv_slot = kv_->slot.data();
    op.q_pos0 = kv_->pos0.data();
    if (kv_->cache->layer_paged(l)) {
      op.kv_page_table = kv_page_rows_.data();
      op.kv_pages_per_seq = kv_->cache->pages_per_seq();
      op.kv_page_size = kv_->cache->page_size();
      op.kv_num_pages = kv_->cache->num_pages();
    }
    op.workspace = kv_->cache->workspace(l);
    RETURN_IF_ERROR(be.Attention(op));
  } else if (sink != nullptr && hooks_.Contains(HookSite::kPattern, l)) {
    // One sequence at a time so each sequence's probabilities can be
    // delivered.
    float* probs = s.buf(BufferId::kPattern);
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      AttentionOp one = op;
      one.seq_start = batch.seq_start.data() + s;
      one.seq_start_device = seq_device + s;
      one.num_seqs = 1;
      one.max_seq_len = batch.seq_start[s + 1] - batch.seq_start[s];
      one.probs = probs;
      one.probs_seq = 0;
      RETURN_IF_ERROR(be.Attention(one));
      const int64_t len = batch.seq_start[s + 1] - batch.seq_start[s];
      RETURN_IF_ERROR(sink->OnActivation(
          HookPoint{HookSite::kPattern, l}, batch, s, batch.seq_start[s],
          F32View(be, probs, c_.num_heads * len, len, len)));
    }
  } else {
    RETURN_IF_ERROR(be.Attention(op));
  }
  const int64_t Z = lc->z_width();  // [T, q_heads v_head_dim]
  RoundActivations(d, z, T, Z, Z);
  return Deliver(HookSite::kZ, l, batch, d, Z, Z, z, sink);
}

Status Executor::StepOProj(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  float* o = s.buf(BufferId::kAttnOut);
  Linear(d, s.buf(step.reads[0]), T, WeightRole::kO, WeightRole::kOBias, l, o,
         H);
  RoundActivations(d, o, T, H, H);
  return Deliver(HookSite::kAttnOut, l, batch, d, H, H, o, sink);
}

Status Executor::StepAttnResidualAdd(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  return BranchResidualAdd(
      d, *lc, lc->post_attn_norm, WeightRole::kPostAttnNorm, HookSite::kLn1Post,
      HookSite::kResidMid, l, s.buf(BufferId::kAttnOut), x, batch, sink);
}

Status Executor::StepLn2(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  if (!lc->pre_mlp_norm) return Status();
  return Norm(d, lc->norm, lc->norm_eps, lc->norm_offset, WeightRole::kMlpNorm,
              WeightRole::kMlpNormBias, l, x, s.buf(BufferId::kMlpIn),
              HookSite::kLn2, batch, sink);
}

Status Executor::StepUpProj(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t I = c_.intermediate_size;
  const float* in = s.buf(step.reads[0]);  // [T, H]
  float* up = s.buf(step.writes[0]);       // [T, I] fc or [T, 2I] gate|up
  if (lc->mlp == MlpKind::kPlain) {
    Linear(d, in, T, WeightRole::kUp, WeightRole::kUpBias, l, up, I);
    RoundActivations(d, up, T, I, I);
    return Deliver(HookSite::kMlpPre, l, batch, d, I, I, up, sink);
  }
  if (lc->mlp == MlpKind::kGatedFused) {
    Linear(d, in, T, WeightRole::kGateUp, WeightRole::kOther, l, up, 2 * I);
  } else {
    Linear(d, in, T, WeightRole::kGate, WeightRole::kGateBias, l, up, 2 * I);
    Linear(d, in, T, WeightRole::kUp, WeightRole::kUpBias, l, up + I, 2 * I,
           /*same_x=*/true);
  }
  RoundActivations(d, up, T, 2 * I, 2 * I);
  return Deliver(HookSite::kMlpPre, l, batch, d, I, 2 * I, up, sink);
}

Status Executor::StepActivation(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t I = c_.intermediate_size;
  const ActivationFn fn = ToActivationFn(lc->act);
  float* in = s.buf(step.reads[0]);
  float* out = s.buf(step.writes[0]);
  if (lc->mlp == MlpKind::kPlain) {
    be.Activation(fn, out, T * I);  // in place on the dense fc rows
  } else {
    be.GatedActivation(fn, in, 2 * I, in + I, 2 * I, out, T, I);
  }
  RoundActivations(d, out, T, I, I);
  return Deliver(HookSite::kMlpPost, l, batch, d, I, I, out, sink);
}

Status Executor::StepDownProj(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  float* o = s.buf(BufferId::kMlpOut);
  Linear(d, s.buf(step.reads[0]), T, WeightRole::kDown, WeightRole::kDownBias,
         l, o, H);
  RoundActivations(d, o, T, H, H);
  return Deliver(HookSite::kMlpOut, l, batch, d, H, H, o, sink);
}

Status Executor::StepRouter(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t E = lc->num_experts, K = lc->experts_per_token;
  const float* in = s.buf(step.reads[0]);             // [T, H]
  float* logits = s.buf(BufferId::kRouterLogits);     // [T, E] f32
  int32_t* ids = a.as<int32_t>(BufferId::kRouteIds);  // [T, k] i32
  float* w = s.buf(BufferId::kRouteWeights);          // [T, k] f32
  Linear(d, in, T, WeightRole::kRouter,
         lc->router_bias ? WeightRole::kRouterBias : WeightRole::kOther, l,
         logits, E);
  RETURN_IF_ERROR(
      Deliver(HookSite::kRouterLogits, l, batch, d, E, E, logits, sink));
  RouteOp route;
  route.kind = lc->router;
  route.renormalize = lc->norm_topk_prob;
  if (lc->router_correction_bias) {
    const BiasOperand b =
        BiasOf(*d.weights, WeightRole::kRouterCorrectionBias, l);
    route.correction_bias = b.data;
    route.correction_bias_dtype = b.dtype;
  }
  route.groups = lc->router_groups;
  route.keep_groups = lc->router_keep_groups;
  route.scale = lc->routed_scaling_factor;
  Status routed = be.TopKRoute(logits, T, E, E, K, route, ids, w);
  if (!routed.ok())
    return Status(routed.code(), "executor: layer " + std::to_string(l) + ": " +
                                     routed.message());
  if (sink != nullptr && hooks_.Contains(HookSite::kExpertIds, l)) {
    static_assert(IsIntegerSite(HookSite::kExpertIds));
    ActivationView v = F32View(be, nullptr, T, K, K);
    v.data = ids;
    v.dtype = DType::kI32;
    RETURN_IF_ERROR(sink->OnActivation(HookPoint{HookSite::kExpertIds, l},
                                       batch, -1, 0, v));
  }
  return Deliver(HookSite::kExpertWeights, l, batch, d, K, K, w, sink);
}

Status Executor::StepExpertGather(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  // Group the T k (token, slot) pairs by expert, stable in token order;
  // the per-expert offsets come back to the host, which issues one GEMM
  // per expert with rows.
  const int64_t E = lc->num_experts, K = lc->experts_per_token;
  int32_t* off = a.as<int32_t>(BufferId::kExpertOffsets);  // [E + 1]
  Status st = be.GroupByExpert(
      a.as<int32_t>(BufferId::kRouteIds), s.buf(BufferId::kRouteWeights), T, K,
      E, off, a.as<int32_t>(BufferId::kExpertRows),
      s.buf(BufferId::kExpertRowWeights),
      d.host_memory ? off : host_expert_offsets_.data());
  if (!st.ok())
    return InternalError("executor: layer " + std::to_string(l) + ": " +
                         st.message());
  be.GatherRows(s.buf(step.reads[0]), H, a.as<int32_t>(BufferId::kExpertRows),
                T * K, H, s.buf(BufferId::kExpertIn));
  return Status();
}

Status Executor::StepExpertGateUp(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t Ie = lc->expert_intermediate_size;
  const int32_t* off = HostExpertOffsets(d);
  const float* in = s.buf(BufferId::kExpertIn);  // [T k, H]
  float* gu = s.buf(BufferId::kExpertGateUp);    // [T k, 2 Ie]
  const bool fused = lc->expert_act == ExpertActKind::kClampedSwigluInterleaved;
  // Every expert's gate and up GEMMs as one group (experts in parallel).
  for (int64_t e = 0; e < lc->num_experts; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0) continue;
    const float* x = in + off[e] * H;  // [n, H]
    float* y = gu + off[e] * 2 * Ie;   // [n, 2 Ie]
    if (fused) {
      expert_gemms_.push_back(ExpertGemmOp(d, x, n, WeightRole::kExpertGateUp,
                                           WeightRole::kExpertGateUpBias, l, e,
                                           y, 2 * Ie));
    } else {
      expert_gemms_.push_back(ExpertGemmOp(d, x, n, WeightRole::kExpertGate,
                                           WeightRole::kOther, l, e, y,
                                           2 * Ie));
      expert_gemms_.push_back(ExpertGemmOp(d, x, n, WeightRole::kExpertUp,
                                           WeightRole::kOther, l, e, y + Ie,
                                           2 * Ie));
    }
  }
  const int64_t R = T * lc->experts_per_token;
  RunExpertGemms(d, in, R);
  RoundActivations(d, gu, R, 2 * Ie, 2 * Ie);
  return Status();
}

Status Executor::StepExpertActivation(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t Ie = lc->expert_intermediate_size,
                R = T * lc->experts_per_token;
  const float* gu = s.buf(BufferId::kExpertGateUp);  // [R, 2 Ie]
  float* act = s.buf(BufferId::kExpertAct);          // [R, Ie]
  if (lc->expert_act == ExpertActKind::kClampedSwigluInterleaved)
    be.ClampedSwiglu(gu, 2 * Ie, act, R, Ie, lc->swiglu_alpha,
                     lc->swiglu_limit);
  else
    be.GatedActivation(ToActivationFn(lc->act), gu, 2 * Ie, gu + Ie, 2 * Ie,
                       act, R, Ie);
  RoundActivations(d, act, R, Ie, Ie);
  return Status();
}

Status Executor::StepExpertDown(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t Ie = lc->expert_intermediate_size;
  const int32_t* off = HostExpertOffsets(d);
  const float* act = s.buf(BufferId::kExpertAct);  // [T k, Ie]
  float* out = s.buf(BufferId::kExpertOut);        // [T k, H]
  for (int64_t e = 0; e < lc->num_experts; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0) continue;
    expert_gemms_.push_back(ExpertGemmOp(
        d, act + off[e] * Ie, n, WeightRole::kExpertDown,
        lc->expert_bias ? WeightRole::kExpertDownBias : WeightRole::kOther, l,
        e, out + off[e] * H, H));
  }
  RunExpertGemms(d, act, T * lc->experts_per_token);
  RoundActivations(d, out, T * lc->experts_per_token, H, H);
  return Status();
}

Status Executor::StepExpertScatterAdd(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  // HF's loop over experts 0..E-1 adding weight * out into the zeroed
  // output (index_add_): the same order gives the same f32 sums. Within
  // one expert the rows are distinct tokens.
  const int32_t* off = HostExpertOffsets(d);
  const int32_t* rows = a.as<int32_t>(BufferId::kExpertRows);
  const float* row_w = s.buf(BufferId::kExpertRowWeights);
  const float* out = s.buf(BufferId::kExpertOut);  // [T k, H]
  float* y = s.buf(BufferId::kMlpOut);             // [T, H]
  be.SetZero(y, T * H);
  for (int64_t e = 0; e < lc->num_experts; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0) continue;
    be.ScatterAddRows(out + off[e] * H, rows + off[e], row_w + off[e], n, H, y,
                      H);
  }
  RoundActivations(d, y, T, H, H);
  return Status();
}

Status Executor::StepSharedExpert(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const int64_t S = lc->shared_expert_intermediate_size;
  const float* in = s.buf(step.reads[0]);      // [T, H]
  float* gu = s.buf(BufferId::kSharedGateUp);  // [T, 2 S]
  float* act = s.buf(BufferId::kSharedAct);    // [T, S]
  float* out = s.buf(BufferId::kSharedOut);    // [T, H]
  Linear(d, in, T, WeightRole::kSharedExpertGateProj, WeightRole::kOther, l, gu,
         2 * S);
  Linear(d, in, T, WeightRole::kSharedExpertUp, WeightRole::kOther, l, gu + S,
         2 * S, /*same_x=*/true);
  RoundActivations(d, gu, T, 2 * S, 2 * S);
  be.GatedActivation(ToActivationFn(lc->act), gu, 2 * S, gu + S, 2 * S, act, T,
                     S);
  RoundActivations(d, act, T, S, S);
  Linear(d, act, T, WeightRole::kSharedExpertDown, WeightRole::kOther, l, out,
         H);
  RoundActivations(d, out, T, H, H);
  float* y = s.buf(BufferId::kMlpOut);  // [T, H]
  if (lc->shared_expert_gate) {
    float* g = s.buf(BufferId::kSharedGateLogit);  // [T] f32
    Linear(d, in, T, WeightRole::kSharedExpertGate, WeightRole::kOther, l, g,
           1);
    be.SigmoidGateAddRows(out, g, T, H, y, H);
  } else {
    be.Add(out, y, T * H);
  }
  RoundActivations(d, y, T, H, H);
  return Status();
}

Status Executor::StepMlpResidualAdd(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  // An MoE block's output is complete only here (routed sum + shared
  // expert); a dense MLP's was delivered by its down projection.
  if (lc->moe())
    RETURN_IF_ERROR(Deliver(HookSite::kMlpOut, l, batch, d, H, H,
                            s.buf(BufferId::kMlpOut), sink));
  return BranchResidualAdd(d, *lc, lc->post_mlp_norm, WeightRole::kPostMlpNorm,
                           HookSite::kLn2Post, HookSite::kResidPost, l,
                           s.buf(BufferId::kMlpOut), x, batch, sink);
}

Status Executor::StepParallelResidualAdd(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  float* attn = s.buf(BufferId::kAttnOut);  // [T, H]
  float* mlp = s.buf(BufferId::kMlpOut);    // [T, H]
  if (lc->moe())  // complete only now (see StepMlpResidualAdd)
    RETURN_IF_ERROR(Deliver(HookSite::kMlpOut, l, batch, d, H, H, mlp, sink));
  // HF: x + (attn + mlp), the branch sum first (GPT-NeoX mlp + attn + x,
  // Phi attn + mlp + x: the same f32 sum), each add rounded in bf16.
  be.Add(attn, mlp, T * H);
  RoundActivations(d, mlp, T, H, H);
  be.Add(mlp, x, T * H);
  RoundActivations(d, x, T, H, H);
  return Deliver(HookSite::kResidPost, l, batch, d, H, H, x, sink);
}

Status Executor::StepFinalNorm(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  return Norm(d, c_.norm, c_.norm_eps, c_.norm_offset, WeightRole::kFinalNorm,
              WeightRole::kFinalNormBias, -1, x, s.buf(BufferId::kFinalNorm),
              HookSite::kFinalNorm, batch, sink);
}

Status Executor::StepLogits(const StepArgs& s) {
  const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;
  const float* h = s.buf(BufferId::kFinalNorm);
  float* logits = d.logits.as<float>(BufferId::kLogitsChunk);
  const int64_t V = c_.vocab_size;
  for (int64_t r0 = 0; r0 < T; r0 += options_.logits_chunk_rows) {
    const int64_t rows = std::min(options_.logits_chunk_rows, T - r0);
    ComputeLogits(c_, *d.weights, be, h + r0 * H, rows, logits,
                  d.workspace.region(BufferId::kGemmInputCopy));
    RoundActivations(d, logits, rows, V, V);
    if (sink)
      RETURN_IF_ERROR(sink->OnActivation(HookPoint{HookSite::kLogits, -1},
                                         batch, -1, r0,
                                         F32View(be, logits, rows, V, V)));
  }
  return Status();
}

Status Executor::CopyLayer(Device& d, int64_t layer) {
  const DeviceWeights& w = *d.uploaded;
  return d.copier->CopyAsync(w.Slot(w.SlotOf(layer)), d.copier->device(),
                             w.StagedLayer(layer), DeviceRef{},
                             w.LayerBytes(layer));
}

Status Executor::StartStream(Device& d) {
  Backend& compute = *d.backend;
  Backend& copier = *d.copier;
  // The previous forward's last layers may still read both buffers.
  RETURN_IF_ERROR(copier.WaitFor(compute));
  RETURN_IF_ERROR(CopyLayer(d, d.first_layer));
  RETURN_IF_ERROR(compute.WaitFor(copier));
  if (d.first_layer + 1 <= d.last_layer)
    RETURN_IF_ERROR(CopyLayer(d, d.first_layer + 1));
  return Status();
}

Status Executor::AdvanceStream(Device& d, int64_t layer) {
  if (layer + 1 > d.last_layer) return Status();
  Backend& compute = *d.backend;
  Backend& copier = *d.copier;
  // Layer + 1 runs after its copy (issued before layer ran, or at the start).
  RETURN_IF_ERROR(compute.WaitFor(copier));
  if (layer + 2 > d.last_layer) return Status();
  // Layer is done with its buffer: layer + 2 takes it.
  RETURN_IF_ERROR(copier.WaitFor(compute));
  return CopyLayer(d, layer + 2);
}

}  // namespace loom
