#include "src/model/interventions.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "src/base/float16.h"
#include "src/base/read_file.h"
#include "src/base/spelling.h"
#include "src/core/json_error.h"
#include "src/core/json_int.h"
#include "src/core/tensor.h"
#include "src/io/gguf.h"
#include "src/io/npy.h"
#include "src/io/safetensors.h"
#include "src/model/sae.h"

namespace loom {
namespace {

using Json = nlohmann::json;

// How far a project_out direction's norm may be from 1.
constexpr double kUnitTolerance = 1e-3;

constexpr std::pair<InterventionMode, std::string_view> kModes[] = {
    {InterventionMode::kAdd, "add"},
    {InterventionMode::kProjectOut, "project_out"},
    {InterventionMode::kZero, "zero"},
    {InterventionMode::kReplace, "replace"},
    {InterventionMode::kZeroHead, "zero_head"},
    {InterventionMode::kPatch, "patch"},
    {InterventionMode::kPatchHead, "patch_head"},
    {InterventionMode::kFeatureAdd, "feature_add"},
    {InterventionMode::kFeatureClamp, "feature_clamp"},
    {InterventionMode::kFeatureAblate, "feature_ablate"},
    {InterventionMode::kSaeReconstruct, "sae_reconstruct"},
};

bool NeedsVector(InterventionMode m) {
  return m != InterventionMode::kZero && m != InterventionMode::kZeroHead &&
         !IsSaeEditMode(m);
}
bool IsPatch(InterventionMode m) {
  return m == InterventionMode::kPatch || m == InterventionMode::kPatchHead;
}
bool IsHeadMode(InterventionMode m) {
  return m == InterventionMode::kZeroHead || m == InterventionMode::kPatchHead;
}

// One entry of the list, with "interventions[i]" for its errors, or the
// command-line flag it was written from ("--steer HOOK=v.npy*4 (scale)").
struct Entry {
  const Json& json;
  std::string name;
  bool from_flag = false;
  const Json* Find(const char* key) const {
    auto it = json.find(key);
    return it == json.end() || it->is_null() ? nullptr : &*it;
  }
  std::string Field(const char* key) const {
    return from_flag ? name + " (" + key + ")" : name + "." + key;
  }
  Status Error(const char* key, const std::string& what) const {
    return InvalidArgumentError(Field(key) + ": " + what);
  }
};

// The fields an entry may have. The goldens' spec.json annotations (what HF
// module was hooked, the formula, ...) are read and passed over, and so are
// notes; any other field is an error (a misspelt "scal" would otherwise run
// with the default scale).
constexpr std::string_view kFields[] = {
    "hook",      "mode",           "scale", "norm_match", "vector_file",
    "tensor",    "vector",         "sae",   "feature",    "head",
    "positions", "positions_rule", "rows",  "apply_to",   "value"};
// The command-line flag an entry was written from (ShorthandInterventions):
// read, never suggested.
constexpr std::string_view kFlagField = "flag";
constexpr std::string_view kAnnotations[] = {
    "note",    "comment",    "description",    "hf_module",
    "formula", "vector_key", "vector_is_unit", "mean_vector_source"};

Status CheckFieldNames(const Entry& e) {
  const std::vector<std::string_view> fields(std::begin(kFields),
                                             std::end(kFields));
  for (const auto& [key, value] : e.json.items()) {
    if (key == kFlagField ||
        std::find(fields.begin(), fields.end(), key) != fields.end() ||
        std::find(std::begin(kAnnotations), std::end(kAnnotations), key) !=
            std::end(kAnnotations))
      continue;
    const std::string_view near =
        Nearest(key, fields, MisspellingDistance(key));
    std::string list;
    for (std::string_view f : fields)
      list += (list.empty() ? "" : ", ") + std::string(f);
    return InvalidArgumentError(
        e.name + ": unknown field \"" + key + "\"" +
        (near.empty() ? "" : " (did you mean \"" + std::string(near) + "\"?)") +
        "; the fields: " + list);
  }
  return Status();
}

StatusOr<InterventionMode> ParseMode(const Entry& e) {
  const Json* m = e.Find("mode");
  if (m == nullptr) return e.Error("mode", "missing");
  std::string names;
  for (const auto& [mode, name] : kModes) {
    if (m->is_string() && m->get<std::string>() == name) return mode;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return e.Error("mode", m->dump() + " is not one of " + names);
}

// `fallback`: the hook when the entry names none (an SAE feature's: the hook
// its decoder writes), "" for none.
StatusOr<std::vector<HookPoint>> ParseHooks(const Entry& e,
                                            const ModelConfig& config,
                                            const std::string& fallback) {
  const Json* h = e.Find("hook");
  if ((h == nullptr && fallback.empty()) || (h != nullptr && !h->is_string()))
    return e.Error("hook",
                   h == nullptr ? "missing" : h->dump() + " is not a string");
  const std::string name = h != nullptr ? h->get<std::string>() : fallback;
  StatusOr<std::vector<HookPoint>> hooks =
      ParseModelHookPattern(name, config, IsInterventionSite);
  if (!hooks.ok()) return e.Error("hook", hooks.status().message());
  for (const HookPoint& hook : *hooks) {
    if (Status s = CheckHookExists(hook, config); !s.ok())
      return e.Error("hook", s.message());
    if (!IsInterventionSite(hook.site))
      return e.Error("hook", "'" + HookName(hook) +
                                 "' cannot be edited; the hooks of this " +
                                 config.model_type + " model that can: " +
                                 ModelSiteList(config, IsInterventionSite));
  }
  return *std::move(hooks);
}

StatusOr<float> ParseScale(const Entry& e, InterventionMode mode) {
  // An explicit null is no default: it is what a NaN or an infinity becomes
  // in JSON (Python's float('nan') through json.dumps included).
  if (const auto it = e.json.find("scale"); it != e.json.end() && it->is_null())
    return e.Error("scale",
                   "null is not a number (a NaN or infinity written as "
                   "JSON null?); give a finite number or leave scale out");
  const Json* s = e.Find("scale");
  if (s == nullptr) return 1.0f;
  if (mode != InterventionMode::kAdd)
    return e.Error("scale", "applies to mode \"add\" only, not \"" +
                                std::string(InterventionModeName(mode)) + "\"");
  if (!s->is_number()) return e.Error("scale", s->dump() + " is not a number");
  const double d = s->get<double>();
  if (!std::isfinite(static_cast<float>(d)))
    return e.Error("scale", s->dump() + " is not a finite f32 value");
  return static_cast<float>(d);
}

StatusOr<bool> ParseNormMatch(const Entry& e, InterventionMode mode) {
  const Json* n = e.Find("norm_match");
  if (n == nullptr) return false;
  if (!n->is_boolean())
    return e.Error("norm_match", n->dump() + " is not true or false");
  if (n->get<bool>() && mode != InterventionMode::kAdd)
    return e.Error("norm_match", "applies to mode \"add\" only, not \"" +
                                     std::string(InterventionModeName(mode)) +
                                     "\"");
  return n->get<bool>();
}

// {"span": [a, b]}: b exclusive, null for the end; negatives from the end.
StatusOr<InterventionPositions> ParseSpan(const Entry& e, const Json& p) {
  InterventionPositions out;
  out.kind = InterventionPositions::Kind::kSpan;
  auto it = p.find("span");
  if (p.size() != 1 || it == p.end() || !it->is_array() || it->size() != 2)
    return e.Error("positions", p.dump() +
                                    " is not {\"span\": [begin, end]} (end "
                                    "exclusive, null for the sequence's end)");
  const std::optional<int64_t> a = JsonInt64((*it)[0]);
  const std::optional<int64_t> b =
      (*it)[1].is_null() ? std::optional<int64_t>(0) : JsonInt64((*it)[1]);
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (!a || !b || *a < -kLimit || *a >= kLimit || *b < -kLimit || *b >= kLimit)
    return e.Error("positions", "span " + it->dump() +
                                    " is not two 32-bit integer positions");
  out.span_begin = *a;
  out.span_end = *b;
  out.span_to_end = (*it)[1].is_null();
  if (!out.span_to_end && (*a >= 0) == (*b >= 0) && *b <= *a)
    return e.Error("positions",
                   "span " + it->dump() + " is empty (the end is exclusive)");
  return out;
}

StatusOr<std::vector<int64_t>> ParsePositionList(const Entry& e,
                                                 const Json& list) {
  if (list.empty())
    return e.Error("positions", "empty list (use \"all\" for every position)");
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::optional<int64_t> p = JsonInt64(list[i]);
    if (!p || *p < -(int64_t{1} << 31) || *p >= (int64_t{1} << 31))
      return e.Error("positions", "entry " + std::to_string(i) + " (" +
                                      list[i].dump() +
                                      ") is not a 32-bit integer position");
    if (!seen.insert(*p).second)
      return e.Error("positions",
                     "position " + std::to_string(*p) + " is listed twice");
    out.push_back(*p);
  }
  return out;
}

// "all" | "last" | [p, ...]. The goldens' `positions_rule` (all / last /
// explicit), when given, says which: their `positions` list is then just the
// expansion for their own prompt. Their batch case's "all valid positions of
// row N" means "all" (padding is not a token here).
StatusOr<InterventionPositions> ParsePositions(const Entry& e) {
  using Kind = InterventionPositions::Kind;
  InterventionPositions out;
  const Json* p = e.Find("positions");
  if (const Json* rule = e.Find("positions_rule")) {
    const std::string r = rule->is_string() ? rule->get<std::string>() : "";
    if (r == "all" || r == "last") {
      out.kind = r == "all" ? Kind::kAll : Kind::kLast;
      return out;
    }
    if (r != "explicit")
      return e.Error("positions_rule",
                     rule->dump() + " is not one of all, last, explicit");
    if (p == nullptr || !p->is_array())
      return e.Error("positions",
                     "positions_rule \"explicit\" needs a list of positions");
  }
  if (p == nullptr) return out;  // all
  if (p->is_string()) {
    const std::string s = p->get<std::string>();
    if (s == "all" || s.rfind("all valid positions", 0) == 0) return out;
    if (s == "last") {
      out.kind = Kind::kLast;
      return out;
    }
  } else if (p->is_array()) {
    out.kind = Kind::kList;
    ASSIGN_OR_RETURN(out.list, ParsePositionList(e, *p));
    return out;
  } else if (p->is_object()) {
    return ParseSpan(e, *p);
  }
  return e.Error("positions", p->dump() +
                                  " is not \"all\", \"last\", a list of "
                                  "token positions or {\"span\": [a, b]}");
}

// The values of a vector file and their shape (outermost first).
struct VectorData {
  std::vector<float> values;
  std::vector<int64_t> shape;
};

StatusOr<VectorData> ReadNpyVector(const std::string& path) {
  ASSIGN_OR_RETURN(NpyArray a, ReadNpy(path));
  const NpyHeader& h = a.header;
  if (h.dtype != DType::kF32 && h.dtype != DType::kF64)
    return InvalidArgumentError("'" + path + "' holds " + h.descr +
                                " values; expected float32 ('<f4') or "
                                "float64 ('<f8', converted)");
  if (h.fortran_order)
    return InvalidArgumentError("'" + path + "' is in Fortran order");
  VectorData out{std::vector<float>(static_cast<size_t>(h.numel())), h.shape};
  if (h.dtype == DType::kF32) {
    std::memcpy(out.values.data(), a.data.data(),
                out.values.size() * sizeof(float));
    return out;
  }
  // float64 (numpy's default): rounded to f32, as the Python module does; a
  // finite value beyond f32's range is refused rather than made infinite.
  for (size_t i = 0; i < out.values.size(); ++i) {
    double d;
    std::memcpy(&d, a.data.data() + i * sizeof(double), sizeof(double));
    if (std::isfinite(d) && std::abs(d) > std::numeric_limits<float>::max())
      return InvalidArgumentError("'" + path + "': value " + std::to_string(i) +
                                  " (" + std::to_string(d) +
                                  ") is beyond the float32 range");
    out.values[i] = static_cast<float>(d);
  }
  return out;
}

// The tensor `name` of a file holding `names`, or its only tensor.
StatusOr<std::string> PickTensor(const std::string& path,
                                 const std::vector<std::string>& names,
                                 const std::string& name) {
  if (!name.empty()) {
    if (std::find(names.begin(), names.end(), name) != names.end()) return name;
    return NotFoundError("'" + path + "' has no tensor '" + name +
                         "' (it has " + std::to_string(names.size()) + ")");
  }
  if (names.size() == 1) return names[0];
  std::string list;
  for (size_t i = 0; i < names.size() && i < 5; ++i)
    list += (i ? ", " : "") + names[i];
  return InvalidArgumentError(
      "'" + path + "' holds " + std::to_string(names.size()) +
      " tensors; name one with `tensor` (FILE#TENSOR on the command line): " +
      list + (names.size() > 5 ? ", ..." : ""));
}

StatusOr<VectorData> ReadSafetensorsVector(const std::string& path,
                                           const std::string& tensor) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                   SafetensorsFile::Open(path));
  std::vector<std::string> names;
  for (const TensorInfo& t : f->header().tensors) names.push_back(t.name);
  ASSIGN_OR_RETURN(const std::string name, PickTensor(path, names, tensor));
  const TensorView v = f->View(*f->Find(name));
  VectorData out{std::vector<float>(static_cast<size_t>(v.numel())),
                 v.shape.dims()};
  const auto* bytes = static_cast<const uint8_t*>(v.data);
  for (size_t i = 0; i < out.values.size(); ++i) {
    uint32_t f32 = 0;
    uint16_t half = 0;
    switch (v.dtype) {
      case DType::kF32:
        std::memcpy(&f32, bytes + 4 * i, 4);  // views may be unaligned
        std::memcpy(&out.values[i], &f32, 4);
        break;
      case DType::kF16:
      case DType::kBF16:
        std::memcpy(&half, bytes + 2 * i, 2);
        out.values[i] =
            v.dtype == DType::kF16 ? F16ToF32(half) : Bf16ToF32(half);
        break;
      default:
        return InvalidArgumentError("'" + path + "' tensor '" + name + "' is " +
                                    std::string(DTypeName(v.dtype)) +
                                    "; expected F32, F16 or BF16");
    }
  }
  return out;
}

StatusOr<VectorData> ReadGgufVector(const std::string& path,
                                    const std::string& tensor) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
  std::vector<std::string> names;
  for (const GgufTensorInfo& t : f->header().tensors) names.push_back(t.name);
  ASSIGN_OR_RETURN(const std::string name, PickTensor(path, names, tensor));
  const GgufTensorInfo& info = *f->header().Find(name);
  VectorData out;
  ASSIGN_OR_RETURN(out.values, f->ReadF32(info));
  out.shape.assign(info.dims.rbegin(), info.dims.rend());  // outermost first
  return out;
}

// A vector file: .npy (f32), .safetensors or GGUF, told apart by its first
// bytes (GGUF: "GGUF"; .npy: "\x93NUMPY"; otherwise safetensors).
StatusOr<VectorData> ReadVectorFile(const Entry& e, const std::string& path,
                                    const std::string& tensor) {
  char magic[6] = {};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      return NotFoundError(e.Field("vector_file") + ": '" + path +
                           "' cannot be opened");
    in.read(magic, sizeof(magic));
  }
  if (std::memcmp(magic, "\x93NUMPY", 6) == 0 && !tensor.empty())
    return e.Error("tensor", "'" + path + "' is a .npy file (one array)");
  StatusOr<VectorData> data = std::memcmp(magic, "\x93NUMPY", 6) == 0
                                  ? ReadNpyVector(path)
                              : std::memcmp(magic, "GGUF", 4) == 0
                                  ? ReadGgufVector(path, tensor)
                                  : ReadSafetensorsVector(path, tensor);
  if (!data.ok())
    return Status(data.status().code(),
                  e.Field("vector_file") + ": " + data.status().message());
  return data;
}

// The entry's inline `vector`: numbers, or (patch modes) a list of rows.
StatusOr<VectorData> ParseInlineVector(const Entry& e, const Json& v) {
  if (!v.is_array()) return e.Error("vector", "is not a list of numbers");
  VectorData out;
  const bool rows = !v.empty() && v[0].is_array();
  for (const Json& x : v) {
    if (rows != x.is_array() || (rows && x.size() != v[0].size()))
      return e.Error("vector",
                     "mixes numbers and lists, or rows of "
                     "different lengths");
    for (const Json& y : rows ? x : Json::array({x})) {
      if (!y.is_number())
        return e.Error("vector", y.dump() + " is not a number");
      out.values.push_back(static_cast<float>(y.get<double>()));
    }
  }
  out.shape = rows ? std::vector<int64_t>{static_cast<int64_t>(v.size()),
                                          static_cast<int64_t>(v[0].size())}
                   : std::vector<int64_t>{static_cast<int64_t>(v.size())};
  return out;
}

// An SAE feature's decoder direction (`sae` + `feature`): row `feature` of
// The SAE entry `e`'s `sae` names (a path, relative to `base_dir`), loaded;
// *path is where it was read. Errors name the entry's field.
StatusOr<Sae> EntrySae(const Entry& e, const Json& sae,
                       const std::string& base_dir, std::string* path) {
  if (!sae.is_string() || sae.get<std::string>().empty())
    return e.Error("sae", sae.dump() + " is not an SAE's path");
  *path = sae.get<std::string>();
  if ((*path)[0] != '/' && !base_dir.empty())
    *path = (std::filesystem::path(base_dir) / *path).string();
  StatusOr<Sae> loaded = LoadSae(*path);
  if (!loaded.ok())
    return e.Error("sae", std::string(loaded.status().message()));
  return loaded;
}

// the SAE's W_dec, and the hook that row lives at (the SAE's hook; a
// transcoder's: the hook it estimates).
struct SaeDirection {
  std::string hook;
  std::vector<float> row;
};

StatusOr<std::optional<SaeDirection>> ParseSaeFeature(
    const Entry& e, const std::string& base_dir) {
  const Json* sae = e.Find("sae");
  const Json* feature = e.Find("feature");
  if (sae == nullptr && feature == nullptr) return std::nullopt;
  if (sae == nullptr) return e.Error("feature", "needs an sae");
  if (feature == nullptr)
    return e.Error("sae", "needs a feature (the decoder row to use)");
  if (e.Find("vector_file") != nullptr || e.Find("vector") != nullptr)
    return e.Error("sae", "give sae + feature or a vector, not both");
  std::string path;
  ASSIGN_OR_RETURN(Sae loaded, EntrySae(e, *sae, base_dir, &path));
  const std::optional<int64_t> f = JsonInt64(*feature);
  if (!f || *f < 0 || *f >= loaded.d_sae)
    return e.Error("feature", feature->dump() + " is not a feature of " + path +
                                  " (0 .. " + std::to_string(loaded.d_sae - 1) +
                                  ")");
  const int64_t d = loaded.d_out;
  SaeDirection dir;
  dir.hook = IsTranscoder(loaded.architecture) ? loaded.hook_out : loaded.hook;
  dir.row.assign(loaded.w_dec.begin() + *f * d,
                 loaded.w_dec.begin() + (*f + 1) * d);
  return dir;
}

// The vector of the entry (`vector_file`, or an inline `vector` list): one
// row of the hook's width, or a patch's `rows` rows; finite values, and
// (project_out) of norm 1.
StatusOr<std::vector<float>> ParseVector(
    const Entry& e, InterventionMode mode, const HookPoint& hook, int64_t rows,
    const ModelConfig& config, const std::string& base_dir,
    const std::optional<SaeDirection>& sae) {
  const Json* file = e.Find("vector_file");
  const Json* inline_v = e.Find("vector");
  const Json* tensor = e.Find("tensor");
  if (!NeedsVector(mode) || (sae && IsPatch(mode))) {
    if (file != nullptr || inline_v != nullptr || sae)
      return e.Error(sae    ? "sae"
                     : file ? "vector_file"
                            : "vector",
                     "mode \"" + std::string(InterventionModeName(mode)) +
                         "\" takes no " + (sae ? "SAE feature" : "vector"));
    return std::vector<float>();
  }
  if (file != nullptr && inline_v != nullptr)
    return e.Error("vector", "give vector or vector_file, not both");
  if (tensor != nullptr && (file == nullptr || !tensor->is_string()))
    return e.Error("tensor", file == nullptr
                                 ? "needs a vector_file"
                                 : tensor->dump() + " is not a tensor name");
  VectorData v;
  const char* field = sae ? "sae" : file != nullptr ? "vector_file" : "vector";
  if (sae) {
    v.values = sae->row;
    v.shape = {static_cast<int64_t>(sae->row.size())};
  } else if (file != nullptr) {
    if (!file->is_string() || file->get<std::string>().empty())
      return e.Error("vector_file", file->dump() + " is not a file name");
    std::string path = file->get<std::string>();
    if (path[0] != '/' && !base_dir.empty())
      path = (std::filesystem::path(base_dir) / path).string();
    ASSIGN_OR_RETURN(
        v, ReadVectorFile(e, path, tensor ? tensor->get<std::string>() : ""));
  } else if (inline_v != nullptr) {
    ASSIGN_OR_RETURN(v, ParseInlineVector(e, *inline_v));
  } else {
    return e.Error("vector_file",
                   "missing: mode \"" +
                       std::string(InterventionModeName(mode)) +
                       "\" needs a vector (vector_file or vector)");
  }
  ASSIGN_OR_RETURN(const int64_t width, HookWidth(hook, config));
  // Shape [width] or [1, width]; a patch's [rows, width] (or flat).
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < v.shape.size(); ++d) outer *= v.shape[d];
  const bool flat_rows = v.shape.size() == 1 &&
                         static_cast<int64_t>(v.values.size()) == rows * width;
  if (rows == 1 && !v.shape.empty() && v.shape.back() != width)
    return e.Error(field, "has " + std::to_string(v.values.size()) +
                              " values but " + HookName(hook) + " is " +
                              std::to_string(width) + " wide");
  if (!flat_rows &&
      (v.shape.empty() || v.shape.back() != width || outer != rows))
    return e.Error(field, "has shape " + Shape(v.shape).ToString() + " but " +
                              HookName(hook) + " needs " +
                              (rows == 1 ? "[" + std::to_string(width) + "]"
                                         : Shape({rows, width}).ToString()) +
                              (IsPatch(mode) ? " (one row per position)" : ""));
  double norm2 = 0;
  for (size_t i = 0; i < v.values.size(); ++i) {
    const float x = v.values[i];
    if (!std::isfinite(x))
      return e.Error(field, "value " + std::to_string(i) + " of " +
                                std::to_string(v.values.size()) + " is " +
                                (std::isnan(x) ? "nan" : "infinite") +
                                " (as f32)");
    norm2 += double{x} * x;
  }
  if (mode == InterventionMode::kProjectOut &&
      std::abs(std::sqrt(norm2) - 1.0) > kUnitTolerance)
    return e.Error(field, "project_out needs a unit vector; its norm is " +
                              std::to_string(std::sqrt(norm2)));
  return std::move(v.values);
}

StatusOr<int64_t> ParseHead(const Entry& e, InterventionMode mode,
                            const std::vector<HookPoint>& hooks,
                            const ModelConfig& config) {
  const Json* h = e.Find("head");
  const std::string m(InterventionModeName(mode));
  if (!IsHeadMode(mode)) {
    if (h != nullptr)
      return e.Error("head", "applies to modes zero_head and patch_head only");
    return int64_t{-1};
  }
  for (const HookPoint& hook : hooks)
    if (hook.site != HookSite::kZ)
      return e.Error("hook", "mode \"" + m + "\" needs attn.hook_z, not '" +
                                 HookName(hook) + "'");
  if (h == nullptr) return e.Error("head", "missing (" + m + " needs it)");
  const std::optional<int64_t> head = JsonInt64(*h);
  if (!head) return e.Error("head", h->dump() + " is not an integer");
  if (*head < 0 || *head >= config.num_heads)
    return e.Error("head", std::to_string(*head) + " is outside [0, " +
                               std::to_string(config.num_heads) + ")");
  return *head;
}

StatusOr<std::vector<int64_t>> ParseRows(const Entry& e) {
  const Json* r = e.Find("rows");
  if (r == nullptr) return std::vector<int64_t>();
  if (!r->is_array() || r->empty())
    return e.Error("rows", r->dump() +
                               " is not a non-empty list of input rows (leave "
                               "it out for every row)");
  std::vector<int64_t> rows;
  for (const Json& x : *r) {
    const std::optional<int64_t> row = JsonInt64(x);
    if (!row || *row < 0)
      return e.Error("rows", x.dump() + " is not a row index (>= 0)");
    rows.push_back(*row);
  }
  std::sort(rows.begin(), rows.end());
  if (auto d = std::adjacent_find(rows.begin(), rows.end()); d != rows.end())
    return e.Error("rows", "row " + std::to_string(*d) + " is listed twice");
  return rows;
}

StatusOr<InterventionApplyTo> ParseApplyTo(
    const Entry& e, InterventionMode mode,
    const InterventionPositions& positions) {
  const Json* a = e.Find("apply_to");
  if (a == nullptr)
    return positions.kind == InterventionPositions::Kind::kAll && !IsPatch(mode)
               ? InterventionApplyTo::kBoth
               : InterventionApplyTo::kPrompt;
  const std::string s = a->is_string() ? a->get<std::string>() : "";
  if (s == "prompt") return InterventionApplyTo::kPrompt;
  if (IsPatch(mode) && (s == "generated" || s == "both"))
    return e.Error("apply_to",
                   "a patch edits prompt positions only, not " + a->dump());
  if (s == "generated") return InterventionApplyTo::kGenerated;
  if (s == "both") return InterventionApplyTo::kBoth;
  return e.Error("apply_to",
                 a->dump() + " is not one of prompt, generated, both");
}

// The interventions of one entry (one per hook its pattern names).
// The SAE of a feature edit or a reconstruction (`sae`, `feature`, `value`).
StatusOr<std::shared_ptr<SaeEdit>> ParseSaeEdit(const Entry& e,
                                                InterventionMode mode,
                                                const std::string& base_dir) {
  const std::string m(InterventionModeName(mode));
  const Json* sae = e.Find("sae");
  const Json* feature = e.Find("feature");
  const Json* value = e.Find("value");
  if (sae == nullptr) return e.Error("sae", "missing (" + m + " needs it)");
  std::string path;
  ASSIGN_OR_RETURN(Sae loaded, EntrySae(e, *sae, base_dir, &path));
  if (IsTranscoder(loaded.architecture))
    return e.Error("sae", path + " is a transcoder (it reads " + loaded.hook +
                              " and writes " + loaded.hook_out + "); " + m +
                              " splices an SAE at the hook it reads");
  auto edit = std::make_shared<SaeEdit>();
  const bool needs_feature = mode != InterventionMode::kSaeReconstruct;
  const bool needs_value = mode == InterventionMode::kFeatureAdd ||
                           mode == InterventionMode::kFeatureClamp;
  if (feature != nullptr && !needs_feature)
    return e.Error("feature", "mode \"" + m + "\" takes no feature");
  if (value != nullptr && !needs_value)
    return e.Error("value", "mode \"" + m + "\" takes no value");
  if (needs_feature) {
    if (feature == nullptr)
      return e.Error("feature", "missing (" + m + " needs it)");
    const std::optional<int64_t> f = JsonInt64(*feature);
    if (!f || *f < 0 || *f >= loaded.d_sae)
      return e.Error("feature", feature->dump() + " is not a feature of " +
                                    path + " (0 .. " +
                                    std::to_string(loaded.d_sae - 1) + ")");
    edit->feature = *f;
  }
  if (needs_value) {
    if (value == nullptr)
      return e.Error("value", "missing (" + m + " needs it)");
    if (!value->is_number() ||
        !std::isfinite(static_cast<float>(value->get<double>())))
      return e.Error("value", value->dump() + " is not a finite f32 value");
    edit->value = static_cast<float>(value->get<double>());
  }
  edit->sae = std::make_shared<const Sae>(std::move(loaded));
  return edit;
}

Status ParseEntry(const Entry& e, const ModelConfig& config,
                  const std::string& base_dir, std::vector<Intervention>* out) {
  if (!e.json.is_object())
    return InvalidArgumentError(e.name + ": " + e.json.dump() +
                                " is not an object");
  RETURN_IF_ERROR(CheckFieldNames(e));
  ASSIGN_OR_RETURN(const InterventionMode mode, ParseMode(e));
  std::optional<SaeDirection> sae;
  std::shared_ptr<SaeEdit> edit;
  if (IsSaeEditMode(mode)) {
    ASSIGN_OR_RETURN(edit, ParseSaeEdit(e, mode, base_dir));
  } else {
    ASSIGN_OR_RETURN(sae, ParseSaeFeature(e, base_dir));
  }
  ASSIGN_OR_RETURN(const std::vector<HookPoint> hooks,
                   ParseHooks(e, config,
                              edit  ? edit->sae->hook
                              : sae ? sae->hook
                                    : std::string()));
  if (edit) {
    for (const HookPoint& h : hooks) {
      if (HookName(h) != edit->sae->hook)
        return e.Error("hook", "'" + HookName(h) + "', but " + edit->sae->path +
                                   " reads " + edit->sae->hook);
      ASSIGN_OR_RETURN(const int64_t width, HookWidth(h, config));
      if (width != edit->sae->d_in)
        return e.Error("sae", edit->sae->path + " has d_in " +
                                  std::to_string(edit->sae->d_in) + ", " +
                                  HookName(h) + " is " + std::to_string(width) +
                                  " wide");
    }
  }
  Intervention iv;
  iv.mode = mode;
  iv.sae_edit = edit;
  ASSIGN_OR_RETURN(iv.scale, ParseScale(e, mode));
  ASSIGN_OR_RETURN(iv.norm_match, ParseNormMatch(e, mode));
  ASSIGN_OR_RETURN(iv.positions, ParsePositions(e));
  ASSIGN_OR_RETURN(iv.head, ParseHead(e, mode, hooks, config));
  ASSIGN_OR_RETURN(iv.rows, ParseRows(e));
  ASSIGN_OR_RETURN(iv.apply_to, ParseApplyTo(e, mode, iv.positions));
  int64_t rows = 1;
  if (IsPatch(mode)) {
    StatusOr<int64_t> n = PatchRowCount(iv.positions);
    if (!n.ok()) return e.Error("positions", n.status().message());
    rows = *n;
  }
  for (const HookPoint& hook : hooks) {
    iv.hook = hook;
    // Every hook of a pattern has the same site, hence the same width.
    if (hook == hooks.front()) {
      ASSIGN_OR_RETURN(iv.vector,
                       ParseVector(e, mode, hook, rows, config, base_dir, sae));
    }
    out->push_back(iv);
  }
  return Status();
}

}  // namespace

std::string_view InterventionModeName(InterventionMode mode) {
  for (const auto& [m, name] : kModes)
    if (m == mode) return name;
  return "?";
}

bool IsInterventionSite(HookSite site) { return SiteInfo(site).editable; }

bool IsSaeEditMode(InterventionMode mode) {
  return mode == InterventionMode::kFeatureAdd ||
         mode == InterventionMode::kFeatureClamp ||
         mode == InterventionMode::kFeatureAblate ||
         mode == InterventionMode::kSaeReconstruct;
}

int64_t SaeEdit::bytes() const {
  const Sae& s = *sae;
  const int64_t weights = static_cast<int64_t>(
      s.w_enc.size() + s.b_enc.size() + s.w_mag.size() + s.b_gate.size() +
      s.threshold.size() + s.w_dec.size() + s.b_dec.size() + s.w_skip.size() +
      s.dec_norm.size());
  // The scratch: x, acts, out, norm_scale, coef, and the kernel's own
  // (its sae_in, hidden, gate, acts, recons: PrepareSaeEdits sizes it).
  const int64_t R = kSaeEditRows;
  const int64_t scratch = R * (2 * s.d_in + 4 * s.d_sae + 2 * s.d_out + 4) + 64;
  return 4 * (weights + scratch);
}

void PrepareSaeEdits(
    const std::vector<Intervention>& list,
    const std::function<int64_t(const Sae&, int64_t)>& workspace_bytes) {
  for (const Intervention& iv : list) {
    if (!iv.sae_edit || !iv.sae_edit->x.empty()) continue;
    SaeEdit& e = *iv.sae_edit;
    const Sae& s = *e.sae;
    const size_t R = kSaeEditRows;
    e.x.resize(R * static_cast<size_t>(s.d_in));
    e.acts.resize(R * static_cast<size_t>(s.d_sae));
    e.out.resize(R * static_cast<size_t>(s.d_out));
    e.norm_scale.resize(R);
    e.coef.resize(R);
    // 64-byte alignment inside: 16 floats of slack.
    e.workspace.resize(
        static_cast<size_t>(workspace_bytes(s, kSaeEditRows) / 4 + 16));
  }
}

StatusOr<std::vector<Intervention>> ParseInterventions(
    std::string_view json_text, const std::string& base_dir,
    const ModelConfig& config) {
  const Json doc = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return InvalidArgumentError("interventions: not valid JSON at " +
                                LocateJsonError(json_text).Where());
  if (!doc.is_object())
    return InvalidArgumentError("interventions: the top level is " +
                                std::string(doc.type_name()) +
                                ", expected an object with an "
                                "\"interventions\" list");
  auto list = doc.find("interventions");
  if (list == doc.end() || !list->is_array() || list->empty())
    return InvalidArgumentError(
        "interventions: expected a non-empty list under \"interventions\"");
  std::vector<Intervention> out;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const auto flag =
        entry.is_object() ? entry.find(std::string(kFlagField)) : entry.end();
    const bool from_flag = flag != entry.end() && flag->is_string();
    const Entry e{entry,
                  from_flag ? flag->get<std::string>()
                            : "interventions[" + std::to_string(i) + "]",
                  from_flag};
    RETURN_IF_ERROR(ParseEntry(e, config, base_dir, &out));
  }
  return out;
}

StatusOr<std::vector<Intervention>> ParseInterventionFile(
    const std::string& path, const ModelConfig& config) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash + (slash == 0));
  StatusOr<std::vector<Intervention>> parsed =
      ParseInterventions(text, dir, config);
  if (!parsed.ok())
    return Status(parsed.status().code(),
                  path + ": " + parsed.status().message());
  return parsed;
}

StatusOr<std::vector<Intervention>> LoadInterventions(
    const std::string& file, const std::string& json, const std::string& dir,
    const ModelConfig& config) {
  std::vector<Intervention> out;
  if (!file.empty()) {
    ASSIGN_OR_RETURN(out, ParseInterventionFile(file, config));
  }
  if (!json.empty()) {
    ASSIGN_OR_RETURN(std::vector<Intervention> more,
                     ParseInterventions(json, dir, config));
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

StatusOr<InterventionPositions> ParsePositionsText(std::string_view text) {
  InterventionPositions p;
  if (text == "all") return p;
  if (text == "last") {
    p.kind = InterventionPositions::Kind::kLast;
    return p;
  }
  if (const size_t colon = text.find(':'); colon != std::string_view::npos) {
    p.kind = InterventionPositions::Kind::kSpan;
    const std::string a(text.substr(0, colon)), z(text.substr(colon + 1));
    char* end_a = nullptr;
    char* end_z = nullptr;
    p.span_begin = a.empty() ? 0 : std::strtoll(a.c_str(), &end_a, 10);
    p.span_end = z.empty() ? 0 : std::strtoll(z.c_str(), &end_z, 10);
    p.span_to_end = z.empty();
    if ((!a.empty() && *end_a != '\0') || (!z.empty() && *end_z != '\0'))
      return InvalidArgumentError("span '" + std::string(text) +
                                  "' is not A:B (integers; either may be "
                                  "left out)");
    return p;
  }
  p.kind = InterventionPositions::Kind::kList;
  size_t b = 0;
  while (b <= text.size()) {
    const size_t e = std::min(text.find(',', b), text.size());
    const std::string item(text.substr(b, e - b));
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0')
      return InvalidArgumentError("position '" + item +
                                  "' is not an integer (all, last or a "
                                  "comma-separated list)");
    p.list.push_back(v);
    b = e + 1;
  }
  return p;
}

namespace {

// The file form of `p`: "all", "last", [..] or {"span": [a, b | null]}.
Json PositionsJson(const InterventionPositions& p) {
  switch (p.kind) {
    case InterventionPositions::Kind::kAll:
      return "all";
    case InterventionPositions::Kind::kLast:
      return "last";
    case InterventionPositions::Kind::kList:
      return p.list;
    case InterventionPositions::Kind::kSpan:
      return Json{
          {"span",
           {p.span_begin, p.span_to_end ? Json(nullptr) : Json(p.span_end)}}};
  }
  return "all";
}

// FILE or FILE#TENSOR into the entry's vector_file (and tensor).
void SetVectorFile(const std::string& spec, Json* e) {
  const size_t hash = spec.rfind('#');
  (*e)["vector_file"] = spec.substr(0, hash);
  if (hash != std::string::npos) (*e)["tensor"] = spec.substr(hash + 1);
}

}  // namespace

StatusOr<std::string> ShorthandInterventions(
    const std::vector<std::string>& steer,
    const std::vector<std::string>& ablate) {
  Json list = Json::array();
  for (const std::string& s : steer) {
    const std::string flag = "--steer " + s;
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      return InvalidArgumentError(flag +
                                  ": expected HOOK=VECTOR*SCALE[@POSITIONS]");
    std::string rest = s.substr(eq + 1);
    Json e{{"hook", s.substr(0, eq)}, {"mode", "add"}, {kFlagField, flag}};
    if (const size_t at = rest.rfind('@'); at != std::string::npos) {
      const std::string p = rest.substr(at + 1);
      rest.resize(at);
      StatusOr<InterventionPositions> pos = ParsePositionsText(p);
      if (!pos.ok()) return pos.status().WithContext(flag);
      e["positions"] = PositionsJson(*pos);
    }
    const size_t star = rest.rfind('*');
    if (star == std::string::npos)
      return InvalidArgumentError(
          flag + ": expected HOOK=VECTOR*SCALE[@POSITIONS] (no *SCALE)");
    const std::string scale = rest.substr(star + 1);
    char* end = nullptr;
    const double v = std::strtod(scale.c_str(), &end);
    if (scale.empty() || *end != '\0')
      return InvalidArgumentError(flag + ": scale '" + scale +
                                  "' is not a number");
    // A NaN or infinity would be written as JSON null, which reads as "no
    // scale": refused here, by the flag's name.
    if (!std::isfinite(static_cast<float>(v)))
      return InvalidArgumentError(flag + ": scale '" + scale +
                                  "' is not a finite f32 number");
    e["scale"] = v;
    SetVectorFile(rest.substr(0, star), &e);
    list.push_back(std::move(e));
  }
  for (const std::string& s : ablate) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      return InvalidArgumentError("--ablate-direction " + s +
                                  ": expected HOOK=DIRECTION");
    Json e{{"hook", s.substr(0, eq)},
           {"mode", "project_out"},
           {kFlagField, "--ablate-direction " + s}};
    SetVectorFile(s.substr(eq + 1), &e);
    list.push_back(std::move(e));
  }
  if (list.empty()) return std::string();
  return Json{{"interventions", list}}.dump();
}

std::string InterventionsSummary(const std::vector<Intervention>& list) {
  std::string out;
  for (const Intervention& iv : list) {
    if (!out.empty()) out += ", ";
    out += HookName(iv.hook) + " " + std::string(InterventionModeName(iv.mode));
    if (iv.mode == InterventionMode::kAdd && iv.scale != 1.0f) {
      char scale[32];
      std::snprintf(scale, sizeof(scale), " x%g", iv.scale);
      out += scale;
    }
    if (iv.head >= 0) out += " (head " + std::to_string(iv.head) + ")";
  }
  return out;
}

Json InterventionsJson(const std::vector<Intervention>& list) {
  Json out = Json::array();
  for (const Intervention& iv : list) {
    uint64_t h = 14695981039346656037ull;  // FNV-1a 64
    for (float f : iv.vector) {
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      for (int b = 0; b < 4; ++b) {
        h ^= (bits >> (8 * b)) & 0xff;
        h *= 1099511628211ull;
      }
    }
    char digest[17];
    std::snprintf(digest, sizeof(digest), "%016llx",
                  static_cast<unsigned long long>(h));
    Json e{{"hook", HookName(iv.hook)},
           {"mode", std::string(InterventionModeName(iv.mode))},
           {"positions", PositionsJson(iv.positions)}};
    if (iv.mode == InterventionMode::kAdd) e["scale"] = iv.scale;
    if (iv.norm_match) e["norm_match"] = true;
    if (iv.head >= 0) e["head"] = iv.head;
    if (!iv.rows.empty()) e["rows"] = iv.rows;
    e["apply_to"] = iv.apply_to == InterventionApplyTo::kPrompt ? "prompt"
                    : iv.apply_to == InterventionApplyTo::kGenerated
                        ? "generated"
                        : "both";
    if (!iv.vector.empty()) {
      e["vector_values"] = iv.vector.size();
      e["vector_fnv1a64"] = digest;
    }
    if (iv.sae_edit) {
      e["sae"] = iv.sae_edit->sae->path;
      if (iv.sae_edit->feature >= 0) e["feature"] = iv.sae_edit->feature;
      if (iv.mode == InterventionMode::kFeatureAdd ||
          iv.mode == InterventionMode::kFeatureClamp)
        e["value"] = iv.sae_edit->value;
    }
    out.push_back(std::move(e));
  }
  return out;
}

int64_t InterventionBytes(const std::vector<Intervention>& list) {
  int64_t bytes = 0;
  for (const Intervention& iv : list)
    bytes += static_cast<int64_t>(iv.vector.size() * sizeof(float));
  // An SAE shared by the copies of a pattern's entry counts once.
  std::vector<const SaeEdit*> seen;
  for (const Intervention& iv : list) {
    if (!iv.sae_edit ||
        std::find(seen.begin(), seen.end(), iv.sae_edit.get()) != seen.end())
      continue;
    seen.push_back(iv.sae_edit.get());
    bytes += iv.sae_edit->bytes();
  }
  return bytes;
}

Status CheckIntervention(const Intervention& iv, const ModelConfig& c,
                         const std::string& name, bool patch_rows_elsewhere) {
  if (!IsInterventionSite(iv.hook.site))
    return InvalidArgumentError(
        name + ": '" + HookName(iv.hook) +
        "' cannot be edited; the hooks of this " + c.model_type +
        " model that can: " + ModelSiteList(c, IsInterventionSite));
  RETURN_IF_ERROR(CheckHookExists(iv.hook, c).WithContext(name));
  ASSIGN_OR_RETURN(const int64_t width, HookWidth(iv.hook, c));
  int64_t want = 0;
  switch (iv.mode) {
    case InterventionMode::kAdd:
    case InterventionMode::kProjectOut:
    case InterventionMode::kReplace:
      want = width;
      break;
    case InterventionMode::kPatch:
    case InterventionMode::kPatchHead: {
      StatusOr<int64_t> n = PatchRowCount(iv.positions);
      if (!n.ok()) return n.status().WithContext(name);
      want = patch_rows_elsewhere ? 0 : width * *n;
      if (iv.mode == InterventionMode::kPatch) break;
      [[fallthrough]];
    }
    case InterventionMode::kZeroHead:
      if (iv.hook.site != HookSite::kZ || iv.head < 0 || iv.head >= c.num_heads)
        return InvalidArgumentError(name + ": head " + std::to_string(iv.head) +
                                    " of " + HookName(iv.hook) +
                                    " outside [0, " +
                                    std::to_string(c.num_heads) + ")");
      break;
    case InterventionMode::kZero:
      break;
    case InterventionMode::kFeatureAdd:
    case InterventionMode::kFeatureClamp:
    case InterventionMode::kFeatureAblate:
    case InterventionMode::kSaeReconstruct:
      if (!iv.sae_edit || iv.sae_edit->sae->d_in != width)
        return InvalidArgumentError(name + ": " + HookName(iv.hook) +
                                    " needs an SAE of d_in " +
                                    std::to_string(width));
      break;
  }
  if (static_cast<int64_t>(iv.vector.size()) != want)
    return InvalidArgumentError(name + ": " + HookName(iv.hook) + " needs " +
                                std::to_string(want) + " values, got " +
                                std::to_string(iv.vector.size()));
  for (size_t j = 0; j < iv.vector.size(); ++j)
    if (!std::isfinite(iv.vector[j]))
      return InvalidArgumentError(name + ": value " + std::to_string(j) +
                                  " of the vector is not finite");
  return Status();
}

bool AppliesToRow(const Intervention& iv, int64_t row) {
  return iv.rows.empty() ||
         std::binary_search(iv.rows.begin(), iv.rows.end(), row);
}

Status CheckInterventionsApply(const std::vector<Intervention>& list,
                               int64_t count, std::string_view noun,
                               bool generates) {
  for (const Intervention& iv : list) {
    const std::string what = "interventions: the " +
                             std::string(InterventionModeName(iv.mode)) +
                             " at " + HookName(iv.hook);
    if (!iv.rows.empty() && iv.rows.back() >= count)
      return InvalidArgumentError(
          what + " lists row " + std::to_string(iv.rows.back()) +
          " in `rows`, but this job has " + std::to_string(count) + " " +
          std::string(count == 1 && noun.ends_with('s')
                          ? noun.substr(0, noun.size() - 1)
                          : noun) +
          " (rows count from 0): it would edit nothing");
    if (!generates && !iv.edits_prompt())
      return InvalidArgumentError(
          what +
          " has apply_to \"generated\", but this job generates no tokens: "
          "it would edit nothing (leave apply_to out)");
  }
  return Status();
}

std::string CheckInterventionsFit(const std::vector<Intervention>& list,
                                  int64_t row, int64_t length) {
  for (size_t i = 0; i < list.size(); ++i) {
    const Intervention& iv = list[i];
    if (!AppliesToRow(iv, row) ||
        (iv.positions.kind != InterventionPositions::Kind::kList &&
         iv.positions.kind != InterventionPositions::Kind::kSpan))
      continue;
    const StatusOr<std::vector<int64_t>> p =
        ResolvePositions(iv.positions, length);
    if (!p.ok())
      return "intervention " + std::to_string(i) + " (" + HookName(iv.hook) +
             "): " + p.status().message();
  }
  return "";
}

StatusOr<std::vector<int64_t>> ResolvePositions(
    const InterventionPositions& positions, int64_t length) {
  using Kind = InterventionPositions::Kind;
  std::vector<int64_t> out;
  if (positions.kind == Kind::kAll) {
    for (int64_t p = 0; p < length; ++p) out.push_back(p);
    return out;
  }
  if (positions.kind == Kind::kLast) {
    if (length > 0) out.push_back(length - 1);
    return out;
  }
  if (positions.kind == Kind::kSpan) {
    ASSIGN_OR_RETURN(const auto span, ResolveSpan(positions, length));
    for (int64_t p = span.first; p < span.second; ++p) out.push_back(p);
    return out;
  }
  for (int64_t p : positions.list) {
    const int64_t q = p < 0 ? p + length : p;
    if (q < 0 || q >= length)
      return OutOfRangeError("position " + std::to_string(p) +
                             " is outside a sequence of " +
                             std::to_string(length) + " tokens");
    out.push_back(q);
  }
  std::sort(out.begin(), out.end());
  if (auto d = std::adjacent_find(out.begin(), out.end()); d != out.end())
    return InvalidArgumentError("positions name token " + std::to_string(*d) +
                                " twice (in a sequence of " +
                                std::to_string(length) + " tokens)");
  return out;
}

StatusOr<std::pair<int64_t, int64_t>> ResolveSpan(
    const InterventionPositions& positions, int64_t length) {
  const int64_t a = positions.span_begin, b = positions.span_end;
  const int64_t begin = a < 0 ? a + length : a;
  const int64_t end = positions.span_to_end ? length : b < 0 ? b + length : b;
  const std::string span = "span [" + std::to_string(a) + ", " +
                           (positions.span_to_end ? "end" : std::to_string(b)) +
                           ")";
  if (begin < 0 || begin > length || end < 0 || end > length)
    return OutOfRangeError(span + " is outside a sequence of " +
                           std::to_string(length) + " tokens");
  if (end <= begin)
    return OutOfRangeError(span + " is empty in a sequence of " +
                           std::to_string(length) + " tokens");
  return std::make_pair(begin, end);
}

StatusOr<int64_t> PatchRowCount(const InterventionPositions& p) {
  using Kind = InterventionPositions::Kind;
  if (p.kind == Kind::kSpan) {
    if (p.span_begin < 0 || p.span_to_end || p.span_end <= p.span_begin)
      return InvalidArgumentError(
          "a patch's span needs 0 <= begin < end, both given (it sets the "
          "rows it copies)");
    return p.span_end - p.span_begin;
  }
  if (p.kind != Kind::kList)
    return InvalidArgumentError(
        "a patch names its positions (a list or a span), not \"" +
        std::string(p.kind == Kind::kAll ? "all" : "last") + "\"");
  for (size_t j = 0; j < p.list.size(); ++j)
    if (p.list[j] < 0 || (j > 0 && p.list[j] <= p.list[j - 1]))
      return InvalidArgumentError(
          "a patch's positions must be ascending and >= 0");
  return static_cast<int64_t>(p.list.size());
}

}  // namespace loom
