// `loom compare --model A --reference B (--text FILE | --tokens FILE)
//  [--protocol P] [--ctx N] [--stride S] [--max-windows K] [--drift] [--json]`:
// KL(B || A) and llama.cpp's statistics over the same windows, without a
// logits file; with --drift, per-layer divergence of hook_resid_post.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "src/base/progress.h"
#include "src/base/units.h"
#include "src/eval/compare.h"
#include "src/eval/job_plan.h"
#include "src/eval/input.h"
#include "src/model/registry.h"
#include "src/runtime/memory_stats.h"
#include "src/runtime/model.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/job_options.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

struct CompareArgs : WindowArgs {
  std::string model_dir, reference_dir;
  std::string precision = "auto", reference_precision = "auto";
  bool drift = false;
  std::string reference_logprobs;  // saved reference instead of --reference
  std::string save_reference;      // write the reference's top-k log-probs here
  int64_t top_k = 32;
  bool same_tokens = false;         // skip the tokenizer check (--tokens only)
  InterventionFlags interventions;  // applied to --model only
};

nlohmann::json Number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// The options that need nothing read: InvalidArgument naming them.
Status CheckCompareArgs(const CompareArgs& args, bool saved) {
  if (saved == !args.reference_dir.empty())
    return InvalidArgumentError(
        "give exactly one of --reference MODEL_DIR and --reference-logprobs "
        "DIR");
  if (saved && !args.save_reference.empty())
    return InvalidArgumentError(
        "--save-reference needs the reference model (--reference)");
  if (args.same_tokens && args.tokens_file.empty())
    return InvalidArgumentError(
        "--same-tokens needs --tokens: text goes through one tokenizer, "
        "which the other model may not share");
  return Status();
}

// The models of a comparison: the candidate A (with the interventions) and,
// unless the reference is saved log-probs, the reference B.
struct CompareSessions {
  std::unique_ptr<Session> a, b;  // b null with --reference-logprobs
  int64_t planned = 0;            // host bytes of both plans
};

// Both planned before either is loaded (they are resident together): refused
// when either, or both together, do not fit; then both loaded.
StatusOr<CompareSessions> OpenCompareSessions(const CompareArgs& args,
                                              bool saved) {
  CompareSessions m;
  const auto shape = [&](const Session& s) -> StatusOr<JobSpec> {
    return EvalJobOf(s.config(), args.ctx, args.chunk_rows);
  };
  ASSIGN_OR_RETURN(SessionParams sa,
                   CommandSession("compare", args.model_dir, args.precision,
                                  args.plan, args.threads, args.quiet));
  sa.speaker = "loom compare: " + args.model_dir;
  ASSIGN_OR_RETURN(sa.interventions, InterventionSourceOf(args.interventions));
  ASSIGN_OR_RETURN(m.a, Session::Prepare(sa, shape));
  m.planned = m.a->planned_host_bytes();
  if (!saved) {
    ASSIGN_OR_RETURN(
        SessionParams sb,
        CommandSession("compare", args.reference_dir, args.reference_precision,
                       args.plan, args.threads, args.quiet));
    sb.speaker = "loom compare: " + args.reference_dir;
    ASSIGN_OR_RETURN(m.b, Session::Prepare(sb, shape));
    m.planned += m.b->planned_host_bytes();
  }
  for (const DevicePlan& d : m.a->plan().devices)
    if (d.device.kind == DeviceKind::kCpu && m.planned > d.device.usable())
      return ResourceExhaustedError(
          "the two models together need " + FormatBytes(m.planned) + " on " +
          d.device.name + ", usable " + FormatBytes(d.device.usable()) +
          " (model " + FormatBytes(m.a->planned_host_bytes()) +
          " + reference " + FormatBytes(m.planned - m.a->planned_host_bytes()) +
          ")");
  RETURN_IF_ERROR(m.a->LoadWeights());
  if (m.b) RETURN_IF_ERROR(m.b->LoadWeights());
  return m;
}

// The token stream (tokenized by B's tokenizer unless --tokenizer) and its
// windows, checked against both models.
StatusOr<std::pair<eval::EvalInput, eval::WindowPlan>> CompareInput(
    const CompareArgs& args, const ModelConfig& ca, const ModelConfig& cb,
    bool saved) {
  ASSIGN_OR_RETURN(eval::Protocol protocol, eval::ParseProtocol(args.protocol));
  ASSIGN_OR_RETURN(eval::AddBos add_bos, eval::ParseAddBos(args.add_bos));
  if (ca.vocab_size != cb.vocab_size)
    return InvalidArgumentError(
        "model " + args.model_dir + " has a vocabulary of " +
        std::to_string(ca.vocab_size) + " tokens but the reference " +
        args.reference_dir + " has " + std::to_string(cb.vocab_size) +
        "; KL needs the same vocabulary");
  eval::InputOptions io{args.text_file, args.tokens_file,
                        args.tokenizer_dir.empty()
                            ? (saved ? args.model_dir : args.reference_dir)
                            : args.tokenizer_dir,
                        add_bos};
  ASSIGN_OR_RETURN(eval::EvalInput input, eval::LoadEvalInput(io, cb));
  const int64_t max_ctx =
      std::min(ca.max_position_embeddings, cb.max_position_embeddings);
  const int64_t ctx = args.ctx > 0 ? args.ctx
                                   : std::min(DefaultContext(ca, kEvalContext),
                                              DefaultContext(cb, kEvalContext));
  if (ctx > max_ctx)
    return OutOfRangeError(
        "--ctx " + std::to_string(ctx) + " exceeds the maximum context " +
        std::to_string(max_ctx) + " (max_position_embeddings of " +
        (ca.max_position_embeddings < cb.max_position_embeddings
             ? args.model_dir
             : args.reference_dir) +
        ")");
  ASSIGN_OR_RETURN(
      eval::WindowPlan plan,
      eval::PlanWindows(static_cast<int64_t>(input.ids.size()),
                        eval::MakeWindowOptions(protocol, ctx, args.stride,
                                                args.max_windows, input)));
  return std::make_pair(std::move(input), std::move(plan));
}

// --json's object.
nlohmann::json CompareJson(const CompareArgs& args, const CompareSessions& m,
                           const eval::EvalInput& input,
                           const eval::CompareResult& r) {
  const bool saved = m.b == nullptr;
  nlohmann::json j = {
      {"model", args.model_dir},
      {"reference", saved ? args.reference_logprobs : args.reference_dir},
      {"precision", std::string(DTypeName(m.a->model().compute_dtype()))},
      {"reference_precision",
       saved ? std::string("saved")
             : std::string(DTypeName(m.b->model().compute_dtype()))},
      {"protocol", std::string(eval::ProtocolName(r.protocol))},
      {"ctx", r.ctx},
      {"stride", r.stride},
      {"bos", input.bos},
      {"windows", r.windows},
      {"tokens_scored", r.tokens_scored},
      {"tokens_evaluated", r.tokens_evaluated},
      {"seconds", r.seconds},
      {"ppl", r.ppl_a},
      {"ppl_reference", r.ppl_b},
      {"ln_ppl_ratio", r.ln_ppl_ratio.value},
      {"ln_ppl_ratio_uncertainty", r.ln_ppl_ratio.uncertainty},
      {"ppl_diff", r.ppl_diff.value},
      {"ppl_diff_uncertainty", r.ppl_diff.uncertainty},
      {"kl_mean", r.kl.value},
      {"kl_uncertainty", r.kl.uncertainty},
      {"kl_median", r.kl_median},
      {"kl_p90", r.kl_p90},
      {"kl_p95", r.kl_p95},
      {"kl_p99", r.kl_p99},
      {"kl_max", r.kl_max},
      {"same_top1", r.same_top1.value},
      {"same_top1_uncertainty", r.same_top1.uncertainty},
      {"delta_p_mean", r.delta_p.value},
      {"delta_p_uncertainty", r.delta_p.uncertainty},
      {"rms_delta_p", r.rms_delta_p.value},
      {"rms_delta_p_uncertainty", r.rms_delta_p.uncertainty},
      {"prob_pearson", r.prob_pearson}};
  if (!m.a->interventions().empty())
    j["interventions"] = InterventionsJson(m.a->interventions());
  if (args.drift) {
    nlohmann::json d = nlohmann::json::array();
    for (const auto& l : r.drift)
      d.push_back(
          {{"hook", "blocks." + std::to_string(l.layer) + ".hook_resid_post"},
           {"layer", l.layer},
           {"rel_frobenius", l.rel_frobenius},
           {"cosine", l.cosine},
           {"sqnr_db", Number(l.sqnr_db)}});
    j["drift"] = std::move(d);
  }
  return j;
}

// The report in llama.cpp's layout.
void PrintCompare(const CompareArgs& args, const CompareSessions& m,
                  const eval::EvalInput& input, const eval::CompareResult& r) {
  const bool saved = m.b == nullptr;
  std::printf("model        %s (%s)\n", args.model_dir.c_str(),
              std::string(DTypeName(m.a->model().compute_dtype())).c_str());
  std::printf(
      "reference    %s (%s)\n",
      (saved ? args.reference_logprobs : args.reference_dir).c_str(),
      saved ? "saved top-k log-probs"
            : std::string(DTypeName(m.b->model().compute_dtype())).c_str());
  if (!m.a->interventions().empty())
    std::printf("interventions %s (on the model)\n",
                InterventionsSummary(m.a->interventions()).c_str());
  std::printf("input        %s: %zu tokens%s\n", input.source.c_str(),
              input.ids.size(), input.bos ? ", BOS at the start" : ", no BOS");
  std::printf(
      "protocol     %s, ctx %lld, stride %lld, %lld windows, %lld tokens "
      "scored, %.2f s\n\n",
      std::string(eval::ProtocolName(r.protocol)).c_str(),
      static_cast<long long>(r.ctx), static_cast<long long>(r.stride),
      static_cast<long long>(r.windows),
      static_cast<long long>(r.tokens_scored), r.seconds);
  std::printf("====== Perplexity ======\n");
  std::printf("PPL(A)                 : %.6f\n", r.ppl_a);
  std::printf("PPL(B)                 : %.6f\n", r.ppl_b);
  std::printf("ln(PPL(A)/PPL(B))      : %.6f ± %.6f\n", r.ln_ppl_ratio.value,
              r.ln_ppl_ratio.uncertainty);
  std::printf("PPL(A) - PPL(B)        : %.6f ± %.6f\n", r.ppl_diff.value,
              r.ppl_diff.uncertainty);
  std::printf("Cor(p_A, p_B)          : %.4f %%\n", 100 * r.prob_pearson);
  std::printf("====== KL divergence KL(B || A), nats ======\n");
  std::printf("Mean                   : %.6f ± %.6f\n", r.kl.value,
              r.kl.uncertainty);
  std::printf("Maximum                : %.6f\n", r.kl_max);
  std::printf("99.0%%                  : %.6f\n", r.kl_p99);
  std::printf("95.0%%                  : %.6f\n", r.kl_p95);
  std::printf("90.0%%                  : %.6f\n", r.kl_p90);
  std::printf("Median                 : %.6f\n", r.kl_median);
  std::printf("====== Correct-token probability ======\n");
  std::printf("Mean Δp (A - B)        : %.4f ± %.4f %%\n",
              100 * r.delta_p.value, 100 * r.delta_p.uncertainty);
  std::printf("RMS Δp                 : %.4f ± %.4f %%\n",
              100 * r.rms_delta_p.value, 100 * r.rms_delta_p.uncertainty);
  std::printf("Same top-1             : %.4f ± %.4f %%\n",
              100 * r.same_top1.value, 100 * r.same_top1.uncertainty);
  if (args.drift) {
    std::printf("====== Drift of hook_resid_post (A vs B) ======\n");
    std::printf("%-28s %14s %14s %10s\n", "hook", "rel. Frobenius", "cosine",
                "SQNR dB");
    for (const auto& l : r.drift)
      std::printf(
          "%-28s %14.6g %14.10f %10.2f\n",
          ("blocks." + std::to_string(l.layer) + ".hook_resid_post").c_str(),
          l.rel_frobenius, l.cosine, l.sqnr_db);
  }
}

Status RunCompare(const CompareArgs& args) {
  const bool saved = !args.reference_logprobs.empty();
  RETURN_IF_ERROR(CheckCompareArgs(args, saved));
  // A live comparison reads one token stream with both models: refused when
  // their tokenizers differ (the saved reference records its ids instead).
  if (!saved && !args.same_tokens)
    RETURN_IF_ERROR(
        eval::CheckSameTokenizer(args.model_dir, args.reference_dir));
  ASSIGN_OR_RETURN(CompareSessions m, OpenCompareSessions(args, saved));
  const ModelConfig& ca = m.a->config();
  ASSIGN_OR_RETURN(auto input,
                   CompareInput(args, ca, saved ? ca : m.b->config(), saved));
  eval::CompareOptions o;
  o.interventions = &m.a->interventions();
  o.segments = m.a->segments();
  if (m.b) o.reference_segments = m.b->segments();
  o.logits_chunk_rows = args.chunk_rows;
  o.drift = args.drift;
  o.hf_bf16_activations = args.hf_bf16;
  o.progress =
      MakeProgressBar(!args.quiet && StderrIsTerminal(), "compare", "windows");
  o.save_reference_dir = args.save_reference;
  o.top_k = args.top_k;
  eval::CompareResult r;
  if (saved) {
    ASSIGN_OR_RETURN(r, eval::CompareWithSavedReference(
                            m.a->model(), input.first.ids, input.second,
                            args.reference_logprobs, o));
  } else {
    ASSIGN_OR_RETURN(r, eval::CompareModels(m.a->model(), m.b->model(),
                                            input.first.ids, input.second, o));
  }
  if (args.plan.verify_plan) {
    const nlohmann::json v =
        VerifyPlan(m.planned, m.a->rss_watch(), "loom compare");
    std::fprintf(stderr, "loom compare: verify-plan: %s\n", v.dump().c_str());
  }
  if (args.json) {
    std::cout << CompareJson(args, m, input.first, r).dump(2) << "\n";
  } else {
    PrintCompare(args, m, input.first, r);
  }
  return Status::Ok();
}

}  // namespace

void AddCompareCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand("compare",
                                     "KL divergence and perplexity of a model "
                                     "against a reference, window by window");
  AddModelFlag(*cmd, &args->model_dir, "Model A under test (e.g. quantized)")
      ->required();
  cmd->add_option("--reference", args->reference_dir, "Reference model B");
  cmd->add_option("--reference-logprobs", args->reference_logprobs,
                  "Instead of --reference: top-k log-probs saved by "
                  "--save-reference (KL over the top-k plus "
                  "one bucket for the rest: a lower bound)");
  cmd->add_option("--save-reference", args->save_reference,
                  "Write B's top-k log-probs per scored token to this "
                  "directory for later runs");
  cmd->add_flag("--same-tokens", args->same_tokens,
                "With --tokens: compare even though the two tokenizers differ "
                "or are missing (you vouch that both models read the ids "
                "alike)");
  cmd->add_option("--top-k", args->top_k,
                  "Log-probs kept per token by --save-reference (at most the "
                  "vocabulary)")
      ->capture_default_str()
      ->check(IntRange(1));
  AddWindowOptions(cmd, args.get(), "--reference");
  AddInterventionFlags(*cmd, &args->interventions);
  AddPrecisionFlag(*cmd, &args->precision, "A");
  cmd->add_option("--reference-precision", args->reference_precision,
                  "Precision of B: auto, f32, bf16 or f16");
  cmd->add_flag("--drift", args->drift,
                "Per-layer divergence of hook_resid_post (relative Frobenius, "
                "cosine, SQNR)");
  cmd->callback([args, exit_code] {
    *exit_code = ReportStatus("compare", RunCompare(*args));
  });
}

}  // namespace loom::cli
