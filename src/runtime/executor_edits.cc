// The executor's interventions (SequenceEdit): checked against the batch
// before a forward runs, then applied where the forward delivers each hook.
// A host device's rows are edited in place by its backend's row ops; a
// device whose memory is not the host's has its edited rows copied to a host
// buffer (kEditStageRows rows at a time), edited there by the host backend's
// kernels and copied back: the bytes equal the host run's, on every backend.
#include <algorithm>
#include <cstring>

#include "src/runtime/executor.h"

namespace loom {

Status Executor::CheckEdits(const Batch& batch,
                            std::span<const SequenceEdit> edits) const {
  using Kind = InterventionPositions::Kind;
  for (size_t i = 0; i < edits.size(); ++i) {
    const SequenceEdit& e = edits[i];
    const std::string name = "intervention " + std::to_string(i);
    if (e.edit == nullptr)
      return InvalidArgumentError(name + ": no intervention");
    const Intervention& iv = *e.edit;
    if (e.seq < 0 || e.seq >= batch.num_seqs())
      return InvalidArgumentError(name + ": sequence " + std::to_string(e.seq) +
                                  " outside the batch's " +
                                  std::to_string(batch.num_seqs()));
    const int64_t len = batch.seq_start[e.seq + 1] - batch.seq_start[e.seq];
    if (e.length < Pos0(e.seq) + len)
      return InvalidArgumentError(name + ": sequence " + std::to_string(e.seq) +
                                  " of " + std::to_string(e.length) +
                                  " tokens, but the batch holds positions " +
                                  "up to " + std::to_string(Pos0(e.seq) + len));
    const bool patch = iv.mode == InterventionMode::kPatch ||
                       iv.mode == InterventionMode::kPatchHead;
    if (e.every_position && patch)
      return InvalidArgumentError(name + ": a patch edits its positions");
    if (e.patch_rows != nullptr && !patch)
      return InvalidArgumentError(name + ": patch rows given to a " +
                                  std::string(InterventionModeName(iv.mode)));
    RETURN_IF_ERROR(CheckIntervention(
        iv, c_, name, /*patch_rows_elsewhere=*/e.patch_rows != nullptr));
    if (iv.positions.kind == Kind::kList)
      for (int64_t p : iv.positions.list)
        if (p < -e.length || p >= e.length)
          return OutOfRangeError(name + ": position " + std::to_string(p) +
                                 " outside sequence " + std::to_string(e.seq) +
                                 " of " + std::to_string(e.length) + " tokens");
    if (iv.positions.kind == Kind::kSpan && !e.every_position) {
      StatusOr<std::pair<int64_t, int64_t>> span =
          ResolveSpan(iv.positions, e.length);
      if (!span.ok())
        return span.status().WithContext(name + ", sequence " +
                                         std::to_string(e.seq));
    }
  }
  return Status();
}

namespace {

// Rows idx[0..n) of h [T, cols] (ld apart, host memory) through the SAE of
// `iv` (IsSaeEditMode), kSaeEditRows rows at a time in the edit's scratch:
// the reconstruction written over them, or h += d * decoded(feature) per row
// (the product rounded to f32, then added: AddRowsBroadcast).
Status ApplySaeEdit(Backend& be, const Intervention& iv, float* data, int64_t T,
                    int64_t cols, int64_t ld, const int32_t* idx, int64_t n) {
  SaeEdit& e = *iv.sae_edit;
  const Sae& s = *e.sae;
  if (e.x.empty() || s.d_in != cols)
    return InternalError("executor: the SAE edit at " + HookName(iv.hook) +
                         " was not prepared for " + std::to_string(cols) +
                         " columns (PrepareSaeEdits)");
  std::lock_guard<std::mutex> lock(e.mu);
  const auto base = reinterpret_cast<uintptr_t>(e.workspace.data());
  void* ws = reinterpret_cast<void*>((base + 63) & ~uintptr_t{63});
  const bool reconstruct = iv.mode == InterventionMode::kSaeReconstruct;
  const float* row = s.w_dec.data() + std::max<int64_t>(e.feature, 0) * cols;
  for (int64_t c0 = 0; c0 < n; c0 += kSaeEditRows) {
    const int64_t m = std::min(kSaeEditRows, n - c0);
    // x: [m, d_in] the rows, contiguous.
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(e.x.data() + r * cols, data + idx[c0 + r] * ld,
                  static_cast<size_t>(cols) * sizeof(float));
    SaeOutputs o;
    if (reconstruct) {
      o.reconstruction = e.out.data();
    } else {
      o.feature_acts = e.acts.data();
      o.norm_scale = e.norm_scale.data();
    }
    RETURN_IF_ERROR(be.RunSae(s, e.x.data(), nullptr, m, ws, o));
    if (reconstruct) {
      RETURN_IF_ERROR(
          be.SetRows(data, T, cols, ld, idx + c0, m, 0, cols, e.out.data(), m));
      continue;
    }
    for (int64_t r = 0; r < m; ++r) {
      const float f = e.acts[static_cast<size_t>(r * s.d_sae + e.feature)];
      const float d = iv.mode == InterventionMode::kFeatureAdd     ? e.value
                      : iv.mode == InterventionMode::kFeatureClamp ? e.value - f
                                                                   : -f;
      const float coef = d * SaeDecodedScale(s, e.feature, e.norm_scale[r]);
      RETURN_IF_ERROR(be.AddRowsBroadcast(data, T, cols, ld, idx + c0 + r, 1,
                                          row, coef, false));
    }
  }
  return Status();
}

}  // namespace

Status Executor::ApplyEdit(const SequenceEdit& e, const Batch& batch, Device& d,
                           int64_t cols, int64_t ld, float* data) {
  using Kind = InterventionPositions::Kind;
  const Intervention& iv = *e.edit;
  const int64_t T = batch.num_tokens(), begin = batch.seq_start[e.seq];
  const int64_t p0 = Pos0(e.seq), p1 = p0 + batch.seq_start[e.seq + 1] - begin;
  // The batch rows of the edited positions this batch holds, ascending
  // (capacity max_tokens: no allocation). `first`: the list index of the
  // first one (a patch's source row).
  edit_rows_.clear();
  int64_t first = -1;
  auto take = [&](int64_t p) {
    if (p >= p0 && p < p1)
      edit_rows_.push_back(static_cast<int32_t>(begin + p - p0));
  };
  switch (e.every_position ? Kind::kAll : iv.positions.kind) {
    case Kind::kAll:
      for (int64_t p = p0; p < p1; ++p) take(p);
      break;
    case Kind::kLast:
      take(e.length - 1);
      break;
    case Kind::kList:
      for (size_t j = 0; j < iv.positions.list.size(); ++j) {
        const int64_t q = iv.positions.list[j];
        const int64_t p = q < 0 ? q + e.length : q;
        if (first < 0 && p >= p0 && p < p1) first = static_cast<int64_t>(j);
        take(p);
      }
      std::sort(edit_rows_.begin(), edit_rows_.end());
      break;
    case Kind::kSpan: {
      // Checked by CheckEdits: a non-empty span inside the sequence.
      const auto span = *ResolveSpan(iv.positions, e.length);
      for (int64_t p = span.first; p < span.second; ++p) take(p);
      first = std::max(p0, span.first) - span.first;
      break;
    }
  }
  const int64_t n = static_cast<int64_t>(edit_rows_.size());
  if (n == 0) return Status();
  if (d.host_memory)
    return EditRows(*d.backend, iv, e.patch_rows, data, T, cols, ld,
                    edit_rows_.data(), n, first);
  // A device's rows: copied to the host stage, edited there by the host
  // backend, copied back (runs of consecutive rows in one copy when the rows
  // are dense).
  const DeviceRef dev = d.backend->device(), host{};
  const int64_t row_bytes = cols * int64_t{sizeof(float)};
  for (int64_t c0 = 0; c0 < n; c0 += kEditStageRows) {
    const int64_t m = std::min(kEditStageRows, n - c0);
    const int32_t* idx = edit_rows_.data() + c0;
    auto copy_runs = [&](bool to_host) -> Status {
      for (int64_t r = 0; r < m;) {
        int64_t run = 1;
        while (ld == cols && r + run < m && idx[r + run] == idx[r] + run) ++run;
        float* staged = edit_stage_.data() + r * cols;
        float* rows = data + idx[r] * ld;
        RETURN_IF_ERROR(
            to_host
                ? d.backend->Copy(staged, host, rows, dev, run * row_bytes)
                : d.backend->Copy(rows, dev, staged, host, run * row_bytes));
        r += run;
      }
      return Status();
    };
    RETURN_IF_ERROR(copy_runs(/*to_host=*/true));
    RETURN_IF_ERROR(EditRows(*host_edits_, iv, e.patch_rows, edit_stage_.data(),
                             m, cols, cols, source_rows_.data(), m,
                             first < 0 ? first : first + c0));
    RETURN_IF_ERROR(copy_runs(/*to_host=*/false));
  }
  return Status();
}

Status Executor::EditRows(Backend& be, const Intervention& iv,
                          const float* patch_rows, float* data, int64_t T,
                          int64_t cols, int64_t ld, const int32_t* idx,
                          int64_t n, int64_t first) const {
  // A head's columns: v and z heads are v_head_dim wide (MLA), q and k heads
  // head_dim.
  const LayerConfig& g =
      program_.layers[static_cast<size_t>(std::max<int64_t>(0, iv.hook.layer))];
  const bool vz = iv.hook.site == HookSite::kV || iv.hook.site == HookSite::kZ;
  const int64_t head_width = vz ? g.v_head_dim : g.head_dim;
  switch (iv.mode) {
    case InterventionMode::kAdd:
      return be.AddRowsBroadcast(data, T, cols, ld, idx, n, iv.vector.data(),
                                 iv.scale, iv.norm_match);
    case InterventionMode::kProjectOut:
      return be.ProjectOutRows(data, T, cols, ld, idx, n, iv.vector.data());
    case InterventionMode::kZero:
      return be.SetRows(data, T, cols, ld, idx, n, 0, cols, zero_row_.data(),
                        1);
    case InterventionMode::kReplace:
      return be.SetRows(data, T, cols, ld, idx, n, 0, cols, iv.vector.data(),
                        1);
    case InterventionMode::kZeroHead:
      return be.SetRows(data, T, cols, ld, idx, n, iv.head * head_width,
                        (iv.head + 1) * head_width, zero_row_.data(), 1);
    case InterventionMode::kPatch:
      return be.SetRows(
          data, T, cols, ld, idx, n, 0, cols,
          (patch_rows ? patch_rows : iv.vector.data()) + first * cols, n);
    case InterventionMode::kPatchHead: {
      // The head's columns of the source rows first .. first + n - 1.
      const int64_t c0 = iv.head * head_width;
      const float* src = patch_rows ? patch_rows : iv.vector.data();
      return be.CopyRows(data + c0, T, head_width, ld, idx, n,
                         src + first * cols + c0, n, cols, source_rows_.data());
    }
    case InterventionMode::kFeatureAdd:
    case InterventionMode::kFeatureClamp:
    case InterventionMode::kFeatureAblate:
    case InterventionMode::kSaeReconstruct:
      return ApplySaeEdit(be, iv, data, T, cols, ld, idx, n);
  }
  return InternalError("executor: unknown intervention mode");
}

}  // namespace loom
