// The outputs of `loom extract`: one array per hook x selector, the hook sink
// that fills the window's staging from the forward, the offsets of ragged
// selectors, the array files (.npy, or safetensors shards) and rows.jsonl,
// and the commit protocol (docs/formats/activations.md): arrays first (data,
// then headers), then rows.jsonl, then the manifest.
#ifndef LOOM_EVAL_EXTRACT_OUTPUTS_H_
#define LOOM_EVAL_EXTRACT_OUTPUTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/eval/extract_manifest.h"
#include "src/eval/extract_rows.h"
#include "src/eval/extract_settings.h"
#include "src/eval/sae_dashboard.h"
#include "src/io/npy.h"
#include "src/model/hooks.h"
#include "src/runtime/executor.h"

namespace loom {

class DerivedRunner;  // src/eval/extract_derived_runner.h

// The one conversion of captured f32 activations to the output dtype, by the
// host backend.
//   src: [n] f32; dst: [n] values of `dtype` (F32, BF16 or F16)
void ConvertActivations(Backend& host, const float* src, uint8_t* dst,
                        DType dtype, int64_t n);

// Rows [row_begin, row_begin + rows) of a batch's packed tokens for one hook:
// row r at data + (r - row_begin) * ld, `cols` f32 values each.
struct ActivationRows {
  const float* data = nullptr;  // [rows, ld] f32, valid during the call
  int64_t row_begin = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
};

// One output array: a hook x selector pair. A derived output
// (src/eval/extract_derived.h) is an array of its source hook with `derived`
// >= 0, the index of its DerivedHook in the settings.
struct OutputArray {
  HookPoint hook;
  int derived = -1;
  std::string hook_name;
  // The file's dtype: the job's output dtype, or int32 for the top-k
  // indices of an SAE or lens (exact integers delivered as f32 values).
  DType dtype = DType::kF32;
  RowSelector sel;
  int64_t width = 0;  // values per selected row
  int64_t heads = 0;  // attn.hook_pattern: rows are [heads, width / heads]
  std::string file;   // "<hook>.<selector>.npy"
  int ragged = -1;    // index of its RaggedIndex, -1 for fixed selectors
  std::unique_ptr<NpyWriter> npy;
  // Window staging in the output dtype: fixed selectors [slots,
  // rows_per_prompt, width]; ragged ones [window rows, width]; mean/max
  // accumulate in `acc` [slots, width].
  std::vector<uint8_t> stage;
  std::vector<double> acc;
  // OutputFormat::kMemory: the committed rows, [memory_rows, row_shape...]
  // in the output dtype.
  std::vector<uint8_t> memory;
  int64_t memory_rows = 0;
  // The shape of one row of the array: [width] or [positions, width].
  std::vector<int64_t> row_shape() const;
};

// Per ragged selector: its offsets file and the window's layout.
struct RaggedIndex {
  std::string file;  // "<selector>.offsets.npy"
  std::unique_ptr<NpyWriter> npy;
  std::vector<int64_t> slot_begin;  // [slots + 1]: first row of each slot
  int64_t window_rows = 0;
  // OutputFormat::kMemory: [committed rows + 1] offsets into the data rows
  // (as the offsets file holds them).
  std::vector<int64_t> memory_offsets;
};

// What a bf16 array's .npy file holds (numpy has no bfloat16), for the
// manifest's arrays and the job's summary.
inline constexpr char kBf16NpyStorage[] =
    "uint16: the bfloat16 bits (numpy has no bfloat16); view them as "
    "ml_dtypes.bfloat16, or convert exactly with (a.astype(np.uint32) << "
    "16).view(np.float32) or loom.bf16_to_float32(a)";

class OutputSet {
 public:
  // `host` converts captured rows to `dtype` (borrowed).
  OutputSet(const ExtractSettings& settings, DType dtype, OutputFormat format,
            std::string out_dir, Backend* host);
  DType dtype() const { return dtype_; }
  // Values per token of the widest integer hook (IsIntegerSite); 0 = none.
  int64_t IntegerHookWidth() const;
  // Values per token of the widest attn.hook_pattern array; 0 = none.
  int64_t PatternRowWidth() const;

  // The file list of a fresh manifest (empty for safetensors: shards are
  // added as they are committed), the ragged data files (keys of
  // progress.ragged_rows) and the manifest's "arrays".
  std::vector<std::string> InitialFiles() const;
  std::vector<std::string> RaggedDataFiles() const;
  nlohmann::json ArraysJson() const;

  // A new job: creates the empty arrays (npy) durably.
  Status Create();
  // --resume: checks, without writing anything, that every committed array
  // (or shard in `files`) is there whole; DataLoss naming the file if not.
  Status CheckCommitted(const ManifestProgress& progress,
                        const std::vector<std::string>& files) const;
  // --resume after CheckCommitted: reopens the arrays at the committed rows
  // (dropping what was written after) or removes the shard files `files`
  // (the committed ones) does not list.
  Status Reopen(const ManifestProgress& progress,
                const std::vector<std::string>& files);

  // Sizes the staging for a window of prepared rows.
  void StageWindow(const std::vector<PreparedRow>& window);
  // Sets the window slot of each sequence of the next batch (borrowed).
  void SetBatchSlots(const std::vector<int64_t>* slots) { slots_ = slots; }
  // The next batches are chunks of a streamed row: one sequence holding
  // positions [pos0, pos0 + its length) of a row of `row_tokens` tokens.
  // Selectors resolve positions against the whole row (last = row_tokens -
  // 1, ...), and mean / max accumulate over the chunks. ClearChunk: every
  // sequence is a whole row (the packed batches).
  void SetChunk(int64_t pos0, int64_t row_tokens) {
    chunk_pos0_ = pos0;
    chunk_row_tokens_ = row_tokens;
  }
  void ClearChunk() { SetChunk(0, 0); }
  // Copies what the selectors keep of `hook`'s rows into the staging
  // (`derived` >= 0: of that derived output of `hook`).
  void Capture(const HookPoint& hook, const Batch& batch,
               const ActivationRows& rows, int derived = -1);
  // Device capture: what the selectors keep of rows [row_begin, row_begin +
  // rows) of `hook`'s block, without reading the rows. Rows to copy: the
  // block row (relative to row_begin) and its place in the window staging;
  // segments to reduce (mean / max): block rows [begin, end) and the
  // accumulator [width] they combine into. Appends to the vectors (whose
  // capacity the caller reserved).
  struct DevicePicks {
    std::vector<int32_t> rows;       // [n] block rows to copy
    std::vector<uint8_t*> dst;       // [n] staging row of each
    std::vector<int32_t> seg_begin;  // [g]
    std::vector<int32_t> seg_end;    // [g]
    std::vector<double*> seg_acc;    // [g] accumulator [width] each
    std::vector<uint8_t> seg_max;    // [g] 1 = max, 0 = sum
    // Empties every vector (keeping the capacity reserved).
    void Clear() {
      rows.clear();
      dst.clear();
      seg_begin.clear();
      seg_end.clear();
      seg_acc.clear();
      seg_max.clear();
    }
  };
  void PickRows(const HookPoint& hook, const Batch& batch, int64_t row_begin,
                int64_t rows, DevicePicks* picks, int derived = -1);
  // --sae-dashboard: the dashboard of SAE `sae` (the settings' analyses'
  // index); null without dashboards.
  SaeDashboard* dashboard(int sae) {
    return static_cast<size_t>(sae) < dashboards_.size()
               ? dashboards_[static_cast<size_t>(sae)].get()
               : nullptr;
  }
  // The input row and the position in it of packed token `t` of sequence
  // `s` of the batch in progress (SetBatchSlots, SetChunk).
  void RowPosition(const Batch& batch, int64_t s, int64_t t, int64_t* row,
                   int64_t* position) const;
  // Upper bounds for one batch of `max_tokens` tokens over every hook: rows
  // copied x their bytes in the output dtype, copied rows, and segments x
  // width reduced.
  int64_t MaxPickedBytes(int64_t max_tokens) const;
  int64_t MaxPickedRows(int64_t max_tokens) const;
  int64_t MaxSegmentValues(int64_t max_tokens) const;
  // After the window's batches: mean/max finalised, skipped rows NaN.
  void FinishWindow(const std::vector<PreparedRow>& window);
  // Writes the window's rows durably: appends and commits every .npy
  // (recording ragged counts in `progress`), or writes one shard per array,
  // numbered `window_index` (the window's place in the whole input) with
  // metadata first_row = `first_row` (its first input row), adding it to
  // `files` and counting it in progress->shards.
  Status CommitArrays(int64_t window_size, int64_t window_index,
                      int64_t first_row, ManifestProgress* progress,
                      std::vector<std::string>* files);

  // ---- OutputFormat::kMemory: the arrays kept in memory ----
  // Sizes the in-memory arrays for every row the job will commit (`rows`,
  // prepared), so that the commits never reallocate them.
  void ReserveMemory(const std::vector<PreparedRow>& rows);
  // One array as committed, handed over (moved out) by TakeMemory.
  struct MemoryArray {
    std::string hook;            // hook name
    std::string selector;        // selector spec
    std::string selector_file;   // the selector's file name ("all", "pos_0_-1")
    std::vector<int64_t> shape;  // [rows, row_shape...]
    DType dtype = DType::kF32;   // dtype() or int32 (top-k indices)
    std::vector<uint8_t> data;   // [shape] values of dtype
  };
  // The offsets of a ragged selector: data rows [offsets[i], offsets[i + 1])
  // belong to input row i (an empty range for a skipped row).
  struct MemoryOffsets {
    std::string selector;
    std::string selector_file;
    std::vector<int64_t> offsets;  // [rows + 1] i64
  };
  // Moves the committed arrays (one per hook x selector, in manifest order)
  // and the offsets (one per ragged selector) out; the set is then empty.
  std::vector<MemoryArray> TakeMemoryArrays();
  std::vector<MemoryOffsets> TakeMemoryOffsets();

 private:
  // Where sequence `s` of a batch lies in its row, seen from the block of
  // packed rows [row_begin, row_end) a hook delivered.
  struct SeqRows {
    int64_t slot = 0;    // window slot
    int64_t origin = 0;  // packed index of the row's position 0 (before the
                         // batch for a later chunk of a streamed row)
    int64_t len = 0;     // tokens of the whole row
    int64_t lo = 0;      // the sequence's packed tokens in the block:
    int64_t hi = 0;      //   [lo, hi), non-empty
  };
  SeqRows Locate(const Batch& batch, int64_t s, int64_t row_begin,
                 int64_t row_end) const;
  void CaptureFixed(OutputArray& o, const SeqRows& q,
                    const ActivationRows& rows);
  void CaptureReduced(OutputArray& o, const SeqRows& q,
                      const ActivationRows& rows);
  void CaptureRagged(OutputArray& o, const SeqRows& q,
                     const ActivationRows& rows);
  Status CommitNpy(int64_t window_size, ManifestProgress* progress);
  Status CommitMemory(int64_t window_size);
  Status CommitShards(int64_t window_size, int64_t window_index,
                      int64_t first_row, ManifestProgress* progress,
                      std::vector<std::string>* files);
  Status CheckCommittedNpy(const ManifestProgress& progress) const;
  // `n` f32 values as `o`'s dtype (int32: exact integers) into `dst`.
  void Store(const OutputArray& o, const float* src, uint8_t* dst,
             int64_t n) const;
  Status CheckCommittedShards(const ManifestProgress& progress,
                              const std::vector<std::string>& files) const;
  std::string PathOf(const std::string& file) const;

  DType dtype_;
  OutputFormat format_;
  Backend* host_;
  std::string out_dir_;
  std::vector<OutputArray> arrays_;
  std::vector<RaggedIndex> ragged_;
  const std::vector<int64_t>* slots_ = nullptr;
  int64_t chunk_pos0_ = 0, chunk_row_tokens_ = 0;     // SetChunk
  const std::vector<PreparedRow>* window_ = nullptr;  // StageWindow's
  // --sae-dashboard: one per SAE, and its file.
  std::vector<std::unique_ptr<SaeDashboard>> dashboards_;
  std::vector<std::string> dashboard_files_;
  Status CreateDashboards() const;
};

// The executor's hook sink for extraction: hands every captured block of rows
// to the OutputSet. (The one adapter between the executor's hook interface
// and the outputs.)
// Integer hooks (mlp.hook_expert_ids, delivered as i32) are written as exact
// values of the output dtype: every id must be an integer that dtype holds
// exactly (f32: < 2^24, f16: <= 2048, bf16: <= 256), else the capture fails
// with an error naming the hook and the id.
//
// Views in device memory (a GPU segment) are selected on the device: the
// sink computes which rows the selectors keep, the device backend gathers
// just those rows, converted to the output dtype, straight into pinned host
// staging (mapped memory: no separate copy), and reduces mean / max segments
// in double there; Flush(), after the batch's forward has finished, moves
// them into the window's staging. All of it is sized at EnableDevices(),
// before any forward.
class ExtractSink : public HookSink {
 public:
  // Batches of up to `max_tokens` tokens: the staging of integer hooks is
  // sized here, before any forward.
  ExtractSink(OutputSet* outputs, int64_t max_tokens)
      : outputs_(outputs),
        max_tokens_(max_tokens),
        ints_(static_cast<size_t>(max_tokens * outputs->IntegerHookWidth())),
        device_ints_(ints_.size()),
        pattern_row_(static_cast<size_t>(outputs->PatternRowWidth())) {}
  // The device backends whose views may arrive (one per executor segment
  // that is not on the host): allocates the pinned staging of the device
  // path from the first of them.
  Status EnableDevices(const std::vector<Backend*>& devices);
  // The SAEs and lenses computed from delivered hooks (borrowed; null:
  // none). Their sources must arrive in host memory.
  void SetDerived(DerivedRunner* derived) { derived_ = derived; }
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override;
  // After a forward (whose backends have synchronised): completes the
  // device captures of that batch.
  void Flush();

 private:
  Status OnDeviceActivation(const HookPoint& hook, const Batch& batch,
                            int64_t row_begin, const ActivationView& view);
  // attn.hook_pattern of one sequence ([heads, L, L], row_begin = its first
  // packed token): handed to the outputs one query token at a time, as a
  // [heads, pattern keys] row.
  Status OnPattern(const HookPoint& hook, const Batch& batch, int64_t row_begin,
                   const ActivationView& view);
  OutputSet* outputs_;
  int64_t max_tokens_;
  DerivedRunner* derived_ = nullptr;
  std::vector<float> ints_;  // [rows, cols] an integer hook's values as f32
  // An integer hook's values copied from a device: [rows, cols] i32.
  std::vector<int32_t> device_ints_;
  std::vector<float> pattern_row_;  // [heads, pattern keys] one query's row
  // ---- Device path ----
  std::vector<Backend*> devices_;
  Buffer pinned_rows_;   // [picked bytes] gathered rows, output dtype
  Buffer pinned_index_;  // [picked rows + 2 segments] i32 row indices
  Buffer pinned_sums_;   // [segment values] f64 reductions
  int64_t bytes_used_ = 0, index_used_ = 0, sums_used_ = 0;
  OutputSet::DevicePicks picks_;
  struct Pending {
    uint8_t* dst;
    const uint8_t* src;
    int64_t bytes;
  };
  struct PendingSegment {
    double* acc;
    const double* sums;
    int64_t width;
    bool max;
  };
  std::vector<Pending> pending_;
  std::vector<PendingSegment> pending_segments_;
};

// rows.jsonl: one record per input row, appended per commit.
class RowsLog {
 public:
  explicit RowsLog(std::string path) : path_(std::move(path)) {}
  // A new job: creates the file empty.
  Status Create();
  // --resume: reads the committed bytes [0, progress.rows_file_bytes) once,
  // writing nothing, and checks that they are progress.rows_committed lines,
  // line i the record of row i with exactly the fields Records writes, as
  // many "ok" and "skipped" as progress counts, and, when the manifest
  // records it, their crc32. DataLoss naming the file and the byte offset
  // (and line) of the first difference, or the committed range when only
  // the checksum differs. Returns the crc32 of the committed bytes.
  // `input_row` maps line i to the row it must record (a --shard job's
  // lines are not rows 0, 1, 2, ...); none = line i is row i.
  StatusOr<uint32_t> CheckCommitted(
      const ManifestProgress& progress,
      const std::function<int64_t(int64_t)>& input_row = nullptr) const;
  // --resume after the check: cuts what was appended after the commit.
  Status Reopen(int64_t committed_bytes);
  // The window's records; counts ok and skipped rows.
  static std::string Records(const std::vector<PreparedRow>& window,
                             int64_t* rows_ok, int64_t* rows_skipped);
  // Appends and syncs; returns the bytes appended.
  StatusOr<int64_t> Append(const std::string& records);
  // zlib's crc32 of `bytes`, continuing `crc` (the crc32 of what precedes
  // them; 0 for none).
  static uint32_t Crc32(uint32_t crc, std::string_view bytes);
  // All records, for the completed manifest's "rows".
  StatusOr<nlohmann::json> ReadAll() const;

 private:
  std::string path_;
};

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_OUTPUTS_H_
