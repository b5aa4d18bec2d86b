#include "src/eval/params.h"

#include <cmath>
#include <initializer_list>
#include <limits>

#include "src/base/check.h"
#include "src/eval/job_plan.h"

namespace loom::eval {
namespace {

// "2", "0.5": a bound as written in a range.
std::string BoundText(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15)
    return std::to_string(static_cast<int64_t>(x));
  std::string s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  return s;
}

constexpr ParamSpec kGenerationSpecs[] = {
    {"max_tokens", ParamKind::kInt, 0, 1 << 30, false,
     "Most tokens to generate (0: none)"},
    {"temperature", ParamKind::kFloat, 0, kMaxTemperature, false,
     "0 = greedy; > 0 samples"},
    {"top_k", ParamKind::kInt, 0, 1 << 30, false,
     "Keep the k most likely tokens (0 = off)"},
    {"top_p", ParamKind::kFloat, 0, 1, true, "Nucleus mass (1 = off)"},
    {"seed", ParamKind::kSeed, 0, 0, false, "Sampling seed"},
    {"stop", ParamKind::kStrings, 0, 0, false,
     "Stop once the generated text contains this (repeatable)"},
};

// Options of more than one group: one declaration each.
constexpr ParamSpec kAddBos{
    "add_bos", ParamKind::kString,
    0,         0,
    false,     "auto (the tokenizer's default), yes or no"};

constexpr ParamSpec kExtractRowSpecs[] = {
    kAddBos,
    {"batch_tokens", ParamKind::kInt, 1, kNoUpperBound, false,
     "Token budget per batch (default min(4096, max positions); a short "
     "input: its own tokens, rounded up to 64)",
     true},
    {"commit_every", ParamKind::kInt, 1, kNoUpperBound, false,
     "Rows per commit (the unit of resume)"},
    {"on_error", ParamKind::kString, 0, 0, false,
     "fail or skip (skipped rows are recorded with the reason)"},
    {"streaming_chunk_size", ParamKind::kInt, 0, kNoUpperBound, false,
     "Rows longer than --batch-tokens run alone, prefilled in chunks of N "
     "tokens that carry the KV cache: the hidden states of one full pass "
     "(unlike TheLoom's independent chunks). 0 = off: such rows are errors"},
    {"max_row_tokens", ParamKind::kInt, 1, kNoUpperBound, false,
     "With --streaming-chunk-size: the longest row streamed; sizes the "
     "planned KV cache (default min(32768, max positions))",
     true},
};

constexpr ParamSpec kWindowSpecs[] = {
    {"protocol", ParamKind::kString, 0, 0, false,
     "hf-stride, llama-cpp or all-tokens"},
    {"ctx", ParamKind::kInt, 2, kNoUpperBound, false,
     "Window length in tokens (default min(512, max_position_embeddings))",
     true},
    {"stride", ParamKind::kInt, 1, kNoUpperBound, false,
     "Window step (default ctx/2; llama-cpp: ctx)", true},
    {"max_windows", ParamKind::kInt, 1, kNoUpperBound, false,
     "Evaluate at most K windows (default all)", true},
    kAddBos,
    {"chunk_rows", ParamKind::kInt, 1, kNoUpperBound, false,
     "Logit rows computed at a time (memory: rows x vocab floats)"},
};

constexpr ParamSpec kPlacementSpecs[] = {
    {"device", ParamKind::kStrings, 0, 0, false,
     "Devices to plan on, repeatable: cpu[=SIZE] (default: this machine's "
     "RAM), cuda:N=SIZE (GPU N with SIZE usable: the plan places layers there "
     "and the job runs them on it), disk (weights streamed from the "
     "checkpoint)"},
    {"max_memory", ParamKind::kString, 0, 0, false,
     "Caps per device, accelerate's syntax: 0=38GiB,1=90GiB,cpu=50GiB; a key "
     "names a device --device gave, or, with no GPU given there, declares "
     "cuda:0..N-1 with that capacity"},
    {"reserve", ParamKind::kString, 0, 0, false,
     "Bytes kept free: SIZE for every device, or cuda:0=2GiB,cpu=4GiB"},
    {"offload", ParamKind::kBool, 0, 0, false,
     "Layers placed on the host run on the last GPU, their weights streamed "
     "from pinned host memory, two layers' buffers on that GPU"},
    {"show_plan", ParamKind::kBool, 0, 0, false,
     "Print the memory plan (stderr) before running"},
    {"verify_plan", ParamKind::kBool, 0, 0, false,
     "After the run, compare resident memory with the plan"},
};

constexpr ParamSpec kCaptureSpecs[] = {
    {"hooks", ParamKind::kStrings, 0, 0, false,
     "Hook names, comma-separated or repeated: blocks.12.hook_resid_post, "
     "blocks.{0.5}.hook_resid_post, blocks.-1.…, blocks.*.…, "
     "ln_final.hook_normalized, logits, or a bare site (hook_resid_post) "
     "with --layers",
     false, true},
    {"layers", ParamKind::kStrings, 0, 0, false,
     "Layers for bare hook sites: indices, negative indices, fractions or * "
     "(0,12,-1 or 0.25,0.5,1.0)",
     false, true},
    {"select", ParamKind::kStrings, 0, 0, false,
     "Row selectors: last, first, mean, max, all, pos:I[,J…], span:A:B"},
    {"precision", ParamKind::kString, 0, 0, false,
     "Compute precision: auto, f32, bf16 or f16"},
};

// Top-k widths: feature and token ids travel as exact f32 integers.
constexpr double kMaxTopK = 1 << 24;

constexpr ParamSpec kLensGridSpecs[] = {
    {"topk", ParamKind::kInt, 1, kNoUpperBound, false,
     "Tokens per cell: the lens's K largest logits (at most the "
     "vocabulary)"},
    {"kl", ParamKind::kBool, 0, 0, false,
     "Also KL(final || lens) per hook and position, in nats (kl_to_final; "
     "the grid then holds the last hook_resid_post)"},
};

constexpr ParamSpec kAnalysisSpecs[] = {
    {"sae", ParamKind::kStrings, 0, 0, false,
     "An SAE or transcoder as published (SAELens, sparsify, Gemma Scope "
     "1/2 folder or file), @HOOK when the format names no hook; its "
     "HOOK.hook_sae_acts_post, .hook_sae_recons, .hook_sae_error, ... are "
     "then hooks (repeatable; docs/saes.md)"},
    {"sae_topk", ParamKind::kInt, 1, kMaxTopK, false,
     "Per token, each SAE's K largest features: "
     "HOOK.hook_sae_acts_post.topk_indices (int32) and .topk_values",
     true},
    {"lens", ParamKind::kString, 0, 0, false,
     "logit or tuned:FILE (a tuned-lens folder, params.pt or "
     "params.safetensors): HOOK.hook_lens_logits is then a hook at every "
     "residual hook"},
    {"lens_topk", ParamKind::kInt, 1, kMaxTopK, false,
     "Per token, the lens's K largest logits at each residual hook asked: "
     "HOOK.lens_topk_ids (int32) and HOOK.lens_topk_values, without the "
     "vocabulary-wide array",
     true},
    {"sae_dashboard", ParamKind::kInt, 1, 4096, false,
     "Per feature of each SAE over the whole job: firing count, max, sum and "
     "the N top (row, position, value) contexts, in "
     "HOOK.hook_sae_acts_post.dashboard.safetensors (resumable)",
     true},
};

constexpr ParamSpec kModelSpecs[] = {
    {"model", ParamKind::kString, 0, 0, false, "Hugging Face model directory"},
    {"threads", ParamKind::kInt, 0, kMaxThreads, false,
     "CPU threads (0 = all cores, the default)"},
    {"hf_bf16", ParamKind::kBool, 0, 0, false,
     "With bf16 compute, round activations to bf16 where Hugging Face's bf16 "
     "forward does (reproduces HF's bf16 numbers); default: f32 activations, "
     "closer to f32"},
};

constexpr ParamSpec kInterventionSpecs[] = {
    {"interventions", ParamKind::kString, 0, 0, false,
     "Interventions applied inside the forward: a list of objects "
     "(steering, ablation, patching; docs/interventions.md)"},
    {"intervene", ParamKind::kString, 0, 0, false,
     "JSON file of interventions applied inside the forward (steering, "
     "ablation; docs/interventions.md)"},
    {"steer", ParamKind::kStrings, 0, 0, false,
     "HOOK=VECTOR.npy*SCALE[@POSITIONS]: add SCALE times the vector at HOOK "
     "(POSITIONS all, last or 1,3,-1; default all); repeatable"},
    {"ablate_direction", ParamKind::kStrings, 0, 0, false,
     "HOOK=DIRECTION.npy: project the unit direction out of HOOK at every "
     "position; repeatable"},
    {"control_vector", ParamKind::kStrings, 0, 0, false,
     "llama.cpp control vector (GGUF, tensors direction.N added to the "
     "output of layer N); repeatable, summed"},
    {"control_vector_scaled", ParamKind::kStrings, 0, 0, false,
     "FILE SCALE: a control vector times SCALE; repeatable, summed with "
     "--control-vector's"},
    {"control_vector_layer_range", ParamKind::kStrings, 0, 0, false,
     "A B: apply the control vectors to layers A..B only (inclusive; A <= 0: "
     "1, B <= 0: the last layer)"},
};

const ParamSpec& SpecNamed(std::span<const ParamSpec> specs,
                           std::string_view group, std::string_view name) {
  for (const ParamSpec& s : specs)
    if (s.name == name) return s;
  LOOM_CHECK(false) << "no " << group << " parameter " << name;
  return specs[0];
}

// The specs bound in order to `targets` (one each).
std::vector<ParamField> Bind(std::span<const ParamSpec> specs,
                             std::initializer_list<ParamTarget> targets) {
  LOOM_CHECK_EQ(specs.size(), targets.size());
  std::vector<ParamField> fields;
  const ParamTarget* t = targets.begin();
  for (const ParamSpec& spec : specs) fields.push_back({&spec, *t++, {}});
  return fields;
}

}  // namespace

std::string ParamFlag(const ParamSpec& spec) {
  std::string flag = "--" + std::string(spec.name);
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

std::string ParamRangeText(const ParamField& f) {
  const ParamSpec& s = *f.spec;
  const bool open = f.upper() >= kNoUpperBound;
  switch (s.kind) {
    case ParamKind::kInt:
      return (open ? "an integer >= " + BoundText(s.lo)
                   : "an integer in [" + BoundText(s.lo) + ", " +
                         BoundText(f.upper()) + "]") +
             (s.zero_is_default ? ", or 0 (the default)" : "");
    case ParamKind::kSeed:
      return "an integer in [0, " +
             std::to_string(std::numeric_limits<uint64_t>::max()) + "]";
    case ParamKind::kFloat:
      return std::string("a number in ") + (s.lo_open ? "(" : "[") +
             BoundText(s.lo) + ", " + BoundText(f.upper()) + "]";
    case ParamKind::kString:
      return "a string";
    case ParamKind::kStrings:
      return "a string or a list of strings";
    case ParamKind::kBool:
      return "true or false";
  }
  return "";
}

bool InParamRange(const ParamField& f, double v) {
  const ParamSpec& s = *f.spec;
  if (!std::isfinite(v)) return false;
  if (s.kind == ParamKind::kSeed) return v >= 0;
  if (s.zero_is_default && v == 0) return true;
  return (s.lo_open ? v > s.lo : v >= s.lo) && v <= f.upper();
}

ParamField* FindParam(std::span<ParamField> fields, std::string_view name) {
  for (ParamField& f : fields)
    if (f.spec->name == name) return &f;
  return nullptr;
}

std::span<const ParamSpec> GenerationParamSpecs() { return kGenerationSpecs; }

std::vector<ParamField> GenerationParams(int64_t* max_tokens,
                                         SamplingOptions* sampling,
                                         std::vector<std::string>* stop) {
  return Bind(kGenerationSpecs,
              {max_tokens, &sampling->temperature, &sampling->top_k,
               &sampling->top_p, &sampling->seed, stop});
}

std::span<const ParamSpec> WindowParamSpecs() { return kWindowSpecs; }

std::vector<ParamField> WindowParamFields(WindowParams* p) {
  return Bind(kWindowSpecs, {&p->protocol, &p->ctx, &p->stride, &p->max_windows,
                             &p->add_bos, &p->chunk_rows});
}

const ParamSpec& WindowParam(std::string_view name) {
  return SpecNamed(kWindowSpecs, "window", name);
}

std::span<const ParamSpec> ExtractRowParamSpecs() { return kExtractRowSpecs; }

std::vector<ParamField> ExtractRowParamFields(ExtractRowParams* p) {
  return Bind(kExtractRowSpecs,
              {&p->add_bos, &p->batch_tokens, &p->commit_every, &p->on_error,
               &p->streaming_chunk_size, &p->max_row_tokens});
}

std::span<const ParamSpec> AnalysisParamSpecs() { return kAnalysisSpecs; }

std::span<const ParamSpec> LensGridParamSpecs() { return kLensGridSpecs; }

std::vector<ParamField> LensGridParams(int64_t* topk, bool* kl) {
  return Bind(kLensGridSpecs, {topk, kl});
}

std::vector<ParamField> AnalysisParamFields(AnalysisParams* p) {
  return Bind(kAnalysisSpecs, {&p->sae, &p->sae_topk, &p->lens, &p->lens_topk,
                               &p->sae_dashboard});
}

std::span<const ParamSpec> PlacementParamSpecs() { return kPlacementSpecs; }

std::vector<ParamField> PlacementParamFields(JobPlanOptions* p) {
  return Bind(kPlacementSpecs, {&p->devices, &p->max_memory, &p->reserve,
                                &p->offload, &p->show_plan, &p->verify_plan});
}

std::span<const ParamSpec> CaptureParamSpecs() { return kCaptureSpecs; }

const ParamSpec& CaptureParam(std::string_view name) {
  return SpecNamed(kCaptureSpecs, "capture", name);
}

std::span<const ParamSpec> ModelParamSpecs() { return kModelSpecs; }

const ParamSpec& ModelParam(std::string_view name) {
  return SpecNamed(kModelSpecs, "model", name);
}

std::span<const ParamSpec> InterventionParamSpecs() {
  return kInterventionSpecs;
}

const ParamSpec& InterventionParam(std::string_view name) {
  return SpecNamed(kInterventionSpecs, "intervention", name);
}

}  // namespace loom::eval
