#include "src/plan/activations.h"

#include <array>

#include <algorithm>
#include <limits>

#include "src/base/units.h"

namespace loom {
namespace {

// Builds the step program and its regions.
class Builder {
 public:
  int Step(std::string name) {
    steps_.push_back(std::move(name));
    return static_cast<int>(steps_.size()) - 1;
  }
  void Region(ArenaPlan* arena, std::string name, std::vector<int64_t> dims,
              DType dtype, int first, int last,
              std::vector<HookSite> hooks = {}) {
    PlannedRegion r;
    r.name = std::move(name);
    int64_t n = 1;
    r.shape = "[";
    for (size_t i = 0; i < dims.size(); ++i) {
      n *= dims[i];
      r.shape += (i ? ", " : "") + std::to_string(dims[i]);
    }
    r.shape += "] " + std::string(DTypeName(dtype));
    r.bytes = n * DTypeSize(dtype);
    r.first_step = first;
    r.last_step = last;
    r.hooks = std::move(hooks);
    arena->regions.push_back(std::move(r));
  }
  std::vector<std::string> TakeSteps() { return std::move(steps_); }

 private:
  std::vector<std::string> steps_;
};

}  // namespace

int ArenaPlan::Find(std::string_view name) const {
  for (size_t i = 0; i < regions.size(); ++i)
    if (regions[i].name == name) return static_cast<int>(i);
  return -1;
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
  const int64_t half =
      c.rope.type == RopeConfig::Type::kNone ? 0 : c.rope.rotary_dim / 2;
  const bool moe = c.mlp == MlpKind::kMoE;
  bool pattern = false;
  for (const HookPoint& h : job.hooks.hooks())
    pattern |= h.site == HookSite::kPattern;

  ActivationLayout out;
  ArenaPlan& act = out.activations;
  Builder b;
  // ---- Program ----
  const int s_embed = b.Step("embed");
  const int s_ln1 = b.Step("ln1");
  const int s_qkv = b.Step("qkv proj");
  const int s_attn = b.Step("attention");
  const int s_o = b.Step("o proj");
  const int s_attn_add = b.Step("attention residual add");
  const int s_ln2 = b.Step("ln2");
  int s_up = 0, s_act = 0, s_down = 0, s_router = 0, s_gather = 0, s_eup = 0,
      s_eact = 0, s_edown = 0, s_scatter = 0, s_shared = 0;
  if (!moe) {
    s_up = b.Step("gate/up proj");
    s_act = b.Step("activation");
    s_down = b.Step("down proj");
  } else {
    s_router = b.Step("router + top-k");
    s_gather = b.Step("expert loop: gather tokens");
    s_eup = b.Step("expert loop: gate/up proj");
    s_eact = b.Step("expert loop: activation");
    s_edown = b.Step("expert loop: down proj");
    s_scatter = b.Step("expert loop: weighted scatter-add");
    if (c.moe.shared_expert_intermediate_size > 0)
      s_shared = b.Step("shared expert");
  }
  const int s_mlp_add = b.Step("mlp residual add");
  const int s_final = b.Step("final norm");
  const int s_logits = b.Step("logits");
  out.block_first_step = s_ln1;
  out.block_last_step = s_mlp_add;
  const int s_end = s_logits;

  // A hooked tensor read at `step` is live until then, or to the end of the
  // block when the copy is asynchronous.
  auto until = [&](int last, int hook_step, bool hooked) {
    if (!hooked) return last;
    const int copy_done =
        job.async_capture && hook_step >= s_ln1 && hook_step <= s_mlp_add
            ? s_mlp_add
            : hook_step;
    return std::max(last, copy_done);
  };
  auto hooked = [&](std::initializer_list<HookSite> sites) {
    for (const HookPoint& h : job.hooks.hooks())
      for (HookSite s : sites)
        if (h.site == s) return true;
    return false;
  };

  // ---- Activations ----
  b.Region(&act, "positions", {T}, DType::kI32, s_embed, s_end);
  b.Region(&act, "residual", {T, H}, A, s_embed, s_end,
           {HookSite::kEmbed, HookSite::kResidPre, HookSite::kResidMid,
            HookSite::kResidPost});
  if (c.learned_positions)
    b.Region(&act, "position embeddings", {T, H}, A, s_embed,
             until(s_embed, s_embed, hooked({HookSite::kPosEmbed})),
             {HookSite::kPosEmbed});
  if (half > 0) {
    b.Region(&act, "rope inv_freq", {half}, DType::kF32, s_embed, s_mlp_add);
    b.Region(&act, "rope cos", {T, half}, DType::kF32, s_embed, s_mlp_add);
    b.Region(&act, "rope sin", {T, half}, DType::kF32, s_embed, s_mlp_add);
  }
  if (c.pre_attn_norm)
    b.Region(&act, "attention input", {T, H}, A, s_ln1,
             until(s_qkv, s_ln1, hooked({HookSite::kLn1})), {HookSite::kLn1});
  b.Region(&act, "qkv", {T, Q + 2 * KV}, A, s_qkv,
           until(s_attn, s_attn,
                 hooked({HookSite::kQ, HookSite::kK, HookSite::kV,
                         HookSite::kRotQ, HookSite::kRotK})),
           {HookSite::kQ, HookSite::kK, HookSite::kV, HookSite::kRotQ,
            HookSite::kRotK});
  if (pattern)
    b.Region(&act, "attention pattern", {c.num_heads, L, L}, A, s_attn,
             until(s_attn, s_attn, true), {HookSite::kPattern});
  b.Region(&act, "attention z", {T, Q}, A, s_attn,
           until(s_o, s_attn, hooked({HookSite::kZ})), {HookSite::kZ});
  b.Region(&act, "attention out", {T, H}, A, s_o,
           until(s_attn_add, s_attn_add,
                 hooked({HookSite::kAttnOut, HookSite::kLn1Post})),
           {HookSite::kAttnOut, HookSite::kLn1Post});
  const int mlp_in_last = !moe ? s_up : (s_shared ? s_shared : s_gather);
  if (c.pre_mlp_norm)
    b.Region(&act, "mlp input", {T, H}, A, s_ln2,
             until(mlp_in_last, s_ln2, hooked({HookSite::kLn2})),
             {HookSite::kLn2});
  if (!moe) {
    const bool plain = c.mlp == MlpKind::kPlain;
    b.Region(
        &act, plain ? "mlp fc" : "mlp gate|up", {T, plain ? I : 2 * I}, A, s_up,
        until(plain ? s_down : s_act, s_up, hooked({HookSite::kMlpPre})),
        plain ? std::vector<HookSite>{HookSite::kMlpPre, HookSite::kMlpPost}
              : std::vector<HookSite>{HookSite::kMlpPre});
    if (!plain)
      b.Region(&act, "mlp activated", {T, I}, A, s_act,
               until(s_down, s_act, hooked({HookSite::kMlpPost})),
               {HookSite::kMlpPost});
    b.Region(&act, "mlp out", {T, H}, A, s_down,
             until(s_mlp_add, s_mlp_add,
                   hooked({HookSite::kMlpOut, HookSite::kLn2Post})),
             {HookSite::kMlpOut, HookSite::kLn2Post});
  } else {
    const int64_t E = c.moe.num_experts, K = c.moe.experts_per_token,
                  Ie = c.moe.expert_intermediate_size;
    b.Region(&act, "router logits", {T, E}, DType::kF32, s_router, s_router);
    b.Region(&act, "routes (expert ids)", {T, K}, DType::kI32, s_router,
             s_scatter);
    b.Region(&act, "routes (weights)", {T, K}, DType::kF32, s_router,
             s_scatter);
    // Per expert: at most every token of the batch (all may pick it).
    b.Region(&act, "expert tokens (row ids)", {T}, DType::kI32, s_gather,
             s_scatter);
    b.Region(&act, "expert input", {T, H}, A, s_gather, s_eup);
    b.Region(&act, "expert gate|up", {T, 2 * Ie}, A, s_eup, s_eact);
    b.Region(&act, "expert activated", {T, Ie}, A, s_eact, s_edown);
    b.Region(&act, "expert out", {T, H}, A, s_edown, s_scatter);
    if (s_shared) {
      const int64_t S = c.moe.shared_expert_intermediate_size;
      b.Region(&act, "shared expert gate|up", {T, 2 * S}, A, s_shared,
               s_shared);
      b.Region(&act, "shared expert activated", {T, S}, A, s_shared, s_shared);
      b.Region(&act, "shared expert out", {T, H}, A, s_shared, s_shared);
    }
    b.Region(&act, "mlp out", {T, H}, A, s_gather,
             until(s_mlp_add, s_mlp_add,
                   hooked({HookSite::kMlpOut, HookSite::kLn2Post})),
             {HookSite::kMlpOut, HookSite::kLn2Post});
  }
  if (job.NeedsFinalNorm())
    b.Region(&act, "final norm", {T, H}, A, s_final,
             job.NeedsLogits() ? s_logits : s_final, {HookSite::kFinalNorm});
  out.steps = b.TakeSteps();
  PackArena(&act);

  // ---- Kernel workspace: each kernel's scratch, all resident ----
  const DType w_dtype = job.weight_compute_dtype.value_or(c.torch_dtype);
  int64_t kmax = std::max({H, Q, I});
  if (moe)
    kmax = std::max({kmax, c.moe.expert_intermediate_size,
                     c.moe.shared_expert_intermediate_size});
  const int64_t gemm_m =
      job.NeedsLogits() ? std::max(T, job.logits_chunk_rows) : T;
  auto ws = [&](std::string name, int64_t bytes, std::string shape) {
    PlannedRegion r;
    r.name = std::move(name);
    r.shape = std::move(shape);
    r.bytes = bytes;
    r.first_step = 0;
    r.last_step = s_end;
    out.workspace.regions.push_back(std::move(r));
  };
  if (costs.gemm_workspace)
    ws("gemm input copy", costs.gemm_workspace(gemm_m, kmax, w_dtype),
       "m=" + std::to_string(gemm_m) + " k=" + std::to_string(kmax) + " " +
           std::string(DTypeName(w_dtype)));
  if (costs.gemm_scratchpad) {
    // The largest scratch over the forward's GEMM shapes (both weight
    // layouts: the declaration, not the config, knows which one a model uses).
    std::vector<std::array<int64_t, 3>> shapes = {
        {T, Q, H}, {T, KV, H}, {T, Q + 2 * KV, H}, {T, H, Q}, {T, I, H}, {T, 2 * I, H}, {T, H, I}};
    if (moe) {
      const int64_t Ie = c.moe.expert_intermediate_size, S = c.moe.shared_expert_intermediate_size;
      shapes.push_back({T, 2 * Ie, H});
      shapes.push_back({T, H, Ie});
      if (S > 0) {
        shapes.push_back({T, 2 * S, H});
        shapes.push_back({T, H, S});
      }
    }
    if (job.NeedsLogits()) shapes.push_back({std::min(job.logits_chunk_rows, T), c.vocab_size, H});
    int64_t scratch = 0;
    for (const auto& [m, n, k] : shapes)
      for (bool k_major : {false, true}) scratch = std::max(scratch, costs.gemm_scratchpad(m, n, k, w_dtype, k_major));
    if (scratch > 0) ws("gemm scratchpad", scratch, "max over the forward's GEMM shapes");
  }
  if (costs.attention_workspace)
    ws("attention workspace",
       costs.attention_workspace(L, c.num_heads, c.head_dim, costs.num_threads),
       "L=" + std::to_string(L) + " heads=" + std::to_string(c.num_heads) +
           " threads=" + std::to_string(costs.num_threads));
  PackArena(&out.workspace);

  // ---- Logits, a chunk of rows at a time ----
  if (job.NeedsLogits()) {
    Builder lb;
    lb.Region(&out.logits, "logits chunk",
              {std::min(job.logits_chunk_rows, T), c.vocab_size}, DType::kF32,
              s_logits, s_logits, {HookSite::kLogits});
    PackArena(&out.logits);
  }
  return out;
}

}  // namespace loom
