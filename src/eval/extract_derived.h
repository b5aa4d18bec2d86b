// Outputs an extraction computes from a hook the forward delivers, rather
// than reads from it: an SAE's (or transcoder's) features and
// reconstruction at the hook it reads (--sae PATH[@HOOK]), and the logit or
// tuned lens of a residual hook (--lens logit|tuned:FILE). They are named
// under their source hook, as SAELens' HookedSAETransformer and Loom's lens
// name them, and captured with every row selector like any other hook:
//   HOOK.hook_sae_input        [d_in]   the SAE's input (the hook's value)
//   HOOK.hook_sae_acts_pre     [d_sae]  pre-activation
//   HOOK.hook_sae_acts_post    [d_sae]  feature activations
//   HOOK.hook_sae_recons       [d_out]  reconstruction
//   HOOK.hook_sae_error        [d_out]  input - reconstruction (SAEs only)
//   HOOK.hook_sae_acts_post.topk_indices / .topk_values   [K] (--sae-topk K;
//                                       int32 indices, ties to the lower)
//   HOOK.hook_lens_logits      [vocab]  the lens's logits
//   HOOK.lens_topk_ids / HOOK.lens_topk_values            [K] (--lens-topk K;
//                                       int32 ids, ties to the lower)
//   HOOK.grad                  [width]  d metric / d HOOK (--grad-of METRIC:
//                                       the rows come from the backward,
//                                       src/runtime/backward.h, not from the
//                                       hook's forward value)
// The splice is read-only: the model's forward is byte-identical to one
// without them. They are computed on the host from the source's f32 rows,
// chunk by chunk, only for the rows some selector keeps; every value of a
// row depends on that row alone (not on the batch, the chunk or --threads).
#ifndef LOOM_EVAL_EXTRACT_DERIVED_H_
#define LOOM_EVAL_EXTRACT_DERIVED_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/eval/params.h"
#include "src/model/config.h"
#include "src/model/hooks.h"
#include "src/model/lens.h"
#include "src/model/sae.h"

namespace loom {

enum class DerivedKind : uint8_t {
  kSaeInput,
  kSaeActsPre,
  kSaeActsPost,
  kSaeRecons,
  kSaeError,
  kSaeTopkIndices,
  kSaeTopkValues,
  kLensLogits,
  kLensTopkIds,
  kLensTopkValues,
  kGrad,
};

// What computes a derived output.
enum class DerivedFrom : uint8_t { kSae, kLens, kBackward };

// The name under the source hook ("hook_sae_acts_post"), what computes the
// kind, and whether it is written as int32.
struct DerivedKindInfo {
  DerivedKind kind;
  std::string_view suffix;
  DerivedFrom from;
  bool integer;
  bool sae() const { return from == DerivedFrom::kSae; }
};
const DerivedKindInfo& DerivedInfo(DerivedKind kind);

// One derived output: what it reads, what it is, its width.
struct DerivedHook {
  HookPoint source;
  DerivedKind kind = DerivedKind::kSaeActsPost;
  int sae = -1;      // index into Analyses::saes; -1 for the lens
  std::string name;  // "blocks.3.hook_resid_post.hook_sae_acts_post"
  int64_t width = 0;
  bool integer() const { return DerivedInfo(kind).integer; }
  // A gradient (HOOK.grad): delivered by the backward, not the forward.
  bool gradient() const {
    return DerivedInfo(kind).from == DerivedFrom::kBackward;
  }
};

// What --sae and --lens loaded, checked against the model's config.
struct Analyses {
  std::vector<std::shared_ptr<const Sae>> saes;
  std::vector<HookPoint> sae_hooks;  // the hook each reads, distinct
  bool lens = false;
  std::shared_ptr<const TunedLens> tuned;  // --lens tuned:FILE
  int64_t sae_topk = 0, lens_topk = 0;
  int64_t dashboard = 0;  // --sae-dashboard N (src/eval/sae_dashboard.h)
  // --grad-of given: HOOK.grad may be named.
  bool gradients = false;
  bool empty() const { return saes.empty() && !lens; }
};

// The --hooks entries split into plain hook patterns (for ResolveHooks) and
// derived items (an item ending in ".<suffix>" of a kind): "prefix" the
// source pattern, which may name several hooks (blocks.*.hook_resid_post).
struct DerivedItem {
  std::string source_pattern;
  DerivedKind kind;
};
void SplitDerivedItems(const std::vector<std::string>& hook_entries,
                       std::vector<std::string>* plain,
                       std::vector<DerivedItem>* derived);

// Loads --sae (each FILE_OR_DIR[@HOOK]) and --lens: the SAE's hook must
// exist in the model with the SAE's width, one SAE per hook; K in [1, d_sae]
// and [1, vocab]. Errors name the option, the file and both values.
StatusOr<Analyses> LoadAnalyses(const eval::AnalysisParams& p,
                                const ModelConfig& config);

// The derived outputs of a job: the items named in --hooks, plus, with
// --sae-topk, every SAE's top-k pair, and with --lens-topk, the top-k pair
// of every residual hook among `plain` and the lens items. Refuses a derived
// name without its --sae / --lens, a lens item at a hook that is no
// residual stream, hook_sae_error of a transcoder, an SAE or lens that
// would compute nothing, HOOK.grad without --grad-of or at a hook with no
// gradient (IsGradientSite), --grad-of naming no HOOK.grad. Sorted by
// source, then kind; distinct.
StatusOr<std::vector<DerivedHook>> ResolveDerivedHooks(
    const std::vector<DerivedItem>& items, const HookSet& plain,
    const Analyses& analyses, const ModelConfig& config);

// Host bytes the job holds for them besides the model: the SAEs' f32
// weights, the lens's arena (a chunk of logits), the chunk buffers.
int64_t DerivedBytes(const Analyses& analyses,
                     const std::vector<DerivedHook>& derived,
                     const ModelConfig& config);

// Rows of a chunk the runner computes at once.
inline constexpr int64_t kDerivedChunkRows = 256;

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_DERIVED_H_
