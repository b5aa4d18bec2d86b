#include "src/model/bind.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "src/base/float16.h"
#include "src/base/units.h"
#include "src/core/quant_codes.h"

namespace loom {
namespace {

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
  if (v.data == nullptr) return;
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

std::vector<StoredTensor> StoredTensorsOf(const Checkpoint& ckpt) {
  std::vector<StoredTensor> out;
  out.reserve(ckpt.entries().size());
  for (size_t i = 0; i < ckpt.entries().size(); ++i) {
    const Checkpoint::Entry& e = ckpt.entries()[i];
    out.push_back(StoredTensor{e.info.name, e.info.dtype, e.info.shape,
                               ckpt.files()[e.file]->path(),
                               static_cast<int64_t>(i)});
  }
  return out;
}

StatusOr<std::vector<MatchedWeight>> MatchCheckpoint(const ModelConfig& config,
                                                     const ArchWeights& decl,
                                                     const Checkpoint& ckpt) {
  const std::vector<StoredTensor> stored = StoredTensorsOf(ckpt);
  MatchOptions o;
  o.source = ckpt.files().size() == 1 ? ckpt.files()[0]->path()
                                      : "the checkpoint's shards";
  return MatchCheckpoint(config, decl, &stored, o);
}

BoundWeights::Slot* BoundWeights::SlotFor(const WeightSpec& spec) {
  if (spec.expert != kNoExpert)
    return &expert_slots_[{static_cast<int>(spec.role), spec.layer,
                           spec.expert}];
  const int64_t row = spec.layer < 0 ? num_layers_ : spec.layer;
  return &slots_[static_cast<size_t>(row) * kNumWeightRoles +
                 static_cast<int>(spec.role)];
}

const BoundWeights::Slot* BoundWeights::FindSlot(WeightRole role, int64_t layer,
                                                 int64_t expert) const {
  if (expert != kNoExpert) {
    auto it = expert_slots_.find({static_cast<int>(role), layer, expert});
    return it == expert_slots_.end() ? nullptr : &it->second;
  }
  const int64_t row = layer < 0 ? num_layers_ : layer;
  return &slots_[static_cast<size_t>(row) * kNumWeightRoles +
                 static_cast<int>(role)];
}

StatusOr<BoundWeights> BoundWeights::Bind(const ModelConfig& config,
                                          const ArchWeights& decl,
                                          const Checkpoint& ckpt,
                                          DType compute_dtype) {
  ASSIGN_OR_RETURN(std::vector<MatchedWeight> matches,
                   MatchCheckpoint(config, decl, ckpt));
  // The entry each present dense weight binds (its values tensor).
  auto entry_of = [&](size_t i) -> const Checkpoint::Entry* {
    if (!matches[i].present || matches[i].format.quantized()) return nullptr;
    return &ckpt.entries()[static_cast<size_t>(matches[i].tensors[0].id)];
  };
  BoundWeights b;
  b.num_layers_ = config.num_layers;
  b.compute_dtype_ = compute_dtype;
  b.slots_.resize(static_cast<size_t>(config.num_layers + 1) * kNumWeightRoles);
  // Quantized weights: views of their components, in place.
  for (size_t i = 0; i < matches.size(); ++i) {
    const MatchedWeight& m = matches[i];
    if (!m.present || !m.format.quantized()) continue;
    const WeightSpec& spec = decl.specs[i];
    Quantized q;
    q.format = m.format;
    q.logical = LogicalWeightShape(spec);
    FormatBlock(m.format, &q.block_out, &q.block_in);
    for (const MatchedTensor& t : m.tensors) {
      const TensorView v = ckpt.View(ckpt.entries()[static_cast<size_t>(t.id)]);
      b.in_place_bytes_ += v.bytes();
      switch (t.tensor.component) {
        case ComponentKind::kValues:
          q.values = v;
          break;
        case ComponentKind::kBlockScales:
          q.scales = v;
          q.scales_element = t.tensor.element;
          break;
        case ComponentKind::kGlobalScale:
          q.global = v;
          break;
        case ComponentKind::kInputScale:
        case ComponentKind::kKvCacheScale:
          break;  // weight-only semantics: activations stay unquantized
      }
    }
    if (q.global.data != nullptr && q.global.dtype != DType::kF32)
      return InvalidArgumentError(
          "tensor " + spec.name + " global scale: dtype " +
          std::string(DTypeName(q.global.dtype)) + ", expected F32");
    Slot* slot = b.SlotFor(spec);
    slot->view = q.values;
    slot->layout = MatrixLayout::kOutIn;
    slot->present = true;
    slot->quantized = true;
    slot->quant = std::move(q);
  }
  // Size the conversion arena: one aligned region per converted tensor.
  constexpr int64_t kAlign = 64;
  // A tensor bound twice (a tied lm_head) is converted once.
  int64_t arena_bytes = 0;
  std::set<const Checkpoint::Entry*> sized;
  for (size_t i = 0; i < matches.size(); ++i) {
    const Checkpoint::Entry* e = entry_of(i);
    if (!e || !sized.insert(e).second) continue;
    if (e->info.dtype != compute_dtype)
      arena_bytes +=
          AlignUp(e->info.shape.numel() * DTypeSize(compute_dtype), kAlign);
  }
  if (arena_bytes > 0) {
    void* p = std::aligned_alloc(kAlign, static_cast<size_t>(arena_bytes));
    if (p == nullptr)
      return ResourceExhaustedError("cannot allocate " +
                                    FormatBytes(arena_bytes) +
                                    " for converted weights");
    b.arena_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p),
                                        [](uint8_t* q) { std::free(q); });
    b.arena_bytes_ = arena_bytes;
  }
  std::map<const Checkpoint::Entry*, TensorView> bound;
  int64_t offset = 0;
  for (size_t i = 0; i < matches.size(); ++i) {
    const Checkpoint::Entry* e = entry_of(i);
    if (!e) continue;
    const WeightSpec& spec = decl.specs[i];
    TensorView view = ckpt.View(*e);
    if (auto it = bound.find(e); it != bound.end()) {
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
    bound.emplace(e, view);
    Slot* slot = b.SlotFor(spec);
    slot->view = view;
    slot->layout = spec.layout;
    slot->present = true;
  }
  return b;
}

const BoundWeights::Quantized* BoundWeights::GetQuantized(
    WeightRole role, int64_t layer, int64_t expert) const {
  const Slot* s = FindSlot(role, layer, expert);
  return s != nullptr && s->present && s->quantized ? &s->quant : nullptr;
}

const TensorView* BoundWeights::Get(WeightRole role, int64_t layer) const {
  return Get(role, layer, kNoExpert);
}

const TensorView& BoundWeights::Require(WeightRole role, int64_t layer) const {
  return Require(role, layer, kNoExpert);
}

const TensorView* BoundWeights::Get(WeightRole role, int64_t layer,
                                    int64_t expert) const {
  const Slot* s = FindSlot(role, layer, expert);
  return s != nullptr && s->present ? &s->view : nullptr;
}

const TensorView& BoundWeights::Require(WeightRole role, int64_t layer,
                                        int64_t expert) const {
  const TensorView* v = Get(role, layer, expert);
  LOOM_CHECK(v != nullptr) << "weight " << WeightRoleName(role) << " layer "
                           << layer << " expert " << expert << " not bound";
  return *v;
}

BoundWeights BoundWeights::Placed(PlaceFn place, void* context) const {
  BoundWeights b = *this;
  auto move = [&](Slot& slot, int64_t layer) {
    if (!slot.present) return;
    void* data = place(context, layer, slot.view);
    if (data == nullptr) {
      slot = Slot();
      return;
    }
    slot.view.data = data;
    if (!slot.quantized) return;
    slot.quant.values.data = data;
    if (slot.quant.scales.data != nullptr) {
      slot.quant.scales.data = place(context, layer, slot.quant.scales);
      LOOM_CHECK(slot.quant.scales.data != nullptr)
          << "block scales dropped while their codes were kept";
    }
  };
  for (int64_t row = 0; row <= num_layers_; ++row)
    for (int r = 0; r < kNumWeightRoles; ++r)
      move(b.slots_[static_cast<size_t>(row) * kNumWeightRoles +
                    static_cast<size_t>(r)],
           row == num_layers_ ? -1 : row);
  for (auto& [key, slot] : b.expert_slots_) move(slot, std::get<1>(key));
  return b;
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
           r == WeightRole::kLmHead || r == WeightRole::kLmHeadBias))
        continue;
      loom::FaultIn(s.view);
      if (s.quantized) loom::FaultIn(s.quant.scales);
    }
  }
  for (const auto& [key, s] : expert_slots_) {
    if (!s.present || std::get<1>(key) > last_layer) continue;
    loom::FaultIn(s.view);
    if (s.quantized) loom::FaultIn(s.quant.scales);
  }
}

namespace {

// Roles read only as a GEMM's weight (WeightOperandOf).
bool IsGemmWeight(WeightRole r) {
  switch (r) {
    case WeightRole::kLmHead:
    case WeightRole::kQ:
    case WeightRole::kK:
    case WeightRole::kV:
    case WeightRole::kQkv:
    case WeightRole::kO:
    case WeightRole::kGate:
    case WeightRole::kUp:
    case WeightRole::kGateUp:
    case WeightRole::kDown:
    case WeightRole::kRouter:
    case WeightRole::kExpertGate:
    case WeightRole::kExpertUp:
    case WeightRole::kExpertDown:
    case WeightRole::kExpertGateUp:
    case WeightRole::kSharedExpertGateProj:
    case WeightRole::kSharedExpertUp:
    case WeightRole::kSharedExpertDown:
    case WeightRole::kSharedExpertGate:
    case WeightRole::kQA:
    case WeightRole::kQB:
    case WeightRole::kKvA:
    case WeightRole::kKvB:
      return true;
    default:
      return false;
  }
}


// Anonymous memory for `bytes`, huge pages asked for its whole 2 MB blocks
// (none past the last: nothing beyond the bytes becomes resident).
StatusOr<std::shared_ptr<uint8_t>> AllocateRepacked(int64_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const size_t len = static_cast<size_t>(bytes) + kHuge;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return ResourceExhaustedError("repacking " + std::to_string(bytes) +
                                  " bytes of weights: mmap: " +
                                  std::strerror(errno));
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = (base + kHuge - 1) / kHuge * kHuge;
  const uintptr_t whole = (start + static_cast<uintptr_t>(bytes)) / kHuge * kHuge;
  if (whole > start)
    (void)::madvise(reinterpret_cast<void*>(start), whole - start,
                    MADV_HUGEPAGE);  // a hint: 4 KB pages otherwise
  return std::shared_ptr<uint8_t>(reinterpret_cast<uint8_t*>(start),
                                   [p, len](uint8_t*) { ::munmap(p, len); });
}

// Drops the mapped pages wholly inside [begin, end) of a tensor whose bytes
// span [lo, hi): they are read again from the file if touched (never: the
// weight now lives elsewhere). Pages shared with a neighbour stay.
void ReleaseMapped(const uint8_t* lo, const uint8_t* hi, const uint8_t* begin,
                   const uint8_t* end) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t b = (reinterpret_cast<uintptr_t>(std::max(begin, lo)) + page - 1) /
                page * page;
  uintptr_t e = reinterpret_cast<uintptr_t>(std::min(end, hi)) / page * page;
  if (e > b)
    (void)::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

}  // namespace

Status BoundWeights::Repack(int64_t first_layer, int64_t last_layer, bool head,
                            const LayoutFn& layout_of,
                            const RepackFn& repack) const {
  std::lock_guard<std::mutex> lock(*repack_mutex_);
  const Slot* embed = FindSlot(WeightRole::kEmbed, -1, kNoExpert);
  const auto* embed_begin =
      embed != nullptr && embed->present
          ? static_cast<const uint8_t*>(embed->view.data)
          : nullptr;
  const uint8_t* embed_end =
      embed_begin != nullptr ? embed_begin + embed->view.bytes() : nullptr;
  const uint8_t* arena_begin = arena_.get();
  const uint8_t* arena_end = arena_begin + arena_bytes_;
  struct Job {
    const Slot* slot;
    MatrixLayout to;
    bool in_place;  // in the owned arena
  };
  std::vector<Job> jobs;
  auto offer = [&](const Slot& s, WeightRole role) {
    if (!s.present || s.quantized || s.layout != MatrixLayout::kOutIn ||
        s.view.dtype != compute_dtype_ || !IsGemmWeight(role))
      return;
    const TensorView& v = s.view;
    const auto* p = static_cast<const uint8_t*>(v.data);
    if (embed_begin != nullptr && p < embed_end && p + v.bytes() > embed_begin)
      return;  // shares the embedding table (tied)
    const int64_t rank = v.shape.rank();
    if (rank != 2 && rank != 3) return;
    const int64_t n = v.shape.dim(-2), k = v.shape.dim(-1);
    const MatrixLayout to = layout_of(n, k, v.dtype);
    if (to == MatrixLayout::kOutIn) return;
    // Packed gate/up experts are served as row halves (WeightOperandOf).
    if (role == WeightRole::kExpertGateUp && (n / 2) % 16 != 0) return;
    const bool in_place =
        arena_begin != nullptr && p >= arena_begin && p < arena_end;
    jobs.push_back({&s, to, in_place});
  };
  for (int64_t row = 0; row <= num_layers_; ++row) {
    const bool model_level = row == num_layers_;
    if (!model_level && (row < first_layer || row > last_layer)) continue;
    if (model_level && !head) continue;
    for (int role = 0; role < kNumWeightRoles; ++role) {
      const auto r = static_cast<WeightRole>(role);
      if (model_level && r != WeightRole::kLmHead) continue;
      offer(slots_[static_cast<size_t>(row) * kNumWeightRoles + role], r);
    }
  }
  for (const auto& [key, s] : expert_slots_) {
    const int64_t layer = std::get<1>(key);
    if (layer >= first_layer && layer <= last_layer)
      offer(s, static_cast<WeightRole>(std::get<0>(key)));
  }
  int64_t moved = 0;
  for (const Job& j : jobs)
    if (!j.in_place) moved += AlignUp(j.slot->view.bytes(), 64);
  uint8_t* out = nullptr;
  if (moved > 0) {
    ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> mem, AllocateRepacked(moved));
    out = mem.get();
    repacked_->push_back(std::move(mem));
  }
  for (const Job& j : jobs) {
    TensorView& v = j.slot->view;
    const int64_t n = v.shape.dim(-2), k = v.shape.dim(-1);
    const int64_t es = static_cast<int64_t>(DTypeSize(v.dtype));
    const int64_t matrices = v.shape.rank() == 3 ? v.shape.dim(0) : 1;
    const auto* src = static_cast<const uint8_t*>(v.data);
    uint8_t* dst = j.in_place ? const_cast<uint8_t*>(src) : out;
    for (int64_t e = 0; e < matrices; ++e)
      for (int64_t r0 = 0; r0 < n; r0 += kRepackRows) {
        const int64_t rows = std::min(kRepackRows, n - r0);
        const int64_t at = (e * n + r0) * k * es;
        repack(src + at, rows, k, v.dtype, dst + at);
        if (!j.in_place)
          ReleaseMapped(src, src + v.bytes(), src + at,
                        src + at + rows * k * es);
      }
    if (!j.in_place) {
      v.data = dst;
      out += AlignUp(v.bytes(), 64);
    }
    j.slot->layout = j.to;
  }
  return Status();
}

MatrixLayout BoundWeights::Layout(WeightRole role, int64_t layer) const {
  return Layout(role, layer, kNoExpert);
}

MatrixLayout BoundWeights::Layout(WeightRole role, int64_t layer,
                                  int64_t expert) const {
  const Slot* s = FindSlot(role, layer, expert);
  return s != nullptr ? s->layout : MatrixLayout::kOutIn;
}

}  // namespace loom
