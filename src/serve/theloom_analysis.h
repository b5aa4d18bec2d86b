// TheLoom's analysis routes, computed the way TheLoom computes them:
// POST /analyze/geometry (Wolf-axiom density, directional coverage, grains,
// overall health), POST /analyze/bilateral (alignment of two sets), and the
// statistics of one vector that TheLoom's text-form POST /analyze returns.
// The algorithms and their quirks are TheLoom's (its kakeya_geometry.py and
// hidden_states.py; docs/server.md lists what Loom adds: a `seed`, the
// limits, 400 instead of 422).
//
// Numbers: requests are rounded to float32 as TheLoom does (np.float32), and
// the float32 steps whose results are discrete (the row normalisation, the
// sparsity threshold) are float32 here too; everything else is computed in
// double (Eigen), which matches TheLoom's float32 pipeline to its own
// round-off. Principal components come from the eigen-decomposition of the
// centered Gram matrix (rows <= columns) or covariance matrix, one Gram
// matrix per set serving the PCA, the DBSCAN distances and the grains.
//
// Randomness: TheLoom draws unseeded numbers (the Wolf regions, the pairs of
// spherical_uniformity when n >= 101). Here every draw comes from numpy's
// legacy RandomState(seed) recipe (MT19937 init_genrand, polar Box-Muller
// with a cached normal, masked randint), so seed 0 reproduces TheLoom's
// values when it is seeded with 0.
#ifndef LOOM_SERVE_THELOOM_ANALYSIS_H_
#define LOOM_SERVE_THELOOM_ANALYSIS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace loom::serve::theloom {

using nlohmann::json;

// A row-major float32 matrix: the rows of a request's list of vectors.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> values;  // rows * cols
  const float* row(int64_t i) const { return values.data() + i * cols; }
};

// At most this many vectors per set: the analysis keeps a rows x rows Gram
// matrix of doubles (128 MiB at this size).
inline constexpr int64_t kMaxVectors = 4096;
// The seed when a request gives none (TheLoom's goldens' reference mode).
inline constexpr uint32_t kDefaultSeed = 0;

// numpy's legacy RandomState (MT19937): seeded with init_genrand(seed) as
// RandomState(int) does; doubles, uniform, randn (polar method, caching the
// second normal) and randint(0, n) (masked rejection) draw as numpy does.
class LegacyRandom {
 public:
  explicit LegacyRandom(uint32_t seed);
  uint32_t NextU32();
  double NextDouble();  // [0, 1), 53 bits
  double Uniform(double lo, double hi);
  double Gauss();
  int64_t RandInt(int64_t n);  // [0, n), n >= 1

 private:
  uint32_t mt_[624];
  int index_ = 624;
  bool has_gauss_ = false;
  double gauss_ = 0;
};

// Student's t two-sided p-value of statistic t with df degrees of freedom.
double StudentTwoSidedP(double t, double df);

struct WolfResult {
  std::vector<double> ratios;  // one per region tested, in region order
  double max_ratio = 1, mean_ratio = 1, p_value = 1;
  int64_t violations = 0;
  std::string severity;
};
// check_wolf_axioms: `regions` random regions of three half-spaces each.
WolfResult WolfDensity(const Matrix& x, int regions, uint32_t seed,
                       int threads = 0);

struct GeometryResult {
  int64_t num_vectors = 0, ambient_dim = 0;
  WolfResult wolf;
  // Directional coverage.
  int64_t effective_dim = 0, effective_dim_99 = 0;
  double coverage_ratio = 0;
  std::string coverage_quality;
  double spherical_uniformity = 0;
  double isotropy_score = 0;
  // Grains.
  double grain_eps = 0;
  std::vector<int64_t> labels;  // DBSCAN label per row, -1 = noise
  int64_t num_grains = 0;
  double grain_coverage = 0, mean_grain_size = 0, mean_local_dim = 0,
         mean_aspect_ratio = 0;
  std::vector<int64_t> local_dims;
  std::vector<double> aspect_ratios;
  bool has_structure = false;
  std::string overall_health;
};
// The whole /analyze/geometry analysis (Wolf with 50 regions). x has >= 1
// row and >= 1 column, finite values.
GeometryResult AnalyzeGeometry(const Matrix& x, uint32_t seed, int threads = 0);
// The route's response fields (analysis_time_ms added by the caller).
json GeometryJson(const GeometryResult& g);

struct BilateralResult {
  double directional_alignment = 0, subspace_overlap = 0, grain_alignment = 0,
         density_similarity = 0, effective_dim_ratio = 0, overall_alignment = 0;
  int64_t subspace_components = 0;
  struct Side {
    int64_t num_grains = 0, effective_dim = 0;
    double grain_coverage = 0, mean_local_dim = 0, grain_eps = 0,
           wolf_mean_density_ratio = 0;
  } sender, receiver;
};
// compare_bilateral_geometry; s and r have the same number of columns.
BilateralResult AnalyzeBilateral(const Matrix& s, const Matrix& r,
                                 uint32_t seed, int threads = 0);
json BilateralJson(const BilateralResult& b);

// analyze_hidden_state of a float32 vector (TheLoom's /analyze statistics):
// shape, layer (-1), dtype ("torch.float32"), mean, std, min, max, l2_norm,
// sparsity (|x| < float32(1e-6)), percentile_25/50/75, embedding_shape. An
// empty vector gives zeros and no percentiles.
json HiddenStateStatistics(const std::vector<float>& x);

// A request body of an analysis route: the fields named in `matrix_fields`
// as matrices (each a list of lists of numbers, rounded to float32), every
// other field as JSON in `rest`. Numbers are read straight from the text
// (no JSON tree of the vectors): an 80 MB body of 4M numbers parses in
// well under a second. Errors (InvalidArgument) name the field and the
// row: a field missing or not a list of lists, a non-number, rows of
// different lengths, an empty row, a value that is not finite in float32,
// fewer than `min_rows` or more than `max_rows` rows.
struct AnalysisBody {
  std::vector<Matrix> matrices;  // in the order of matrix_fields
  json rest = json::object();
};
StatusOr<AnalysisBody> ParseAnalysisBody(
    std::string_view body, const std::vector<std::string>& matrix_fields,
    int64_t min_rows, int64_t max_rows);

// The request's `seed` (kDefaultSeed when missing or null): an integer in
// [0, 2^32 - 1] (numpy's seed range), else InvalidArgument.
StatusOr<uint32_t> SeedOf(const json& rest);

}  // namespace loom::serve::theloom

#endif  // LOOM_SERVE_THELOOM_ANALYSIS_H_
