#include "tests/golden_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/base/float16.h"
#include "src/model/registry.h"

namespace loom::testing {

std::string ModelCaseDir(const ModelCase& m) {
  return m.bundled ? std::string(LOOM_MODELS_DIR) + "/" + m.name
                   : SharedGoldenDir() + "/tiny/" + m.name;
}

HookSet EveryHookOf(const ModelConfig& c, bool with_pattern) {
  HookSet h;
  h.Add({HookSite::kEmbed, -1});
  if (c.learned_positions) h.Add({HookSite::kPosEmbed, -1});
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int s = static_cast<int>(HookSite::kResidPre); s < kNumHookSites;
         ++s) {
      const HookPoint hook{static_cast<HookSite>(s), l};
      if (hook.site == HookSite::kPattern && !with_pattern) continue;
      if (CheckHookExists(hook, c).ok()) h.Add(hook);
    }
  h.Add({HookSite::kFinalNorm, -1});
  h.Add({HookSite::kLogits, -1});
  return h;
}

std::string SharedGoldenDir() {
  const std::string dir = std::string(LOOM_SHARED_DIR) + "/golden";
  return std::filesystem::exists(dir) ? dir : "";
}

std::string ConstructedModelDir(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/data/constructed/" + name;
}

std::vector<std::string> RunnableTinyModels(const std::string& shared) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(shared + "/tiny")) {
    if (!std::filesystem::exists(e.path() / "config.json")) continue;
    const StatusOr<ModelConfig> c = LoadModelConfig(e.path().string());
    if (!c.ok() && c.status().code() == StatusCode::kUnimplemented) {
      std::fprintf(stderr, "SKIPPED LOUDLY: %s: %s\n",
                   e.path().filename().string().c_str(),
                   c.status().message().c_str());
      continue;
    }
    // Registered for inspect and plan only (Model::Load refuses it).
    if (const ArchDef* arch = c.ok() ? FindArch(c->model_type) : nullptr;
        arch != nullptr && !arch->runnable) {
      std::fprintf(stderr,
                   "SKIPPED LOUDLY: %s: model_type '%s' can be inspected and "
                   "planned but not run yet\n",
                   e.path().filename().string().c_str(), c->model_type.c_str());
      continue;
    }
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string BundledGoldenDir() {
  return std::string(LOOM_TESTDATA_DIR) + "/golden";
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::unique_ptr<GoldenFile> GoldenFile::Open(const std::string& path) {
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) {
    ADD_FAILURE() << f.status().ToString();
    return nullptr;
  }
  auto g = std::make_unique<GoldenFile>();
  g->file_ = std::move(f).value();
  return g;
}

bool GoldenFile::Has(const std::string& name) const {
  return file_->Find(name) != nullptr;
}

std::vector<float> GoldenFile::F32(const std::string& name,
                                   Shape* shape) const {
  const TensorInfo* info = file_->Find(name);
  if (info == nullptr) {
    ADD_FAILURE() << "golden tensor " << name << " missing";
    return {};
  }
  TensorView v = file_->View(*info);
  if (shape) *shape = v.shape;
  std::vector<float> out(v.numel());
  if (v.dtype == DType::kF32) {
    std::memcpy(out.data(), v.data, out.size() * 4);
  } else if (v.dtype == DType::kBF16) {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(v.data) + 2 * i, 2);
      out[i] = Bf16ToF32(h);
    }
  } else {
    ADD_FAILURE() << "golden tensor " << name << " has dtype "
                  << DTypeName(v.dtype);
  }
  return out;
}

std::vector<int32_t> GoldenFile::Ids(const std::string& name,
                                     Shape* shape) const {
  const TensorInfo* info = file_->Find(name);
  if (info == nullptr) {
    ADD_FAILURE() << "golden tensor " << name << " missing";
    return {};
  }
  TensorView v = file_->View(*info);
  if (shape) *shape = v.shape;
  std::vector<int32_t> out(v.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t x;
    std::memcpy(&x, static_cast<const uint8_t*>(v.data) + 8 * i, 8);
    out[i] = static_cast<int32_t>(x);
  }
  return out;
}

Status CaptureSink::OnActivation(const HookPoint& hook, const Batch& batch,
                                 int64_t seq, int64_t row_begin,
                                 const ActivationView& view) {
  const int64_t rows = view.rows, cols = view.cols, ld = view.ld;
  Tensor& t = tensors_[{hook, seq}];
  if (view.dtype == DType::kI32) {
    // Integer hooks (mlp.hook_expert_ids) are kept as exact f32 values.
    t.cols = cols;
    t.data.resize(static_cast<size_t>(batch.num_tokens() * cols));
    const int32_t* ids = static_cast<const int32_t*>(view.data);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        t.data[(row_begin + r) * cols + j] =
            static_cast<float>(ids[r * ld + j]);
    return Status();
  }
  const float* data = view.f32();
  t.cols = cols;
  const int64_t total_rows = seq >= 0 ? rows : batch.num_tokens();
  if (static_cast<int64_t>(t.data.size()) != total_rows * cols)
    t.data.assign(total_rows * cols, 0.0f);
  const int64_t base = seq >= 0 ? 0 : row_begin;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(&t.data[(base + r) * cols], data + r * ld,
                cols * sizeof(float));
  return Status();
}

const CaptureSink::Tensor& CaptureSink::Get(const HookPoint& h,
                                            int64_t seq) const {
  auto it = tensors_.find({h, seq});
  static const Tensor kEmpty;
  if (it == tensors_.end()) {
    ADD_FAILURE() << "hook " << HookName(h) << " was not captured";
    return kEmpty;
  }
  return it->second;
}

bool CaptureSink::Has(const HookPoint& h, int64_t seq) const {
  return tensors_.count({h, seq}) > 0;
}

CompareResult Compare(const float* a, const float* b, int64_t n, double atol,
                      double rtol) {
  CompareResult r;
  double worst_excess = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(a[i]) - b[i]);
    const double tol = atol + rtol * std::fabs(static_cast<double>(b[i]));
    if (err > r.max_abs_err) r.max_abs_err = err;
    if (!(err <= tol) && (r.ok || err - tol > worst_excess)) {
      r.ok = false;
      worst_excess = err - tol;
      r.worst_index = i;
      r.message = "index " + std::to_string(i) + ": got " +
                  std::to_string(a[i]) + ", expected " + std::to_string(b[i]) +
                  " (|err| " + std::to_string(err) + " > tol " +
                  std::to_string(tol) + ")";
    }
  }
  return r;
}

std::vector<double> LogprobNext(const float* logits, int64_t T, int64_t V,
                                const int32_t* ids) {
  std::vector<double> out;
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* row = logits + t * V;
    double mx = row[0];
    for (int64_t j = 1; j < V; ++j)
      mx = std::max(mx, static_cast<double>(row[j]));
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
    out.push_back(row[ids[t + 1]] - mx - std::log(sum));
  }
  return out;
}

int RunShell(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string s;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) s.append(buf, n);
  const int rc = pclose(p);
  if (out != nullptr) *out = s;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace loom::testing
