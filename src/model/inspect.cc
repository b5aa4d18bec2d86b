#include "src/model/inspect.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "src/base/units.h"
#include "src/io/safetensors.h"
#include "src/model/bind.h"
#include "src/model/registry.h"

namespace loom {
namespace {

std::string RopeName(RopeConfig::Type t) {
  switch (t) {
    case RopeConfig::Type::kNone:
      return "none";
    case RopeConfig::Type::kDefault:
      return "default";
    case RopeConfig::Type::kLinear:
      return "linear";
    case RopeConfig::Type::kDynamic:
      return "dynamic";
    case RopeConfig::Type::kLlama3:
      return "llama3";
    case RopeConfig::Type::kYarn:
      return "yarn";
  }
  return "?";
}

std::string BlockName(BlockKind b) {
  switch (b) {
    case BlockKind::kSequential:
      return "sequential";
    case BlockKind::kParallel:
      return "parallel";
    case BlockKind::kParallelSharedNorm:
      return "parallel, shared norm";
  }
  return "?";
}

std::string NormName(NormKind kind, float offset, bool bias) {
  std::string s = kind == NormKind::kRms     ? "rmsnorm"
                  : kind == NormKind::kLayer ? "layernorm"
                                             : "layernorm (no parameters)";
  if (kind != NormKind::kLayerNoAffine && offset != 0.0f)
    s += offset == 1.0f ? " (1 + w)" : " (w + " + std::to_string(offset) + ")";
  if (kind == NormKind::kLayer) s += bias ? " with bias" : " without bias";
  return s;
}

// The norms: the block's kind and the q/k norms, if any.
std::string NormsText(const ModelConfig& c) {
  std::ostringstream o;
  o << NormName(c.norm, c.norm_offset, c.norm_bias) << ", eps " << c.norm_eps;
  if (c.embed_norm) o << "; the embeddings normalized too";
  if (c.qk_norm == QkNormKind::kNone) return o.str();
  // RMSNorm q/k norms take the block's gain offset (Gemma 3's 1 + w); the
  // q/k LayerNorms none.
  o << "; q/k: "
    << NormName(c.qk_norm_type,
                c.qk_norm_type == NormKind::kRms ? c.norm_offset : 0.0f,
                c.qk_norm_type == NormKind::kLayer && c.qk_norm_bias);
  switch (c.qk_norm) {
    case QkNormKind::kPerHead:
      o << " per head (one weight for every head)";
      break;
    case QkNormKind::kPerHeadOwn:
      o << " per head (each head its own weight)";
      break;
    case QkNormKind::kFull:
      o << " over the whole projection";
      break;
    case QkNormKind::kNone:
      break;
  }
  return o.str();
}

// "rope default (theta 10000) on 8 of 16 dims (pairs interleaved), max
// 512".
std::string PositionsText(const ModelConfig& c) {
  std::ostringstream o;
  if (c.alibi) {
    o << "alibi (per-head slopes), max " << c.max_position_embeddings;
    return o.str();
  }
  o << (c.learned_positions ? "learned" : "rope " + RopeName(c.rope.type));
  if (!c.learned_positions && c.rope.type != RopeConfig::Type::kNone)
    o << " (theta " << c.rope.theta << ")";
  if (!c.learned_positions && c.rope.type != RopeConfig::Type::kNone &&
      c.rope.rotary_dim < c.head_dim)
    o << " on " << c.rope.rotary_dim << " of " << c.head_dim << " dims";
  if (!c.learned_positions && c.rope.rotate_pairs) o << " (pairs interleaved)";
  if (c.learned_positions && c.position_offset != 0)
    o << " (position p reads row p + " << c.position_offset << ")";
  o << ", max " << c.max_position_embeddings;
  return o.str();
}

// Granite's embedding / residual / logits multipliers, Gemma's embedding
// scale ("" when all are 1).
std::string MultipliersText(const ModelConfig& c) {
  std::ostringstream o;
  auto add = [&](const char* what, float v) {
    if (v == 1.0f) return;
    o << (o.tellp() > 0 ? ", " : "") << what << " " << v;
  };
  add("embeddings x", c.embedding_scale);
  add("residual branches x", c.residual_multiplier);
  add("logits /", c.logits_scaling);
  return o.str();
}

std::string ActName(ActKind a) {
  switch (a) {
    case ActKind::kSilu:
      return "silu";
    case ActKind::kGeluTanh:
      return "gelu (tanh)";
    case ActKind::kGeluExact:
      return "gelu (erf)";
    case ActKind::kRelu:
      return "relu";
    case ActKind::kReluSquared:
      return "relu^2";
  }
  return "?";
}

std::string QkvLayoutName(QkvLayout l) {
  switch (l) {
    case QkvLayout::kConcat:
      return "[q | k | v]";
    case QkvLayout::kPerHead:
      return "per head [q_h | k_h | v_h]";
    case QkvLayout::kGroupedQvk:
      return "chunks of [q | v | k]";
    case QkvLayout::kPerKvGroup:
      return "per kv group [q heads | k | v]";
  }
  return "?";
}

std::string RouterName(RouterKind r) {
  switch (r) {
    case RouterKind::kSoftmaxTopK:
      return "softmax_topk";
    case RouterKind::kTopKSoftmax:
      return "topk_softmax";
    case RouterKind::kSigmoidGroupTopK:
      return "sigmoid_group_topk";
  }
  return "?";
}

// The layers of a mixture-of-experts model with routed experts, and those
// with a dense MLP (deepseek_v3's first_k_dense_replace, Qwen-MoE's
// mlp_only_layers and decoder_sparse_step).
std::pair<std::vector<int64_t>, std::vector<int64_t>> SparseAndDenseLayers(
    const ModelConfig& c) {
  std::vector<int64_t> sparse, dense;
  for (int64_t l = 0; l < c.num_layers; ++l)
    (c.moe.IsSparseLayer(l) ? sparse : dense).push_back(l);
  return {sparse, dense};
}

// "0-2, 5, 7-9".
std::string LayerRanges(const std::vector<int64_t>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(layers[i]) +
           (j > i ? "-" + std::to_string(layers[j]) : "");
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

nlohmann::json MoeJson(const ModelConfig& c) {
  if (c.mlp != MlpKind::kMoE) return nullptr;
  const MoEConfig& m = c.moe;
  const auto [sparse, dense] = SparseAndDenseLayers(c);
  nlohmann::json j = {
      {"num_experts", m.num_experts},
      {"experts_per_token", m.experts_per_token},
      {"expert_intermediate_size", m.expert_intermediate_size},
      {"shared_expert_intermediate_size", m.shared_expert_intermediate_size},
      {"shared_expert_gate", m.shared_expert_gate},
      {"router", RouterName(m.router)},
      {"norm_topk_prob", m.norm_topk_prob},
      {"sparse_layers", sparse},
      {"dense_layers", dense}};
  if (m.router == RouterKind::kSigmoidGroupTopK) {
    j["n_group"] = m.n_group;
    j["topk_group"] = m.topk_group;
    j["routed_scaling_factor"] = m.routed_scaling_factor;
  }
  return j;
}

nlohmann::json MlaJson(const ModelConfig& c) {
  if (c.attention != AttentionKind::kMla) return nullptr;
  const MlaConfig& m = c.mla;
  return {{"q_lora_rank", m.q_lora_rank},
          {"kv_lora_rank", m.kv_lora_rank},
          {"qk_nope_head_dim", m.qk_nope_head_dim},
          {"qk_rope_head_dim", m.qk_rope_head_dim},
          {"v_head_dim", m.v_head_dim}};
}

// The text lines of the attention and the experts.
void AttentionText(const ModelConfig& c, std::ostringstream& o) {
  if (c.attention == AttentionKind::kMla) {
    const MlaConfig& m = c.mla;
    o << "attention         multi-head latent (MLA), " << c.num_heads
      << " heads: q "
      << (m.q_lora_rank > 0 ? "via rank " + std::to_string(m.q_lora_rank)
                            : std::string("plain"))
      << ", kv latent rank " << m.kv_lora_rank << ", q/k " << m.qk_head_dim()
      << " (" << m.qk_nope_head_dim << " nope + " << m.qk_rope_head_dim
      << " rope, the rope key shared), v " << m.v_head_dim;
  } else {
    o << "attention         " << c.num_heads << " heads x " << c.head_dim
      << ", " << c.num_kv_heads << " kv heads";
  }
  int64_t windowed = 0;
  for (int64_t w : c.sliding_window) windowed += w > 0;
  if (windowed) {
    int64_t w = 0;
    for (int64_t x : c.sliding_window) w = std::max(w, x);
    o << ", sliding window (" << w << ") on " << windowed << "/" << c.num_layers
      << " layers";
  }
  // A scale other than 1/sqrt(head_dim) (GPT-Neo's none, Granite's
  // multiplier, Gemma 2's query_pre_attn_scalar).
  if (c.attn_scale > 0 &&
      std::fabs(c.attn_scale * std::sqrt(static_cast<float>(c.head_dim)) -
                1.0f) > 1e-6f)
    o << ", scores x " << c.attn_scale;
  o << "\n";
  if (c.mlp != MlpKind::kMoE) return;
  const MoEConfig& m = c.moe;
  const auto [sparse, dense] = SparseAndDenseLayers(c);
  o << "experts           " << m.num_experts << " routed, top "
    << m.experts_per_token << " per token, intermediate "
    << m.expert_intermediate_size;
  if (m.shared_expert_intermediate_size > 0)
    o << "; shared expert of " << m.shared_expert_intermediate_size
      << (m.shared_expert_gate ? " (gated)" : "");
  o << "\n";
  // top-k then softmax sums to 1 by construction: no renormalisation.
  o << "router            " << RouterName(m.router)
    << (m.norm_topk_prob && m.router != RouterKind::kTopKSoftmax
            ? ", top-k renormalised"
            : "");
  if (m.router == RouterKind::kSigmoidGroupTopK)
    o << ", " << m.n_group << " groups keep " << m.topk_group << ", scaling "
      << m.routed_scaling_factor;
  o << "\n";
  o << "expert layers     " << LayerRanges(sparse);
  if (!dense.empty()) o << "  (dense MLP: " << LayerRanges(dense) << ")";
  o << "\n";
}

// Weight families in display order; stored tensors no weight uses come last.
enum class Family : int {
  kEmbeddings,
  kNorms,
  kAttention,
  kAttentionBiases,
  kAttentionSinks,
  kMlp,
  kMlpBiases,
  kRouter,
  kExpertsGateUp,
  kExpertsDown,
  kExpertBiases,
  kSharedExpert,
  kLmHead,
  kOther,
  kUnused,
};
constexpr std::string_view kFamilyNames[] = {
    "embeddings",       "norms",           "attention q/k/v/o",
    "attention biases", "attention sinks", "mlp gate/up/down",
    "mlp biases",       "router",          "experts gate/up",
    "experts down",     "expert biases",   "shared expert",
    "lm_head",          "other",           "unused"};
static_assert(std::size(kFamilyNames) ==
              static_cast<size_t>(Family::kUnused) + 1);

std::string_view NameOf(Family f) { return kFamilyNames[static_cast<int>(f)]; }

Family FamilyOf(WeightRole role) {
  using R = WeightRole;
  switch (role) {
    case R::kEmbed:
    case R::kPosEmbed:
      return Family::kEmbeddings;
    case R::kFinalNorm:
    case R::kFinalNormBias:
    case R::kEmbedNorm:
    case R::kEmbedNormBias:
    case R::kAttnNorm:
    case R::kAttnNormBias:
    case R::kQNorm:
    case R::kKNorm:
    case R::kQNormBias:
    case R::kKNormBias:
    case R::kPostAttnNorm:
    case R::kMlpNorm:
    case R::kMlpNormBias:
    case R::kPostMlpNorm:
    case R::kQANorm:
    case R::kKvANorm:
      return Family::kNorms;
    case R::kQ:
    case R::kK:
    case R::kV:
    case R::kQkv:
    case R::kO:
    case R::kQA:
    case R::kQB:
    case R::kKvA:
    case R::kKvB:
      return Family::kAttention;
    case R::kQBias:
    case R::kKBias:
    case R::kVBias:
    case R::kQkvBias:
    case R::kOBias:
      return Family::kAttentionBiases;
    case R::kAttnSinks:
      return Family::kAttentionSinks;
    case R::kGate:
    case R::kUp:
    case R::kGateUp:
    case R::kDown:
      return Family::kMlp;
    case R::kGateBias:
    case R::kUpBias:
    case R::kDownBias:
      return Family::kMlpBiases;
    case R::kRouter:
    case R::kRouterBias:
    case R::kRouterCorrectionBias:
      return Family::kRouter;
    case R::kExpertGate:
    case R::kExpertUp:
    case R::kExpertGateUp:
      return Family::kExpertsGateUp;
    case R::kExpertDown:
      return Family::kExpertsDown;
    case R::kExpertGateUpBias:
    case R::kExpertDownBias:
      return Family::kExpertBiases;
    case R::kSharedExpertGateProj:
    case R::kSharedExpertUp:
    case R::kSharedExpertDown:
    case R::kSharedExpertGate:
      return Family::kSharedExpert;
    case R::kLmHead:
    case R::kLmHeadBias:
      return Family::kLmHead;
    case R::kOther:
      return Family::kOther;
  }
  return Family::kOther;
}

// Groups the matched weights by (family, format); tied weights are skipped
// (their tensors are the target's, counted there). With `entries`, stored
// tensors no weight matched (the architecture's ignored suffixes) form the
// "unused" group, one per dtype, so the groups cover every stored byte.
std::vector<WeightGroup> GroupWeights(
    const ArchWeights& decl, const std::vector<MatchedWeight>& matched,
    const std::vector<Checkpoint::Entry>* entries) {
  std::map<std::pair<Family, std::string>, WeightGroup> by_key;
  std::set<int64_t> used_ids;
  for (size_t i = 0; i < matched.size(); ++i) {
    const MatchedWeight& w = matched[i];
    if (!w.present || w.tied) continue;
    const Family family = FamilyOf(decl.specs[i].role);
    WeightGroup& g = by_key[{family, w.format.ToString()}];
    g.family = std::string(NameOf(family));
    g.format = w.format.ToString();
    ++g.weights;
    g.bytes += w.bytes();
    for (const MatchedTensor& t : w.tensors) {
      ++g.tensors;
      g.dtype_assumed |= t.dtype_assumed;
      used_ids.insert(t.id);
    }
  }
  if (entries) {
    for (size_t i = 0; i < entries->size(); ++i) {
      if (used_ids.count(static_cast<int64_t>(i))) continue;
      const TensorInfo& info = (*entries)[i].info;
      const std::string dtype(DTypeName(info.dtype));
      WeightGroup& g = by_key[{Family::kUnused, dtype}];
      g.family = std::string(NameOf(Family::kUnused));
      g.format = dtype;
      ++g.tensors;
      g.bytes += info.bytes();
    }
  }
  std::vector<WeightGroup> out;
  for (auto& [key, g] : by_key) out.push_back(std::move(g));
  return out;
}

}  // namespace

std::string_view WeightFamilyName(WeightRole role) {
  return NameOf(FamilyOf(role));
}

StatusOr<InspectReport> InspectModel(const std::string& dir) {
  InspectReport rep;
  ASSIGN_OR_RETURN(rep.config, LoadModelConfig(dir));
  const ArchDef* arch = FindArch(rep.config.model_type);
  rep.runnable = arch->runnable;
  const ArchWeights decl = arch->declare_weights(rep.config);
  const bool has_single = std::filesystem::exists(dir + "/model.safetensors");
  const bool has_index =
      std::filesystem::exists(dir + "/model.safetensors.index.json");
  if (!has_single && !has_index) {
    rep.problems.push_back(
        "no model.safetensors or model.safetensors.index.json in " + dir +
        " (parameter count and group bytes from the declared shapes, dtype "
        "assumed " +
        std::string(DTypeName(rep.config.torch_dtype)) + ")");
    for (const auto& s : decl.specs)
      if (s.tied_to.empty() || !rep.config.tie_word_embeddings)
        rep.num_parameters += s.shape.numel();
    MatchOptions o;
    o.source = "config.json";
    o.assumed_dense_dtype = rep.config.torch_dtype;
    StatusOr<std::vector<MatchedWeight>> m =
        MatchCheckpoint(rep.config, decl, nullptr, o);
    if (!m.ok()) {
      rep.problems.push_back(m.status().message());
      return rep;
    }
    rep.groups = GroupWeights(decl, *m, nullptr);
    return rep;
  }
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) {
    rep.problems.push_back(ckpt.status().message());
    for (const auto& s : decl.specs)
      if (s.tied_to.empty() || !rep.config.tie_word_embeddings)
        rep.num_parameters += s.shape.numel();
    return rep;
  }
  rep.weights_present = true;
  for (const auto& f : (*ckpt)->files())
    rep.files.push_back(std::filesystem::path(f->path()).filename().string());
  for (const auto& e : (*ckpt)->entries()) {
    rep.num_parameters += e.info.shape.numel();
    rep.bytes_by_dtype[std::string(DTypeName(e.info.dtype))] += e.info.bytes();
  }
  StatusOr<std::vector<MatchedWeight>> m =
      MatchCheckpoint(rep.config, decl, **ckpt);
  if (!m.ok()) {
    rep.problems.push_back(m.status().message());
    return rep;
  }
  for (const MatchedWeight& w : *m)
    if (w.present && !w.tied) ++rep.weights_by_format[w.format.ToString()];
  rep.groups = GroupWeights(decl, *m, &(*ckpt)->entries());
  return rep;
}

nlohmann::json InspectReport::ToJson() const {
  const ModelConfig& c = config;
  nlohmann::json j;
  j["model_type"] = c.model_type;
  j["architecture"] = c.architecture;
  j["runnable"] = runnable;
  j["num_layers"] = c.num_layers;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = std::string(DTypeLongName(c.torch_dtype));
  j["rope"] = {{"type", RopeName(c.rope.type)},
               {"theta", c.rope.theta},
               {"rotary_dim", c.rope.rotary_dim}};
  j["sliding_window"] = c.sliding_window;
  j["block"] = BlockName(c.block);
  j["norms"] = NormsText(c);
  j["positions"] = PositionsText(c);
  j["multipliers"] = MultipliersText(c);
  j["fused_qkv"] = c.fused_qkv ? nlohmann::json(QkvLayoutName(c.qkv_layout))
                               : nlohmann::json(nullptr);
  j["activation"] = ActName(c.act);
  j["attention"] = c.attention == AttentionKind::kMla ? "mla" : "standard";
  j["mla"] = MlaJson(c);
  j["moe"] = MoeJson(c);
  j["num_parameters"] = num_parameters;
  j["bytes_by_dtype"] = bytes_by_dtype;
  j["weights_by_format"] = weights_by_format;
  nlohmann::json gs = nlohmann::json::array();
  for (const WeightGroup& g : groups)
    gs.push_back({{"family", g.family},
                  {"format", g.format},
                  {"weights", g.weights},
                  {"tensors", g.tensors},
                  {"bytes", g.bytes},
                  {"dtype_assumed", g.dtype_assumed}});
  j["groups"] = std::move(gs);
  j["quantization"] = c.quant.quantized()
                          ? nlohmann::json(c.quant.format.ToString())
                          : nlohmann::json(nullptr);
  j["weights_present"] = weights_present;
  j["files"] = files;
  j["problems"] = problems;
  return j;
}

std::string InspectReport::ToText() const {
  const ModelConfig& c = config;
  std::ostringstream o;
  o << "model_type        " << c.model_type
    << (c.architecture.empty() ? "" : " (" + c.architecture + ")")
    << (runnable ? "" : "  [plan/inspect only: forward not implemented]")
    << "\n";
  o << "layers            " << c.num_layers << "\n";
  o << "hidden            " << c.hidden_size << "  (intermediate "
    << c.intermediate_size << ")\n";
  AttentionText(c, o);
  o << "positions         " << PositionsText(c) << "\n";
  if (c.block != BlockKind::kSequential)
    o << "block             " << BlockName(c.block) << " (x + attn + mlp)\n";
  o << "norms             " << NormsText(c) << "\n";
  if (!MultipliersText(c).empty())
    o << "multipliers       " << MultipliersText(c) << "\n";
  if (c.fused_qkv)
    o << "fused q/k/v       " << QkvLayoutName(c.qkv_layout)
      << (c.qkv_layout == QkvLayout::kGroupedQvk
              ? " x " + std::to_string(c.qkv_groups)
              : std::string())
      << "\n";
  if (c.mlp != MlpKind::kMoE)
    o << "mlp               "
      << (c.mlp == MlpKind::kPlain ? "plain, " : "gated, ") << ActName(c.act)
      << (c.mlp_bias ? ", with biases" : "") << "\n";
  o << "vocab             " << c.vocab_size
    << (c.tie_word_embeddings ? "  (tied embeddings)" : "") << "\n";
  o << "parameters        " << num_parameters << "\n";
  for (const auto& [d, b] : bytes_by_dtype)
    o << "bytes " << d << std::string(12 - std::min<size_t>(11, d.size()), ' ')
      << b << "  (" << FormatBytes(b) << ")\n";
  if (c.quant.quantized())
    o << "quantization      " << c.quant.format.ToString() << " ("
      << c.quant.source << ")\n";
  for (const auto& [f, n] : weights_by_format)
    o << "weights " << f << std::string(10 - std::min<size_t>(9, f.size()), ' ')
      << n << "\n";
  if (!groups.empty()) {
    bool assumed = false;
    int64_t total = 0;
    for (const WeightGroup& g : groups) {
      assumed |= g.dtype_assumed;
      total += g.bytes;
    }
    o << "weight groups     stored bytes per role family and format"
      << (assumed ? " (declared shapes, dtype assumed)" : "") << "\n";
    o << "  " << std::left << std::setw(20) << "family" << std::setw(26)
      << "format" << std::right << std::setw(8) << "weights" << std::setw(9)
      << "tensors" << std::setw(14) << "bytes"
      << "\n";
    for (const WeightGroup& g : groups)
      o << "  " << std::left << std::setw(20) << g.family << std::setw(26)
        << g.format << std::right << std::setw(8) << g.weights << std::setw(9)
        << g.tensors << std::setw(14) << g.bytes << "  ("
        << FormatBytes(g.bytes) << ")\n";
    o << "  " << std::left << std::setw(63) << "total" << std::right
      << std::setw(14) << total << "  (" << FormatBytes(total) << ")\n";
  }
  if (!files.empty()) {
    o << "files            ";
    for (const auto& f : files) o << " " << f;
    o << "\n";
  }
  if (problems.empty()) {
    o << "checkpoint        OK\n";
  } else {
    for (const auto& p : problems) o << "PROBLEM           " << p << "\n";
  }
  return o.str();
}

}  // namespace loom
