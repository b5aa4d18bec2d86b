// Interventions: edits of a hooked activation inside the forward pass
// (steering, directional ablation, zero / mean / head ablation), as read from
// an intervention file (docs/interventions.md). This is the validated
// specification only: applying it in the forward pass is later work (the
// executor does not read it yet). Nothing here knows a backend.
//
// File format: a JSON object with an `interventions` list; each entry uses the
// field names of the goldens' spec.json (shared/golden/interventions/README.md)
// and unknown fields are ignored, so such a spec.json is itself a valid file:
//   {"interventions": [
//     {"hook": "blocks.1.hook_resid_post", "mode": "add", "scale": 4.0,
//      "positions": "all", "vector_file": "vector.npy", "rows": [0]}]}
#ifndef LOOM_MODEL_INTERVENTIONS_H_
#define LOOM_MODEL_INTERVENTIONS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/hooks.h"

namespace loom {

enum class InterventionMode : uint8_t {
  kAdd,         // h += scale * v
  kProjectOut,  // h -= (h . r) r, r a unit vector
  kZero,        // h = 0
  kReplace,     // h = m (e.g. a mean activation)
  kZeroHead,    // attn.hook_z only: the columns of head `head` = 0
  kPatch,       // h[p] = a recorded run's h[p] (not accepted yet: see below)
};
// "add", "project_out", "zero", "replace", "zero_head", "patch".
std::string_view InterventionModeName(InterventionMode mode);

// Token positions of a sequence an intervention applies to.
struct InterventionPositions {
  enum class Kind : uint8_t { kAll, kLast, kList };
  Kind kind = Kind::kAll;
  // kList: distinct positions; negative ones count from the end (-1 = the
  // last token). Which are in range is known only per sequence
  // (ResolvePositions).
  std::vector<int64_t> list;
};

// Generation: which tokens an intervention edits. kPrompt: its positions of
// the prompt (prefill); kGenerated: every generated token as it is fed back
// (each decode step), not the prompt; kBoth: both. Field "apply_to":
// "prompt" | "generated" | "both"; default "both" with positions "all",
// else "prompt". Evaluations without generation (extract, perplexity)
// edit the prompt only, whatever it says.
enum class InterventionApplyTo : uint8_t { kPrompt, kGenerated, kBoth };

struct Intervention {
  HookPoint hook;
  InterventionMode mode = InterventionMode::kAdd;
  float scale = 1.0f;  // kAdd only
  InterventionPositions positions;
  // [HookWidth(hook)] f32, finite: v (kAdd), the unit r (kProjectOut), m
  // (kReplace); empty for kZero and kZeroHead.
  std::vector<float> vector;
  int64_t head = -1;  // kZeroHead: 0 <= head < num_heads; -1 otherwise
  // Input rows (sequences of the request, 0-based) it applies to, sorted and
  // distinct; empty = every row.
  std::vector<int64_t> rows;
  InterventionApplyTo apply_to = InterventionApplyTo::kBoth;
  bool edits_prompt() const {
    return apply_to != InterventionApplyTo::kGenerated;
  }
  bool edits_generated() const {
    return apply_to != InterventionApplyTo::kPrompt;
  }
};

// Whether `site` can be edited: hook_resid_pre / hook_resid_mid /
// hook_resid_post, hook_attn_out, hook_mlp_out, attn.hook_z, mlp.hook_post.
bool IsInterventionSite(HookSite site);

// Parses and validates the intervention list of `json_text`. `base_dir` is
// where relative `vector_file` paths are resolved (the JSON file's folder).
// A `hook` with a layer pattern (blocks.*.hook_resid_pre) gives one
// Intervention per layer, in layer order; otherwise entries keep the file's
// order. Every error is InvalidArgument naming the entry and field
// ("interventions[2].head: 7 is outside [0, 4)"), except: a vector file that
// cannot be read keeps its reader's code (NotFound, DataLoss, ...), and mode
// "patch" is Unimplemented (it needs a source run, which a file cannot name
// yet).
StatusOr<std::vector<Intervention>> ParseInterventions(
    std::string_view json_text, const std::string& base_dir,
    const ModelConfig& config);

// ParseInterventions of the file at `path` (relative vector files are resolved
// against its folder); the file's own errors name it.
StatusOr<std::vector<Intervention>> ParseInterventionFile(
    const std::string& path, const ModelConfig& config);

// Checks one intervention against a model, as every forward that applies it
// needs: the hook can be edited and exists, the vector's width (kPatch:
// width x the listed positions, which must be ascending and >= 0; none when
// `patch_rows_elsewhere`: the rows come from another buffer), finite
// values, and zero_head's head. InvalidArgument starting with `name`.
Status CheckIntervention(const Intervention& iv, const ModelConfig& config,
                         const std::string& name,
                         bool patch_rows_elsewhere = false);

// Whether `iv` applies to input row `row` (its `rows`, or every row).
bool AppliesToRow(const Intervention& iv, int64_t row);

// Why the interventions that apply to input row `row` of `length` tokens do
// not fit it ("" if they do): the first position outside the row or named
// twice, e.g. "intervention 2 (blocks.1.hook_resid_post): position 12 is
// outside a sequence of 9 tokens".
std::string CheckInterventionsFit(const std::vector<Intervention>& list,
                                  int64_t row, int64_t length);

// The interventions of a job: those of ParseInterventionFile(file) (when
// given), then those of ParseInterventions(json, dir) (when given).
StatusOr<std::vector<Intervention>> LoadInterventions(
    const std::string& file, const std::string& json, const std::string& dir,
    const ModelConfig& config);

// Positions as the command line spells them: "all", "last" or a
// comma-separated list "1,3,-1". InvalidArgument naming the bad item.
StatusOr<InterventionPositions> ParsePositionsText(std::string_view text);

// The intervention document of the CLI's shorthand flags (empty when there
// are none): --steer HOOK=VECTOR*SCALE[@POSITIONS] (mode add; POSITIONS all,
// last or a list "1,3,-1"; default all) and --ablate-direction HOOK=DIRECTION
// (mode project_out at every position). Vector paths are kept as given
// (relative to the working directory). InvalidArgument naming the flag.
StatusOr<std::string> ShorthandInterventions(
    const std::vector<std::string>& steer,
    const std::vector<std::string>& ablate);

// The bytes of the vectors of `list` (f32), as the memory plan counts them.
int64_t InterventionBytes(const std::vector<Intervention>& list);

// A record of `list` for manifests and reports, one object per
// intervention: hook, mode, scale, positions, head, rows, and the vector's
// width and FNV-1a 64 digest of its f32 bytes (hex), so that a --resume with
// other interventions is refused.
nlohmann::json InterventionsJson(const std::vector<Intervention>& list);

// The positions of a sequence of `length` tokens, ascending: all, the last,
// or the list with negatives counted from the end. OutOfRange naming the
// position and `length` when one falls outside [0, length); InvalidArgument
// when two name the same token (e.g. 8 and -1 with length 9).
StatusOr<std::vector<int64_t>> ResolvePositions(
    const InterventionPositions& positions, int64_t length);

}  // namespace loom

#endif  // LOOM_MODEL_INTERVENTIONS_H_
