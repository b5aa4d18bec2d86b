#include "src/plan/weight_table.h"

#include <filesystem>

#include "src/io/safetensors.h"
#include "src/model/match.h"

namespace loom {
namespace {

bool IsPre(WeightRole r) { return IsEmbeddingSide(r); }

// Runs the matcher on `stored` (nullptr: config only) and sums bytes.
StatusOr<WeightTable> Match(const ModelConfig& c, const ArchWeights& decl,
                            const std::vector<StoredTensor>* stored,
                            DType dense_dtype, const std::string& source) {
  MatchOptions o;
  o.source = source;
  o.assumed_dense_dtype = dense_dtype;
  ASSIGN_OR_RETURN(std::vector<MatchedWeight> matched,
                   MatchCheckpoint(c, decl, stored, o));
  WeightTable t;
  t.source_path = source;
  t.layer_bytes.assign(c.num_layers, 0);
  if (c.quant.quantized()) t.quantization = c.quant.format.ToString();
  for (size_t i = 0; i < matched.size(); ++i) {
    const MatchedWeight& w = matched[i];
    const WeightSpec& spec = decl.specs[i];
    if (!w.present) continue;
    if (w.tied) {
      t.tied_head = true;  // counted once, with the tensor it is tied to
      continue;
    }
    for (const MatchedTensor& m : w.tensors) {
      PlannedTensor p;
      p.name = m.stored_name;
      p.role = spec.role;
      p.layer = spec.layer;
      p.expert = spec.expert;
      p.shape = m.tensor.shape;
      p.dtype = m.tensor.dtype;
      p.bytes = m.tensor.bytes;
      p.quantized = w.format.quantized();
      p.component = m.tensor.component;
      if (p.layer >= 0) {
        LOOM_CHECK(p.layer < c.num_layers)
            << "tensor " << p.name << " declared for layer " << p.layer;
        t.layer_bytes[p.layer] += p.bytes;
      } else if (IsPre(p.role)) {
        t.pre_bytes += p.bytes;
      } else {
        t.post_bytes += p.bytes;
      }
      if (p.role == WeightRole::kEmbed) t.embed_bytes += p.bytes;
      t.tensors.push_back(std::move(p));
    }
  }
  return t;
}

}  // namespace

std::string_view WeightSourceName(WeightSource s) {
  switch (s) {
    case WeightSource::kHeaders:
      return "safetensors headers";
    case WeightSource::kIndex:
      return "index (shards absent)";
    case WeightSource::kConfig:
      return "config.json only";
  }
  return "?";
}

int64_t WeightTable::total_bytes() const {
  int64_t sum = pre_bytes + post_bytes;
  for (int64_t b : layer_bytes) sum += b;
  return sum;
}

int64_t WeightTable::LayerRangeBytes(int64_t begin, int64_t end) const {
  int64_t sum = 0;
  for (int64_t i = begin; i < end; ++i) sum += layer_bytes[i];
  return sum;
}

StatusOr<WeightTable> WeightTableFromNames(const ModelConfig& config,
                                           const ArchWeights& decl,
                                           const std::set<std::string>* names,
                                           DType dtype,
                                           const std::string& source) {
  if (names == nullptr) {
    ASSIGN_OR_RETURN(WeightTable t,
                     Match(config, decl, nullptr, dtype, source));
    t.source = WeightSource::kConfig;
    t.assumed_dtype = dtype;
    return t;
  }
  std::vector<StoredTensor> stored;
  stored.reserve(names->size());
  for (const std::string& n : *names)
    stored.push_back(StoredTensor{n, std::nullopt, std::nullopt, "", -1});
  ASSIGN_OR_RETURN(WeightTable t, Match(config, decl, &stored, dtype, source));
  t.source = WeightSource::kIndex;
  t.assumed_dtype = dtype;
  return t;
}

StatusOr<WeightTable> BuildWeightTable(const std::string& model_dir,
                                       const ModelConfig& config,
                                       const ArchWeights& decl,
                                       const WeightTableOptions& options) {
  namespace fs = std::filesystem;
  const DType fallback = options.assume_dtype.value_or(config.torch_dtype);
  if (DTypeBits(fallback) % 8 != 0)
    return InvalidArgumentError(
        std::string("dense weight dtype ") + std::string(DTypeName(fallback)) +
        (options.assume_dtype ? " (--assume-dtype)" : " (torch_dtype)") +
        " is a sub-byte type (it only stores quantized weights)");
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  std::error_code ec;
  std::optional<SafetensorsIndex> index;
  bool shards_present = false;
  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(SafetensorsIndex idx, ReadSafetensorsIndex(index_path));
    shards_present = !idx.shards.empty();
    for (const std::string& shard : idx.shards)
      shards_present &= fs::exists(model_dir + "/" + shard, ec);
    index = std::move(idx);
  } else {
    shards_present = fs::exists(model_dir + "/model.safetensors", ec);
  }
  if (shards_present) {
    ASSIGN_OR_RETURN(CheckpointHeaders headers,
                     ReadCheckpointHeaders(model_dir));
    std::vector<StoredTensor> stored;
    for (const SafetensorsHeader& h : headers.headers)
      for (const TensorInfo& info : h.tensors)
        stored.push_back(
            StoredTensor{info.name, info.dtype, info.shape, h.path, -1});
    const std::string source = headers.index_path.empty()
                                   ? model_dir + "/model.safetensors"
                                   : headers.index_path;
    ASSIGN_OR_RETURN(WeightTable t,
                     Match(config, decl, &stored, fallback, source));
    t.source = WeightSource::kHeaders;
    if (index) t.index_total_size = index->total_size;
    return t;
  }
  if (index) {
    std::set<std::string> names;
    for (const auto& [name, shard] : index->weight_map) names.insert(name);
    ASSIGN_OR_RETURN(WeightTable t, WeightTableFromNames(config, decl, &names,
                                                         fallback, index_path));
    t.index_total_size = index->total_size;
    // FP8 block scales are BF16 in some checkpoints and F32 in others, and
    // config.json does not say which: the index's total_size decides when
    // exactly one choice reproduces it.
    if (t.index_total_size && t.total_bytes() != *t.index_total_size &&
        config.quant.format.kind == FormatKind::kFp8Block) {
      for (DType scale : {DType::kBF16, DType::kF16}) {
        ModelConfig alt = config;
        alt.quant.format.scale_dtype = scale;
        ASSIGN_OR_RETURN(
            WeightTable a,
            WeightTableFromNames(alt, decl, &names, fallback, index_path));
        if (a.total_bytes() != *t.index_total_size) continue;
        a.index_total_size = t.index_total_size;
        return a;
      }
    }
    return t;
  }
  return WeightTableFromNames(config, decl, nullptr, fallback,
                              model_dir + "/config.json");
}

}  // namespace loom
