// Session: the one place a job is opened. Every surface (the CLI commands,
// the Python module, the server) describes what it wants as SessionParams
// and the job's shape (a JobSpec), and Session::Open does, once and in this
// order:
//   1. config.json (and the architecture: one that cannot run is refused);
//   2. the devices of the placement flags: a GPU named that this build or
//      machine does not have is refused (UNAVAILABLE, naming it) before
//      anything is read;
//   3. the compute dtype, resolved once from the checkpoint's stored dtype,
//      the requested precision and the GPUs' capability (the plan and the
//      load use this one value);
//   4. the tokenizer (when the job asks for one) and the interventions,
//      checked against the config;
//   5. the job's shape (JobShape, which may read 1-4) and the plan: a job
//      that does not fit is refused with the plan's breakdown before any
//      weight is read; --show-plan prints it;
//   6. the backends of the plan's placement (one per computing device, the
//      host's owned by the session) and the executor segments;
//   7. the weights.
// The jobs (extract, perplexity, compare, generate, patch, serve's requests)
// then run over the session's model, segments and plan. See
// docs/design/architecture.md, "Session".
#ifndef LOOM_EVAL_SESSION_H_
#define LOOM_EVAL_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/eval/job_plan.h"
#include "src/model/config.h"
#include "src/model/control_vectors.h"
#include "src/model/interventions.h"
#include "src/plan/job.h"
#include "src/plan/planner.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"

namespace loom {

// Where a job's interventions come from; each surface translates its own
// syntax into this (the CLI's shorthand flags into `json`, an HTTP body's or
// a Python call's list into `json`).
struct InterventionSource {
  std::string file;            // an intervention JSON file (--intervene)
  std::string json;            // an intervention document
  std::string base_dir = ".";  // relative vector paths in `json`
  std::vector<ControlVectorFile> control_vectors;  // llama.cpp GGUFs
  std::optional<ControlVectorLayerRange> control_vector_range;
};

// Interventions given as a document (an HTTP body's, a Python call's);
// relative vector paths against `base_dir`.
inline InterventionSource InterventionsFromJson(std::string json,
                                                std::string base_dir = ".") {
  InterventionSource s;
  s.json = std::move(json);
  s.base_dir = std::move(base_dir);
  return s;
}

enum class TokenizerUse {
  kNone,      // not loaded
  kOptional,  // loaded when present; tokenizer_error() says why not
  kRequired,  // a job that cannot run without it: its absence is an error
};

class Session;

struct SessionParams {
  // The command, for messages: "generate" prints "loom generate: warning:".
  std::string command;
  std::string model_dir;
  Precision precision = Precision::kAuto;
  // --device, --max-memory, --reserve, --offload, --show-plan, --verify-plan.
  JobPlanOptions plan;
  int threads = 0;     // CPU threads; 0 = the backend's default
  bool quiet = false;  // no warnings on stderr
  InterventionSource interventions;
  TokenizerUse tokenizer = TokenizerUse::kNone;
  std::string tokenizer_dir;  // empty = model_dir
  // Asked once the plan fits and its backends exist, before any weight is
  // read (may be empty): an error here ends Open with nothing loaded (loom
  // serve admits a model by its plan beside the models already loaded;
  // extract refuses streaming on a backend without KV attention).
  std::function<Status(const Session&)> admit;
  // Warnings on stderr read "<speaker>: warning: ..."; empty: "loom
  // <command>".
  std::string speaker;
  // Tests: every executor segment runs on this backend (a host-as-device
  // backend standing in for a GPU).
  Backend* compute_backend_for_tests = nullptr;
};

class Session {
 public:
  // The job's shape from what the session knows before planning (config,
  // compute dtype, tokenizer, interventions).
  using JobShape = std::function<StatusOr<JobSpec>(const Session&)>;

  static StatusOr<std::unique_ptr<Session>> Open(const SessionParams& params,
                                                 const JobShape& shape);
  // Open in two steps, for jobs that hold several models at once (compare):
  // Prepare does 1-6 (model() is not there yet), LoadWeights does 7.
  static StatusOr<std::unique_ptr<Session>> Prepare(const SessionParams& params,
                                                    const JobShape& shape);
  Status LoadWeights();
  ~Session();

  // Another job on the open session's weights (the Python module loads once
  // and plans each call): its interventions and shape replace the session's,
  // are checked, planned and refused as Open does them; plan(), segments(),
  // job() and interventions() then describe this job. On an error the
  // session is left describing no job (call Replan again).
  Status Replan(const InterventionSource& interventions, const JobShape& shape);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Known before the plan (what a JobShape may read).
  const SessionParams& params() const { return params_; }
  const ModelConfig& config() const { return config_; }
  DType compute_dtype() const { return compute_dtype_; }
  // Null when not loaded (TokenizerUse::kNone) or absent (kOptional: then
  // tokenizer_error() says why).
  const tok::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const std::string& tokenizer_error() const { return tokenizer_error_; }
  const std::vector<Intervention>& interventions() const {
    return interventions_;
  }

  // After Open.
  const JobSpec& job() const { return job_; }
  const MemoryPlan& plan() const { return plan_; }
  const Model& model() const { return *model_; }
  Backend* host() const { return host_.get(); }
  // The executor segments of the plan's placement (ExecutorOptions::segments).
  const std::vector<ExecutorSegment>& segments() const {
    return backends_.segments;
  }
  // Bytes the plan puts on the host.
  int64_t planned_host_bytes() const { return PlannedHostBytes(plan_); }
  // --verify-plan's report (VerifyPlan) since Open began; a JSON null when
  // --verify-plan was not given.
  nlohmann::json VerifyPlanReport() const;
  // The resident-memory watch started when the session began (VerifyPlan).
  const RssWatch& rss_watch() const { return rss_watch_; }

 private:
  explicit Session(const SessionParams& p) : params_(p) {}
  Status ReadConfig();
  Status CheckDevices();
  Status ResolveComputeDType();
  Status LoadTokenizer();
  Status LoadInterventions(const InterventionSource& source);
  Status PlanJob(const JobShape& shape);
  Status CreateBackends();
  void Warn(const std::string& message) const;

  SessionParams params_;
  RssWatch rss_watch_;
  ModelConfig config_;
  JobDevices devices_;  // the placement flags' devices, GPUs checked
  DType compute_dtype_ = DType::kF32;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
  std::string tokenizer_error_;
  std::vector<Intervention> interventions_;
  JobSpec job_;
  MemoryPlan plan_;
  std::unique_ptr<Backend> host_;
  JobBackends backends_;
  std::unique_ptr<Model> model_;
};

}  // namespace loom

#endif  // LOOM_EVAL_SESSION_H_
