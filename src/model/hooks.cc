#include "src/model/hooks.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "src/base/spelling.h"
#include "src/model/layer_config.h"

namespace loom {
namespace {

std::string AllSiteNames() {
  std::string s;
  for (const HookSiteInfo& n : kHookSites) {
    s += s.empty() ? "" : ", ";
    s += IsLayerSite(n.site) ? "blocks.{L}." + std::string(n.name)
                             : std::string(n.name);
  }
  return s;
}

// "a,,b" -> {"a", "b"}.
std::vector<std::string> SplitCommas(std::string_view s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= s.size()) {
    size_t end = s.find(',', begin);
    if (end == std::string_view::npos) end = s.size();
    if (end > begin) out.emplace_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

// This model's hooks that `keep` keeps (every one when null), distinct, in
// order: model-level names, per-layer sites as blocks.{L}.<site>.
std::vector<std::string> ModelSiteNames(const ModelConfig& c,
                                        HookSiteFilter keep) {
  std::vector<std::string> names;
  for (const HookPoint& h : ModelHooks(c)) {
    if (keep != nullptr && !keep(h.site)) continue;
    std::string n = IsLayerSite(h.site)
                        ? "blocks.{L}." + std::string(HookSiteName(h.site))
                        : std::string(HookSiteName(h.site));
    if (std::find(names.begin(), names.end(), n) == names.end())
      names.push_back(std::move(n));
  }
  return names;
}

// An item naming no hook of `c` (of those `keep` keeps): the error lists
// them and suggests the nearest spelling, keeping the item's layer.
Status UnknownHookError(const std::string& item, const std::string& what,
                        const ModelConfig& c, HookSiteFilter keep) {
  std::string layer_prefix, site = item;
  if (item.rfind("blocks.", 0) == 0) {
    size_t at = 7;
    if (at < item.size() && item[at] == '{') at = item.find('}', at);
    const size_t dot = at == std::string::npos ? at : item.find('.', at);
    if (dot != std::string::npos) {
      layer_prefix = item.substr(0, dot + 1);
      site = item.substr(dot + 1);
    }
  }
  const std::vector<std::string> names = ModelSiteNames(c, keep);
  std::vector<std::string_view> candidates;  // of the item's kind, bare
  std::vector<bool> layered;                 // [candidates.size()]
  std::string list;
  for (const std::string& n : names) {
    list += (list.empty() ? "" : ", ") + n;
    const bool per_layer = n.rfind("blocks.{L}.", 0) == 0;
    if (!layer_prefix.empty() && !per_layer) continue;
    candidates.push_back(per_layer ? std::string_view(n).substr(11) : n);
    layered.push_back(per_layer);
  }
  const std::string_view near =
      Nearest(site, candidates, std::max<size_t>(3, site.size() / 3));
  std::string best;
  for (size_t i = 0; i < candidates.size() && !near.empty(); ++i)
    if (candidates[i].data() == near.data())
      best = (layered[i] ? (layer_prefix.empty() ? "blocks.{L}." : layer_prefix)
                         : "") +
             std::string(near);
  return InvalidArgumentError(
      what + (best.empty() ? "" : "; did you mean '" + best + "'?") + "; " +
      (keep == nullptr ? "hooks of this " : "the hooks of this ") +
      c.model_type + " model" + (keep == nullptr ? "" : " that can be edited") +
      ": " + list +
      (keep == nullptr ? " (`loom hooks MODEL_DIR` lists every one)" : ""));
}

// A per-layer site named without its layer: "hook_resid_post".
bool IsBareLayerSite(std::string_view item) {
  for (const HookSiteInfo& n : kHookSites)
    if (IsLayerSite(n.site) && item == n.name) return true;
  return false;
}

}  // namespace

std::string_view HookSiteName(HookSite site) {
  const int i = static_cast<int>(site);
  return i >= 0 && i < kNumHookSites ? kHookSites[i].name : "?";
}

std::string HookName(const HookPoint& h) {
  if (!IsLayerSite(h.site)) return std::string(HookSiteName(h.site));
  return "blocks." + std::to_string(h.layer) + "." +
         std::string(HookSiteName(h.site));
}

StatusOr<int64_t> ResolveLayer(std::string_view spec, int64_t n) {
  const std::string s(spec);
  if (s.empty()) return InvalidArgumentError("empty layer in hook name");
  if (s.find('.') != std::string::npos) {
    char* end = nullptr;
    const double f = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || !std::isfinite(f))
      return InvalidArgumentError("layer '" + s + "' is not a number");
    if (f < 0 || f > 1)
      return InvalidArgumentError(
          "layer fraction " + s +
          " is outside [0, 1] (0 <= f < 1 gives floor(f x " +
          std::to_string(n) + "), 1.0 the last layer)");
    if (f == 1.0) return n - 1;
    return static_cast<int64_t>(std::floor(f * static_cast<double>(n)));
  }
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size())
    return InvalidArgumentError("layer '" + s + "' is not an integer");
  const int64_t layer = v < 0 ? n + v : v;
  if (layer < 0 || layer >= n)
    return OutOfRangeError("layer " + s + " is out of range for a model with " +
                           std::to_string(n) + " layers (valid: 0.." +
                           std::to_string(n - 1) + " or -" + std::to_string(n) +
                           "..-1)");
  return layer;
}

namespace {

// ParseHookPattern; a name that is no hook is refused listing every site, or,
// given the model `c`, its own hooks (those `keep` keeps) and the nearest
// spelling.
StatusOr<std::vector<HookPoint>> ParsePattern(std::string_view pattern,
                                              int64_t num_layers,
                                              const ModelConfig* c,
                                              HookSiteFilter keep = nullptr) {
  const std::string p(pattern);
  auto unknown = [&](const std::string& what) {
    return c != nullptr ? UnknownHookError(p, what, *c, keep)
                        : InvalidArgumentError(
                              what + "; known hooks: " + AllSiteNames());
  };
  for (const HookSiteInfo& n : kHookSites) {
    if (!IsLayerSite(n.site) && p == n.name)
      return std::vector<HookPoint>{{n.site, -1}};
  }
  const std::string prefix = "blocks.";
  if (p.rfind(prefix, 0) != 0) {
    for (const HookSiteInfo& n : kHookSites)
      if (IsLayerSite(n.site) && p == n.name)
        return InvalidArgumentError("hook '" + p +
                                    "' needs a layer: blocks.{L}." + p);
    return unknown("unknown hook '" + p + "'");
  }
  std::string rest = p.substr(prefix.size());
  std::string layer_spec;
  if (!rest.empty() && rest[0] == '{') {
    const size_t close = rest.find('}');
    if (close == std::string::npos)
      return InvalidArgumentError("hook '" + p + "': missing '}'");
    layer_spec = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (layer_spec.find('.') == std::string::npos)
      layer_spec += ".0";  // {1} means the fraction 1
  } else {
    const size_t dot = rest.find('.');
    if (dot == std::string::npos)
      return InvalidArgumentError("hook '" + p +
                                  "': expected blocks.{L}.<site>");
    layer_spec = rest.substr(0, dot);
    rest = rest.substr(dot);
  }
  if (rest.empty() || rest[0] != '.')
    return InvalidArgumentError("hook '" + p + "': expected blocks.{L}.<site>");
  const std::string site_name = rest.substr(1);
  const HookSiteInfo* site = nullptr;
  for (const HookSiteInfo& n : kHookSites)
    if (IsLayerSite(n.site) && n.name == site_name) site = &n;
  if (site == nullptr)
    return unknown("hook '" + p + "': unknown site '" + site_name + "'");
  std::vector<HookPoint> out;
  if (layer_spec == "*") {
    for (int64_t l = 0; l < num_layers; ++l) out.push_back({site->site, l});
    return out;
  }
  StatusOr<int64_t> layer = ResolveLayer(layer_spec, num_layers);
  if (!layer.ok()) return layer.status().WithContext("hook '" + p + "'");
  out.push_back({site->site, *layer});
  return out;
}

}  // namespace

StatusOr<std::vector<HookPoint>> ParseHookPattern(std::string_view pattern,
                                                  int64_t num_layers) {
  return ParsePattern(pattern, num_layers, nullptr);
}

StatusOr<std::vector<HookPoint>> ParseModelHookPattern(std::string_view pattern,
                                                       const ModelConfig& c,
                                                       HookSiteFilter keep) {
  return ParsePattern(pattern, c.num_layers, &c, keep);
}

std::string ModelSiteList(const ModelConfig& c, HookSiteFilter keep) {
  std::string list;
  for (const std::string& n : ModelSiteNames(c, keep))
    list += (list.empty() ? "" : ", ") + n;
  return list;
}

Status CheckHookExists(const HookPoint& h, const ModelConfig& c) {
  auto missing = [&](const std::string& why) {
    return InvalidArgumentError("hook " + HookName(h) + " does not exist in " +
                                c.model_type + " (" + why + ")");
  };
  if (IsLayerSite(h.site) && (h.layer < 0 || h.layer >= c.num_layers))
    return OutOfRangeError("hook " + HookName(h) +
                           ": layer out of range (model has " +
                           std::to_string(c.num_layers) + " layers)");
  // Per-layer facts come from the layer's LayerConfig.
  const LayerConfig l = MakeLayerConfig(c, IsLayerSite(h.site) ? h.layer : 0);
  const std::string at = "blocks." + std::to_string(h.layer) + ".";
  const bool sparse = c.mlp == MlpKind::kMoE && c.moe.IsSparseLayer(h.layer);
  switch (SiteInfo(h.site).exists) {
    case SiteExists::kAlways:
      break;
    case SiteExists::kLearnedPositions:
      if (!c.learned_positions)
        return missing("no learned position embeddings");
      break;
    case SiteExists::kPreAttnNorm:
      if (!l.pre_attn_norm) return missing("no pre-attention norm");
      break;
    case SiteExists::kPreMlpNorm:
      if (l.block == BlockKind::kParallelSharedNorm)
        return missing("one norm per layer feeds both attention and MLP: " +
                       at + "ln1.hook_normalized is the MLP's input too");
      if (!l.pre_mlp_norm) return missing("no pre-MLP norm");
      break;
    case SiteExists::kSequential:
      if (l.parallel())
        return missing(
            "a parallel block: attention and MLP both read " + at +
            "hook_resid_pre, and " + at +
            "hook_resid_post = hook_resid_pre + " +
            "hook_attn_out + hook_mlp_out; no residual exists between them");
      break;
    case SiteExists::kPostAttnNorm:
      if (!l.post_attn_norm) return missing("no post-attention norm");
      break;
    case SiteExists::kPostMlpNorm:
      if (!l.post_mlp_norm) return missing("no post-MLP norm");
      break;
    case SiteExists::kRotary:
      if (c.rope.type == RopeConfig::Type::kNone)
        return missing("no rotary embeddings");
      break;
    case SiteExists::kDenseMlp:
      if (sparse)
        return InvalidArgumentError(
            "hook " + HookName(h) + ": layer " + std::to_string(h.layer) +
            " of " + c.model_type +
            " is a mixture-of-experts (MoE) layer, where mlp.hook_pre / "
            "mlp.hook_post are not defined (capture hook_mlp_out, "
            "mlp.hook_router_logits, mlp.hook_expert_ids or "
            "mlp.hook_expert_weights)");
      break;
    case SiteExists::kSparseMlp:
      if (!sparse)
        return missing("layer " + std::to_string(h.layer) +
                       " is not a mixture-of-experts layer");
      break;
  }
  return Status();
}

int64_t MaxEditableWidth(const ModelConfig& c) {
  int64_t widest = c.hidden_size;
  for (const HookPoint& h : ModelHooks(c))
    if (SiteInfo(h.site).editable)
      if (StatusOr<int64_t> w = HookWidth(h, c); w.ok())
        widest = std::max(widest, *w);
  return widest;
}

int64_t EditStageBytes(const ModelConfig& c) {
  return kEditStageRows * MaxEditableWidth(c) * int64_t{sizeof(float)};
}

StatusOr<int64_t> HookWidth(const HookPoint& h, const ModelConfig& c,
                            int64_t pattern_keys) {
  RETURN_IF_ERROR(CheckHookExists(h, c));
  // Attention widths: the layer's geometry (MLA: z and v are heads x
  // v_head_dim, q and k heads x (qk_nope + qk_rope)).
  const LayerConfig g = MakeLayerConfig(
      c, std::max<int64_t>(0, std::min(h.layer, c.num_layers - 1)));
  switch (SiteInfo(h.site).width) {
    case SiteWidth::kHidden:
      return c.hidden_size;
    case SiteWidth::kQ:
      return g.q_width();
    case SiteWidth::kK:
      return g.k_width();
    case SiteWidth::kV:
      return g.v_width();
    case SiteWidth::kZ:
      return g.z_width();
    case SiteWidth::kIntermediate:
      return c.intermediate_size;
    case SiteWidth::kVocab:
      return c.vocab_size;
    case SiteWidth::kExperts:
      return c.moe.num_experts;
    case SiteWidth::kExpertsPerToken:
      return c.moe.experts_per_token;
    case SiteWidth::kPattern:
      if (pattern_keys > 0) return c.num_heads * pattern_keys;
      return InvalidArgumentError(
          "hook " + HookName(h) +
          " has no row width: it is [heads, L, L] per sequence");
  }
  return c.hidden_size;
}

std::vector<HookPoint> ModelHooks(const ModelConfig& c) {
  std::vector<HookPoint> out;
  auto add = [&](HookSite site, int64_t layer) {
    const HookPoint h{site, layer};
    if (CheckHookExists(h, c).ok()) out.push_back(h);
  };
  add(HookSite::kEmbed, -1);
  add(HookSite::kPosEmbed, -1);
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int s = static_cast<int>(HookSite::kResidPre); s < kNumHookSites; ++s)
      add(static_cast<HookSite>(s), l);
  add(HookSite::kFinalNorm, -1);
  add(HookSite::kLogits, -1);
  return out;
}

namespace {

// The hooks of one pattern. "blocks.*.<site>" (also --layers '*') means every
// layer that has the site: a layer without it (deepseek_v3's dense first
// layers for the router hooks) is passed over, and only a site no layer has
// is an error. A layer named explicitly must have it.
Status AddPatternHooks(const std::string& pattern, const ModelConfig& c,
                       HookSet* set) {
  ASSIGN_OR_RETURN(std::vector<HookPoint> points,
                   ParsePattern(pattern, c.num_layers, &c));
  const bool every_layer = pattern.rfind("blocks.*.", 0) == 0;
  Status first_missing;
  bool added = false;
  for (const HookPoint& hp : points) {
    const Status exists = CheckHookExists(hp, c);
    if (!exists.ok()) {
      if (!every_layer) return exists;
      if (first_missing.ok()) first_missing = exists;
      continue;
    }
    set->Add(hp);
    added = true;
  }
  if (!added && !first_missing.ok())
    return InvalidArgumentError("'" + pattern + "': no layer of " +
                                c.model_type + " has this hook (" +
                                std::string(first_missing.message()) + ")");
  return Status();
}

}  // namespace

StatusOr<HookSet> ResolveHooks(const std::vector<std::string>& patterns,
                               const std::vector<std::string>& layers,
                               const ModelConfig& c, bool layers_given) {
  std::vector<std::string> layer_specs;
  for (const std::string& entry : layers)
    for (std::string& l : SplitCommas(entry)) layer_specs.push_back(l);
  HookSet set;
  bool used_layers = false;  // some bare site took the --layers
  for (const std::string& entry : patterns) {
    for (const std::string& item : SplitCommas(entry)) {
      std::vector<std::string> expanded;
      if (item == "*") {  // every hook of the model
        for (const HookPoint& hp : ModelHooks(c)) set.Add(hp);
        continue;
      }
      if (IsBareLayerSite(item)) {
        used_layers = true;
        if (layer_specs.empty())
          return InvalidArgumentError("hook '" + item +
                                      "' needs a layer: write blocks.{L}." +
                                      item + " or give --layers");
        // A fraction goes in braces: blocks.{0.5}.<site>.
        for (const std::string& l : layer_specs)
          expanded.push_back(
              "blocks." +
              (l.find('.') != std::string::npos ? "{" + l + "}" : l) + "." +
              item);
      } else {
        expanded.push_back(item);
      }
      for (const std::string& p : expanded)
        RETURN_IF_ERROR(AddPatternHooks(p, c, &set));
    }
  }
  std::string layer_list;
  for (const std::string& l : layer_specs)
    layer_list += (layer_list.empty() ? "" : ",") + l;
  if (layers_given && !layer_specs.empty() && !used_layers)
    return InvalidArgumentError(
        "--layers " + layer_list +
        " applies to bare hook names (hook_resid_post, attn.hook_z, ...), "
        "and every --hooks item names its own layer; drop --layers or write "
        "the hooks without their blocks.{L}. prefix");
  return set;
}

void HookSet::Add(const HookPoint& h) {
  auto it = std::lower_bound(hooks_.begin(), hooks_.end(), h);
  if (it != hooks_.end() && *it == h) return;
  hooks_.insert(it, h);
}

bool HookSet::Contains(const HookPoint& h) const {
  return std::binary_search(hooks_.begin(), hooks_.end(), h);
}
bool HookSet::Contains(HookSite site, int64_t layer) const {
  return Contains(HookPoint{site, layer});
}

int64_t HookSet::LastLayerNeeded(int64_t num_layers) const {
  int64_t last = -1;
  for (const auto& h : hooks_) {
    if (IsLayerSite(h.site)) last = std::max(last, h.layer);
    if (h.site == HookSite::kFinalNorm || h.site == HookSite::kLogits)
      last = num_layers - 1;
  }
  return last;
}

bool HookSet::NeedsFinalNorm() const {
  for (const auto& h : hooks_)
    if (h.site == HookSite::kFinalNorm || h.site == HookSite::kLogits)
      return true;
  return false;
}

bool HookSet::NeedsLogits() const { return Contains(HookSite::kLogits, -1); }

}  // namespace loom
