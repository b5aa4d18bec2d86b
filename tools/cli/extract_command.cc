// loom extract --model DIR --input FILE --out DIR [options]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "src/backend/registry.h"
#include "src/eval/extract.h"
#include "src/eval/extract_manifest.h"
#include "src/eval/extract_merge.h"
#include "src/eval/shard.h"
#include "src/io/file_util.h"
#include "src/model/interventions.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/job_options.h"
#include "tools/cli/mpi_world.h"
#include "tools/cli/param_flags.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {

namespace {

struct ExtractCliOptions {
  ExtractOptions job;
  PlanFlags plan;
  std::string precision = "auto";
  // --add-bos ... --max-row-tokens, into the job in the callback.
  eval::ExtractRowParams rows;
  // Words parsed into the job's enums in the callback.
  std::string dtype;
  std::string format = "npy";
  std::string shard;  // "I/N" or "auto"
  InterventionFlags interventions;
  // --grad-of METRIC --answer A --wrong B
  std::string grad_of;
  int64_t answer = -1, wrong = -1;
  bool progress = false;
  bool quiet = false;
};

// The flags given as words, into the job's enums.
Status ParseWords(const ExtractCliOptions& opts, ExtractOptions* job) {
  ASSIGN_OR_RETURN(job->precision, ParsePrecision(opts.precision));
  RETURN_IF_ERROR(ApplyRowParams(opts.rows, job));
  ASSIGN_OR_RETURN(job->format, ParseOutputFormat(opts.format));
  if (!opts.dtype.empty()) {
    ASSIGN_OR_RETURN(job->dtype, ParseOutputDType(opts.dtype));
  }
  if (!opts.shard.empty() && opts.shard != "auto") {
    ASSIGN_OR_RETURN(job->shard, ParseShardSpec(opts.shard));
  }
  job->interventions_file = opts.interventions.file;
  ASSIGN_OR_RETURN(job->interventions_json,
                   ShorthandInterventions(opts.interventions.steer,
                                          opts.interventions.ablate));
  ASSIGN_OR_RETURN(job->control_vectors,
                   ControlVectorFlagFiles(opts.interventions));
  job->control_vector_layer_range = ControlVectorFlagRange(opts.interventions);
  ASSIGN_OR_RETURN(job->grad_of,
                   ParseGradOf(opts.grad_of, opts.answer, opts.wrong));
  return Status();
}

// The shard directories of `--shard auto` under `out`.
std::vector<std::string> ShardDirs(const std::string& out, int64_t count) {
  std::vector<std::string> dirs;
  for (int64_t i = 0; i < count; ++i)
    dirs.push_back(ShardDirOf(out, ShardSpec{i, count}));
  return dirs;
}

bool ShardComplete(const std::string& dir) {
  StatusOr<Manifest> m = Manifest::Load(dir + "/manifest.json");
  if (!m.ok()) return false;
  StatusOr<bool> complete = m->GetBool({"complete"});
  return complete.ok() && *complete;
}

// Without MPI: every rank, once its shard is complete, takes OUT/.lock in
// turn; the one that finds every shard complete merges (the last to
// finish), the others leave it to that one. A rank that finds the merged
// manifest there is done.
StatusOr<bool> MergeIfLast(const std::string& out, const ShardSpec& shard,
                           nlohmann::json* merged) {
  std::optional<FileLock> lock;
  for (;;) {
    StatusOr<FileLock> l = LockOutDir(out);
    if (l.ok()) {
      lock.emplace(std::move(l).value());
      break;
    }
    if (l.status().code() != StatusCode::kFailedPrecondition) return l.status();
    ::usleep(200 * 1000);  // another rank checks or merges
  }
  if (ShardComplete(out)) return false;  // merged by another rank
  for (const std::string& dir : ShardDirs(out, shard.count)) {
    if (!ShardComplete(dir)) return false;  // not the last one
    // Complete but still locked: its rank has written the final manifest and
    // not yet left the job; it comes here after this one and merges then.
    if (!LockOutDir(dir).ok()) return false;
  }
  StatusOr<MergeSummary> s =
      MergeExtractShards({.out_dir = out,
                          .shard_dirs = ShardDirs(out, shard.count),
                          .remove_shards = true,
                          .out_locked = true});
  if (!s.ok()) return s.status().WithContext("merging the shards into " + out);
  *merged = s->ToJson();
  return true;
}

// Warnings on stderr (with --quiet too) for a job whose outputs hold no
// activations: an empty input, or every row skipped.
void WarnAboutRows(const ExtractSummary& s, const std::string& out) {
  if (!s.complete) return;
  if (s.rows == 0)
    std::fprintf(stderr,
                 "loom extract: warning: the input held no rows; %s holds "
                 "empty arrays\n",
                 out.c_str());
  else if (s.rows_skipped == s.rows)
    std::fprintf(stderr,
                 "loom extract: warning: every row (%lld) was skipped "
                 "(--on-error skip); the reasons are in %s/manifest.json "
                 "\"rows\"\n",
                 static_cast<long long>(s.rows), out.c_str());
}

// --shard auto: the rank and world size from the launcher's environment;
// this rank's shard goes to OUT/shards/shard-I-of-N, then the shards are
// merged into OUT (by rank 0 after an MPI barrier, else by the last rank to
// finish). `job.out_dir` is OUT.
int RunAutoShard(ExtractOptions job, bool quiet) {
  StatusOr<LauncherEnv> env = DetectLauncher();
  if (!env.ok()) return ReportStatus("extract", env.status());
  const std::string out = job.out_dir;
  job.shard = env->shard;
  job.out_dir = ShardDirOf(out, job.shard);
  // One GPU per rank, by its local rank; on the CPU, the node's cores
  // shared between its ranks.
  if (job.plan.devices.empty()) {
    std::string why;
    const std::vector<GpuDescription> gpus = ListGpus(&why);
    if (!gpus.empty())
      job.plan.devices = {
          "cuda:" +
          std::to_string(env->local_rank % static_cast<int64_t>(gpus.size()))};
  }
  if (job.threads == 0 && job.plan.devices.empty() && env->local_size > 1)
    job.threads = std::max<int>(
        1, static_cast<int>(std::thread::hardware_concurrency() /
                            static_cast<unsigned>(env->local_size)));
  if (!quiet)
    std::fprintf(stderr, "loom extract: %s rank %s (%s) -> %s%s\n",
                 env->launcher.c_str(), job.shard.ToString().c_str(),
                 env->source.c_str(), job.out_dir.c_str(),
                 job.plan.devices.empty()
                     ? ""
                     : (" on " + job.plan.devices.front()).c_str());
  std::optional<MpiWorld> mpi;
  if (env->mpi && MpiWorld::Available()) {
    StatusOr<MpiWorld> w = MpiWorld::Init();
    if (!w.ok()) return ReportStatus("extract", w.status());
    mpi.emplace(std::move(w).value());
    if (mpi->rank() != job.shard.index || mpi->size() != job.shard.count)
      return ReportStatus(
          "extract",
          InternalError("--shard auto: MPI says rank " +
                        std::to_string(mpi->rank()) + " of " +
                        std::to_string(mpi->size()) +
                        ", the "
                        "environment " +
                        job.shard.ToString() + " (" + env->source + ")"));
  }
  // Already merged (a --resume after the end): nothing to do.
  Status status;
  if (ShardComplete(out)) {
    if (!job.resume)
      status = FailedPreconditionError(
          "--out " + out +
          " already holds a job (manifest.json); use --resume to continue it "
          "or choose another directory (nothing was overwritten)");
  } else {
    // A rank that never started has nothing to resume: it starts.
    std::error_code ec;
    if (job.resume &&
        !std::filesystem::exists(job.out_dir + "/manifest.json", ec))
      job.resume = false;
    std::filesystem::create_directories(job.out_dir, ec);
    StatusOr<ExtractSummary> s = RunExtract(job);
    status = s.status();
    if (s.ok() && !quiet) {
      nlohmann::json j = s->ToJson();
      j["out"] = job.out_dir;
      j["shard"] = job.shard.ToString();
      std::printf("%s\n", j.dump(2).c_str());
    }
    if (s.ok()) WarnAboutRows(*s, job.out_dir);
  }
  nlohmann::json merged;
  if (mpi) {
    // The barrier: rank 0 merges only when every rank's shard is complete.
    StatusOr<bool> all = mpi->AllSucceeded(status.ok());
    Status merge = all.status();
    if (all.ok() && mpi->rank() == 0) {
      if (!*all) {
        merge = status.ok() ? FailedPreconditionError(
                                  "another rank failed; its shard under " +
                                  out + "/shards is kept: rerun with --resume")
                            : status;
      } else if (!ShardComplete(out)) {
        StatusOr<MergeSummary> m =
            MergeExtractShards({.out_dir = out,
                                .shard_dirs = ShardDirs(out, job.shard.count),
                                .remove_shards = true});
        merge = m.status().WithContext("merging the shards into " + out);
        if (m.ok()) merged = m->ToJson();
      }
    }
    const Status shared = mpi->Share(merge);
    if (!status.ok()) return ReportStatus("extract", status);
    if (!shared.ok()) return ReportStatus("extract", shared);
  } else {
    if (!status.ok()) return ReportStatus("extract", status);
    StatusOr<bool> did = MergeIfLast(out, job.shard, &merged);
    if (!did.ok()) return ReportStatus("extract", did.status());
  }
  if (!merged.is_null() && !quiet) {
    merged["out"] = out;
    std::printf("%s\n", merged.dump(2).c_str());
  }
  return 0;
}

}  // namespace

void AddExtractCommand(CLI::App& app, int* exit_code) {
  using Options = ExtractCliOptions;
  auto opts = std::make_shared<Options>();
  ExtractOptions& j = opts->job;
  CLI::App* cmd = app.add_subcommand(
      "extract",
      "Extract activations at hook points for every prompt of an input file");
  AddModelFlag(*cmd, &j.model_dir)->required();
  cmd->add_option("--input", j.input_path,
                  "JSONL rows {\"id\":…, \"text\":…} or {\"id\":…, "
                  "\"tokens\":[…]}, or plain text (one prompt per line)")
      ->required();
  cmd->add_option(
         "--out", j.out_dir,
         "Output directory (manifest.json + one .npy per hook x selector)")
      ->required();
  AddHookFlags(*cmd, &j.hooks, &j.layers)->required();
  AddSelectFlag(*cmd, &j.selectors,
                "Selectors: last, first, mean, max, all, pos:I[,J…], "
                "span:A:B (repeatable)");
  cmd->add_option("--template", j.template_text,
                  "Wrap each text prompt: \"…{text}…\"");
  cmd->add_option("--dtype", opts->dtype,
                  "Output dtype f32, bf16 or f16 (default: the compute dtype)");
  cmd->add_option("--format", opts->format, "npy or safetensors")
      ->capture_default_str();
  AddPrecisionFlag(*cmd, &opts->precision);
  AddThreadsFlag(*cmd, &j.threads);
  AddParamFlags(*cmd, eval::ExtractRowParamFields(&opts->rows));
  cmd->add_option(
      "--shard", opts->shard,
      "I/N: run the commit windows w with w mod N == I (an output of its own; "
      "join the N outputs with `loom merge`); auto: I and N from mpirun, "
      "srun, sbatch --array or torchrun, shards under OUT/shards, merged into "
      "OUT");
  cmd->add_flag(
      "--resume", j.resume,
      "Continue an interrupted job in --out after its last committed row");
  cmd->add_flag("--replace-invalid-utf8", j.replace_invalid_utf8,
                "Replace invalid UTF-8 in plain-text input with U+FFFD (as "
                "Python's errors='replace') "
                "instead of failing the row");
  AddPlanFlags(*cmd, &opts->plan, PlanFlagUse::kJobCommand);
  AddHfBf16Flag(*cmd, &j.hf_bf16_activations);
  AddInterventionFlags(*cmd, &opts->interventions);
  AddParamFlags(*cmd, eval::AnalysisParamFields(&j.analysis));
  cmd->add_option("--grad-of", opts->grad_of,
                  "logit-diff (with --answer A --wrong B) or logprob: "
                  "HOOK.grad (d metric / d HOOK, each row's backward at f32) "
                  "is then a hook (docs/attribution.md)");
  cmd->add_option("--answer", opts->answer,
                  "--grad-of logit-diff: the answer token id A")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  cmd->add_option("--wrong", opts->wrong,
                  "--grad-of logit-diff: the wrong token id B")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  cmd->add_flag("--progress", opts->progress,
                "Progress on stderr even when it is not a terminal");
  cmd->add_flag("--quiet", opts->quiet,
                "No progress and no summary (warnings are still printed)")
      ->excludes("--progress");
  cmd->callback([opts, exit_code] {
    ExtractOptions job = opts->job;
    job.plan = opts->plan;  // the JobPlanOptions part
    if (Status st = ParseWords(*opts, &job); !st.ok()) {
      *exit_code = ReportStatus("extract", st);
      return;
    }
    const bool show = !opts->quiet &&
                      (opts->progress || ::isatty(STDERR_FILENO)) &&
                      opts->shard != "auto";
    if (opts->shard == "auto") {
      *exit_code = RunAutoShard(job, opts->quiet);
      return;
    }
    if (show) {
      // ETA from the share of the input read (after a --resume it counts
      // the rows done before as if this run had read them).
      job.progress = [](int64_t rows, int64_t tokens, double secs,
                        double fraction) {
        const double eta =
            fraction > 0 ? secs * (1.0 - fraction) / fraction : 0.0;
        std::fprintf(stderr,
                     "\rloom extract: %lld rows, %.0f%% of the input, "
                     "%.0f tokens/s, ETA %.0fs   ",
                     static_cast<long long>(rows), 100.0 * fraction,
                     secs > 0 ? static_cast<double>(tokens) / secs : 0.0, eta);
        std::fflush(stderr);
      };
    }
    StatusOr<ExtractSummary> s = RunExtract(job);
    if (show) std::fprintf(stderr, "\n");
    if (!s.ok()) {
      *exit_code = ReportStatus("extract", s.status());
      return;
    }
    if (!opts->quiet) {
      nlohmann::json out = s->ToJson();
      out["out"] = job.out_dir;
      std::printf("%s\n", out.dump(2).c_str());
    }
    WarnAboutRows(*s, job.out_dir);
  });
}

}  // namespace loom::cli
