#include "src/eval/extract_derived.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <tuple>

#include "src/base/check.h"
#include "src/eval/lens.h"
#include "src/runtime/backward.h"

namespace loom {
namespace {

// clang-format off
constexpr DerivedKindInfo kKinds[] = {
  // kind                            suffix                             from                   int
  {DerivedKind::kSaeInput,        "hook_sae_input",                   DerivedFrom::kSae,      false},
  {DerivedKind::kSaeActsPre,      "hook_sae_acts_pre",                DerivedFrom::kSae,      false},
  {DerivedKind::kSaeActsPost,     "hook_sae_acts_post",               DerivedFrom::kSae,      false},
  {DerivedKind::kSaeRecons,       "hook_sae_recons",                  DerivedFrom::kSae,      false},
  {DerivedKind::kSaeError,        "hook_sae_error",                   DerivedFrom::kSae,      false},
  {DerivedKind::kSaeTopkIndices,  "hook_sae_acts_post.topk_indices",  DerivedFrom::kSae,      true},
  {DerivedKind::kSaeTopkValues,   "hook_sae_acts_post.topk_values",   DerivedFrom::kSae,      false},
  {DerivedKind::kLensLogits,      "hook_lens_logits",                 DerivedFrom::kLens,     false},
  {DerivedKind::kLensTopkIds,     "lens_topk_ids",                    DerivedFrom::kLens,     true},
  {DerivedKind::kLensTopkValues,  "lens_topk_values",                 DerivedFrom::kLens,     false},
  {DerivedKind::kGrad,            "grad",                             DerivedFrom::kBackward, false},
};
// clang-format on

constexpr bool KindsInEnumOrder() {
  for (size_t i = 0; i < std::size(kKinds); ++i)
    if (static_cast<size_t>(kKinds[i].kind) != i) return false;
  return true;
}
static_assert(KindsInEnumOrder(), "kKinds: one row per kind, in order");

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// The one hook `name` names in the model (an SAE's hook).
StatusOr<HookPoint> OneHook(const std::string& name, const ModelConfig& c) {
  ASSIGN_OR_RETURN(std::vector<HookPoint> hooks,
                   ParseModelHookPattern(name, c));
  if (hooks.size() != 1)
    return InvalidArgumentError("'" + name + "' names " +
                                std::to_string(hooks.size()) +
                                " hooks; an SAE reads one");
  RETURN_IF_ERROR(CheckHookExists(hooks[0], c));
  return hooks[0];
}

// The hook `sae` reads in the model, checked: its width is the SAE's d_in,
// and a transcoder reads no norm output. Errors start with `what`.
StatusOr<HookPoint> SaeHookIn(const Sae& sae, const std::string& what,
                              const ModelConfig& c) {
  StatusOr<HookPoint> h = OneHook(sae.hook, c);
  if (!h.ok()) return h.status().WithContext(what);
  const std::string name = HookName(*h);
  ASSIGN_OR_RETURN(const int64_t width, HookWidth(*h, c));
  if (width != sae.d_in)
    return InvalidArgumentError(what + ": reads " + name + " of width " +
                                std::to_string(width) + ", the SAE's d_in is " +
                                std::to_string(sae.d_in));
  if (IsTranscoder(sae.architecture) &&
      (h->site == HookSite::kLn1 || h->site == HookSite::kLn2))
    return UnimplementedError(
        what + ": a transcoder reading " + name +
        " reads the norm's pre-gain value (TransformerLens' "
        "hook_normalized); Loom's hook of that name is the norm's output, "
        "so this transcoder cannot run inside the forward yet");
  return *h;
}

StatusOr<std::shared_ptr<const Sae>> LoadOneSae(const std::string& spec) {
  const size_t at = spec.rfind('@');
  const std::string path = spec.substr(0, at);
  const std::string given = at == std::string::npos ? "" : spec.substr(at + 1);
  StatusOr<Sae> sae = LoadSae(path, given);
  if (!sae.ok()) return sae.status().WithContext("--sae " + spec);
  return std::make_shared<const Sae>(std::move(sae).value());
}

// Adds `sae` (named `what` in errors) to `a`: one SAE per hook, --sae-topk
// within its width.
Status AddSae(std::shared_ptr<const Sae> sae, const std::string& what,
              const eval::AnalysisParams& p, const ModelConfig& c,
              Analyses* a) {
  ASSIGN_OR_RETURN(const HookPoint h, SaeHookIn(*sae, what, c));
  for (size_t i = 0; i < a->sae_hooks.size(); ++i)
    if (a->sae_hooks[i] == h)
      return InvalidArgumentError(what + ": " + HookName(h) +
                                  " is already read by --sae " +
                                  a->saes[i]->path + " (one SAE per hook)");
  if (p.sae_topk > sae->d_sae)
    return InvalidArgumentError("--sae-topk " + std::to_string(p.sae_topk) +
                                " exceeds " + sae->path + "'s " +
                                std::to_string(sae->d_sae) + " features");
  a->saes.push_back(std::move(sae));
  a->sae_hooks.push_back(h);
  return Status();
}

}  // namespace

const DerivedKindInfo& DerivedInfo(DerivedKind kind) {
  return kKinds[static_cast<int>(kind)];
}

void SplitDerivedItems(const std::vector<std::string>& entries,
                       std::vector<std::string>* plain,
                       std::vector<DerivedItem>* derived) {
  for (const std::string& entry : entries) {
    std::string kept;
    std::string_view rest = entry;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view item = Trim(rest.substr(0, comma));
      bool is_derived = false;
      for (const DerivedKindInfo& k : kKinds) {
        const std::string suffix = "." + std::string(k.suffix);
        if (item.size() > suffix.size() && item.ends_with(suffix)) {
          derived->push_back(
              {std::string(item.substr(0, item.size() - suffix.size())),
               k.kind});
          is_derived = true;
          break;
        }
      }
      if (!is_derived && !item.empty())
        kept += (kept.empty() ? "" : ",") + std::string(item);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (!kept.empty()) plain->push_back(kept);
  }
}

StatusOr<Analyses> LoadAnalyses(const eval::AnalysisParams& p,
                                const ModelConfig& c) {
  Analyses a;
  for (const std::string& spec : p.sae) {
    ASSIGN_OR_RETURN(std::shared_ptr<const Sae> sae, LoadOneSae(spec));
    RETURN_IF_ERROR(AddSae(std::move(sae), "--sae " + spec, p, c, &a));
  }
  for (const std::shared_ptr<const Sae>& sae : p.loaded_sae)
    RETURN_IF_ERROR(AddSae(sae, "--sae " + sae->path, p, c, &a));
  if (p.sae_topk > 0 && a.saes.empty())
    return InvalidArgumentError("--sae-topk needs an --sae");
  if (p.sae_dashboard > 0 && a.saes.empty())
    return InvalidArgumentError("--sae-dashboard needs an --sae");
  a.sae_topk = p.sae_topk;
  a.dashboard = p.sae_dashboard;
  if (p.lens == "logit") {
    a.lens = true;
  } else if (p.lens.starts_with("tuned:") && p.lens.size() > 6) {
    a.lens = true;
    StatusOr<TunedLens> t = LoadTunedLens(p.lens.substr(6));
    if (!t.ok()) return t.status().WithContext("--lens " + p.lens);
    if (t->d_model != c.hidden_size || t->num_layers != c.num_layers)
      return InvalidArgumentError(
          "--lens " + p.lens + ": translators for d_model " +
          std::to_string(t->d_model) + " x " + std::to_string(t->num_layers) +
          " layers; the model has hidden size " +
          std::to_string(c.hidden_size) + " x " + std::to_string(c.num_layers) +
          " layers");
    a.tuned = std::make_shared<const TunedLens>(std::move(t).value());
  } else if (!p.lens.empty()) {
    return InvalidArgumentError("--lens '" + p.lens +
                                "': expected logit or tuned:FILE");
  }
  if (p.lens_topk > 0 && !a.lens)
    return InvalidArgumentError("--lens-topk needs --lens");
  RETURN_IF_ERROR(
      eval::CheckLensTopK(p.lens_topk, c.vocab_size, 0, "--lens-topk"));
  a.lens_topk = p.lens_topk;
  return a;
}

namespace {

// The width of `kind` read by SAE `sae` (null: the lens).
int64_t KindWidth(DerivedKind kind, const HookPoint& source, const Sae* sae,
                  const Analyses& a, const ModelConfig& c) {
  switch (kind) {
    case DerivedKind::kSaeInput:
      return sae->d_in;
    case DerivedKind::kSaeActsPre:
    case DerivedKind::kSaeActsPost:
      return sae->d_sae;
    case DerivedKind::kSaeRecons:
    case DerivedKind::kSaeError:
      return sae->d_out;
    case DerivedKind::kSaeTopkIndices:
    case DerivedKind::kSaeTopkValues:
      return a.sae_topk;
    case DerivedKind::kLensLogits:
      return c.vocab_size;
    case DerivedKind::kLensTopkIds:
    case DerivedKind::kLensTopkValues:
      return a.lens_topk;
    case DerivedKind::kGrad: {
      StatusOr<int64_t> w = HookWidth(source, c);
      return w.ok() ? *w : 0;
    }
  }
  return 0;
}

// One derived output of `source`, checked against what was loaded.
StatusOr<DerivedHook> MakeDerived(const HookPoint& source, DerivedKind kind,
                                  const Analyses& a, const ModelConfig& c) {
  const DerivedKindInfo& info = DerivedInfo(kind);
  DerivedHook d;
  d.source = source;
  d.kind = kind;
  d.name = HookName(source) + "." + std::string(info.suffix);
  const std::string where = "--hooks " + d.name;
  if (info.from == DerivedFrom::kBackward) {
    if (!a.gradients)
      return InvalidArgumentError(
          where +
          ": needs --grad-of logit-diff (with --answer A --wrong B) "
          "or --grad-of logprob");
    if (!IsGradientSite(source.site))
      return InvalidArgumentError(
          where + ": " + HookName(source) +
          " has no gradient (gradients are taken at the token-major float "
          "hooks: not at logits, the router's or the attention pattern)");
    RETURN_IF_ERROR(CheckHookExists(source, c));
  } else if (info.sae()) {
    for (size_t i = 0; i < a.sae_hooks.size(); ++i)
      if (a.sae_hooks[i] == source) d.sae = static_cast<int>(i);
    if (d.sae < 0)
      return InvalidArgumentError(where + ": no --sae reads " +
                                  HookName(source) +
                                  (a.saes.empty() ? " (no --sae given)" : ""));
    const Sae& sae = *a.saes[d.sae];
    if (kind == DerivedKind::kSaeError && IsTranscoder(sae.architecture))
      return UnimplementedError(
          where + ": a transcoder's error term needs " + sae.hook_out +
          ", which the forward delivers after " + HookName(source) +
          "; capture " + sae.hook_out + " and the recons instead");
    if ((kind == DerivedKind::kSaeTopkIndices ||
         kind == DerivedKind::kSaeTopkValues) &&
        a.sae_topk == 0)
      return InvalidArgumentError(where + ": needs --sae-topk K");
  } else {
    if (!a.lens)
      return InvalidArgumentError(where +
                                  ": needs --lens logit or --lens tuned:FILE");
    StatusOr<int64_t> t = CheckLensHook(source, c, a.tuned.get());
    if (!t.ok()) return t.status().WithContext(where);
    if (kind != DerivedKind::kLensLogits && a.lens_topk == 0)
      return InvalidArgumentError(where + ": needs --lens-topk K");
  }
  d.width =
      KindWidth(kind, source, d.sae >= 0 ? a.saes[d.sae].get() : nullptr, a, c);
  return d;
}

}  // namespace

StatusOr<std::vector<DerivedHook>> ResolveDerivedHooks(
    const std::vector<DerivedItem>& items, const HookSet& plain,
    const Analyses& a, const ModelConfig& c) {
  std::vector<std::pair<HookPoint, DerivedKind>> wanted;
  std::vector<HookPoint> lens_sources;
  for (const DerivedItem& item : items) {
    StatusOr<std::vector<HookPoint>> sources =
        ParseModelHookPattern(item.source_pattern, c);
    if (!sources.ok())
      return sources.status().WithContext(
          "--hooks " + item.source_pattern + "." +
          std::string(DerivedInfo(item.kind).suffix));
    for (const HookPoint& h : *sources) {
      wanted.emplace_back(h, item.kind);
      if (DerivedInfo(item.kind).from == DerivedFrom::kLens)
        lens_sources.push_back(h);
    }
  }
  if (a.sae_topk > 0)
    for (const HookPoint& h : a.sae_hooks) {
      wanted.emplace_back(h, DerivedKind::kSaeTopkIndices);
      wanted.emplace_back(h, DerivedKind::kSaeTopkValues);
    }
  if (a.lens_topk > 0) {
    for (const HookPoint& h : plain.hooks())
      if (IsLensSite(h.site)) lens_sources.push_back(h);
    for (const HookPoint& h : lens_sources) {
      wanted.emplace_back(h, DerivedKind::kLensTopkIds);
      wanted.emplace_back(h, DerivedKind::kLensTopkValues);
    }
  }
  std::sort(wanted.begin(), wanted.end(), [](const auto& x, const auto& y) {
    return x.first == y.first ? x.second < y.second : x.first < y.first;
  });
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  std::vector<DerivedHook> out;
  for (const auto& [h, kind] : wanted) {
    ASSIGN_OR_RETURN(DerivedHook d, MakeDerived(h, kind, a, c));
    out.push_back(std::move(d));
  }
  // Nothing loaded goes unused.
  for (size_t i = 0; i < a.saes.size() && a.dashboard == 0; ++i)
    if (std::none_of(out.begin(), out.end(), [&](const DerivedHook& d) {
          return d.sae == static_cast<int>(i);
        }))
      return InvalidArgumentError(
          "--sae " + a.saes[i]->path + ": nothing is computed from it; name " +
          HookName(a.sae_hooks[i]) +
          ".hook_sae_acts_post (or .hook_sae_recons, .hook_sae_error, ...) "
          "in --hooks, or give --sae-topk K or --sae-dashboard N");
  if (a.gradients &&
      std::none_of(out.begin(), out.end(),
                   [](const DerivedHook& d) { return d.gradient(); }))
    return InvalidArgumentError(
        "--grad-of: no gradient is asked; name HOOK.grad in --hooks (e.g. "
        "blocks.0.hook_resid_pre.grad)");
  if (a.lens && std::none_of(out.begin(), out.end(), [](const DerivedHook& d) {
        return DerivedInfo(d.kind).from == DerivedFrom::kLens;
      }))
    return InvalidArgumentError(
        "--lens: nothing is computed from it; name HOOK.hook_lens_logits in "
        "--hooks (HOOK a residual hook), or give --lens-topk K with "
        "residual hooks in --hooks");
  return out;
}

int64_t DerivedBytes(const Analyses& a, const std::vector<DerivedHook>& d,
                     const ModelConfig& c) {
  constexpr int64_t C = kDerivedChunkRows, f = sizeof(float);
  int64_t bytes = 0;
  for (const auto& sae : a.saes) {
    const Sae& s = *sae;
    bytes += f * static_cast<int64_t>(
                     s.w_enc.size() + s.b_enc.size() + s.w_mag.size() +
                     s.b_gate.size() + s.threshold.size() + s.w_dec.size() +
                     s.b_dec.size() + s.w_skip.size() + s.dec_norm.size());
    // The kernel's pre-activations and a scratch of each output.
    bytes += 3 * C * (s.d_sae + s.d_out) * f;
  }
  if (a.tuned != nullptr)
    bytes +=
        f * static_cast<int64_t>(a.tuned->weight.size() + a.tuned->bias.size());
  // The dashboards: count, max, sum (16 B), N entries of 20 B per feature,
  // and a chunk of activations.
  if (a.dashboard > 0)
    for (const auto& sae : a.saes)
      bytes += sae->d_sae * (4 + 8 + 16 + 20 * a.dashboard + 8 + C * f);
  // The lens: its rows, final norm and one chunk of logits.
  if (a.lens) bytes += C * (2 * c.hidden_size + c.vocab_size) * f;
  // The input copy and one chunk of each output.
  bytes += C * c.hidden_size * f;
  for (const DerivedHook& x : d)
    if (!x.gradient()) bytes += C * x.width * f;  // gradients: BackwardBytes
  return bytes;
}

}  // namespace loom
