// Interventions: edits of a hooked activation inside the forward pass
// (steering, directional ablation, zero / mean / head ablation, activation
// patching), as read from an intervention file (docs/interventions.md): the
// validated specification. The executor applies it (SequenceEdit in
// src/runtime/executor.h); nothing here knows a backend.
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
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/hooks.h"
#include "src/model/sae.h"

namespace loom {

enum class InterventionMode : uint8_t {
  kAdd,         // h += scale * v
  kProjectOut,  // h -= (h . r) r, r a unit vector
  kZero,        // h = 0
  kReplace,     // h = m (e.g. a mean activation)
  kZeroHead,    // attn.hook_z only: the columns of head `head` = 0
  kPatch,       // h[p] = a recorded run's h[p]
  kPatchHead,   // attn.hook_z only: h[p, head] = a recorded run's h[p, head]
  // Through an SAE at its own hook (`sae`; docs/saes.md, "Splices and
  // feature edits"). The error term is kept: h += d * decoded(feature),
  // decoded(f) = W_dec[f] as the SAE decodes it (norm_out's factor, the TopK
  // decoder-norm rescale), with d = c (feature_add), v - f (feature_clamp),
  // -f (feature_ablate), f the feature's activation on h.
  kFeatureAdd,
  kFeatureClamp,
  kFeatureAblate,
  kSaeReconstruct,  // h = the SAE's reconstruction of h (error dropped)
};
// "add", "project_out", "zero", "replace", "zero_head", "patch",
// "patch_head", "feature_add", "feature_clamp", "feature_ablate",
// "sae_reconstruct".
std::string_view InterventionModeName(InterventionMode mode);

// Token positions of a sequence an intervention applies to.
struct InterventionPositions {
  enum class Kind : uint8_t { kAll, kLast, kList, kSpan };
  Kind kind = Kind::kAll;
  // kList: distinct positions; negative ones count from the end (-1 = the
  // last token). Which are in range is known only per sequence
  // (ResolvePositions).
  std::vector<int64_t> list;
  // kSpan: the positions [span_begin, span_end), each negative bound counted
  // from the end; span_to_end: span_end is the sequence's end ({"span": [a,
  // null]}, text "a:").
  int64_t span_begin = 0, span_end = 0;
  bool span_to_end = false;
};

// Generation: which tokens an intervention edits. kPrompt: its positions of
// the prompt (prefill); kGenerated: every generated token as it is fed back
// (each decode step), not the prompt; kBoth: both. Field "apply_to":
// "prompt" | "generated" | "both"; default "both" with positions "all",
// else "prompt". Evaluations without generation (extract, perplexity)
// edit the prompt only, whatever it says.
enum class InterventionApplyTo : uint8_t { kPrompt, kGenerated, kBoth };

// The SAE of a feature edit or a reconstruction, and the scratch its
// application uses (kSaeEditRows rows at a time), allocated when the
// intervention is read, before any forward; one application at a time.
inline constexpr int64_t kSaeEditRows = 64;
struct SaeEdit {
  std::shared_ptr<const Sae> sae;
  int64_t feature = -1;  // feature modes
  float value = 0;       // feature_add: c; feature_clamp: v
  std::mutex mu;
  std::vector<float> x;           // [rows, d_in]
  std::vector<float> acts;        // [rows, d_sae]
  std::vector<float> out;         // [rows, d_out]
  std::vector<float> norm_scale;  // [rows]
  std::vector<float> coef;        // [rows]
  std::vector<float> workspace;   // SaeWorkspaceBytes, 64-byte aligned inside
  int64_t bytes() const;
};
bool IsSaeEditMode(InterventionMode mode);
// Sizes the scratch of every SAE edit of `list` (once; before any forward):
// `workspace_bytes(sae, rows)`, the kernel's workspace on the backend that
// will run it (Backend::SaeWorkspaceBytes).
struct Intervention;
void PrepareSaeEdits(
    const std::vector<Intervention>& list,
    const std::function<int64_t(const Sae&, int64_t)>& workspace_bytes);

struct Intervention {
  HookPoint hook;
  InterventionMode mode = InterventionMode::kAdd;
  float scale = 1.0f;  // kAdd only
  // kAdd only: rescale each edited row to its L2 norm before the add.
  bool norm_match = false;
  InterventionPositions positions;
  // [HookWidth(hook)] f32, finite: v (kAdd), the unit r (kProjectOut), m
  // (kReplace); kPatch / kPatchHead: [n, HookWidth(hook)], the recorded
  // run's rows at the n positions in order (kPatchHead copies only the
  // head's columns); empty for kZero and kZeroHead.
  std::vector<float> vector;
  // kZeroHead / kPatchHead: 0 <= head < num_heads; -1 otherwise.
  int64_t head = -1;
  // Input rows (sequences of the request, 0-based) it applies to, sorted and
  // distinct; empty = every row.
  std::vector<int64_t> rows;
  InterventionApplyTo apply_to = InterventionApplyTo::kBoth;
  // IsSaeEditMode(mode): the SAE and its scratch (shared by the copies).
  std::shared_ptr<SaeEdit> sae_edit;
  bool edits_prompt() const {
    return apply_to != InterventionApplyTo::kGenerated;
  }
  bool edits_generated() const {
    return apply_to != InterventionApplyTo::kPrompt;
  }
};

// Whether `site` can be edited (kHookSites' `editable`: hook_resid_pre /
// hook_resid_mid / hook_resid_post, hook_attn_out, hook_mlp_out, attn.hook_z,
// mlp.hook_post).
bool IsInterventionSite(HookSite site);

// Parses and validates the intervention list of `json_text`. `base_dir` is
// where relative `vector_file` paths are resolved (the JSON file's folder).
// A `hook` with a layer pattern (blocks.*.hook_resid_pre) gives one
// Intervention per layer, in layer order; otherwise entries keep the file's
// order. Every error is InvalidArgument naming the entry and field
// ("interventions[2].head: 7 is outside [0, 4)"), except that a vector file
// that cannot be read keeps its reader's code (NotFound, DataLoss, ...).
// Vector files are .npy (f32), .safetensors or GGUF (F32, F16 or BF16),
// told apart by their first bytes; `tensor` names the tensor of a
// .safetensors or GGUF file (optional when it holds one).
StatusOr<std::vector<Intervention>> ParseInterventions(
    std::string_view json_text, const std::string& base_dir,
    const ModelConfig& config);

// ParseInterventions of the file at `path` (relative vector files are resolved
// against its folder); the file's own errors name it.
StatusOr<std::vector<Intervention>> ParseInterventionFile(
    const std::string& path, const ModelConfig& config);

// Checks one intervention against a model, as every forward that applies it
// needs: the hook can be edited and exists, the vector's width (kPatch,
// kPatchHead: width x PatchRowCount; none when `patch_rows_elsewhere`: the
// rows come from another buffer), finite values, and the head of zero_head
// and patch_head. InvalidArgument starting with `name`.
Status CheckIntervention(const Intervention& iv, const ModelConfig& config,
                         const std::string& name,
                         bool patch_rows_elsewhere = false);

// The rows a patch copies in: its listed positions (ascending, >= 0) or its
// span (0 <= begin < end, end given). InvalidArgument otherwise.
StatusOr<int64_t> PatchRowCount(const InterventionPositions& positions);

// Whether `iv` applies to input row `row` (its `rows`, or every row).
bool AppliesToRow(const Intervention& iv, int64_t row);

// Refuses, before a job runs, an intervention that would edit nothing in
// it: one whose `rows` lists a row past the job's `count` rows (input rows,
// windows or prompts, as `noun` says), or one that edits generated tokens
// only (apply_to "generated") in a job that generates none.
Status CheckInterventionsApply(const std::vector<Intervention>& list,
                               int64_t count, std::string_view noun,
                               bool generates);

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

// Positions as the command line spells them: "all", "last", a
// comma-separated list "1,3,-1" or a span "A:B" (B exclusive; either may be
// left out: ":B" from 0, "A:" to the end; negatives count from the end).
// InvalidArgument naming the bad item.
StatusOr<InterventionPositions> ParsePositionsText(std::string_view text);

// The intervention document of the CLI's shorthand flags (empty when there
// are none): --steer HOOK=VECTOR*SCALE[@POSITIONS] (mode add; POSITIONS as
// ParsePositionsText; default all) and --ablate-direction HOOK=DIRECTION
// (mode project_out at every position). VECTOR and DIRECTION are a file,
// or FILE#TENSOR for one tensor of a .safetensors or GGUF file. Vector
// paths are kept as given (relative to the working directory).
// InvalidArgument naming the flag.
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

// One line for reports: "blocks.1.hook_resid_post add x2.5, blocks.0.attn.
// hook_z zero_head (head 3), ..." (the edits' hooks and modes in order).
std::string InterventionsSummary(const std::vector<Intervention>& list);

// The positions of a sequence of `length` tokens, ascending: all, the last,
// the list with negatives counted from the end, or the span. OutOfRange
// naming the position and `length` when one falls outside [0, length) (a
// span's bounds outside [0, length] or an empty span); InvalidArgument when
// two name the same token (e.g. 8 and -1 with length 9).
StatusOr<std::vector<int64_t>> ResolvePositions(
    const InterventionPositions& positions, int64_t length);

// A kSpan's [begin, end) in a sequence of `length` tokens, with the errors of
// ResolvePositions; allocates nothing.
StatusOr<std::pair<int64_t, int64_t>> ResolveSpan(
    const InterventionPositions& positions, int64_t length);

}  // namespace loom

#endif  // LOOM_MODEL_INTERVENTIONS_H_
