// The executor's intervention modes beyond the HF goldens, on the bundled
// model (no shared data needed), each against an equivalent the goldens do
// check, byte for byte:
//  - a span edits what the same list edits;
//  - add with norm_match is the reference kernel's add-and-rescale of the
//    un-edited activation (and keeps each row's norm);
//  - patch_head of head h equals a whole-row patch whose source is the
//    corrupted row with head h's columns taken from the clean run;
//  - a patch of every position of blocks.0.hook_resid_pre from a recorded
//    (clean) run turns the corrupted run into the clean run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "src/backend/cpu/reference/reference_rows.h"
#include "src/model/interventions.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

using testing::CaptureSink;

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ExecutorInterventionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                         Precision::kF32);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = *std::move(m);
    const ModelConfig& c = model_->config();
    for (int64_t l = 0; l < c.num_layers; ++l) {
      hooks_.Add({HookSite::kResidPre, l});
      hooks_.Add({HookSite::kResidPost, l});
      hooks_.Add({HookSite::kZ, l});
    }
    hooks_.Add({HookSite::kLogits, -1});
    auto ex = Executor::Create(*model_, hooks_, {.max_tokens = 64});
    ASSERT_TRUE(ex.ok()) << ex.status().message();
    ex_ = *std::move(ex);
  }

  // One forward of `ids` with `edits` (all on sequence 0).
  CaptureSink Run(const std::vector<int32_t>& ids,
                  const std::vector<const Intervention*>& ivs = {}) {
    std::vector<SequenceEdit> edits;
    for (const Intervention* iv : ivs)
      edits.push_back(
          {.seq = 0, .length = static_cast<int64_t>(ids.size()), .edit = iv});
    const std::vector<int64_t> starts = {0, static_cast<int64_t>(ids.size())};
    CaptureSink sink;
    const Status s = ex_->Forward(Batch{ids, starts}, &sink, nullptr, edits);
    EXPECT_TRUE(s.ok()) << s.message();
    return sink;
  }
  const std::vector<float>& Logits(const CaptureSink& s) {
    return s.Get({HookSite::kLogits, -1}).data;
  }

  const std::vector<int32_t> clean_ = {1, 403, 22, 91, 300, 7, 250, 12};
  const std::vector<int32_t> corrupted_ = {1, 403, 22, 480, 300, 7, 250, 12};
  std::unique_ptr<Model> model_;
  HookSet hooks_;
  std::unique_ptr<Executor> ex_;
};

std::vector<float> Direction(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = std::sin(0.7f * static_cast<float>(i)) + 0.1f;
  return v;
}

TEST_F(ExecutorInterventionsTest, SpanEqualsItsList) {
  const int64_t H = model_->config().hidden_size;
  Intervention list;
  list.hook = {HookSite::kResidPost, 1};
  list.scale = 3.0f;
  list.vector = Direction(H);
  list.positions.kind = InterventionPositions::Kind::kList;
  list.positions.list = {5, 6, 7};
  Intervention span = list;
  span.positions.kind = InterventionPositions::Kind::kSpan;
  span.positions.span_begin = -3;
  span.positions.span_to_end = true;
  const CaptureSink a = Run(clean_, {&list}), b = Run(clean_, {&span});
  EXPECT_TRUE(SameBytes(Logits(a), Logits(b)));
  EXPECT_FALSE(SameBytes(Logits(a), Logits(Run(clean_))));
  // A span outside the sequence is refused before anything runs.
  span.positions.span_begin = 4;
  span.positions.span_to_end = false;
  span.positions.span_end = 9;
  std::vector<SequenceEdit> edits = {{.seq = 0, .length = 8, .edit = &span}};
  CaptureSink sink;
  const std::vector<int64_t> starts = {0, 8};
  const Status s = ex_->Forward(Batch{clean_, starts}, &sink, nullptr, edits);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("span [4, 9) is outside a sequence of 8 tokens"),
            std::string::npos)
      << s.message();
}

TEST_F(ExecutorInterventionsTest, NormMatchIsTheReferenceAddAndRescale) {
  const int64_t H = model_->config().hidden_size;
  const HookPoint hook = {HookSite::kResidPost, 2};
  Intervention add;
  add.hook = hook;
  add.scale = 5.0f;
  add.norm_match = true;
  add.vector = Direction(H);
  add.positions.kind = InterventionPositions::Kind::kList;
  add.positions.list = {2, 6};
  // The hook's un-edited value (edits before it are none), edited by the
  // reference kernel, is what the intervened forward captures there.
  std::vector<float> want = Run(clean_).Get(hook).data;
  const std::vector<float> before = want;
  const int32_t rows[] = {2, 6};
  cpu::ref::AddRowsBroadcast(want.data(), H, H, rows, 2, add.vector.data(),
                             add.scale, /*norm_match=*/true);
  const CaptureSink got = Run(clean_, {&add});
  EXPECT_TRUE(SameBytes(got.Get(hook).data, want));
  for (int32_t r : rows) {
    double n0 = 0, n1 = 0;
    for (int64_t j = 0; j < H; ++j) {
      n0 += double{before[r * H + j]} * before[r * H + j];
      n1 += double{want[r * H + j]} * want[r * H + j];
    }
    EXPECT_NEAR(std::sqrt(n1), std::sqrt(n0), 1e-5 * std::sqrt(n0));
  }
  add.norm_match = false;
  EXPECT_FALSE(SameBytes(Run(clean_, {&add}).Get(hook).data, want));
}

TEST_F(ExecutorInterventionsTest, PatchHeadIsAPatchOfTheHeadsColumns) {
  const ModelConfig& c = model_->config();
  const int64_t Q = c.num_heads * c.head_dim, hd = c.head_dim;
  const HookPoint z = {HookSite::kZ, 1};
  const std::vector<float> clean_z = Run(clean_).Get(z).data;        // [T, Q]
  const std::vector<float> corrupt_z = Run(corrupted_).Get(z).data;  // [T, Q]
  const int64_t head = c.num_heads - 1;
  Intervention ph;
  ph.hook = z;
  ph.mode = InterventionMode::kPatchHead;
  ph.head = head;
  ph.positions.kind = InterventionPositions::Kind::kList;
  ph.positions.list = {3, 5};
  Intervention whole = ph;
  whole.mode = InterventionMode::kPatch;
  whole.head = -1;
  for (int64_t p : ph.positions.list) {
    ph.vector.insert(ph.vector.end(), clean_z.begin() + p * Q,
                     clean_z.begin() + (p + 1) * Q);
    std::vector<float> row(corrupt_z.begin() + p * Q,
                           corrupt_z.begin() + (p + 1) * Q);
    std::copy(clean_z.begin() + p * Q + head * hd,
              clean_z.begin() + p * Q + (head + 1) * hd,
              row.begin() + head * hd);
    whole.vector.insert(whole.vector.end(), row.begin(), row.end());
  }
  const CaptureSink a = Run(corrupted_, {&ph}), b = Run(corrupted_, {&whole});
  EXPECT_TRUE(SameBytes(a.Get(z).data, b.Get(z).data));
  EXPECT_TRUE(SameBytes(Logits(a), Logits(b)));
  EXPECT_FALSE(SameBytes(Logits(a), Logits(Run(corrupted_))));
  // The other heads keep the corrupted values.
  const std::vector<float>& got = a.Get(z).data;
  EXPECT_TRUE(std::equal(got.begin() + 3 * Q, got.begin() + 3 * Q + head * hd,
                         corrupt_z.begin() + 3 * Q));
}

TEST_F(ExecutorInterventionsTest, PatchingEveryEmbeddingRowGivesTheCleanRun) {
  const int64_t H = model_->config().hidden_size;
  const HookPoint hook = {HookSite::kResidPre, 0};
  const CaptureSink clean = Run(clean_);
  Intervention patch;
  patch.hook = hook;
  patch.mode = InterventionMode::kPatch;
  patch.positions.kind = InterventionPositions::Kind::kSpan;
  patch.positions.span_begin = 0;
  patch.positions.span_end = static_cast<int64_t>(clean_.size());
  patch.vector = clean.Get(hook).data;  // [T, H], a recorded run
  ASSERT_EQ(static_cast<int64_t>(patch.vector.size()),
            H * static_cast<int64_t>(clean_.size()));
  EXPECT_TRUE(SameBytes(Logits(Run(corrupted_, {&patch})), Logits(clean)));
}

}  // namespace
}  // namespace loom
