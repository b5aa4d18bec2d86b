// Feature dashboards of an SAE over a whole extraction (`loom extract --sae
// ... --sae-dashboard N`), in the style of Neuronpedia's feature pages, one
// pass over every token of every row:
//   count[f]          tokens on which feature f fires (activation > 0)
//   max[f]            its largest activation (0 when it never fires)
//   sum[f]            the sum of its activations (mean when firing:
//                     sum / count)
//   top_*[f, N]       its N largest activations with the input row and the
//                     token position of each, descending; ties to the lower
//                     row, then position; unused slots: value 0, row and
//                     position -1
// Every statistic is independent of the order the tokens arrive in (the sum
// is exact fixed point: each activation truncated to a multiple of 2^-60,
// added as integers), so the file is the same bytes at any batch packing
// and --threads. Written at every commit as HOOK.hook_sae_acts_post.
// dashboard.safetensors (the previous commit's kept as .prev until the
// manifest names the new one's row count), and reloaded by --resume.
#ifndef LOOM_EVAL_SAE_DASHBOARD_H_
#define LOOM_EVAL_SAE_DASHBOARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace loom {

class SaeDashboard {
 public:
  SaeDashboard(int64_t features, int64_t top_n);

  // One token's activations [features].
  void Add(int64_t row, int64_t position, const float* acts);

  // Writes the state durably as `path` with metadata rows = `rows`,
  // keeping the previous file as `path`.prev until the next write.
  Status Write(const std::string& path, int64_t rows) const;
  // Reads the state of `rows` committed rows back: `path`, or its .prev
  // (a kill between the dashboard's write and the manifest's); DataLoss
  // naming the file otherwise. `check_only`: nothing is kept.
  Status Load(const std::string& path, int64_t rows, bool check_only = false);

  int64_t features() const { return features_; }
  int64_t top_n() const { return n_; }

 private:
  struct Entry {
    float value = 0;
    int64_t row = -1, position = -1;
  };
  // Whether a ranks before b: larger value, then lower row, then position.
  static bool Before(const Entry& a, const Entry& b);
  Status Read(const std::string& path, int64_t rows, bool keep);

  int64_t features_, n_;
  std::vector<int64_t> count_;
  std::vector<float> max_;
  std::vector<__int128> sum_;  // multiples of 2^-60
  // [features, n]: a heap per feature (the worst kept entry first) while
  // filling; sorted when written.
  std::vector<Entry> top_;
  std::vector<int64_t> filled_;  // [features] entries in use
};

}  // namespace loom

#endif  // LOOM_EVAL_SAE_DASHBOARD_H_
