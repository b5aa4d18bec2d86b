// The derived outputs of an extraction (src/eval/extract_derived.h) computed
// as the forward delivers their source hooks: the extraction's sink hands
// each block of a source's host f32 rows here; the runner computes, chunk by
// chunk of kDerivedChunkRows rows, the SAE or lens outputs of the chunks in
// which some selector keeps a row, and captures them into the OutputSet
// under their derived arrays. Its buffers are allocated once, at Create.
#ifndef LOOM_EVAL_EXTRACT_DERIVED_RUNNER_H_
#define LOOM_EVAL_EXTRACT_DERIVED_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/eval/extract_outputs.h"
#include "src/eval/extract_settings.h"
#include "src/eval/lens.h"
#include "src/runtime/model.h"

namespace loom {

class DerivedRunner {
 public:
  // `s` (its analyses and derived outputs) and `model` are borrowed.
  static StatusOr<std::unique_ptr<DerivedRunner>> Create(
      const Model& model, const ExtractSettings& s);
  ~DerivedRunner();

  // Whether `hook` is the source of a derived output.
  bool Reads(const HookPoint& hook) const;
  // The derived outputs of `hook`'s rows (host f32), into `outputs`.
  Status OnRows(const HookPoint& hook, const Batch& batch,
                const ActivationRows& rows, OutputSet* outputs);

 private:
  // One source hook and what is computed from it.
  struct Source {
    HookPoint hook;
    int sae = -1;              // -1: the lens
    std::vector<int> derived;  // indices into the settings' derived
  };
  DerivedRunner() = default;
  // Whether some selector keeps a row of [begin, end) of the block.
  bool ChunkNeeded(int64_t begin, int64_t end) const;
  Status RunChunk(const Source& src, const float* x, int64_t n);
  // The chunk's feature activations (acts_: [n, d_sae]) into the SAE's
  // dashboard, token t0 + r being row r.
  void AddToDashboard(const Source& src, const Batch& batch, int64_t t0,
                      int64_t n, OutputSet* outputs);

  const ExtractSettings* s_ = nullptr;
  std::vector<Source> sources_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<eval::Lens> lens_;
  Buffer workspace_;               // the SAE kernel's, for a chunk
  std::vector<float> x_;           // [C, d] the chunk's input rows
  std::vector<std::vector<float>> out_;  // per derived: [C, width]
  std::vector<int32_t> ids_;       // [C, K] top-k indices
  std::vector<float> values_;      // [C, K] top-k values not kept
  OutputSet::DevicePicks picks_;   // the rows the selectors keep
  std::vector<uint8_t> needed_;    // [block rows] 1 = kept
  std::vector<float> dashboard_acts_;  // [C, d_sae] when not an output
  const float* acts_ = nullptr;        // the last SAE chunk's activations
};

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_DERIVED_RUNNER_H_
