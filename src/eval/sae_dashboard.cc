#include "src/eval/sae_dashboard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "src/io/file_util.h"
#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"

namespace loom {
namespace {

constexpr int kFixedBits = 60;  // the sum's unit: 2^-60

// `a` > 0 as a multiple of 2^-60, truncated; saturating at 2^66.
__int128 Fixed(float a) {
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const auto mi = static_cast<int64_t>(std::ldexp(m, 24));  // exact
  const int shift = std::min(e, 66) - 24 + kFixedBits;
  if (shift <= -64) return 0;
  return shift >= 0 ? static_cast<__int128>(mi) << shift
                    : static_cast<__int128>(mi >> -shift);
}

}  // namespace

SaeDashboard::SaeDashboard(int64_t features, int64_t top_n)
    : features_(features),
      n_(top_n),
      count_(static_cast<size_t>(features), 0),
      max_(static_cast<size_t>(features), 0.0f),
      sum_(static_cast<size_t>(features), 0),
      top_(static_cast<size_t>(features * top_n)),
      filled_(static_cast<size_t>(features), 0) {}

bool SaeDashboard::Before(const Entry& a, const Entry& b) {
  if (a.value != b.value) return a.value > b.value;
  if (a.row != b.row) return a.row < b.row;
  return a.position < b.position;
}

void SaeDashboard::Add(int64_t row, int64_t position, const float* acts) {
  for (int64_t f = 0; f < features_; ++f) {
    const float a = acts[f];
    if (!(a > 0)) continue;
    ++count_[f];
    max_[f] = std::max(max_[f], a);
    sum_[f] += Fixed(a);
    // The feature's heap: its worst kept entry first (Before as "less").
    Entry* heap = top_.data() + f * n_;
    int64_t& filled = filled_[f];
    const Entry e{a, row, position};
    if (filled < n_) {
      heap[filled++] = e;
      std::push_heap(heap, heap + filled, Before);
    } else if (n_ > 0 && Before(e, heap[0])) {
      std::pop_heap(heap, heap + n_, Before);
      heap[n_ - 1] = e;
      std::push_heap(heap, heap + n_, Before);
    }
  }
}

Status SaeDashboard::Write(const std::string& path, int64_t rows) const {
  const size_t F = static_cast<size_t>(features_), N = static_cast<size_t>(n_);
  std::vector<double> sum(F);
  std::vector<int64_t> fixed(2 * F);
  std::vector<float> values(F * N, 0.0f);
  std::vector<int64_t> top_rows(F * N, -1), positions(F * N, -1);
  for (size_t f = 0; f < F; ++f) {
    sum[f] = std::ldexp(static_cast<double>(sum_[f]), -kFixedBits);
    const auto u = static_cast<unsigned __int128>(sum_[f]);
    fixed[2 * f] = static_cast<int64_t>(static_cast<uint64_t>(u));
    fixed[2 * f + 1] = static_cast<int64_t>(static_cast<uint64_t>(u >> 64));
    std::vector<Entry> kept(top_.begin() + f * N,
                            top_.begin() + f * N + filled_[f]);
    std::sort(kept.begin(), kept.end(), Before);
    for (size_t k = 0; k < kept.size(); ++k) {
      values[f * N + k] = kept[k].value;
      top_rows[f * N + k] = kept[k].row;
      positions[f * N + k] = kept[k].position;
    }
  }
  const int64_t Fi = features_, Ni = n_;
  SafetensorsWriter w;
  w.SetMetadata("rows", std::to_string(rows));
  w.SetMetadata("top_n", std::to_string(n_));
  w.SetMetadata("sum_fixed",
                "[lo, hi] of the sum as a signed 128-bit multiple of 2^-60");
  RETURN_IF_ERROR(w.Add("count", DType::kI64, Shape({Fi}), count_.data(),
                        Fi * 8));
  RETURN_IF_ERROR(w.Add("max", DType::kF32, Shape({Fi}), max_.data(), Fi * 4));
  RETURN_IF_ERROR(w.Add("sum", DType::kF64, Shape({Fi}), sum.data(), Fi * 8));
  RETURN_IF_ERROR(w.Add("sum_fixed", DType::kI64, Shape({Fi, 2}),
                        fixed.data(), Fi * 16));
  RETURN_IF_ERROR(w.Add("top_values", DType::kF32, Shape({Fi, Ni}),
                        values.data(), Fi * Ni * 4));
  RETURN_IF_ERROR(w.Add("top_rows", DType::kI64, Shape({Fi, Ni}),
                        top_rows.data(), Fi * Ni * 8));
  RETURN_IF_ERROR(w.Add("top_positions", DType::kI64, Shape({Fi, Ni}),
                        positions.data(), Fi * Ni * 8));
  // The new state as `path`, the one before it as `path`.prev.
  namespace fs = std::filesystem;
  RETURN_IF_ERROR(w.Write(path + ".next"));
  std::error_code ec;
  if (fs::exists(path, ec))
    RETURN_IF_ERROR(RenameDurably(path, path + ".prev"));
  return RenameDurably(path + ".next", path);
}

Status SaeDashboard::Load(const std::string& path, int64_t rows,
                          bool check_only) {
  namespace fs = std::filesystem;
  for (const std::string& p : {path, path + ".prev"}) {
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(p);
    if (!h.ok()) continue;
    const auto it = h->metadata.find("rows");
    if (it == h->metadata.end() || it->second != std::to_string(rows))
      continue;
    RETURN_IF_ERROR(Read(p, rows, !check_only));
    if (check_only || p == path) return Status();
    // The newer file was past the commit: the committed one takes its name.
    return RenameDurably(p, path);
  }
  return DataLossError("--resume: " + path + " (or its .prev) holds no "
                       "dashboard of the " + std::to_string(rows) +
                       " committed rows");
}

Status SaeDashboard::Read(const std::string& path, int64_t rows, bool keep) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                   SafetensorsFile::Open(path));
  const int64_t F = features_, N = n_;
  auto get = [&](const char* name, DType dtype,
                 std::vector<int64_t> dims) -> StatusOr<const uint8_t*> {
    const TensorInfo* t = file->Find(name);
    if (t == nullptr || t->dtype != dtype || t->shape.dims() != dims)
      return DataLossError("--resume: " + path + ": tensor '" + name +
                           "' is missing or not " +
                           Shape(dims).ToString() + " of this job's SAE (" +
                           std::to_string(rows) + " rows committed)");
    return static_cast<const uint8_t*>(file->View(*t).data);
  };
  ASSIGN_OR_RETURN(const uint8_t* count, get("count", DType::kI64, {F}));
  ASSIGN_OR_RETURN(const uint8_t* max, get("max", DType::kF32, {F}));
  ASSIGN_OR_RETURN(const uint8_t* fixed,
                   get("sum_fixed", DType::kI64, {F, 2}));
  ASSIGN_OR_RETURN(const uint8_t* values,
                   get("top_values", DType::kF32, {F, N}));
  ASSIGN_OR_RETURN(const uint8_t* top_rows,
                   get("top_rows", DType::kI64, {F, N}));
  ASSIGN_OR_RETURN(const uint8_t* positions,
                   get("top_positions", DType::kI64, {F, N}));
  if (!keep) return Status();
  std::memcpy(count_.data(), count, static_cast<size_t>(F) * 8);
  std::memcpy(max_.data(), max, static_cast<size_t>(F) * 4);
  for (int64_t f = 0; f < F; ++f) {
    uint64_t lo, hi;
    std::memcpy(&lo, fixed + 16 * f, 8);
    std::memcpy(&hi, fixed + 16 * f + 8, 8);
    sum_[f] = static_cast<__int128>(
        (static_cast<unsigned __int128>(hi) << 64) | lo);
    int64_t filled = 0;
    for (int64_t k = 0; k < N; ++k) {
      Entry e;
      std::memcpy(&e.value, values + 4 * (f * N + k), 4);
      std::memcpy(&e.row, top_rows + 8 * (f * N + k), 8);
      std::memcpy(&e.position, positions + 8 * (f * N + k), 8);
      if (e.row < 0) break;
      top_[f * N + filled++] = e;
    }
    filled_[f] = filled;
    std::make_heap(top_.begin() + f * N, top_.begin() + f * N + filled,
                   Before);
  }
  return Status();
}

}  // namespace loom
