#include "src/eval/extract_derived_runner.h"

#include <algorithm>
#include <cstring>

#include "src/backend/registry.h"

namespace loom {

DerivedRunner::~DerivedRunner() = default;

StatusOr<std::unique_ptr<DerivedRunner>> DerivedRunner::Create(
    const Model& model, const ExtractSettings& s) {
  std::unique_ptr<DerivedRunner> r(new DerivedRunner());
  r->s_ = &s;
  const Analyses& a = s.analyses;
  constexpr int64_t C = kDerivedChunkRows;
  int64_t in_width = 0, topk = 0;
  for (size_t i = 0; i < s.derived.size(); ++i) {
    const DerivedHook& d = s.derived[i];
    if (d.gradient()) {  // the backward's (WindowRunner)
      r->out_.emplace_back();
      continue;
    }
    auto it = std::find_if(
        r->sources_.begin(), r->sources_.end(),
        [&](const Source& x) { return x.hook == d.source && x.sae == d.sae; });
    if (it == r->sources_.end()) {
      r->sources_.push_back({d.source, d.sae, {}});
      it = r->sources_.end() - 1;
    }
    it->derived.push_back(static_cast<int>(i));
    r->out_.emplace_back(static_cast<size_t>(C * d.width));
    in_width = std::max(in_width, d.sae >= 0 ? a.saes[d.sae]->d_in
                                             : model.config().hidden_size);
  }
  // Dashboards read every token of each SAE's hook.
  if (a.dashboard > 0) {
    int64_t d_sae = 0;
    for (size_t i = 0; i < a.saes.size(); ++i) {
      d_sae = std::max(d_sae, a.saes[i]->d_sae);
      in_width = std::max(in_width, a.saes[i]->d_in);
      const int sae = static_cast<int>(i);
      if (std::none_of(r->sources_.begin(), r->sources_.end(),
                       [&](const Source& x) { return x.sae == sae; }))
        r->sources_.push_back({a.sae_hooks[i], sae, {}});
    }
    r->dashboard_acts_.resize(static_cast<size_t>(C * d_sae));
  }
  topk = std::max(a.sae_topk, a.lens_topk);
  ASSIGN_OR_RETURN(r->cpu_, CreateBackend("cpu"));
  if (a.lens) {
    // The lens owns its backend (it sets that backend's GEMM scratchpad).
    ASSIGN_OR_RETURN(r->lens_, eval::Lens::Create(model, a.tuned.get(), C));
  }
  int64_t ws = 64;
  for (const auto& sae : a.saes)
    ws = std::max(ws, r->cpu_->SaeWorkspaceBytes(*sae, C));
  ASSIGN_OR_RETURN(r->workspace_, r->cpu_->Allocate(ws, MemoryKind::kHost));
  r->x_.resize(static_cast<size_t>(C * in_width));
  r->ids_.resize(static_cast<size_t>(C * topk));
  r->values_.resize(static_cast<size_t>(C * topk));
  r->needed_.resize(static_cast<size_t>(s.batch_tokens));
  const size_t picks = static_cast<size_t>(s.batch_tokens) * 4;
  r->picks_.rows.reserve(picks);
  r->picks_.dst.reserve(picks);
  return r;
}

bool DerivedRunner::Reads(const HookPoint& hook) const {
  return std::any_of(sources_.begin(), sources_.end(),
                     [&](const Source& x) { return x.hook == hook; });
}

bool DerivedRunner::ChunkNeeded(int64_t begin, int64_t end) const {
  if (s_->analyses.dashboard > 0) return true;  // every token
  return std::any_of(needed_.begin() + begin, needed_.begin() + end,
                     [](uint8_t x) { return x != 0; });
}

Status DerivedRunner::OnRows(const HookPoint& hook, const Batch& batch,
                             const ActivationRows& rows, OutputSet* outputs) {
  if (rows.rows > static_cast<int64_t>(needed_.size()))
    return InternalError("extract: " + HookName(hook) + " delivered " +
                         std::to_string(rows.rows) +
                         " rows; the SAE / lens runner holds " +
                         std::to_string(needed_.size()));
  for (const Source& src : sources_) {
    if (!(src.hook == hook)) continue;
    picks_.Clear();
    for (int d : src.derived)
      outputs->PickRows(hook, batch, rows.row_begin, rows.rows, &picks_, d);
    std::fill_n(needed_.begin(), rows.rows, 0);
    for (int32_t r : picks_.rows) needed_[static_cast<size_t>(r)] = 1;
    for (size_t g = 0; g < picks_.seg_begin.size(); ++g)
      std::fill(needed_.begin() + picks_.seg_begin[g],
                needed_.begin() + picks_.seg_end[g], 1);
    for (int64_t c0 = 0; c0 < rows.rows; c0 += kDerivedChunkRows) {
      const int64_t n = std::min(kDerivedChunkRows, rows.rows - c0);
      if (!ChunkNeeded(c0, c0 + n)) continue;
      // x: [n, cols] the chunk's rows, contiguous.
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(x_.data() + i * rows.cols, rows.data + (c0 + i) * rows.ld,
                    static_cast<size_t>(rows.cols) * sizeof(float));
      RETURN_IF_ERROR(RunChunk(src, x_.data(), n));
      if (src.sae >= 0 && outputs->dashboard(src.sae) != nullptr)
        AddToDashboard(src, batch, rows.row_begin + c0, n, outputs);
      for (int d : src.derived) {
        const int64_t w = s_->derived[static_cast<size_t>(d)].width;
        outputs->Capture(hook, batch,
                         ActivationRows{.data = out_[d].data(),
                                        .row_begin = rows.row_begin + c0,
                                        .rows = n,
                                        .cols = w,
                                        .ld = w},
                         d);
      }
    }
  }
  return Status();
}

void DerivedRunner::AddToDashboard(const Source& src, const Batch& batch,
                                   int64_t t0, int64_t n, OutputSet* outputs) {
  SaeDashboard& dash = *outputs->dashboard(src.sae);
  const int64_t d_sae = dash.features();
  int64_t s = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = t0 + r;
    while (batch.seq_start[s + 1] <= t) ++s;
    int64_t row = 0, position = 0;
    outputs->RowPosition(batch, s, t, &row, &position);
    dash.Add(row, position, acts_ + r * d_sae);
  }
}

Status DerivedRunner::RunChunk(const Source& src, const float* x, int64_t n) {
  const Analyses& a = s_->analyses;
  int ids_to = -1;  // the derived output the top-k indices go to
  if (src.sae >= 0) {
    const Sae& sae = *a.saes[src.sae];
    SaeOutputs o;
    const float* reference = nullptr;
    int input_to = -1;
    for (int d : src.derived) {
      float* buf = out_[d].data();
      switch (s_->derived[static_cast<size_t>(d)].kind) {
        case DerivedKind::kSaeInput:
          input_to = d;
          break;
        case DerivedKind::kSaeActsPre:
          o.hidden_pre = buf;
          break;
        case DerivedKind::kSaeActsPost:
          o.feature_acts = buf;
          break;
        case DerivedKind::kSaeRecons:
          o.recons = buf;
          break;
        case DerivedKind::kSaeError:
          o.error = buf;
          reference = x;  // an SAE's error: its input - the reconstruction
          break;
        case DerivedKind::kSaeTopkIndices:
          ids_to = d;
          o.topk = a.sae_topk;
          break;
        case DerivedKind::kSaeTopkValues:
          o.topk_values = buf;
          o.topk = a.sae_topk;
          break;
        default:
          break;
      }
    }
    if (o.topk > 0) {
      o.topk_indices = ids_.data();
      if (o.topk_values == nullptr) o.topk_values = values_.data();
    }
    if (a.dashboard > 0 && o.feature_acts == nullptr)
      o.feature_acts = dashboard_acts_.data();
    acts_ = o.feature_acts;
    RETURN_IF_ERROR(cpu_->RunSae(sae, x, reference, n, workspace_.data(), o));
    if (input_to >= 0) std::copy_n(x, n * sae.d_in, out_[input_to].data());
    if (ids_to >= 0)
      std::transform(ids_.begin(), ids_.begin() + n * o.topk,
                     out_[ids_to].begin(),
                     [](int32_t i) { return static_cast<float>(i); });
    return Status();
  }
  eval::LensOutputs o;
  for (int d : src.derived) {
    float* buf = out_[d].data();
    switch (s_->derived[static_cast<size_t>(d)].kind) {
      case DerivedKind::kLensLogits:
        o.logits = buf;
        break;
      case DerivedKind::kLensTopkIds:
        ids_to = d;
        o.topk = a.lens_topk;
        break;
      case DerivedKind::kLensTopkValues:
        o.topk_logits = buf;
        o.topk = a.lens_topk;
        break;
      default:
        break;
    }
  }
  if (o.topk > 0) {
    o.topk_ids = ids_.data();
    if (o.topk_logits == nullptr) o.topk_logits = values_.data();
  }
  RETURN_IF_ERROR(lens_->Run(src.hook, x, n, o));
  if (ids_to >= 0)
    std::transform(ids_.begin(), ids_.begin() + n * o.topk,
                   out_[ids_to].begin(),
                   [](int32_t i) { return static_cast<float>(i); });
  return Status();
}

}  // namespace loom
