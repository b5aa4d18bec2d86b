// User-facing options declared once. A ParamSpec is an option's name, kind,
// range and help; a group binds its specs to the fields the option sets
// (ParamField), and each surface derives its reader from the group: `loom`'s
// flags (tools/cli/param_flags.h: --top-p for top_p, the range as a CLI11
// check), `loom serve`'s JSON fields (serve::ReadParams: "field `top_p`:
// expected a number in (0, 1], got 0") and the Python keywords
// (python/convert.h). The default of an option is the value of its field
// when the surface reads it: the library's struct default, or the surface's
// own where its API contract says another (TheLoom's temperature 0.7).
// A new option of a group is one row of its table and the field it sets.
#ifndef LOOM_EVAL_PARAMS_H_
#define LOOM_EVAL_PARAMS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "src/eval/generate.h"

namespace loom {
struct JobPlanOptions;  // src/eval/job_plan.h
struct Sae;             // src/model/sae.h
}  // namespace loom

namespace loom::eval {

enum class ParamKind : uint8_t {
  kInt,      // int64_t in [lo, hi]
  kSeed,     // uint64_t: any integer in [0, 2^64)
  kFloat,    // float: a finite number in [lo, hi] ((lo, hi] when lo_open)
  kString,   // std::string (a name the job parses: its error lists them)
  kStrings,  // std::vector<std::string>: a repeatable flag; a string or a list
  kBool,     // bool: a flag without a value; true or false
};

// A ParamSpec's hi for no upper bound.
inline constexpr double kNoUpperBound = 1e300;

struct ParamSpec {
  std::string_view name;  // snake_case: the JSON field and Python keyword
  ParamKind kind;
  double lo = 0, hi = 0;  // kInt, kFloat
  bool lo_open = false;
  std::string_view help;  // one line, without the default
  // kInt: 0 asks for a default computed from the model (ctx: min(512,
  // max positions)). The Python keyword and JSON field take 0 for it; the
  // CLI flag does not (leaving the flag out is the way, flag_ranges.h), and
  // shows no default.
  bool zero_is_default = false;
  // kStrings: the CLI flag also splits a value at commas (a,b == a --x b).
  bool comma_list = false;
};

// The most CPU threads a job may ask for (--threads, threads=): more than
// any machine has cores, few enough that a typo (100000) is refused rather
// than spawning them.
inline constexpr int kMaxThreads = 4096;

// int*: a kInt field of a struct that keeps it as int (threads).
using ParamTarget =
    std::variant<int64_t*, int*, uint64_t*, float*, std::string*,
                 std::vector<std::string>*, bool*>;

// One option of a group bound to the field it sets. `hi` narrows the
// spec's upper bound on one surface (a server's per-request cap).
struct ParamField {
  const ParamSpec* spec;
  ParamTarget target;
  std::optional<double> hi;
  double upper() const { return hi ? *hi : spec->hi; }
};

// "--top-p" for top_p.
std::string ParamFlag(const ParamSpec& spec);
// "an integer in [0, 8192]", "a number in (0, 1]", "an integer in [0,
// 18446744073709551615]", "a string or a list of strings".
std::string ParamRangeText(const ParamField& field);
// Whether `v` lies in the field's range (finite, kInt/kFloat only).
bool InParamRange(const ParamField& field, double v);
// The field of `name` in `fields`, or null.
ParamField* FindParam(std::span<ParamField> fields, std::string_view name);

// ---- Generation: what continuing a prompt takes besides the prompt.
// max_tokens, temperature, top_k, top_p, seed, stop.
std::span<const ParamSpec> GenerationParamSpecs();
std::vector<ParamField> GenerationParams(int64_t* max_tokens,
                                         SamplingOptions* sampling,
                                         std::vector<std::string>* stop);

// ---- Windows: how perplexity and compare cut a token stream into windows.
// protocol, ctx, stride, max_windows, add_bos, chunk_rows.
struct WindowParams {
  std::string protocol = "hf-stride";
  int64_t ctx = 0;          // 0: min(512, max positions)
  int64_t stride = 0;       // 0: the protocol's default
  int64_t max_windows = 0;  // 0: all
  std::string add_bos = "auto";
  int64_t chunk_rows = 256;
};
std::span<const ParamSpec> WindowParamSpecs();
std::vector<ParamField> WindowParamFields(WindowParams* p);
// The spec of one window option by name ("chunk_rows"), for a command that
// binds it to its own field (loom lens); checked to exist.
const ParamSpec& WindowParam(std::string_view name);

// ---- Extract rows: how extract reads, batches and commits its input rows.
// add_bos, batch_tokens, commit_every, on_error, streaming_chunk_size,
// max_row_tokens (ApplyRowParams in src/eval/extract_settings.h puts them
// into an ExtractOptions).
struct ExtractRowParams {
  std::string add_bos = "auto";
  int64_t batch_tokens = 0;  // 0: min(4096, max positions)
  int64_t commit_every = 256;
  std::string on_error = "fail";
  int64_t streaming_chunk_size = 0;  // 0: off
  int64_t max_row_tokens = 0;        // 0: min(32768, max positions)
};
std::span<const ParamSpec> ExtractRowParamSpecs();
std::vector<ParamField> ExtractRowParamFields(ExtractRowParams* p);

// ---- Analysis: what an extraction computes from the hooks it captures
// (src/eval/extract_derived.h): sae, sae_topk, lens, lens_topk.
struct AnalysisParams {
  std::vector<std::string> sae;  // FILE_OR_DIR[@HOOK] each
  // SAEs loaded already (Python's loom.Sae objects), run as if given in
  // `sae`, after those; shared, never copied.
  std::vector<std::shared_ptr<const Sae>> loaded_sae;
  int64_t sae_topk = 0;       // 0: none
  std::string lens;           // "" (none), "logit" or "tuned:FILE"
  int64_t lens_topk = 0;      // 0: none
  int64_t sae_dashboard = 0;  // N top contexts per feature; 0: none
};
std::span<const ParamSpec> AnalysisParamSpecs();
std::vector<ParamField> AnalysisParamFields(AnalysisParams* p);

// ---- Lens grid: what `loom lens` and Model.lens_grid compute besides the
// hooks (src/eval/lens_job.h): topk, kl.
std::span<const ParamSpec> LensGridParamSpecs();
std::vector<ParamField> LensGridParams(int64_t* topk, bool* kl);

// ---- Placement: where a job's layers go and how much memory it may use.
// device, max_memory, reserve, offload, show_plan, verify_plan (the fields of
// JobPlanOptions). `loom plan` takes the first four, serve all but offload
// and verify_plan.
std::span<const ParamSpec> PlacementParamSpecs();
std::vector<ParamField> PlacementParamFields(JobPlanOptions* p);

// ---- Capture: what a job captures and at which precision it computes.
// hooks, layers (ResolveHooks), select (row selectors), precision
// (ParsePrecision): each command binds the ones it takes to its own fields
// (one std::string for `loom plan`'s single selector).
std::span<const ParamSpec> CaptureParamSpecs();
// The spec of one capture option by name ("hooks"); checked to exist.
const ParamSpec& CaptureParam(std::string_view name);

// ---- Model: which checkpoint a job loads and how its host computes.
// model, threads, hf_bf16 (precision is a capture option); each surface
// binds them to its own fields (`loom serve --model` is repeatable).
std::span<const ParamSpec> ModelParamSpecs();
const ParamSpec& ModelParam(std::string_view name);

// ---- Interventions: the edits applied inside the forward
// (docs/interventions.md). interventions: the document itself, the list of
// objects a Python call (interventions=[...]) and an HTTP request body
// ("interventions": [...]) give; intervene, steer, ablate_direction,
// control_vector, control_vector_scaled (FILE SCALE pairs) and
// control_vector_layer_range (A B): the CLI's file of that document and its
// shorthands (tools/cli/job_options.h).
std::span<const ParamSpec> InterventionParamSpecs();
const ParamSpec& InterventionParam(std::string_view name);

}  // namespace loom::eval

#endif  // LOOM_EVAL_PARAMS_H_
