#include "src/model/match.h"

#include <map>
#include <set>

namespace loom {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsDenseFloat(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

// The module a weight belongs to: its name without ".weight".
std::string ModuleOf(const std::string& name) {
  static const std::string kWeight = ".weight";
  return EndsWith(name, kWeight) ? name.substr(0, name.size() - kWeight.size())
                                 : name;
}

class Lookup {
 public:
  Lookup(const std::vector<StoredTensor>& stored, const ArchWeights& decl)
      : decl_(decl) {
    for (const StoredTensor& t : stored) by_name_.emplace(t.name, &t);
  }
  // Exact, or without an optional prefix (GPT-2's "transformer.").
  const StoredTensor* Find(const std::string& name) const {
    if (auto it = by_name_.find(name); it != by_name_.end()) return it->second;
    for (const std::string& p : decl_.optional_prefixes) {
      if (name.rfind(p, 0) != 0) continue;
      if (auto it = by_name_.find(name.substr(p.size())); it != by_name_.end())
        return it->second;
    }
    return nullptr;
  }

 private:
  const ArchWeights& decl_;
  std::map<std::string, const StoredTensor*> by_name_;
};

// The physical tensors `spec` consists of in `format` (+ the ModelOpt FP8
// KV-cache scales riding on k/v projections).
StatusOr<std::vector<PhysicalTensor>> Expand(const ModelConfig& c,
                                             const WeightSpec& spec,
                                             const WeightFormat& format) {
  ASSIGN_OR_RETURN(
      std::vector<PhysicalTensor> ts,
      ExpandWeight(format, spec.name,
                   format.quantized() ? LogicalWeightShape(spec) : spec.shape));
  if (c.quant.kv_cache_scales &&
      (spec.role == WeightRole::kK || spec.role == WeightRole::kV)) {
    PhysicalTensor t;
    t.component = ComponentKind::kKvCacheScale;
    t.name = ModuleOf(spec.name) +
             (spec.role == WeightRole::kK ? ".k_scale" : ".v_scale");
    t.dtype = t.element = DType::kF32;
    t.bytes = 4;
    ts.push_back(std::move(t));
  }
  return ts;
}

std::string Where(const StoredTensor& s, const MatchOptions& o) {
  return s.file.empty() ? o.source : s.file;
}

std::string Describe(const PhysicalTensor& t, const WeightSpec& spec,
                     const WeightFormat& f) {
  if (!f.quantized() && t.component == ComponentKind::kValues) return "";
  return " (" + std::string(ComponentName(t.component)) + " of " + spec.name +
         ", stored as " + f.ToString() + ")";
}

}  // namespace

Shape LogicalWeightShape(const WeightSpec& s) {
  if (s.layout == MatrixLayout::kOutIn || s.shape.rank() < 2) return s.shape;
  std::vector<int64_t> d = s.shape.dims();
  std::swap(d[d.size() - 1], d[d.size() - 2]);
  return Shape(std::move(d));
}

int64_t MatchedWeight::bytes() const {
  if (!present || tied) return 0;
  int64_t b = 0;
  for (const MatchedTensor& t : tensors) b += t.tensor.bytes;
  return b;
}

WeightFormat ResolveFormat(const ModelConfig& c, const WeightSpec& spec,
                           std::optional<DType> dense_dtype) {
  if (spec.format) return *spec.format;
  if (spec.linear && c.quant.quantized() &&
      !c.quant.Excludes(ModuleOf(spec.name)))
    return c.quant.format;
  WeightFormat f;
  f.dtype = dense_dtype;
  return f;
}

StatusOr<std::vector<MatchedWeight>> MatchCheckpoint(
    const ModelConfig& c, const ArchWeights& decl,
    const std::vector<StoredTensor>* stored, const MatchOptions& o) {
  std::optional<Lookup> lookup;
  if (stored) lookup.emplace(*stored, decl);
  std::vector<MatchedWeight> out(decl.specs.size());
  std::set<const StoredTensor*> consumed;
  for (size_t i = 0; i < decl.specs.size(); ++i) {
    const WeightSpec& spec = decl.specs[i];
    MatchedWeight& w = out[i];
    // A dense weight's dtype is the stored one: resolved per tensor below.
    w.format = ResolveFormat(c, spec, o.assumed_dense_dtype);
    ASSIGN_OR_RETURN(std::vector<PhysicalTensor> phys,
                     Expand(c, spec, w.format));
    // Tied weights (lm_head -> embed_tokens): the target's tensors.
    if (!spec.tied_to.empty() &&
        (!lookup || (lookup->Find(phys[0].name) == nullptr &&
                     lookup->Find(spec.tied_to) != nullptr))) {
      w.present = w.tied = true;
      MatchedTensor m;
      m.tensor = phys[0];
      m.tensor.name = spec.tied_to;
      if (lookup) {
        const StoredTensor* s = lookup->Find(spec.tied_to);
        m.stored_name = s->name;
        m.id = s->id;
        if (s->dtype) m.tensor.dtype = m.tensor.element = *s->dtype;
      }
      w.tensors.push_back(std::move(m));
      continue;
    }
    if (!lookup) {
      if (!spec.required) continue;
      w.present = true;
      for (PhysicalTensor& t : phys) {
        MatchedTensor m;
        m.stored_name = t.name;
        m.tensor = std::move(t);
        m.dtype_assumed = true;
        w.tensors.push_back(std::move(m));
      }
      continue;
    }
    // Optional weights are absent when their values tensor is.
    if (!spec.required && lookup->Find(phys[0].name) == nullptr) continue;
    w.present = true;
    for (PhysicalTensor& t : phys) {
      const StoredTensor* s = lookup->Find(t.name);
      if (s == nullptr)
        return NotFoundError("tensor " + t.name + Describe(t, spec, w.format) +
                             ": missing from " + o.source + " (" +
                             c.model_type + " declares it with shape " +
                             t.shape.ToString() + ")");
      if (s->shape && *s->shape != t.shape)
        return InvalidArgumentError(
            "tensor " + s->name + " in " + Where(*s, o) + ": shape " +
            s->shape->ToString() + " in file, expected " + t.shape.ToString() +
            " from config.json" + Describe(t, spec, w.format));
      MatchedTensor m;
      m.stored_name = s->name;
      m.id = s->id;
      m.dtype_assumed = !s->dtype.has_value();
      if (s->dtype) {
        const bool dense =
            !w.format.quantized() && t.component == ComponentKind::kValues;
        const bool ok = dense            ? IsDenseFloat(*s->dtype)
                        : t.dtype_varies ? IsDenseFloat(*s->dtype)
                                         : *s->dtype == t.dtype;
        if (!ok)
          return InvalidArgumentError(
              "tensor " + s->name + " in " + Where(*s, o) + ": dtype " +
              std::string(DTypeName(*s->dtype)) + ", expected " +
              (dense || t.dtype_varies ? std::string("F32, BF16 or F16")
                                       : std::string(DTypeName(t.dtype))) +
              Describe(t, spec, w.format));
        if (dense || t.dtype_varies) {
          // A dense tensor, or a component whose stored dtype is the
          // checkpoint's choice (FP8 block scales): it encodes that dtype.
          t.dtype = t.element = *s->dtype;
          t.bytes = DTypeBytes(t.dtype, t.shape.numel());
        }
      }
      m.tensor = std::move(t);
      consumed.insert(s);
      w.tensors.push_back(std::move(m));
    }
    if (!w.format.quantized()) w.format.dtype = w.tensors[0].tensor.dtype;
  }
  if (stored) {
    for (const StoredTensor& s : *stored) {
      if (consumed.count(&s)) continue;
      bool ignored = false;
      for (const auto& suffix : decl.ignored_suffixes)
        ignored |= EndsWith(s.name, suffix);
      if (ignored) continue;
      return InvalidArgumentError(
          "tensor " + s.name + " in " + Where(s, o) +
          (s.shape ? " (shape " + s.shape->ToString() + ")" : "") +
          " is not used by " + c.model_type +
          " with this config.json (unexpected tensor: wrong model_type or "
          "config?)");
    }
  }
  return out;
}

}  // namespace loom
