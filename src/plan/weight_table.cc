#include "src/plan/weight_table.h"

#include <filesystem>
#include <map>

#include "src/io/safetensors.h"

namespace loom {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What the checkpoint holds for one tensor (dtype/shape unknown for an index).
struct Stored {
  std::string name;
  std::optional<DType> dtype;
  std::optional<Shape> shape;
};

using StoredMap = std::map<std::string, Stored>;

// The checkpoint entry for a declared name: exact, or without an optional
// prefix (GPT-2's "transformer.").
const Stored* FindStored(const StoredMap& stored, const ArchWeights& decl,
                         const std::string& name) {
  if (auto it = stored.find(name); it != stored.end()) return &it->second;
  for (const std::string& p : decl.optional_prefixes) {
    if (name.rfind(p, 0) != 0) continue;
    if (auto it = stored.find(name.substr(p.size())); it != stored.end())
      return &it->second;
  }
  return nullptr;
}

bool IsPre(WeightRole r) {
  return r == WeightRole::kEmbed || r == WeightRole::kPosEmbed;
}

// Matches the declaration against `stored` (nullptr: every required tensor is
// assumed present) and sums bytes.
StatusOr<WeightTable> Match(const ModelConfig& c, const ArchWeights& decl,
                            const StoredMap* stored, DType fallback,
                            const std::string& source) {
  WeightTable t;
  t.source_path = source;
  t.layer_bytes.assign(c.num_layers, 0);
  std::set<std::string> consumed;
  for (const WeightSpec& spec : decl.specs) {
    const Stored* s = nullptr;
    Stored assumed{spec.name, std::nullopt, std::nullopt};
    if (stored) {
      s = FindStored(*stored, decl, spec.name);
      if (s == nullptr && !spec.tied_to.empty() &&
          FindStored(*stored, decl, spec.tied_to) != nullptr) {
        t.tied_head = true;  // counted once, with the tensor it is tied to
        continue;
      }
      if (s == nullptr) {
        if (!spec.required) continue;
        return NotFoundError("tensor " + spec.name + ": missing from " +
                             source + " (" + c.model_type +
                             " declares it with shape " +
                             spec.shape.ToString() + ")");
      }
      consumed.insert(s->name);
    } else {
      if (!spec.tied_to.empty()) {
        t.tied_head = true;
        continue;
      }
      if (!spec.required) continue;
      s = &assumed;
    }
    if (s->shape && *s->shape != spec.shape)
      return InvalidArgumentError("tensor " + s->name + " in " + source +
                                  ": shape " + s->shape->ToString() +
                                  " in file, expected " +
                                  spec.shape.ToString() + " from config.json");
    if (s->dtype && spec.storage_dtype && *s->dtype != *spec.storage_dtype)
      return InvalidArgumentError(
          "tensor " + s->name + " in " + source + ": dtype " +
          std::string(DTypeName(*s->dtype)) + ", expected " +
          std::string(DTypeName(*spec.storage_dtype)) +
          " (fixed by the format)");
    PlannedTensor p;
    p.name = s->name;
    p.role = spec.role;
    p.layer = spec.layer;
    p.shape = spec.shape;
    p.dtype = s->dtype ? *s->dtype : spec.storage_dtype.value_or(fallback);
    p.bytes = p.shape.numel() * DTypeSize(p.dtype);
    if (p.layer >= 0) {
      LOOM_CHECK(p.layer < c.num_layers)
          << "tensor " << p.name << " declared for layer " << p.layer;
      t.layer_bytes[p.layer] += p.bytes;
    } else if (IsPre(p.role)) {
      t.pre_bytes += p.bytes;
    } else {
      t.post_bytes += p.bytes;
    }
    if (p.role == WeightRole::kEmbed) t.embed_bytes = p.bytes;
    t.tensors.push_back(std::move(p));
  }
  if (stored) {
    for (const auto& [name, s] : *stored) {
      if (consumed.count(name)) continue;
      bool ignored = false;
      for (const auto& suffix : decl.ignored_suffixes)
        ignored |= EndsWith(name, suffix);
      if (ignored) continue;
      return InvalidArgumentError("tensor " + name + " in " + source +
                                  " is not used by " + c.model_type +
                                  " with this config.json (unexpected tensor: "
                                  "wrong model_type or config?)");
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
  StoredMap stored;
  for (const std::string& n : *names)
    stored[n] = Stored{n, std::nullopt, std::nullopt};
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
    StoredMap stored;
    for (const SafetensorsHeader& h : headers.headers)
      for (const TensorInfo& info : h.tensors)
        stored[info.name] = Stored{info.name, info.dtype, info.shape};
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
    return t;
  }
  return WeightTableFromNames(config, decl, nullptr, fallback,
                              model_dir + "/config.json");
}

}  // namespace loom
