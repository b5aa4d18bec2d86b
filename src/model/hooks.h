// Hook points: the named places in a forward pass where activations can be
// captured, with TransformerLens names. See docs/design/hook-points.md for
// where each sits in every architecture and the mapping to HF's
// output_hidden_states.
#ifndef LOOM_MODEL_HOOKS_H_
#define LOOM_MODEL_HOOKS_H_

#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"

namespace loom {

enum class HookSite : uint8_t {
  // Model-level.
  kEmbed,      // hook_embed: token embeddings (after Gemma's scale)
  kPosEmbed,   // hook_pos_embed: GPT-2 position embeddings
  kFinalNorm,  // ln_final.hook_normalized
  kLogits,     // logits
  // Per layer (blocks.{L}.*), in execution order.
  kResidPre,  // hook_resid_pre: input to block L
  kLn1,       // ln1.hook_normalized: input norm output (attention input)
  kQ,        // attn.hook_q: [T, heads, head_dim], after projection/bias/q-norm,
             // before RoPE
  kK,        // attn.hook_k: [T, kv_heads, head_dim], likewise
  kV,        // attn.hook_v: [T, kv_heads, head_dim]
  kRotQ,     // attn.hook_rot_q: q after RoPE
  kRotK,     // attn.hook_rot_k: k after RoPE
  kPattern,  // attn.hook_pattern: [heads, T, T] probabilities (per sequence)
  kZ,        // attn.hook_z: [T, heads, head_dim] attention output before o_proj
  kAttnOut,  // hook_attn_out: o_proj output (before any post-attention norm)
  kLn1Post,  // ln1_post.hook_normalized: post-attention norm output (Gemma2,
             // OLMo2)
  kResidMid,  // hook_resid_mid: residual after the attention add
  kLn2,       // ln2.hook_normalized: MLP input norm output
  // MoE layers only (MoEConfig::IsSparseLayer):
  kRouterLogits,   // mlp.hook_router_logits: [T, E] pre-softmax (+ bias)
  kExpertIds,      // mlp.hook_expert_ids: [T, k] chosen experts (i32 view)
  kExpertWeights,  // mlp.hook_expert_weights: [T, k] applied routing weights
  kMlpPre,     // mlp.hook_pre: gate pre-activation (GPT-2: fc output) [T, I]
  kMlpPost,    // mlp.hook_post: act(gate) * up (GPT-2: act(fc)) [T, I]
  kMlpOut,     // hook_mlp_out: MLP output (before any post-MLP norm)
  kLn2Post,    // ln2_post.hook_normalized: post-MLP norm output (Gemma2, OLMo2)
  kResidPost,  // hook_resid_post: output of block L
};
inline constexpr int kNumHookSites = static_cast<int>(HookSite::kResidPost) + 1;

// How a site's row width (columns per token) follows from the layer's config.
enum class SiteWidth : uint8_t {
  kHidden,           // hidden_size
  kQ,                // LayerConfig::q_width (heads x head_dim; MLA: qk dims)
  kK,                // LayerConfig::k_width
  kV,                // LayerConfig::v_width
  kZ,                // LayerConfig::z_width
  kIntermediate,     // intermediate_size
  kVocab,            // vocab_size
  kExperts,          // moe.num_experts
  kExpertsPerToken,  // moe.experts_per_token
  kPattern,          // none: [heads, T, T] per sequence
};

// When a site exists in a layer (CheckHookExists gives the reason when not).
enum class SiteExists : uint8_t {
  kAlways,
  kLearnedPositions,  // GPT-2's position embeddings
  kPreAttnNorm,       // the layer has a pre-attention norm
  kPreMlpNorm,        // its own pre-MLP norm (not one norm for both branches)
  kSequential,        // a residual between attention and MLP (not parallel)
  kPostAttnNorm,      // Gemma2, OLMo2
  kPostMlpNorm,       // Gemma2, OLMo2
  kRotary,            // rotary position embeddings
  kDenseMlp,          // not a mixture-of-experts layer
  kSparseMlp,         // a mixture-of-experts layer
};

// The facts of one hook site, read by the name parser, CheckHookExists,
// HookWidth, the intervention-site check and the surfaces that deliver
// rows. A new site is one row of kHookSites (and its place in the program,
// src/plan/program.cc).
struct HookSiteInfo {
  HookSite site;
  std::string_view name;  // TransformerLens name, without blocks.{L}.
  bool per_layer;         // blocks.{L}.<name>; else model-level
  SiteWidth width;
  SiteExists exists;
  bool editable;     // interventions may write it (IsInterventionSite)
  bool integer;      // delivered as an i32 view (expert ids); else f32
  bool token_major;  // one row per token; else per sequence (the pattern)
};

// clang-format off
inline constexpr HookSiteInfo kHookSites[] = {
  // site                     name                        layer  width                         exists                       edit   int    rows
  {HookSite::kEmbed,          "hook_embed",               false, SiteWidth::kHidden,          SiteExists::kAlways,           false, false, true},
  {HookSite::kPosEmbed,       "hook_pos_embed",           false, SiteWidth::kHidden,          SiteExists::kLearnedPositions, false, false, true},
  {HookSite::kFinalNorm,      "ln_final.hook_normalized", false, SiteWidth::kHidden,          SiteExists::kAlways,           false, false, true},
  {HookSite::kLogits,         "logits",                   false, SiteWidth::kVocab,           SiteExists::kAlways,           false, false, true},
  {HookSite::kResidPre,       "hook_resid_pre",           true,  SiteWidth::kHidden,          SiteExists::kAlways,           true,  false, true},
  {HookSite::kLn1,            "ln1.hook_normalized",      true,  SiteWidth::kHidden,          SiteExists::kPreAttnNorm,      false, false, true},
  {HookSite::kQ,              "attn.hook_q",              true,  SiteWidth::kQ,               SiteExists::kAlways,           false, false, true},
  {HookSite::kK,              "attn.hook_k",              true,  SiteWidth::kK,               SiteExists::kAlways,           false, false, true},
  {HookSite::kV,              "attn.hook_v",              true,  SiteWidth::kV,               SiteExists::kAlways,           false, false, true},
  {HookSite::kRotQ,           "attn.hook_rot_q",          true,  SiteWidth::kQ,               SiteExists::kRotary,           false, false, true},
  {HookSite::kRotK,           "attn.hook_rot_k",          true,  SiteWidth::kK,               SiteExists::kRotary,           false, false, true},
  {HookSite::kPattern,        "attn.hook_pattern",        true,  SiteWidth::kPattern,         SiteExists::kAlways,           false, false, false},
  {HookSite::kZ,              "attn.hook_z",              true,  SiteWidth::kZ,               SiteExists::kAlways,           true,  false, true},
  {HookSite::kAttnOut,        "hook_attn_out",            true,  SiteWidth::kHidden,          SiteExists::kAlways,           true,  false, true},
  {HookSite::kLn1Post,        "ln1_post.hook_normalized", true,  SiteWidth::kHidden,          SiteExists::kPostAttnNorm,     false, false, true},
  {HookSite::kResidMid,       "hook_resid_mid",           true,  SiteWidth::kHidden,          SiteExists::kSequential,       true,  false, true},
  {HookSite::kLn2,            "ln2.hook_normalized",      true,  SiteWidth::kHidden,          SiteExists::kPreMlpNorm,       false, false, true},
  {HookSite::kRouterLogits,   "mlp.hook_router_logits",   true,  SiteWidth::kExperts,         SiteExists::kSparseMlp,        false, false, true},
  {HookSite::kExpertIds,      "mlp.hook_expert_ids",      true,  SiteWidth::kExpertsPerToken, SiteExists::kSparseMlp,        false, true,  true},
  {HookSite::kExpertWeights,  "mlp.hook_expert_weights",  true,  SiteWidth::kExpertsPerToken, SiteExists::kSparseMlp,        false, false, true},
  {HookSite::kMlpPre,         "mlp.hook_pre",             true,  SiteWidth::kIntermediate,    SiteExists::kDenseMlp,         false, false, true},
  {HookSite::kMlpPost,        "mlp.hook_post",            true,  SiteWidth::kIntermediate,    SiteExists::kDenseMlp,         true,  false, true},
  {HookSite::kMlpOut,         "hook_mlp_out",             true,  SiteWidth::kHidden,          SiteExists::kAlways,           true,  false, true},
  {HookSite::kLn2Post,        "ln2_post.hook_normalized", true,  SiteWidth::kHidden,          SiteExists::kPostMlpNorm,      false, false, true},
  {HookSite::kResidPost,      "hook_resid_post",          true,  SiteWidth::kHidden,          SiteExists::kAlways,           true,  false, true},
};
// clang-format on

// The row of `s` (the table is in enum order: checked below).
constexpr const HookSiteInfo& SiteInfo(HookSite s) {
  return kHookSites[static_cast<int>(s)];
}

constexpr bool HookSitesInEnumOrder() {
  if (std::size(kHookSites) != kNumHookSites) return false;
  for (int i = 0; i < kNumHookSites; ++i)
    if (static_cast<int>(kHookSites[i].site) != i) return false;
  return true;
}
static_assert(HookSitesInEnumOrder(), "kHookSites: one row per site, in order");

constexpr bool IsLayerSite(HookSite s) { return SiteInfo(s).per_layer; }
// Sites delivered as i32 views (expert ids); the others are float.
constexpr bool IsIntegerSite(HookSite s) { return SiteInfo(s).integer; }
// One row of floats per token (what generation and serving can stream):
// not the pattern ([heads, T, T] per sequence), not the expert ids.
constexpr bool IsFloatRowSite(HookSite s) {
  return SiteInfo(s).token_major && !SiteInfo(s).integer;
}

struct HookPoint {
  HookSite site = HookSite::kResidPost;
  int64_t layer = -1;  // -1 for model-level sites
  bool operator==(const HookPoint& o) const {
    return site == o.site && layer == o.layer;
  }
  bool operator<(const HookPoint& o) const {
    return layer != o.layer ? layer < o.layer : site < o.site;
  }
};

// "hook_resid_post", "attn.hook_q", ... for a per-layer site; "hook_embed",
// "ln_final.hook_normalized", "logits" for model-level ones.
std::string_view HookSiteName(HookSite site);
// "blocks.3.hook_resid_post", "ln_final.hook_normalized".
std::string HookName(const HookPoint& hook);

// Parses one hook pattern against a model with `num_layers` layers. The layer
// may be an index (3), a negative index (-1 = last), '*' (all layers), or a
// fraction in braces: blocks.{0.5}.hook_resid_post -> floor(0.5 * n); {1.0}
// means the last layer; fractions outside [0, 1] are errors. A bare per-layer
// site name ("hook_resid_post") is an error: the layer must be given.
StatusOr<std::vector<HookPoint>> ParseHookPattern(std::string_view pattern,
                                                  int64_t num_layers);

// Which sites a caller accepts (IsInterventionSite: the editable ones).
using HookSiteFilter = bool (*)(HookSite);

// ParseHookPattern against the model `c`: a name that is no hook is refused
// with the nearest spelling among this model's hooks (those `keep` keeps,
// when given; the item's layer kept: "did you mean
// 'blocks.0.hook_resid_post'?") and their list.
StatusOr<std::vector<HookPoint>> ParseModelHookPattern(
    std::string_view pattern, const ModelConfig& config,
    HookSiteFilter keep = nullptr);

// This model's hooks that `keep` keeps (every one when null), distinct:
// "hook_embed, blocks.{L}.hook_resid_pre, ...".
std::string ModelSiteList(const ModelConfig& config, HookSiteFilter keep);

// Resolves a layer spec ("3", "-1", "0.25", "1.0") alone.
StatusOr<int64_t> ResolveLayer(std::string_view spec, int64_t num_layers);

// Whether the hook exists in this architecture (e.g. OLMo2 has no ln1/ln2,
// only Gemma2/OLMo2 have ln1_post/ln2_post, only GPT-2 has hook_pos_embed,
// rotary hooks need RoPE, MoE layers define no mlp.hook_pre/post, the
// router hooks exist on MoE layers only). Returns
// InvalidArgument naming the hook otherwise, OutOfRange for a layer outside
// the model.
Status CheckHookExists(const HookPoint& hook, const ModelConfig& config);

// Every hook this model has (CheckHookExists passes), model-level sites
// first (hook_embed, hook_pos_embed), then layer by layer in execution
// order, then ln_final.hook_normalized and logits. What `loom hooks`,
// `--hooks '*'` and the Python `Model.hook_names` list.
std::vector<HookPoint> ModelHooks(const ModelConfig& config);

// The widest row of any hook this model lets interventions write
// (HookSiteInfo::editable): the executor's zero row and edit stage.
int64_t MaxEditableWidth(const ModelConfig& config);

// Edits of a device's rows whose memory is not the host's go through a host
// stage of this many rows (the executor); its bytes, which the plan counts
// on the host beside a GPU.
inline constexpr int64_t kEditStageRows = 64;
int64_t EditStageBytes(const ModelConfig& config);

// Columns of one captured row (one token) of `hook`: q_dim for attn.hook_q,
// hook_rot_q and hook_z; kv_dim for attn.hook_k, hook_v and hook_rot_k;
// intermediate_size for mlp.hook_pre/post; num_experts for
// mlp.hook_router_logits; experts_per_token for mlp.hook_expert_ids /
// hook_expert_weights; vocab_size for logits;
// hidden_size for every other site. The one function every consumer (the
// planner, the extraction outputs) asks. Errors: the hook does not exist
// (CheckHookExists), or it is attn.hook_pattern, which is [heads, L, L] per
// sequence rather than rows of tokens (InvalidArgument) -- unless
// `pattern_keys` > 0: then each query token's row of it is heads x
// pattern_keys (its probabilities over key positions 0..pattern_keys-1,
// zero past the sequence), heads * pattern_keys columns.
StatusOr<int64_t> HookWidth(const HookPoint& hook, const ModelConfig& config,
                            int64_t pattern_keys = 0);

// Deduplicated, sorted set of requested hooks.
class HookSet {
 public:
  HookSet() = default;
  void Add(const HookPoint& h);
  bool Contains(const HookPoint& h) const;
  bool Contains(HookSite site, int64_t layer) const;
  const std::vector<HookPoint>& hooks() const { return hooks_; }
  bool empty() const { return hooks_.empty(); }
  // Deepest layer any hook needs (num_layers if a model-level output after the
  // blocks is requested; -1 if only hook_embed/hook_pos_embed).
  int64_t LastLayerNeeded(int64_t num_layers) const;
  bool NeedsFinalNorm() const;
  bool NeedsLogits() const;

 private:
  std::vector<HookPoint> hooks_;
};

// The hook resolver behind --hooks / --layers (loom extract, loom plan).
// Each entry of `patterns` is a comma-separated list of items; an item is a
// full name (blocks.3.hook_resid_post, blocks.-1.attn.hook_q,
// blocks.*.hook_mlp_out, blocks.{0.5}.hook_z: see ParseHookPattern), a
// model-level name (hook_embed, hook_pos_embed, ln_final.hook_normalized,
// logits), or a bare per-layer site (hook_resid_post) applied to every layer
// of `layers`. Each entry of `layers` is a comma-separated list of layer
// specs: an index (12), a negative index (-1 = last), a fraction (0.25;
// 1.0 = last layer) or '*' (all layers). Every hook is checked to exist in
// `config` (CheckHookExists). Empty items are skipped; the result is
// deduplicated and sorted, and may be empty (callers decide whether that is
// an error). The item '*' is every hook of the model (ModelHooks).
// Errors: a bare site with empty `layers`, `layers` given
// (`layers_given`) but used by no bare site, an unknown hook (naming this
// model's hooks and the nearest spelling), a bad or out-of-range layer, a
// hook the architecture lacks.
StatusOr<HookSet> ResolveHooks(const std::vector<std::string>& patterns,
                               const std::vector<std::string>& layers,
                               const ModelConfig& config,
                               bool layers_given = true);

}  // namespace loom

#endif  // LOOM_MODEL_HOOKS_H_
