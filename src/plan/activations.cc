#include "src/plan/activations.h"

#include <algorithm>
#include <array>
#include <limits>

#include "src/base/units.h"
#include "src/model/match.h"
#include "src/model/registry.h"

namespace loom {
namespace {

std::string ShapeText(const BufferShape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.dims.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape.dims[i]);
  return text + "] " + std::string(DTypeName(shape.dtype));
}

int64_t ShapeBytes(const BufferShape& shape) {
  int64_t n = 1;
  for (int64_t d : shape.dims) n *= d;
  return n * DTypeSize(shape.dtype);
}

}  // namespace

int ArenaPlan::Find(BufferId id) const {
  for (size_t i = 0; i < regions.size(); ++i)
    if (regions[i].id == id) return static_cast<int>(i);
  return -1;
}

void ArenaPlan::Append(BufferId id, const char* name, int64_t bytes) {
  PlannedRegion r;
  r.id = id;
  r.name = name;
  r.bytes = bytes;
  r.offset = total_bytes;
  total_bytes += AlignUp(bytes, kAlign);
  naive_bytes = total_bytes;
  regions.push_back(std::move(r));
}

void PackArena(ArenaPlan* arena) {
  std::vector<PlannedRegion>& rs = arena->regions;
  std::vector<size_t> order(rs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Largest first; ties by start step then declaration order (deterministic).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (rs[a].bytes != rs[b].bytes) return rs[a].bytes > rs[b].bytes;
    return rs[a].first_step < rs[b].first_step;
  });
  std::vector<size_t> placed;
  arena->total_bytes = 0;
  arena->naive_bytes = 0;
  for (size_t i : order) {
    PlannedRegion& r = rs[i];
    const int64_t size = AlignUp(r.bytes, ArenaPlan::kAlign);
    arena->naive_bytes += size;
    // Placed regions alive at the same time, by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (size_t j : placed) {
      const PlannedRegion& o = rs[j];
      if (o.last_step < r.first_step || r.last_step < o.first_step) continue;
      busy.emplace_back(o.offset,
                        o.offset + AlignUp(o.bytes, ArenaPlan::kAlign));
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + size <= begin) break;  // fits in the gap before `begin`
      offset = std::max(offset, end);
    }
    r.offset = offset;
    arena->total_bytes = std::max(arena->total_bytes, offset + size);
    placed.push_back(i);
  }
}

ActivationLayout PlanActivations(const ModelConfig& c, const JobSpec& job,
                                 const KernelCosts& costs) {
  const int64_t T = job.batch_tokens, L = job.MaxSeqLen(), H = c.hidden_size,
                I = c.intermediate_size;
  const int64_t Q = c.q_dim(), KV = c.kv_dim();
  const DType A = costs.activation_dtype;
  const bool moe = c.mlp == MlpKind::kMoE;
  const int64_t logits_rows = std::min(job.logits_chunk_rows, T);
  auto hooked = [&](HookSite site) {
    for (const HookSet* set : {&job.hooks, &job.tapped_hooks})
      for (const HookPoint& h : set->hooks())
        if (h.site == site) return true;
    return false;
  };

  // ---- The program, flattened: prologue, each block once, epilogue ----
  const Program program = BuildProgram(c);
  struct Flat {
    const ProgramStep* step;
    int block_end;  // last step of its block (-1 outside the blocks)
  };
  std::vector<Flat> flat;
  for (const ProgramStep& s : program.prologue) flat.push_back({&s, -1});
  const int block_first = static_cast<int>(flat.size());
  for (const std::vector<ProgramStep>& block : program.blocks) {
    const int end = static_cast<int>(flat.size() + block.size()) - 1;
    for (const ProgramStep& s : block) flat.push_back({&s, end});
  }
  const int block_last = static_cast<int>(flat.size()) - 1;
  for (const ProgramStep& s : program.epilogue) flat.push_back({&s, -1});
  const int s_end = static_cast<int>(flat.size()) - 1;

  ActivationLayout out;
  for (const Flat& f : flat) {
    out.steps.emplace_back(StepName(f.step->id));
    out.step_ids.push_back(f.step->id);
  }
  out.block_first_step = block_first;
  out.block_last_step = block_last;

  // ---- Liveness of every buffer from the steps that run ----
  struct Live {
    int first = -1, last = -1;
    std::vector<HookSite> hooks;
  };
  std::array<Live, kNumBuffers> live;
  auto touch = [&](BufferId b, int i) {
    Live& l = live[static_cast<int>(b)];
    if (l.first < 0) l.first = i;
    l.last = std::max(l.last, i);
  };
  for (int i = 0; i <= s_end; ++i) {
    const ProgramStep& s = *flat[i].step;
    if (s.id == StepId::kFinalNorm && !job.NeedsFinalNorm()) continue;
    if (s.id == StepId::kLogits && !job.NeedsLogits()) continue;
    for (BufferId b : s.writes) touch(b, i);
    for (BufferId b : s.reads) touch(b, i);
    if (s.conditional && hooked(s.condition)) touch(s.conditional_buffer, i);
  }
  // Values carried from layer to layer.
  for (BufferId b :
       {BufferId::kPositions, BufferId::kSeqStart, BufferId::kResidual})
    if (live[static_cast<int>(b)].first >= 0)
      live[static_cast<int>(b)].last = s_end;
  for (BufferId b :
       {BufferId::kRopeInvFreq, BufferId::kRopeCos, BufferId::kRopeSin})
    if (live[static_cast<int>(b)].first >= 0)
      live[static_cast<int>(b)].last = block_last;
  // A hooked tensor is live until it is copied: at its step for synchronous
  // capture, at the end of its block when the copy is asynchronous.
  for (int i = 0; i <= s_end; ++i) {
    for (const HookEmit& e : flat[i].step->hooks) {
      Live& l = live[static_cast<int>(e.buffer)];
      if (l.first < 0) continue;
      if (std::find(l.hooks.begin(), l.hooks.end(), e.site) == l.hooks.end())
        l.hooks.push_back(e.site);
      if (!hooked(e.site)) continue;
      const int copy_done =
          job.async_capture && flat[i].block_end >= 0 ? flat[i].block_end : i;
      l.last = std::max(l.last, copy_done);
    }
  }

  // ---- Activations, in buffer order ----
  for (int b = 0; b < static_cast<int>(BufferId::kGemmInputCopy); ++b) {
    if (live[b].first < 0) continue;
    const BufferId id = static_cast<BufferId>(b);
    const BufferShape shape = ShapeOf(id, c, T, L, logits_rows, A);
    PlannedRegion r;
    r.id = id;
    r.name = std::string(BufferName(id));
    r.shape = ShapeText(shape);
    r.bytes = ShapeBytes(shape);
    r.first_step = live[b].first;
    r.last_step = live[b].last;
    r.hooks = live[b].hooks;
    out.activations.regions.push_back(std::move(r));
  }
  PackArena(&out.activations);

  // ---- Kernel workspace: each kernel's scratch, all resident ----
  const DType w_dtype = job.weight_compute_dtype.value_or(c.torch_dtype);
  int64_t kmax = std::max({H, Q, I});
  if (moe)
    kmax = std::max({kmax, c.moe.expert_intermediate_size,
                     c.moe.shared_expert_intermediate_size});
  const MlaConfig& mla = c.mla;
  const bool is_mla = c.attention == AttentionKind::kMla;
  if (is_mla) kmax = std::max({kmax, mla.q_lora_rank, mla.kv_lora_rank});
  // Rows of the largest GEMM input: a logits chunk, or the T k routed rows
  // whose 16-bit copy the experts' grouped GEMMs share (Backend::GemmGroup).
  int64_t gemm_m = job.NeedsLogits() ? std::max(T, job.logits_chunk_rows) : T;
  if (moe) gemm_m = std::max(gemm_m, T * c.moe.experts_per_token);
  auto ws = [&](BufferId id, int64_t bytes, std::string shape) {
    PlannedRegion r;
    r.id = id;
    r.name = std::string(BufferName(id));
    r.shape = std::move(shape);
    r.bytes = bytes;
    r.first_step = 0;
    r.last_step = s_end;
    out.workspace.regions.push_back(std::move(r));
  };
  if (costs.gemm_workspace)
    ws(BufferId::kGemmInputCopy, costs.gemm_workspace(gemm_m, kmax, w_dtype),
       "m=" + std::to_string(gemm_m) + " k=" + std::to_string(kmax) + " " +
           std::string(DTypeName(w_dtype)));
  if (costs.gemm_scratchpad) {
    // The largest scratch over the forward's GEMM shapes (both weight
    // layouts: the declaration, not the config, knows which one a model uses).
    std::vector<std::array<int64_t, 3>> shapes = {
        {T, Q, H}, {T, KV, H},    {T, Q + 2 * KV, H}, {T, H, Q},
        {T, I, H}, {T, 2 * I, H}, {T, H, I}};
    if (moe) {
      const int64_t Ie = c.moe.expert_intermediate_size,
                    S = c.moe.shared_expert_intermediate_size;
      // Router; experts' gate and up (each Ie, or fused 2 Ie) and down on at
      // most T rows; the shared expert and its [1, H] gate.
      shapes.push_back({T, c.moe.num_experts, H});
      shapes.push_back({T, Ie, H});
      shapes.push_back({T, 2 * Ie, H});
      shapes.push_back({T, H, Ie});
      if (S > 0) {
        shapes.push_back({T, S, H});
        shapes.push_back({T, 2 * S, H});
        shapes.push_back({T, H, S});
        shapes.push_back({T, 1, H});
      }
    }
    if (is_mla) {
      // q_a, q_b, kv_a, kv_b and o_proj (from z of heads x v_head_dim).
      const int64_t heads = c.num_heads;
      shapes.push_back({T, mla.q_lora_rank, H});
      shapes.push_back({T, heads * mla.qk_head_dim(), mla.q_lora_rank});
      shapes.push_back({T, mla.kv_lora_rank + mla.qk_rope_head_dim, H});
      shapes.push_back({T, heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                        mla.kv_lora_rank});
      shapes.push_back({T, H, heads * mla.v_head_dim});
    }
    if (job.NeedsLogits())
      shapes.push_back({std::min(job.logits_chunk_rows, T), c.vocab_size, H});
    int64_t scratch = 0;
    for (const auto& [m, n, k] : shapes)
      for (bool k_major : {false, true})
        scratch =
            std::max(scratch, costs.gemm_scratchpad(m, n, k, w_dtype, k_major));
    if (scratch > 0)
      ws(BufferId::kGemmScratchpad, scratch,
         "max over the forward's GEMM shapes");
  }
  if (costs.weight_decode_workspace && c.quant.quantized()) {
    // The largest panel over the GEMMs whose weights the checkpoint stores
    // quantized (the declaration and the quantization config decide which).
    int64_t decode = 0;
    std::string what;
    if (const ArchDef* arch = FindArch(c.model_type); arch != nullptr) {
      const ArchWeights decl = arch->declare_weights(c);
      for (const WeightSpec& spec : decl.specs) {
        const WeightFormat f = ResolveFormat(c, spec, std::nullopt);
        if (!f.quantized() || spec.shape.rank() < 2) continue;
        const Shape s = LogicalWeightShape(spec);
        const int64_t n = s.dim(-2), k = s.dim(-1);
        const int64_t b = costs.weight_decode_workspace(n, k, f.kind, w_dtype);
        if (b > decode) {
          decode = b;
          what = f.ToString() + " n=" + std::to_string(n) +
                 " k=" + std::to_string(k) + " -> " +
                 std::string(DTypeName(w_dtype));
        }
      }
    }
    if (decode > 0) ws(BufferId::kWeightDecode, decode, what);
  }
  if (costs.attention_workspace)
    ws(BufferId::kAttnWorkspace,
       costs.attention_workspace(L, c.num_heads,
                                 std::max(c.head_dim, c.v_head_dim()),
                                 costs.num_threads),
       "L=" + std::to_string(L) + " heads=" + std::to_string(c.num_heads) +
           " threads=" + std::to_string(costs.num_threads));
  PackArena(&out.workspace);

  // ---- Logits, a chunk of rows at a time ----
  const Live& lg = live[static_cast<int>(BufferId::kLogitsChunk)];
  if (lg.first >= 0) {
    const BufferShape shape =
        ShapeOf(BufferId::kLogitsChunk, c, T, L, logits_rows, A);
    PlannedRegion r;
    r.id = BufferId::kLogitsChunk;
    r.name = std::string(BufferName(r.id));
    r.shape = ShapeText(shape);
    r.bytes = ShapeBytes(shape);
    r.first_step = lg.first;
    r.last_step = lg.last;
    r.hooks = lg.hooks;
    out.logits.regions.push_back(std::move(r));
    PackArena(&out.logits);
  }
  return out;
}

}  // namespace loom
