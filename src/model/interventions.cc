#include "src/model/interventions.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "src/base/read_file.h"
#include "src/core/json_error.h"
#include "src/core/json_int.h"
#include "src/io/npy.h"

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
};

constexpr const char* kSiteList =
    "hook_resid_pre, hook_resid_mid, hook_resid_post, hook_attn_out, "
    "hook_mlp_out, attn.hook_z, mlp.hook_post";

bool NeedsVector(InterventionMode m) {
  return m == InterventionMode::kAdd || m == InterventionMode::kProjectOut ||
         m == InterventionMode::kReplace;
}

// One entry of the list, with "interventions[i]" for its errors.
struct Entry {
  const Json& json;
  std::string name;
  const Json* Find(const char* key) const {
    auto it = json.find(key);
    return it == json.end() || it->is_null() ? nullptr : &*it;
  }
  std::string Field(const char* key) const { return name + "." + key; }
  Status Error(const char* key, const std::string& what) const {
    return InvalidArgumentError(Field(key) + ": " + what);
  }
};

StatusOr<InterventionMode> ParseMode(const Entry& e) {
  const Json* m = e.Find("mode");
  if (m == nullptr) return e.Error("mode", "missing");
  std::string names;
  for (const auto& [mode, name] : kModes) {
    if (m->is_string() && m->get<std::string>() == name) {
      if (mode == InterventionMode::kPatch)
        return UnimplementedError(
            e.Field("mode") +
            ": \"patch\" needs a source run (the recorded activations to "
            "copy in), which an intervention file cannot name yet");
      return mode;
    }
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return e.Error("mode", m->dump() + " is not one of " + names);
}

StatusOr<std::vector<HookPoint>> ParseHooks(const Entry& e,
                                            const ModelConfig& config) {
  const Json* h = e.Find("hook");
  if (h == nullptr || !h->is_string())
    return e.Error("hook",
                   h == nullptr ? "missing" : h->dump() + " is not a string");
  const std::string name = h->get<std::string>();
  StatusOr<std::vector<HookPoint>> hooks =
      ParseHookPattern(name, config.num_layers);
  if (!hooks.ok())
    return e.Error("hook", "'" + name + "': " + hooks.status().message());
  for (const HookPoint& hook : *hooks) {
    if (Status s = CheckHookExists(hook, config); !s.ok())
      return e.Error("hook", "'" + name + "': " + s.message());
    if (!IsInterventionSite(hook.site))
      return e.Error(
          "hook", "'" + HookName(hook) +
                      "' cannot be edited; the sites that can: " + kSiteList);
  }
  return *std::move(hooks);
}

StatusOr<float> ParseScale(const Entry& e, InterventionMode mode) {
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
  }
  return e.Error("positions", p->dump() +
                                  " is not \"all\", \"last\" or a list of "
                                  "token positions");
}

// The f32 values of a .npy vector file: [width] or [1, width].
StatusOr<std::vector<float>> ReadVectorFile(const Entry& e,
                                            const std::string& path) {
  StatusOr<NpyArray> a = ReadNpy(path);
  if (!a.ok())
    return Status(a.status().code(),
                  e.Field("vector_file") + ": " + a.status().message());
  const NpyHeader& h = a->header;
  if (h.dtype != DType::kF32)
    return e.Error("vector_file", "'" + path + "' holds " + h.descr +
                                      " values; expected float32 ('<f4')");
  if (h.fortran_order || h.shape.empty() || h.shape.size() > 2 ||
      (h.shape.size() == 2 && h.shape[0] != 1)) {
    std::string shape;
    for (int64_t d : h.shape)
      shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return e.Error("vector_file", "'" + path + "' has shape [" + shape +
                                      "]; expected one vector ([width] or "
                                      "[1, width], C order)");
  }
  std::vector<float> v(static_cast<size_t>(h.numel()));
  std::memcpy(v.data(), a->data.data(), v.size() * sizeof(float));
  return v;
}

// The vector of the entry (`vector_file`, or an inline `vector` list),
// checked against the hook's width, for finiteness and (project_out) norm.
StatusOr<std::vector<float>> ParseVector(const Entry& e, InterventionMode mode,
                                         const HookPoint& hook,
                                         const ModelConfig& config,
                                         const std::string& base_dir) {
  const Json* file = e.Find("vector_file");
  const Json* inline_v = e.Find("vector");
  if (!NeedsVector(mode)) {
    if (file != nullptr || inline_v != nullptr)
      return e.Error(file ? "vector_file" : "vector",
                     "mode \"" + std::string(InterventionModeName(mode)) +
                         "\" takes no vector");
    return std::vector<float>();
  }
  if (file != nullptr && inline_v != nullptr)
    return e.Error("vector", "give vector or vector_file, not both");
  std::vector<float> v;
  const char* field = file != nullptr ? "vector_file" : "vector";
  if (file != nullptr) {
    if (!file->is_string() || file->get<std::string>().empty())
      return e.Error("vector_file", file->dump() + " is not a file name");
    std::string path = file->get<std::string>();
    if (path[0] != '/' && !base_dir.empty())
      path = (std::filesystem::path(base_dir) / path).string();
    ASSIGN_OR_RETURN(v, ReadVectorFile(e, path));
  } else if (inline_v != nullptr) {
    if (!inline_v->is_array())
      return e.Error("vector", "is not a list of numbers");
    for (const Json& x : *inline_v) {
      if (!x.is_number())
        return e.Error("vector", x.dump() + " is not a number");
      v.push_back(static_cast<float>(x.get<double>()));
    }
  } else {
    return e.Error("vector_file",
                   "missing: mode \"" +
                       std::string(InterventionModeName(mode)) +
                       "\" needs a vector (vector_file or vector)");
  }
  ASSIGN_OR_RETURN(const int64_t width, HookWidth(hook, config));
  if (static_cast<int64_t>(v.size()) != width)
    return e.Error(field, "has " + std::to_string(v.size()) + " values but " +
                              HookName(hook) + " is " + std::to_string(width) +
                              " wide");
  double norm2 = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]))
      return e.Error(field, "value " + std::to_string(i) + " of " +
                                std::to_string(v.size()) + " is " +
                                (std::isnan(v[i]) ? "nan" : "infinite") +
                                " (as f32)");
    norm2 += double{v[i]} * v[i];
  }
  if (mode == InterventionMode::kProjectOut &&
      std::abs(std::sqrt(norm2) - 1.0) > kUnitTolerance)
    return e.Error(field, "project_out needs a unit vector; its norm is " +
                              std::to_string(std::sqrt(norm2)));
  return v;
}

StatusOr<int64_t> ParseHead(const Entry& e, InterventionMode mode,
                            const std::vector<HookPoint>& hooks,
                            const ModelConfig& config) {
  const Json* h = e.Find("head");
  if (mode != InterventionMode::kZeroHead) {
    if (h != nullptr)
      return e.Error("head", "applies to mode \"zero_head\" only");
    return int64_t{-1};
  }
  for (const HookPoint& hook : hooks)
    if (hook.site != HookSite::kZ)
      return e.Error("hook", "mode \"zero_head\" needs attn.hook_z, not '" +
                                 HookName(hook) + "'");
  if (h == nullptr) return e.Error("head", "missing (zero_head needs it)");
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
    const Entry& e, const InterventionPositions& positions) {
  const Json* a = e.Find("apply_to");
  if (a == nullptr)
    return positions.kind == InterventionPositions::Kind::kAll
               ? InterventionApplyTo::kBoth
               : InterventionApplyTo::kPrompt;
  const std::string s = a->is_string() ? a->get<std::string>() : "";
  if (s == "prompt") return InterventionApplyTo::kPrompt;
  if (s == "generated") return InterventionApplyTo::kGenerated;
  if (s == "both") return InterventionApplyTo::kBoth;
  return e.Error("apply_to",
                 a->dump() + " is not one of prompt, generated, both");
}

// The interventions of one entry (one per hook its pattern names).
Status ParseEntry(const Entry& e, const ModelConfig& config,
                  const std::string& base_dir, std::vector<Intervention>* out) {
  if (!e.json.is_object())
    return InvalidArgumentError(e.name + ": " + e.json.dump() +
                                " is not an object");
  ASSIGN_OR_RETURN(const InterventionMode mode, ParseMode(e));
  ASSIGN_OR_RETURN(const std::vector<HookPoint> hooks, ParseHooks(e, config));
  Intervention iv;
  iv.mode = mode;
  ASSIGN_OR_RETURN(iv.scale, ParseScale(e, mode));
  ASSIGN_OR_RETURN(iv.positions, ParsePositions(e));
  ASSIGN_OR_RETURN(iv.head, ParseHead(e, mode, hooks, config));
  ASSIGN_OR_RETURN(iv.rows, ParseRows(e));
  ASSIGN_OR_RETURN(iv.apply_to, ParseApplyTo(e, iv.positions));
  for (const HookPoint& hook : hooks) {
    iv.hook = hook;
    // Every hook of a pattern has the same site, hence the same width.
    if (hook == hooks.front()) {
      ASSIGN_OR_RETURN(iv.vector, ParseVector(e, mode, hook, config, base_dir));
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

bool IsInterventionSite(HookSite site) {
  switch (site) {
    case HookSite::kResidPre:
    case HookSite::kResidMid:
    case HookSite::kResidPost:
    case HookSite::kAttnOut:
    case HookSite::kMlpOut:
    case HookSite::kZ:
    case HookSite::kMlpPost:
      return true;
    default:
      return false;
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
    const Entry e{(*list)[i], "interventions[" + std::to_string(i) + "]"};
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
    Json e{{"hook", s.substr(0, eq)}, {"mode", "add"}};
    if (const size_t at = rest.rfind('@'); at != std::string::npos) {
      const std::string p = rest.substr(at + 1);
      rest.resize(at);
      StatusOr<InterventionPositions> pos = ParsePositionsText(p);
      if (!pos.ok()) return pos.status().WithContext(flag);
      if (pos->kind == InterventionPositions::Kind::kList)
        e["positions"] = pos->list;
      else
        e["positions"] = p;
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
    e["scale"] = v;
    e["vector_file"] = rest.substr(0, star);
    list.push_back(std::move(e));
  }
  for (const std::string& s : ablate) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      return InvalidArgumentError("--ablate-direction " + s +
                                  ": expected HOOK=DIRECTION");
    list.push_back(Json{{"hook", s.substr(0, eq)},
                        {"mode", "project_out"},
                        {"vector_file", s.substr(eq + 1)}});
  }
  if (list.empty()) return std::string();
  return Json{{"interventions", list}}.dump();
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
    Json positions;
    switch (iv.positions.kind) {
      case InterventionPositions::Kind::kAll:
        positions = "all";
        break;
      case InterventionPositions::Kind::kLast:
        positions = "last";
        break;
      case InterventionPositions::Kind::kList:
        positions = iv.positions.list;
        break;
    }
    Json e{{"hook", HookName(iv.hook)},
           {"mode", std::string(InterventionModeName(iv.mode))},
           {"positions", positions}};
    if (iv.mode == InterventionMode::kAdd) e["scale"] = iv.scale;
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
    out.push_back(std::move(e));
  }
  return out;
}

int64_t InterventionBytes(const std::vector<Intervention>& list) {
  int64_t bytes = 0;
  for (const Intervention& iv : list)
    bytes += static_cast<int64_t>(iv.vector.size() * sizeof(float));
  return bytes;
}

Status CheckIntervention(const Intervention& iv, const ModelConfig& c,
                         const std::string& name, bool patch_rows_elsewhere) {
  if (!IsInterventionSite(iv.hook.site))
    return InvalidArgumentError(
        name + ": '" + HookName(iv.hook) +
        "' cannot be edited; the sites that can: " + kSiteList);
  RETURN_IF_ERROR(CheckHookExists(iv.hook, c).WithContext(name));
  ASSIGN_OR_RETURN(const int64_t width, HookWidth(iv.hook, c));
  const std::vector<int64_t>& list = iv.positions.list;
  int64_t want = 0;
  switch (iv.mode) {
    case InterventionMode::kAdd:
    case InterventionMode::kProjectOut:
    case InterventionMode::kReplace:
      want = width;
      break;
    case InterventionMode::kPatch:
      if (iv.positions.kind != InterventionPositions::Kind::kList)
        return InvalidArgumentError(name + ": a patch names its positions");
      for (size_t j = 0; j < list.size(); ++j)
        if (list[j] < 0 || (j > 0 && list[j] <= list[j - 1]))
          return InvalidArgumentError(
              name + ": a patch's positions must be ascending and >= 0");
      want =
          patch_rows_elsewhere ? 0 : width * static_cast<int64_t>(list.size());
      break;
    case InterventionMode::kZeroHead:
      if (iv.hook.site != HookSite::kZ || iv.head < 0 || iv.head >= c.num_heads)
        return InvalidArgumentError(name + ": head " + std::to_string(iv.head) +
                                    " of " + HookName(iv.hook) +
                                    " outside [0, " +
                                    std::to_string(c.num_heads) + ")");
      break;
    case InterventionMode::kZero:
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

std::string CheckInterventionsFit(const std::vector<Intervention>& list,
                                  int64_t row, int64_t length) {
  for (size_t i = 0; i < list.size(); ++i) {
    const Intervention& iv = list[i];
    if (!AppliesToRow(iv, row) ||
        iv.positions.kind != InterventionPositions::Kind::kList)
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

}  // namespace loom
