#include "src/model/bind.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "src/base/float16.h"
#include "src/base/units.h"

namespace loom {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const Checkpoint::Entry* FindWithPrefixes(const Checkpoint& ckpt,
                                          const ArchWeights& decl,
                                          const std::string& name) {
  if (const auto* e = ckpt.Find(name)) return e;
  for (const auto& prefix : decl.optional_prefixes) {
    if (name.rfind(prefix, 0) == 0) {
      if (const auto* e = ckpt.Find(name.substr(prefix.size()))) return e;
    }
  }
  return nullptr;
}

std::string FileOf(const Checkpoint& ckpt, const Checkpoint::Entry& e) {
  return ckpt.files()[e.file]->path();
}

void ConvertTensor(const TensorView& src, void* dst, DType dst_dtype) {
  const int64_t n = src.numel();
  const uint8_t* s = static_cast<const uint8_t*>(src.data);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = 0;
    switch (src.dtype) {
      case DType::kF32:
        std::memcpy(&v, s + 4 * i, 4);
        break;
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        v = Bf16ToF32(h);
        break;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        v = F16ToF32(h);
        break;
      }
      default:
        LOOM_CHECK(false) << "unconvertible dtype " << DTypeName(src.dtype);
    }
    switch (dst_dtype) {
      case DType::kF32:
        static_cast<float*>(dst)[i] = v;
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(dst)[i] = F32ToBf16(v);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(dst)[i] = F32ToF16(v);
        break;
      default:
        LOOM_CHECK(false) << "bad compute dtype " << DTypeName(dst_dtype);
    }
  }
}

// Reads one byte per page so the mapped tensor is resident now: memory use is
// then what the plan says from the start, and no forward pays page faults.
void FaultIn(const TensorView& v) {
  const auto* p = static_cast<const volatile uint8_t*>(v.data);
  const int64_t n = v.bytes();
  constexpr int64_t kPage = 4096;
  uint8_t sink = 0;
#pragma omp parallel for schedule(static) reduction(^ : sink)
  for (int64_t off = 0; off < n; off += kPage) sink ^= p[off];
  if (n > 0) sink ^= p[n - 1];
  (void)sink;
}

}  // namespace

StatusOr<std::vector<WeightMatch>> MatchWeights(const ModelConfig& config,
                                                const ArchWeights& decl,
                                                const Checkpoint& ckpt) {
  std::vector<WeightMatch> matches(decl.specs.size());
  std::set<const Checkpoint::Entry*> consumed;
  for (size_t i = 0; i < decl.specs.size(); ++i) {
    const WeightSpec& spec = decl.specs[i];
    const Checkpoint::Entry* e = FindWithPrefixes(ckpt, decl, spec.name);
    if (e == nullptr && !spec.tied_to.empty()) {
      e = FindWithPrefixes(ckpt, decl, spec.tied_to);
      matches[i].tied = true;
    }
    if (e == nullptr) {
      if (!spec.required) continue;
      return NotFoundError("tensor " + spec.name +
                           ": missing from the checkpoint (" +
                           config.model_type + " declares it with shape " +
                           spec.shape.ToString() + ")");
    }
    if (e->info.shape != spec.shape)
      return InvalidArgumentError(
          "tensor " + e->info.name + " in " + FileOf(ckpt, *e) + ": shape " +
          e->info.shape.ToString() + " in file, expected " +
          spec.shape.ToString() + " from config.json");
    const DType want = spec.storage_dtype.value_or(e->info.dtype);
    if (spec.storage_dtype ? e->info.dtype != want
                           : !IsComputeDType(e->info.dtype))
      return InvalidArgumentError(
          "tensor " + e->info.name + " in " + FileOf(ckpt, *e) + ": dtype " +
          std::string(DTypeName(e->info.dtype)) + ", expected " +
          (spec.storage_dtype ? std::string(DTypeName(want))
                              : "F32, BF16 or F16"));
    matches[i].entry = e;
    consumed.insert(e);
  }
  for (const auto& e : ckpt.entries()) {
    if (consumed.count(&e)) continue;
    bool ignored = false;
    for (const auto& suffix : decl.ignored_suffixes)
      ignored |= EndsWith(e.info.name, suffix);
    if (ignored) continue;
    return InvalidArgumentError(
        "tensor " + e.info.name + " in " + FileOf(ckpt, e) + " (shape " +
        e.info.shape.ToString() + ") is not used by " + config.model_type +
        " with this config.json (unexpected tensor: wrong model_type or "
        "config?)");
  }
  return matches;
}

StatusOr<BoundWeights> BoundWeights::Bind(const ModelConfig& config,
                                          const ArchWeights& decl,
                                          const Checkpoint& ckpt,
                                          DType compute_dtype) {
  ASSIGN_OR_RETURN(std::vector<WeightMatch> matches,
                   MatchWeights(config, decl, ckpt));
  BoundWeights b;
  b.num_layers_ = config.num_layers;
  b.slots_.resize(static_cast<size_t>(config.num_layers + 1) * kNumWeightRoles);
  // Size the conversion arena: one aligned region per converted tensor.
  constexpr int64_t kAlign = 64;
  // A tensor bound twice (a tied lm_head) is converted once.
  int64_t arena_bytes = 0;
  std::set<const Checkpoint::Entry*> sized;
  for (size_t i = 0; i < matches.size(); ++i) {
    if (!matches[i].entry || !sized.insert(matches[i].entry).second) continue;
    const TensorInfo& info = matches[i].entry->info;
    if (info.dtype != compute_dtype)
      arena_bytes +=
          AlignUp(info.shape.numel() * DTypeSize(compute_dtype), kAlign);
  }
  if (arena_bytes > 0) {
    void* p = std::aligned_alloc(kAlign, static_cast<size_t>(arena_bytes));
    if (p == nullptr)
      return ResourceExhaustedError("cannot allocate " +
                                    FormatBytes(arena_bytes) +
                                    " for converted weights");
    b.arena_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p),
                                        [](uint8_t* q) { std::free(q); });
  }
  std::map<const Checkpoint::Entry*, TensorView> bound;
  int64_t offset = 0;
  for (size_t i = 0; i < matches.size(); ++i) {
    if (!matches[i].entry) continue;
    const WeightSpec& spec = decl.specs[i];
    TensorView view = ckpt.View(*matches[i].entry);
    if (auto it = bound.find(matches[i].entry); it != bound.end()) {
      view = it->second;
    } else if (view.dtype != compute_dtype) {
      uint8_t* dst = b.arena_.get() + offset;
      const int64_t bytes = view.numel() * DTypeSize(compute_dtype);
      ConvertTensor(view, dst, compute_dtype);
      offset += AlignUp(bytes, kAlign);
      b.converted_bytes_ += bytes;
      view = TensorView{dst, compute_dtype, view.shape};
    } else {
      b.in_place_bytes_ += view.bytes();
    }
    bound.emplace(matches[i].entry, view);
    const int64_t row = spec.layer < 0 ? config.num_layers : spec.layer;
    Slot& slot = b.slots_[static_cast<size_t>(row) * kNumWeightRoles +
                          static_cast<int>(spec.role)];
    slot.view = view;
    slot.layout = spec.layout;
    slot.present = true;
  }
  return b;
}

const TensorView* BoundWeights::Get(WeightRole role, int64_t layer) const {
  const int64_t row = layer < 0 ? num_layers_ : layer;
  const Slot& s = slots_[static_cast<size_t>(row) * kNumWeightRoles +
                         static_cast<int>(role)];
  return s.present ? &s.view : nullptr;
}

const TensorView& BoundWeights::Require(WeightRole role, int64_t layer) const {
  const TensorView* v = Get(role, layer);
  LOOM_CHECK(v != nullptr) << "weight role " << static_cast<int>(role)
                           << " layer " << layer << " not bound";
  return *v;
}

void BoundWeights::FaultIn(int64_t last_layer, bool head) const {
  for (int64_t row = 0; row <= num_layers_; ++row) {
    if (row < num_layers_ && row > last_layer) continue;
    for (int role = 0; role < kNumWeightRoles; ++role) {
      const Slot& s = slots_[static_cast<size_t>(row) * kNumWeightRoles + role];
      if (!s.present) continue;
      const auto r = static_cast<WeightRole>(role);
      if (row == num_layers_ && !head &&
          (r == WeightRole::kFinalNorm || r == WeightRole::kFinalNormBias ||
           r == WeightRole::kLmHead))
        continue;
      loom::FaultIn(s.view);
    }
  }
}

MatrixLayout BoundWeights::Layout(WeightRole role, int64_t layer) const {
  const int64_t row = layer < 0 ? num_layers_ : layer;
  return slots_[static_cast<size_t>(row) * kNumWeightRoles +
                static_cast<int>(role)]
      .layout;
}

}  // namespace loom
