#include "src/serve/sae_set.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "src/backend/registry.h"

namespace loom::serve {

StatusOr<std::unique_ptr<SaeSet>> SaeSet::Load(
    const std::vector<std::string>& specs, std::string_view setting) {
  auto out = std::unique_ptr<SaeSet>(new SaeSet());
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& spec = specs[i];
    const std::string where =
        std::string(setting) + "[" + std::to_string(i) + "] `" + spec + "`";
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      return InvalidArgumentError(
          where +
          ": expected ID=PATH[@HOOK] (a Neuronpedia source id such as "
          "6-res-jb, then the SAE's directory or file)");
    ServedSae s;
    s.id = spec.substr(0, eq);
    s.spec = spec.substr(eq + 1);
    const size_t dash = s.id.find('-');
    s.set = dash == std::string::npos ? s.id : s.id.substr(dash + 1);
    if (out->Find(s.id) != nullptr)
      return InvalidArgumentError(where + ": source id `" + s.id +
                                  "` is configured twice");
    const size_t at = s.spec.rfind('@');
    const std::string path = s.spec.substr(0, at);
    const std::string hook =
        at == std::string::npos ? "" : s.spec.substr(at + 1);
    StatusOr<Sae> sae = LoadSae(path, hook);
    if (!sae.ok()) return sae.status().WithContext(where);
    s.sae = std::make_shared<const Sae>(std::move(sae).value());
    out->saes_.push_back(std::move(s));
  }
  if (!out->saes_.empty()) {
    ASSIGN_OR_RETURN(out->host_, CreateBackend("cpu"));
  }
  return out;
}

const ServedSae* SaeSet::Find(std::string_view id) const {
  for (const ServedSae& s : saes_)
    if (s.id == id) return &s;
  return nullptr;
}

std::vector<std::string> SaeSet::Sets() const {
  std::vector<std::string> out;
  for (const ServedSae& s : saes_)
    if (std::find(out.begin(), out.end(), s.set) == out.end())
      out.push_back(s.set);
  return out;
}

std::vector<std::string> SaeSet::Hooks() const {
  std::vector<std::string> out;
  for (const ServedSae& s : saes_)
    if (std::find(out.begin(), out.end(), s.sae->hook) == out.end())
      out.push_back(s.sae->hook);
  return out;
}

StatusOr<HookPoint> SaeSet::HookOn(const ServedSae& s,
                                   const ModelConfig& config) {
  const std::string who = "source `" + s.id + "` (" + s.spec + ")";
  StatusOr<std::vector<HookPoint>> hooks =
      ParseModelHookPattern(s.sae->hook, config);
  if (!hooks.ok()) return hooks.status().WithContext(who);
  if (hooks->size() != 1)
    return InvalidArgumentError(who + ": " + s.sae->hook + " names " +
                                std::to_string(hooks->size()) +
                                " hooks of this model; an SAE reads one");
  const HookPoint h = hooks->front();
  if (Status st = CheckHookExists(h, config); !st.ok())
    return st.WithContext(who);
  ASSIGN_OR_RETURN(const int64_t width, HookWidth(h, config));
  if (width != s.sae->d_in)
    return InvalidArgumentError(who + ": reads " + HookName(h) + ", which is " +
                                std::to_string(width) +
                                " wide in this model; the SAE's d_in is " +
                                std::to_string(s.sae->d_in));
  return h;
}

Status SaeSet::Run(const Sae& sae, const float* x, int64_t rows,
                   const SaeOutputs& out) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t need =
      static_cast<size_t>(host_->SaeWorkspaceBytes(sae, rows)) + 64;
  if (workspace_.size() < need) workspace_.resize(need);
  const uintptr_t p = reinterpret_cast<uintptr_t>(workspace_.data());
  void* aligned = reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
  return host_->RunSae(sae, x, nullptr, rows, aligned, out);
}

}  // namespace loom::serve
