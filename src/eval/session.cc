#include "src/eval/session.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "src/backend/registry.h"
#include "src/io/safetensors.h"

namespace loom {

Session::~Session() = default;

void Session::Warn(const std::string& message) const {
  if (params_.quiet || message.empty()) return;
  const std::string speaker =
      params_.speaker.empty() ? "loom " + params_.command : params_.speaker;
  std::fprintf(stderr, "%s: warning: %s\n", speaker.c_str(), message.c_str());
}

Status Session::ReadConfig() {
  ASSIGN_OR_RETURN(config_, LoadModelConfig(params_.model_dir));
  return CheckRunnable(params_.model_dir, config_);
}

Status Session::CheckDevices() {
  ASSIGN_OR_RETURN(devices_, ResolveJobDevices(params_.plan));
  return Status();
}

Status Session::ResolveComputeDType() {
  // From the stored dtype, as the weights will be bound; the plan counts the
  // same bytes.
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                   Checkpoint::Open(params_.model_dir));
  std::string warning;
  ASSIGN_OR_RETURN(compute_dtype_,
                   ResolvePrecisionOn(params_.precision, CheckpointDType(*ckpt),
                                      devices_.gpu_capability, &warning));
  Warn(warning);
  return Status();
}

Status Session::LoadTokenizer() {
  if (params_.tokenizer != TokenizerUse::kNone) {
    const std::string& dir = params_.tokenizer_dir.empty()
                                 ? params_.model_dir
                                 : params_.tokenizer_dir;
    StatusOr<std::unique_ptr<tok::Tokenizer>> t = tok::Tokenizer::Load(dir);
    if (t.ok()) {
      tokenizer_ = std::move(t).value();
    } else if (params_.tokenizer == TokenizerUse::kRequired) {
      return t.status();
    } else {
      tokenizer_error_ = t.status().message();
    }
  }
  return Status();
}

Status Session::LoadInterventions(const InterventionSource& src) {
  ASSIGN_OR_RETURN(
      interventions_,
      loom::LoadInterventions(src.file, src.json, src.base_dir, config_));
  ASSIGN_OR_RETURN(std::vector<Intervention> cv,
                   ControlVectorInterventions(
                       src.control_vectors, src.control_vector_range, config_));
  for (Intervention& iv : cv) interventions_.push_back(std::move(iv));
  return Status();
}

Status Session::PlanJob(const JobShape& shape) {
  ASSIGN_OR_RETURN(job_, shape(*this));
  job_.weight_compute_dtype = compute_dtype_;
  job_.intervention_bytes = InterventionBytes(interventions_);
  ASSIGN_OR_RETURN(plan_, PlanJobOrRefuse(params_.command, params_.model_dir,
                                          job_, devices_, params_.plan));
  return Status();
}

Status Session::CreateBackends() {
  ASSIGN_OR_RETURN(backends_, CreateJobBackends(plan_, host_.get()));
  if (params_.compute_backend_for_tests != nullptr)
    for (ExecutorSegment& seg : backends_.segments)
      seg.backend = params_.compute_backend_for_tests;
  // SAE edits run on host rows (a device's edited rows are staged to the
  // host: Executor::ApplyEdit): their scratch sized by the host backend's
  // kernel, before any forward.
  PrepareSaeEdits(interventions_, [&](const Sae& sae, int64_t rows) {
    return host_->SaeWorkspaceBytes(sae, rows);
  });
  return params_.admit ? params_.admit(*this) : Status();
}

Status Session::LoadWeights() {
  // The dtype resolved above is asked for explicitly: the load binds the
  // weights at exactly the dtype the plan counted.
  Precision exact = Precision::kF32;
  if (compute_dtype_ == DType::kBF16) exact = Precision::kBF16;
  if (compute_dtype_ == DType::kF16) exact = Precision::kF16;
  ASSIGN_OR_RETURN(model_, Model::Load(params_.model_dir, exact, nullptr,
                                       backends_.gpu_capability));
  return Status();
}

StatusOr<std::unique_ptr<Session>> Session::Open(const SessionParams& params,
                                                 const JobShape& shape) {
  ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Prepare(params, shape));
  RETURN_IF_ERROR(s->LoadWeights());
  return s;
}

StatusOr<std::unique_ptr<Session>> Session::Prepare(const SessionParams& params,
                                                    const JobShape& shape) {
  auto s = std::unique_ptr<Session>(new Session(params));
  s->rss_watch_ = StartRssWatch();
  // Threads are a process-wide setting of the CPU backend; this instance
  // also runs the layers the plan puts on the host.
  ASSIGN_OR_RETURN(s->host_, CreateBackend("cpu"));
  if (params.threads > 0) s->host_->SetNumThreads(params.threads);
  RETURN_IF_ERROR(s->ReadConfig());
  RETURN_IF_ERROR(s->CheckDevices());
  RETURN_IF_ERROR(s->ResolveComputeDType());
  RETURN_IF_ERROR(s->LoadTokenizer());
  RETURN_IF_ERROR(s->LoadInterventions(params.interventions));
  RETURN_IF_ERROR(s->PlanJob(shape));
  RETURN_IF_ERROR(s->CreateBackends());
  return s;
}

Status Session::Replan(const InterventionSource& interventions,
                       const JobShape& shape) {
  // What a failure leaves: no job (segments of a previous plan would run a
  // job this plan did not size).
  job_ = JobSpec();
  plan_ = MemoryPlan();
  backends_ = JobBackends();
  interventions_.clear();
  rss_watch_ = StartRssWatch();
  RETURN_IF_ERROR(LoadInterventions(interventions));
  RETURN_IF_ERROR(PlanJob(shape));
  return CreateBackends();
}

nlohmann::json Session::VerifyPlanReport() const {
  if (!params_.plan.verify_plan) return nullptr;
  const std::string who = "loom " + params_.command;
  return VerifyPlan(planned_host_bytes(), rss_watch_, who.c_str());
}

}  // namespace loom
