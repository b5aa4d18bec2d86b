#include "src/eval/extract.h"

#include <openssl/evp.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "src/backend/registry.h"
#include "src/eval/extract_manifest.h"
#include "src/eval/extract_outputs.h"
#include "src/eval/extract_rows.h"
#include "src/eval/extract_run.h"
#include "src/io/file_util.h"
#include "src/model/hooks.h"
#include "src/runtime/executor.h"
#include "src/runtime/memory_stats.h"
#include "src/tokenizer/tokenizer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Hex(const unsigned char* d, unsigned n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) s += {k[d[i] >> 4], k[d[i] & 15]};
  return s;
}

StatusOr<std::string> Sha256File(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    std::string message = path + ": cannot open: " + std::strerror(errno);
    return errno == ENOENT ? NotFoundError(std::move(message))
                           : IoError(std::move(message));
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                              &EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0)
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) return IoError(path + ": read error: " + std::strerror(err));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return Hex(md, len);
}

// The job's commit state while it runs.
struct JobState {
  std::optional<Manifest> manifest;
  ManifestProgress progress;
  std::vector<std::string> files;
  int64_t input_bytes = 0;
  bool complete = false;
};

// manifest.json's "input" and "tokenizer" for a new job.
StatusOr<Json> InputJson(const std::string& input_path) {
  ASSIGN_OR_RETURN(std::string sha, Sha256File(input_path));
  ASSIGN_OR_RETURN(std::string path, AbsolutePath(input_path));
  ASSIGN_OR_RETURN(int64_t bytes, FileSize(input_path));
  return Json{{"path", path}, {"sha256", sha}, {"bytes", bytes}};
}

StatusOr<Json> TokenizerJson(const std::string& model_dir) {
  for (const char* f : {"tokenizer.json", "tokenizer.model"}) {
    std::error_code ec;
    if (!fs::exists(model_dir + "/" + f, ec)) continue;
    ASSIGN_OR_RETURN(std::string sha, Sha256File(model_dir + "/" + f));
    return Json{{"file", f}, {"sha256", sha}};
  }
  return Json{{"file", ""}};
}

}  // namespace

StatusOr<FileLock> LockOutDir(const std::string& out_dir) {
  const std::string path = out_dir + "/" + kLockFile;
  StatusOr<FileLock> lock = FileLock::Acquire(path);
  if (lock.ok()) return lock;
  if (lock.status().code() != StatusCode::kFailedPrecondition)
    return lock.status().WithContext("--out " + out_dir);
  return FailedPreconditionError(
      "--out " + out_dir + ": another loom process holds this directory (" +
      path + " is locked) and is writing a job there; wait for it to end or " +
      "choose another --out (nothing was changed)");
}

namespace {

// The lock for a new job: the input must exist (a missing one creates
// nothing), --out is created if needed.
// `*created`: --out did not exist before.
StatusOr<FileLock> LockForStart(const ExtractOptions& o, bool* created) {
  if (StatusOr<int64_t> size = FileSize(o.input_path); !size.ok())
    return size.status().WithContext("--input");
  std::error_code ec;
  *created = fs::create_directories(o.out_dir, ec);
  if (ec) return IoError("--out " + o.out_dir + ": " + ec.message());
  return LockOutDir(o.out_dir);
}

// Text rows need the tokenizer: refused at the start, before --out is
// touched, when the input's first row is text and the model has none.
Status CheckTokenizerForText(const ExtractOptions& o, const Session& session) {
  if (session.tokenizer() != nullptr) return Status();
  ASSIGN_OR_RETURN(std::unique_ptr<InputReader> reader,
                   InputReader::Open(o.input_path, 0, 0));
  InputRow row;
  ASSIGN_OR_RETURN(const bool got, reader->Next(&row, true));
  if (!got || row.has_tokens || !row.error.empty()) return Status();
  return FailedPreconditionError(
      "--input " + o.input_path + " holds text rows, but the model " +
      o.model_dir + " has no tokenizer (" + session.tokenizer_error() +
      "); give rows of token ids, {\"tokens\": [1, 2, ...]} per line of a "
      ".jsonl file, which need no tokenizer (nothing was written)");
}

// A new job that failed before its first commit: removes what it created
// (its arrays, rows.jsonl, manifest.json, the lock file, and --out itself
// when the job created it), so that the same command can run again.
// `error` gains a note saying so.
Status RollBackFreshJob(const ExtractOptions& o, const OutputSet& outputs,
                        bool created_dir, Status error) {
  std::vector<std::string> files = outputs.InitialFiles();
  for (const std::string& f : outputs.RaggedDataFiles()) files.push_back(f);
  for (const char* f : {"rows.jsonl", "manifest.json", kLockFile})
    files.push_back(f);
  std::error_code ec;
  for (const std::string& f : files) fs::remove(o.out_dir + "/" + f, ec);
  if (created_dir) fs::remove(o.out_dir, ec);  // only if now empty
  return Status(error.code(), std::string(error.message()) + " [--out " +
                                  o.out_dir +
                                  " was left as it was before this run]");
}

// The lock for --resume: --out must exist (it is never created).
StatusOr<FileLock> LockForResume(const ExtractOptions& o) {
  std::error_code ec;
  if (!fs::exists(o.out_dir, ec))
    return NotFoundError("--resume: --out " + o.out_dir +
                         " does not exist (nothing to resume)");
  return LockOutDir(o.out_dir);
}

// A new job in --out (locked): refused if one is there; creates the arrays,
// rows.jsonl and the first manifest.
StatusOr<JobState> StartJob(const ExtractOptions& o, Json settings,
                            OutputSet& outputs, RowsLog& rows_log) {
  const std::string manifest_path = o.out_dir + "/manifest.json";
  std::error_code ec;
  if (fs::exists(manifest_path, ec))
    return FailedPreconditionError(
        "--out " + o.out_dir +
        " already holds a job (manifest.json); use --resume to continue it or "
        "choose another directory (nothing was overwritten)");
  StatusOr<Json> input = InputJson(o.input_path);
  if (!input.ok()) return input.status().WithContext("--input");
  ASSIGN_OR_RETURN(Json tokenizer, TokenizerJson(o.model_dir));
  JobState state;
  state.input_bytes = (*input)["bytes"].get<int64_t>();
  state.files = outputs.InitialFiles();
  state.manifest =
      Manifest::Create(manifest_path, std::move(settings), *std::move(input),
                       std::move(tokenizer), outputs.ArraysJson(), state.files,
                       outputs.RaggedDataFiles());
  for (const std::string& f : outputs.RaggedDataFiles())
    state.progress.ragged_rows[f] = 0;
  RETURN_IF_ERROR(outputs.Create());
  RETURN_IF_ERROR(rows_log.Create());
  RETURN_IF_ERROR(state.manifest->Save());
  return state;
}

// --resume: the input must be the one the interrupted run read. Returns
// manifest.json's "input" for it as this run names it.
StatusOr<Json> CheckResumeInput(const Manifest& manifest,
                                const std::string& path, int64_t* input_bytes) {
  ASSIGN_OR_RETURN(*input_bytes, manifest.GetInt({"input", "bytes"}));
  ASSIGN_OR_RETURN(std::string sha, manifest.GetString({"input", "sha256"}));
  StatusOr<int64_t> size = FileSize(path);
  if (!size.ok()) return size.status().WithContext("--resume: input");
  if (*size != *input_bytes)
    return FailedPreconditionError(
        "--resume: input " + path + " has " + std::to_string(*size) +
        " bytes, the interrupted run read " + std::to_string(*input_bytes));
  ASSIGN_OR_RETURN(std::string now, Sha256File(path));
  if (now != sha)
    return FailedPreconditionError("--resume: input " + path +
                                   " changed: sha256 " + now +
                                   ", the interrupted run read " + sha);
  ASSIGN_OR_RETURN(std::string absolute, AbsolutePath(path));
  return Json{{"path", absolute}, {"sha256", sha}, {"bytes", *input_bytes}};
}

// --resume: the model's tokenizer must be the one the interrupted run used
// (its file and sha256; a model without one records none). Returns
// manifest.json's "tokenizer".
StatusOr<Json> CheckResumeTokenizer(const Manifest& manifest,
                                    const std::string& model_dir) {
  ASSIGN_OR_RETURN(const Json* recorded, manifest.GetObject({"tokenizer"}));
  ASSIGN_OR_RETURN(Json now, TokenizerJson(model_dir));
  if (*recorded == now) return now;
  auto describe = [](const Json& t) {
    const std::string file = t.contains("file") && t["file"].is_string()
                                 ? t["file"].get<std::string>()
                                 : "";
    if (file.empty()) return std::string("none");
    const std::string sha = t.contains("sha256") && t["sha256"].is_string()
                                ? t["sha256"].get<std::string>()
                                : "?";
    return file + " (sha256 " + sha + ")";
  };
  return FailedPreconditionError(
      "--resume: the tokenizer of " + model_dir + " is " + describe(now) +
      ", the interrupted run recorded " + describe(*recorded) +
      "; resume with the model it ran");
}

// --resume (--out locked): reads and checks everything (manifest, settings,
// input, committed files) before anything is written, then reopens the
// outputs at the commit.
// `fresh_batch_tokens` != 0: the budget a fresh run of this input would
// plan, which differs from the recorded one the settings were given.
StatusOr<JobState> ResumeJob(const ExtractOptions& o, const Json& settings,
                             int64_t fresh_batch_tokens, OutputSet& outputs,
                             RowsLog& rows_log) {
  const std::string manifest_path = o.out_dir + "/manifest.json";
  StatusOr<Manifest> loaded = Manifest::Load(manifest_path);
  if (!loaded.ok()) return loaded.status().WithContext("--resume");
  JobState state;
  state.manifest = std::move(loaded).value();
  const Manifest& m = *state.manifest;
  // Jobs started before streaming (or shards) existed ran with it off (on
  // the whole input).
  // --on-error may change: it decides only what happens to rows not yet
  // read (the error's own hint is --resume --on-error skip).
  Json compared = settings;
  compared.erase("on_error");
  RETURN_IF_ERROR(m.CheckSettings(compared, Json{{"streaming_chunk_size", 0},
                                                 {"max_row_tokens", 0},
                                                 {"shard", "0/1"}}));
  ASSIGN_OR_RETURN(state.progress, m.ReadProgress(outputs.RaggedDataFiles()));
  ASSIGN_OR_RETURN(Json input,
                   CheckResumeInput(m, o.input_path, &state.input_bytes));
  ASSIGN_OR_RETURN(Json tokenizer, CheckResumeTokenizer(m, o.model_dir));
  if (fresh_batch_tokens != 0) {
    const int64_t recorded = settings["batch_tokens"].get<int64_t>();
    return FailedPreconditionError(
        "--resume: setting 'batch_tokens' differs from the interrupted run (" +
        std::to_string(recorded) + " there, " +
        std::to_string(fresh_batch_tokens) +
        " now: this short input's own tokens); resume with --batch-tokens " +
        std::to_string(recorded));
  }
  ASSIGN_OR_RETURN(state.complete, m.GetBool({"complete"}));
  ASSIGN_OR_RETURN(state.files, m.GetStrings({"files"}));
  if (state.complete) return state;
  if (o.format == OutputFormat::kNpy && state.files != outputs.InitialFiles())
    return DataLossError(manifest_path +
                         ": field files does not list this job's arrays");
  RETURN_IF_ERROR(outputs.CheckCommitted(state.progress, state.files));
  // A shard's k-th window is window shard.Window(k) of the input, so its
  // line i records that window's row.
  const auto input_row = [&o](int64_t line) {
    return o.shard.InputRow(line, o.commit_every);
  };
  ASSIGN_OR_RETURN(state.progress.rows_file_crc32,
                   rows_log.CheckCommitted(state.progress, input_row));
  const ManifestProgress& p = state.progress;
  if (p.rows_committed > 0 &&
      p.input_rows !=
          o.shard.InputRow(p.rows_committed - 1, o.commit_every) + 1)
    return DataLossError(
        manifest_path + ": progress.input_rows is " +
        std::to_string(p.input_rows) + ", but the " +
        std::to_string(p.rows_committed) + " committed rows of shard " +
        o.shard.ToString() + " end at input row " +
        std::to_string(o.shard.InputRow(p.rows_committed - 1, o.commit_every) +
                       1));
  // From here on the manifest is the one this loom writes for the job: every
  // field checked above, or derived from this run (fuzz_resume found a
  // changed row_shape, then a changed tokenizer hash, carried through); only
  // the progress and the files come from the interrupted run.
  state.manifest = Manifest::Create(manifest_path, settings, std::move(input),
                                    std::move(tokenizer), outputs.ArraysJson(),
                                    state.files, outputs.RaggedDataFiles());
  state.manifest->SetProgress(state.progress);
  RETURN_IF_ERROR(outputs.Reopen(state.progress, state.files));
  RETURN_IF_ERROR(rows_log.Reopen(state.progress.rows_file_bytes));
  return state;
}

// The commit protocol: arrays, then rows.jsonl, then the manifest. Window
// `window_index` of the input; the reader is now at `input_offset`, before
// input row `input_rows`.
Status CommitWindow(const std::vector<PreparedRow>& window,
                    int64_t window_index, int64_t input_offset,
                    int64_t input_rows, OutputSet& outputs, RowsLog& rows_log,
                    JobState& state) {
  ManifestProgress& p = state.progress;
  const int64_t W = static_cast<int64_t>(window.size());
  const std::string records =
      RowsLog::Records(window, &p.rows_ok, &p.rows_skipped);
  RETURN_IF_ERROR(outputs.CommitArrays(W, window_index, window.front().index,
                                       &p, &state.files));
  ASSIGN_OR_RETURN(int64_t appended, rows_log.Append(records));
  LOOM_CHECK(p.rows_file_crc32.has_value()) << "set by StartJob / ResumeJob";
  p.rows_file_crc32 = RowsLog::Crc32(*p.rows_file_crc32, records);
  p.rows_file_bytes += appended;
  p.rows_committed += W;
  p.input_offset = input_offset;
  p.input_rows = input_rows;
  state.manifest->SetProgress(p);
  state.manifest->SetFiles(state.files);
  return state.manifest->Save();
}

void FillCounts(const JobState& state, ExtractSummary* summary) {
  summary->rows = state.progress.rows_committed;
  summary->rows_ok = state.progress.rows_ok;
  summary->rows_skipped = state.progress.rows_skipped;
  summary->files = state.files;
}

// The job is done: the per-row records join the manifest.
Status CompleteJob(const RowsLog& rows_log, JobState& state) {
  ASSIGN_OR_RETURN(Json rows, rows_log.ReadAll());
  state.manifest->MarkComplete(std::move(rows), state.progress.rows_committed);
  return state.manifest->Save();
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

StatusOr<HookSet> ResolveExtractHooks(const std::vector<std::string>& hooks,
                                      const std::vector<std::string>& layers,
                                      const ModelConfig& c, bool streaming) {
  ASSIGN_OR_RETURN(HookSet set, ResolveHooks(hooks, layers, c));
  for (const HookPoint& hp : set.hooks())
    if (hp.site == HookSite::kPattern && streaming)
      return UnimplementedError(
          "hook " + HookName(hp) +
          ": with --streaming-chunk-size a long row's attention runs chunk "
          "by chunk over the KV cache, so its pattern is never formed whole "
          "(extract attention patterns without --streaming-chunk-size, or "
          "request hook_z or hook_attn_out instead)");
  if (set.empty()) return InvalidArgumentError("no hooks requested (--hooks)");
  return set;
}

Json ExtractSummary::ToJson() const {
  Json j{{"rows", rows},
         {"rows_ok", rows_ok},
         {"rows_skipped", rows_skipped},
         {"tokens", tokens},
         {"seconds", seconds},
         {"tokens_per_second",
          seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0},
         {"rows_per_second",
          seconds > 0 ? static_cast<double>(rows_ok) / seconds : 0.0},
         {"hooks", resolved_hooks},
         {"files", files},
         {"complete", complete},
         {"planned_bytes", planned_bytes},
         {"verify_plan", verify_plan}};
  j["dtype"] = std::string(DTypeLongName(dtype));
  if (npy && dtype == DType::kBF16) j["storage"] = kBf16NpyStorage;
  return j;
}

// ---- The job ----------------------------------------------------------------

namespace {

// Everything a running job holds.
struct RunContext {
  const ExtractOptions& o;
  const ExtractSettings& settings;
  const Session& session;  // the model, the tokenizer, the plan's segments
  OutputSet& outputs;
  RowsLog& rows_log;
  JobState& state;
  Clock::time_point start;
};

// Reads, runs and commits windows until the input ends, or the test hook
// stops it (`*stopped`).
StatusOr<ExtractSummary> RunWindows(RunContext& ctx, bool* stopped) {
  const ExtractOptions& o = ctx.o;
  const ExtractSettings& s = ctx.settings;
  JobState& state = ctx.state;
  ASSIGN_OR_RETURN(std::unique_ptr<InputReader> reader,
                   InputReader::Open(o.input_path, state.progress.input_offset,
                                     state.progress.input_rows));
  ASSIGN_OR_RETURN(
      std::unique_ptr<WindowRunner> runner,
      WindowRunner::Create(s, o.hf_bf16_activations, ctx.session.model(),
                           ctx.session.segments(), &ctx.outputs));
  const RowPreparer preparer = MakeRowPreparer(o, s, ctx.session);
  ExtractSummary summary;
  summary.resolved_hooks = s.hook_names;
  int64_t commits = 0;
  for (bool eof = false; !eof;) {
    // Windows start at multiples of commit_every input rows; another
    // shard's are passed over unread.
    const int64_t window_index = reader->next_index() / o.commit_every;
    if (!o.shard.Owns(window_index)) {
      ASSIGN_OR_RETURN(int64_t skipped, reader->Skip(o.commit_every));
      if (skipped < o.commit_every) break;
      continue;
    }
    ASSIGN_OR_RETURN(
        std::vector<PreparedRow> window,
        ReadWindow(*reader, preparer, o.commit_every, o.replace_invalid_utf8,
                   o.on_error, state.progress.rows_committed, &eof));
    if (window.empty()) break;
    RETURN_IF_ERROR(runner->Run(window, &summary.tokens));
    RETURN_IF_ERROR(CommitWindow(window, window_index, reader->offset(),
                                 reader->next_index(), ctx.outputs,
                                 ctx.rows_log, state));
    ++commits;
    summary.seconds = SecondsSince(ctx.start);
    if (o.progress) {
      const double size = static_cast<double>(state.input_bytes);
      o.progress(state.progress.rows_committed, summary.tokens, summary.seconds,
                 size > 0 ? static_cast<double>(reader->offset()) / size : 1.0);
    }
    if (o.stop_after_commits > 0 && commits >= o.stop_after_commits) {
      *stopped = true;
      break;
    }
  }
  FillCounts(state, &summary);
  return summary;
}

}  // namespace

SessionParams ExtractSessionParams(const ExtractOptions& o) {
  SessionParams sp;
  sp.command = "extract";
  sp.model_dir = o.model_dir;
  // Gradients run at f32 (a 16-bit precision is refused by name).
  sp.precision = o.grad_of && o.precision == Precision::kAuto ? Precision::kF32
                                                              : o.precision;
  sp.plan = o.plan;
  sp.threads = o.threads;
  // Token-id rows need no tokenizer; text rows without one are refused by
  // name (CheckTokenizerForText, or the row's error).
  sp.tokenizer = TokenizerUse::kOptional;
  sp.interventions = {.file = o.interventions_file,
                      .json = o.interventions_json,
                      .base_dir = o.interventions_dir,
                      .control_vectors = o.control_vectors,
                      .control_vector_range = o.control_vector_layer_range};
  sp.compute_backend_for_tests = o.compute_backend_for_tests;
  return sp;
}

StatusOr<ExtractSummary> RunExtract(const ExtractOptions& o) {
  const Clock::time_point start = Clock::now();
  ExtractSettings settings;
  int64_t fresh_batch = 0;  // != 0: the budget this run would plan
  SessionParams sp = ExtractSessionParams(o);
  // Before any weight is read: a streamed job's backends, and text rows
  // against a missing tokenizer.
  sp.admit = [&](const Session& s) -> Status {
    if (settings.streaming())
      RETURN_IF_ERROR(CheckStreamingBackends(s.segments()));
    return CheckTokenizerForText(o, s);
  };
  ASSIGN_OR_RETURN(
      std::unique_ptr<Session> session,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        // Everything that depends only on config.json and the options is
        // checked before planning, so bad options fail before anything is
        // loaded.
        ASSIGN_OR_RETURN(
            settings, ResolveExtractSettings(o, s.config(), s.interventions()));
        RETURN_IF_ERROR(CheckExtractInterventions(o, s.interventions()));
        // The default budget: a short input's own tokens. A resumed job
        // whose manifest records another budget plans with that one until
        // the resume checks of the options and the input have run (so that
        // a changed option or a missing input is reported by name), then is
        // refused (ResumeJob).
        const int64_t plain_batch = settings.batch_tokens;
        settings.batch_tokens = ShortInputBatchTokens(
            o, settings, s.tokenizer(), s.tokenizer_error());
        if (o.resume && o.batch_tokens == 0 && !settings.streaming()) {
          const int64_t recorded = RecordedBatchTokens(o.out_dir);
          if (recorded > 0 && recorded <= plain_batch &&
              recorded != settings.batch_tokens) {
            fresh_batch = settings.batch_tokens;
            settings.batch_tokens = recorded;
          }
        }
        return ExtractJobSpec(o, settings, s.compute_dtype());
      }));
  const DType compute = session->model().compute_dtype();
  const DType out_dtype = o.dtype.value_or(compute);
  // Held until the job ends, after the outputs below are closed.
  bool created_dir = false;
  ASSIGN_OR_RETURN(FileLock lock,
                   o.resume ? LockForResume(o) : LockForStart(o, &created_dir));
  OutputSet outputs(settings, out_dtype, o.format, o.out_dir, session->host());
  RowsLog rows_log(o.out_dir + "/rows.jsonl");
  ASSIGN_OR_RETURN(std::string config_sha,
                   Sha256File(o.model_dir + "/config.json"));
  ASSIGN_OR_RETURN(Json settings_json,
                   SettingsJson(o, settings, config_sha, compute, out_dtype));
  ASSIGN_OR_RETURN(
      JobState state,
      o.resume ? ResumeJob(o, settings_json, fresh_batch, outputs, rows_log)
               : StartJob(o, settings_json, outputs, rows_log));
  if (state.complete) {
    ExtractSummary done;
    FillCounts(state, &done);
    done.resolved_hooks = settings.hook_names;
    done.dtype = out_dtype;
    done.npy = o.format == OutputFormat::kNpy;
    done.complete = true;
    return done;
  }
  RunContext ctx{o, settings, *session, outputs, rows_log, state, start};
  bool stopped = false;
  StatusOr<ExtractSummary> run = RunWindows(ctx, &stopped);
  if (!run.ok() && !o.resume && state.progress.rows_committed == 0 &&
      o.format != OutputFormat::kMemory)
    return RollBackFreshJob(o, outputs, created_dir, run.status());
  ASSIGN_OR_RETURN(ExtractSummary summary, std::move(run));
  summary.dtype = out_dtype;
  summary.npy = o.format == OutputFormat::kNpy;
  if (stopped) return summary;
  RETURN_IF_ERROR(CompleteJob(rows_log, state));
  summary.complete = true;
  summary.seconds = SecondsSince(start);
  summary.planned_bytes = session->planned_host_bytes();
  if (o.plan.verify_plan) summary.verify_plan = session->VerifyPlanReport();
  return summary;
}

}  // namespace loom
