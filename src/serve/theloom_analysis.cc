#include "src/serve/theloom_analysis.h"

#include <immintrin.h>

#include <Eigen/Dense>
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "src/serve/api.h"

namespace loom::serve::theloom {
namespace {

using MatD = Eigen::MatrixXd;
using RowMatD =
    Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecD = Eigen::VectorXd;

int Threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(std::min(hc, 16u));
}

// Runs `side` on another thread while `main` runs on this one; an exception
// of either (std::bad_alloc for a large set) reaches the caller after both
// have ended, never std::terminate.
void RunBeside(const std::function<void()>& main,
               const std::function<void()>& side) {
  std::exception_ptr side_error;
  std::thread t([&] {
    try {
      side();
    } catch (...) {
      side_error = std::current_exception();
    }
  });
  try {
    main();
  } catch (...) {
    t.join();
    throw;
  }
  t.join();
  if (side_error) std::rethrow_exception(side_error);
}

// Runs fn(i) for i in [0, count) on up to `threads` threads (exceptions as
// RunBeside's: the first one is rethrown here).
void ParallelFor(int64_t count, int threads,
                 const std::function<void(int64_t)>& fn) {
  const int t = static_cast<int>(std::min<int64_t>(Threads(threads), count));
  if (t <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&] {
    try {
      for (int64_t i; (i = next.fetch_add(1)) < count;) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      next = count;  // the others stop at their next item
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < t; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

// One set of vectors, prepared once for every part of the analysis.
struct Prepared {
  int64_t n = 0, d = 0;
  RowMatD x;                 // the float32 values as doubles
  std::vector<double> norm;  // float32 row norms, 1 for a zero row
  // Rows with equal values share a group (the first such row's index):
  // their distances are exactly 0 and a set of them has exactly zero
  // variance, which the Gram matrix's round-off would blur.
  std::vector<int64_t> group;
  MatD gx;  // n x n Gram matrix of the rows
  MatD gu;  // n x n Gram matrix of the normalised rows (cosines)
};

// Dot products of rows: out[i * ldo + j] += a_i . b_j for up to 3 x 3 rows
// (na, nb <= 3) over `len` columns. The AVX2/FMA kernel runs when the CPU
// has it (and LOOM_CPU_ISA does not cap it to baseline, as for the CPU
// backend); Eigen's product (SSE2 in this build) otherwise.
__attribute__((target("avx2,fma"))) void Dots3x3Avx2(const double* const* a,
                                                     int na,
                                                     const double* const* b,
                                                     int nb, int64_t len,
                                                     double* out, int64_t ldo) {
  __m256d c[3][3];
  for (auto& row : c)
    for (auto& v : row) v = _mm256_setzero_pd();
  const double* a0 = a[0];
  const double* a1 = a[na > 1 ? 1 : 0];
  const double* a2 = a[na > 2 ? 2 : 0];
  const double* b0 = b[0];
  const double* b1 = b[nb > 1 ? 1 : 0];
  const double* b2 = b[nb > 2 ? 2 : 0];
  int64_t k = 0;
  for (; k + 4 <= len; k += 4) {
    const __m256d x0 = _mm256_loadu_pd(a0 + k), x1 = _mm256_loadu_pd(a1 + k),
                  x2 = _mm256_loadu_pd(a2 + k);
    __m256d y = _mm256_loadu_pd(b0 + k);
    c[0][0] = _mm256_fmadd_pd(x0, y, c[0][0]);
    c[1][0] = _mm256_fmadd_pd(x1, y, c[1][0]);
    c[2][0] = _mm256_fmadd_pd(x2, y, c[2][0]);
    y = _mm256_loadu_pd(b1 + k);
    c[0][1] = _mm256_fmadd_pd(x0, y, c[0][1]);
    c[1][1] = _mm256_fmadd_pd(x1, y, c[1][1]);
    c[2][1] = _mm256_fmadd_pd(x2, y, c[2][1]);
    y = _mm256_loadu_pd(b2 + k);
    c[0][2] = _mm256_fmadd_pd(x0, y, c[0][2]);
    c[1][2] = _mm256_fmadd_pd(x1, y, c[1][2]);
    c[2][2] = _mm256_fmadd_pd(x2, y, c[2][2]);
  }
  const double* as[3] = {a0, a1, a2};
  const double* bs[3] = {b0, b1, b2};
  for (int i = 0; i < na; ++i)
    for (int j = 0; j < nb; ++j) {
      alignas(32) double lanes[4];
      _mm256_store_pd(lanes, c[i][j]);
      double v = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
      for (int64_t q = k; q < len; ++q) v += as[i][q] * bs[j][q];
      out[i * ldo + j] += v;
    }
}

bool UseAvx2() {
  static const bool use = [] {
    const char* cap = std::getenv("LOOM_CPU_ISA");
    if (cap != nullptr && std::strcmp(cap, "baseline") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return use;
}

// out (row-major, ldo) = A[a0 .. a0+na) . B[b0 .. b0+nb)^T for row-major
// A, B of the same width: the AVX2 kernel over chunks of columns (the rows'
// chunks stay in cache), or Eigen.
void RowDots(const RowMatD& a, int64_t a0, int64_t na, const RowMatD& b,
             int64_t b0, int64_t nb, double* out, int64_t ldo) {
  const int64_t d = a.cols();
  if (!UseAvx2()) {
    Eigen::Map<RowMatD, 0, Eigen::OuterStride<>> o(out, na, nb,
                                                   Eigen::OuterStride<>(ldo));
    o.noalias() = a.middleRows(a0, na) * b.middleRows(b0, nb).transpose();
    return;
  }
  for (int64_t i = 0; i < na; ++i)
    std::fill(out + i * ldo, out + i * ldo + nb, 0.0);
  const int64_t chunk = 512;
  for (int64_t k0 = 0; k0 < d; k0 += chunk) {
    const int64_t len = std::min(chunk, d - k0);
    for (int64_t i = 0; i < na; i += 3) {
      const int ni = static_cast<int>(std::min<int64_t>(3, na - i));
      const double* ar[3];
      for (int q = 0; q < ni; ++q) ar[q] = a.row(a0 + i + q).data() + k0;
      for (int64_t j = 0; j < nb; j += 3) {
        const int nj = static_cast<int>(std::min<int64_t>(3, nb - j));
        const double* br[3];
        for (int q = 0; q < nj; ++q) br[q] = b.row(b0 + j + q).data() + k0;
        Dots3x3Avx2(ar, ni, br, nj, len, out + i * ldo + j, ldo);
      }
    }
  }
}

// X X^T, the lower-triangle blocks spread over threads, then mirrored.
MatD Gram(const RowMatD& x, int threads) {
  const int64_t n = x.rows();
  RowMatD g(n, n);
  const int64_t bs = 96;
  const int64_t blocks = (n + bs - 1) / bs;
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t i = 0; i < blocks; ++i)
    for (int64_t j = 0; j <= i; ++j) tiles.emplace_back(i, j);
  ParallelFor(static_cast<int64_t>(tiles.size()), threads, [&](int64_t t) {
    const auto [bi, bj] = tiles[t];
    const int64_t i0 = bi * bs, j0 = bj * bs;
    const int64_t ni = std::min(bs, n - i0), nj = std::min(bs, n - j0);
    RowDots(x, i0, ni, x, j0, nj, g.data() + i0 * n + j0, n);
  });
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) g(i, j) = g(j, i);
  return g;
}

// The rows as doubles and their norms (np.linalg.norm of a float32 row is a
// float32; a zero row keeps norm 1).
Prepared LoadRows(const Matrix& m) {
  Prepared p;
  p.n = m.rows;
  p.d = m.cols;
  p.x.resize(p.n, p.d);
  p.norm.resize(p.n);
  for (int64_t i = 0; i < p.n; ++i) {
    const float* r = m.row(i);
    double ss = 0;
    for (int64_t j = 0; j < p.d; ++j) {
      p.x(i, j) = r[j];
      ss += static_cast<double>(r[j]) * r[j];
    }
    const float nf = static_cast<float>(std::sqrt(ss));
    p.norm[i] = nf == 0.0f ? 1.0 : static_cast<double>(nf);
  }
  return p;
}

Prepared Prepare(const Matrix& m, int threads) {
  Prepared p = LoadRows(m);
  p.group.resize(p.n);
  std::unordered_map<std::string_view, int64_t> first;
  const size_t row_bytes = static_cast<size_t>(p.d) * sizeof(float);
  for (int64_t i = 0; i < p.n; ++i) {
    const std::string_view bytes(reinterpret_cast<const char*>(m.row(i)),
                                 row_bytes);
    p.group[i] = first.emplace(bytes, i).first->second;
  }
  p.gx = Gram(p.x, threads);
  // Identical rows get identical Gram entries.
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t i = 0; i < p.n; ++i)
      if (p.group[i] != i || p.group[j] != j)
        p.gx(i, j) = p.gx(p.group[i], p.group[j]);
  std::vector<double> inv(p.n);
  for (int64_t i = 0; i < p.n; ++i)
    inv[i] = p.gx(i, i) > 0 ? 1.0 / std::sqrt(p.gx(i, i)) : 0.0;
  p.gu = p.gx;
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t i = 0; i < p.n; ++i) p.gu(i, j) *= inv[i] * inv[j];
  return p;
}

// Row i of the normalised matrix U.
VecD URow(const Prepared& p, int64_t i) {
  const double nn = p.gx(i, i);
  return p.x.row(i).transpose() / (nn > 0 ? std::sqrt(nn) : 1.0);
}

// PCA spectrum of some rows: the explained variances (eigenvalues of the
// centered data's covariance, divided by m - 1), descending, min(m, d) of
// them, and their exact sum (the total variance). Eigenvalues are taken
// in absolute value: a round-off eigenvalue is a tiny positive number in
// an SVD, as in TheLoom's.
struct Spectrum {
  std::vector<double> lambda;
  double total = 0;
  MatD vectors;  // when asked for: top eigenvectors (columns), see callers
};

Spectrum FinishSpectrum(const VecD& ascending, double trace, int64_t m) {
  Spectrum s;
  const double div = m > 1 ? static_cast<double>(m - 1) : 1.0;
  for (int64_t i = ascending.size() - 1; i >= 0; --i)
    s.lambda.push_back(std::fabs(ascending(i)) / div);
  s.total = trace / div;
  return s;
}

// The centered m x m Gram matrix of rows whose Gram matrix is `g`.
MatD CenterGram(const MatD& g) {
  const int64_t m = g.rows();
  const VecD r = g.rowwise().mean();
  const double s = r.mean();
  MatD c(m, m);
  for (int64_t j = 0; j < m; ++j)
    for (int64_t i = 0; i < m; ++i) c(i, j) = g(i, j) - r(i) - r(j) + s;
  return c;
}

// Eigenvectors of the symmetric tridiagonal matrix (diag, sub) for its
// eigenvalues `lambda`, by inverse iteration (LAPACK's dgttrf/dgttrs LU with
// partial pivoting), each orthogonalised against the ones before it (which
// keeps a cluster of close eigenvalues spanning its subspace).
MatD TridiagonalVectors(const VecD& diag, const VecD& sub,
                        const std::vector<double>& lambda) {
  const int64_t n = diag.size();
  const int64_t k = static_cast<int64_t>(lambda.size());
  double scale = 0;
  for (int64_t i = 0; i < n; ++i)
    scale = std::max(scale, std::fabs(diag(i)) +
                                (i > 0 ? std::fabs(sub(i - 1)) : 0.0) +
                                (i + 1 < n ? std::fabs(sub(i)) : 0.0));
  const double tiny = std::max(scale, 1e-300) * 1e-15;
  MatD y(n, k);
  std::vector<double> dl(n), d(n), du(n), du2(n);
  std::vector<char> swapped(n);
  for (int64_t j = 0; j < k; ++j) {
    // LU of T - lambda_j I.
    for (int64_t i = 0; i < n; ++i) {
      d[i] = diag(i) - lambda[j];
      if (i + 1 < n) dl[i] = du[i] = sub(i);
      du2[i] = 0;
      swapped[i] = 0;
    }
    for (int64_t i = 0; i + 1 < n; ++i) {
      if (std::fabs(d[i]) >= std::fabs(dl[i])) {
        if (d[i] == 0) d[i] = tiny;
        const double fact = dl[i] / d[i];
        dl[i] = fact;
        d[i + 1] -= fact * du[i];
      } else {
        const double fact = d[i] / dl[i];
        d[i] = dl[i];
        dl[i] = fact;
        const double temp = du[i];
        du[i] = d[i + 1];
        d[i + 1] = temp - fact * d[i + 1];
        if (i + 2 < n) {
          du2[i] = du[i + 1];
          du[i + 1] = -fact * du[i + 1];
        }
        swapped[i] = 1;
      }
    }
    if (d[n - 1] == 0) d[n - 1] = tiny;
    VecD x(n);
    for (int64_t i = 0; i < n; ++i)
      x(i) = 1.0 + 0.5 * std::sin(static_cast<double>(i * (j + 3)));
    for (int iter = 0; iter < 4; ++iter) {
      for (int64_t i = 0; i + 1 < n; ++i) {
        if (swapped[i]) std::swap(x(i), x(i + 1));
        x(i + 1) -= dl[i] * x(i);
      }
      for (int64_t i = n - 1; i >= 0; --i) {
        double v = x(i);
        if (i + 1 < n) v -= du[i] * x(i + 1);
        if (i + 2 < n) v -= du2[i] * x(i + 2);
        x(i) = v / d[i];
      }
      for (int64_t q = 0; q < j; ++q) x -= y.col(q).dot(x) * y.col(q);
      const double nx = x.norm();
      if (!(nx > 0) || !std::isfinite(nx)) {
        x = VecD::Unit(n, j % n);
        continue;
      }
      x /= nx;
    }
    y.col(j) = x;
  }
  return y;
}

// From the Gram matrix of m <= d rows. With `top` > 0, the top eigenvectors
// of the centered Gram matrix too (m x top). `identical`: every row is the
// same (zero variance, exactly).
Spectrum SpectrumFromGram(const MatD& g, int64_t top = 0,
                          bool identical = false) {
  MatD c = CenterGram(g);
  if (identical) c.setZero();
  const int64_t m = g.rows();
  const double trace = c.trace();
  if (m < 3) {
    Eigen::SelfAdjointEigenSolver<MatD> es(
        c, top > 0 ? Eigen::ComputeEigenvectors : Eigen::EigenvaluesOnly);
    Spectrum s = FinishSpectrum(es.eigenvalues(), trace, m);
    if (top > 0)
      s.vectors = es.eigenvectors().rightCols(top).rowwise().reverse();
    return s;
  }
  // Tridiagonal form, its eigenvalues, and (when asked) the top
  // eigenvectors by inverse iteration mapped back: O(m^3) once, not the
  // full eigenvector matrix.
  Eigen::Tridiagonalization<MatD> tri(c);
  const VecD diag = tri.diagonal();
  const VecD sub = tri.subDiagonal();
  Eigen::SelfAdjointEigenSolver<MatD> es;
  es.computeFromTridiagonal(diag, sub, Eigen::EigenvaluesOnly);
  Spectrum s = FinishSpectrum(es.eigenvalues(), trace, m);
  if (top > 0) {
    std::vector<double> lambda;
    for (int64_t j = 0; j < top; ++j)
      lambda.push_back(es.eigenvalues()(m - 1 - j));
    const MatD y = TridiagonalVectors(diag, sub, lambda);
    s.vectors = tri.matrixQ() * y;
  }
  return s;
}

// From the rows themselves (m > d): the d x d covariance. With `top` > 0,
// its top eigenvectors (d x top: the principal components).
Spectrum SpectrumFromRows(const RowMatD& rows, int64_t top = 0,
                          bool identical = false) {
  const int64_t m = rows.rows();
  const Eigen::RowVectorXd mean = rows.colwise().mean();
  RowMatD c = rows.rowwise() - mean;
  if (identical) c.setZero();
  MatD cov = MatD::Zero(c.cols(), c.cols());
  cov.selfadjointView<Eigen::Lower>().rankUpdate(c.transpose());
  cov.triangularView<Eigen::StrictlyUpper>() = cov.transpose();
  Eigen::SelfAdjointEigenSolver<MatD> es(
      cov, top > 0 ? Eigen::ComputeEigenvectors : Eigen::EigenvaluesOnly);
  Spectrum s = FinishSpectrum(es.eigenvalues(), cov.trace(), m);
  if (top > 0) s.vectors = es.eigenvectors().rightCols(top).rowwise().reverse();
  return s;
}

// The smallest k >= 1 with cumsum(lambda[:count] / total)[k-1] >= t, else
// count + 1 (numpy's searchsorted + 1); 1 for zero total variance (numpy's
// search over NaN ratios).
int64_t FirstReaching(const Spectrum& s, int64_t count, double t) {
  if (!(s.total > 0)) return 1;
  double cum = 0;
  for (int64_t k = 0; k < count; ++k) {
    cum += s.lambda[k] / s.total;
    if (cum >= t) return k + 1;
  }
  return count + 1;
}

// ---- Wolf density (check_wolf_axioms)

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

WolfResult Wolf(const Prepared& p, int regions, uint32_t seed, int threads) {
  const int64_t n = p.n, d = p.d;
  LegacyRandom rng(seed);
  const int64_t cols = 3 * static_cast<int64_t>(regions);
  RowMatD a(cols, d);  // one unit normal per row
  std::vector<double> t(cols);
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  for (int64_t c = 0; c < cols; ++c) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) {
      a(c, i) = rng.Gauss();
      ss += a(c, i) * a(c, i);
    }
    a.row(c) /= std::sqrt(ss);
    t[c] = rng.Uniform(-0.5, 0.5) / sqrt_d;
  }
  // n x cols projections, divided by the row norms below.
  RowMatD proj(n, cols);
  const int64_t bs = 96;
  ParallelFor((n + bs - 1) / bs, threads, [&](int64_t b) {
    const int64_t i0 = b * bs, ni = std::min(bs, n - i0);
    RowDots(p.x, i0, ni, a, 0, cols, proj.data() + i0 * cols, cols);
  });
  WolfResult w;
  for (int r = 0; r < regions; ++r) {
    double expected = 1.0;
    for (int k = 0; k < 3; ++k)
      expected *= 1.0 - NormalCdf(t[3 * r + k] * sqrt_d);
    if (expected < 0.01) continue;  // cannot happen: each factor >= 0.3085
    int64_t inside = 0;
    for (int64_t i = 0; i < n; ++i) {
      bool in = true;
      for (int k = 0; k < 3 && in; ++k)
        in = proj(i, 3 * r + k) / p.norm[i] >= t[3 * r + k];
      inside += in;
    }
    w.ratios.push_back(static_cast<double>(inside) / static_cast<double>(n) /
                       expected);
  }
  const size_t m = w.ratios.size();
  if (m == 0) {
    w.severity = "none";
    return w;
  }
  w.max_ratio = *std::max_element(w.ratios.begin(), w.ratios.end());
  w.mean_ratio = std::accumulate(w.ratios.begin(), w.ratios.end(), 0.0) /
                 static_cast<double>(m);
  w.p_value = 1.0;
  if (m > 2) {
    double ss = 0;
    for (double r : w.ratios) ss += (r - w.mean_ratio) * (r - w.mean_ratio);
    const double sd = std::sqrt(ss / static_cast<double>(m - 1));
    if (sd > 0) {
      const double tt = (w.mean_ratio - 1.0) / (sd / std::sqrt(double(m)));
      w.p_value = StudentTwoSidedP(tt, static_cast<double>(m - 1));
    } else {
      // scipy: t = +-inf gives p = 0; all ratios exactly 1 gives NaN.
      w.p_value =
          w.mean_ratio == 1.0 ? std::numeric_limits<double>::quiet_NaN() : 0.0;
    }
  }
  for (double r : w.ratios) w.violations += r > 2.5;
  const double mx = w.max_ratio;
  w.severity = mx < 1.5   ? "none"
               : mx < 2.5 ? "mild"
               : mx < 5.0 ? "moderate"
                          : "severe";
  return w;
}

// ---- Directional coverage

struct Coverage {
  int64_t effective_dim = 1, effective_dim_99 = 1;
  double ratio = 0;
  std::string quality;
  double spherical = 0.5, isotropy = 0;
};

// Whether the rows `members` (all rows when empty) are all the same.
bool AllSame(const Prepared& p, const std::vector<int64_t>& members = {}) {
  if (members.empty())
    return std::all_of(p.group.begin(), p.group.end(),
                       [&](int64_t g) { return g == p.group[0]; });
  for (int64_t i : members)
    if (p.group[i] != p.group[members[0]]) return false;
  return true;
}

Spectrum DataSpectrum(const Prepared& p) {
  if (p.n <= p.d) return SpectrumFromGram(p.gx, 0, AllSame(p));
  return SpectrumFromRows(p.x, 0, AllSame(p));
}

Coverage DirectionalCoverage(const Prepared& p, const Spectrum& s,
                             uint32_t seed) {
  Coverage c;
  const int64_t n = p.n, d = p.d;
  const int64_t k = std::min(n - 1, d);
  c.effective_dim = FirstReaching(s, k, 0.95);
  c.effective_dim_99 = FirstReaching(s, k, 0.99);
  c.ratio = static_cast<double>(c.effective_dim) / static_cast<double>(d);
  c.quality = c.ratio < 0.1   ? "degenerate"
              : c.ratio < 0.3 ? "sparse"
              : c.ratio < 0.6 ? "moderate"
                              : "full";
  // Spherical uniformity from the cosines of pairs of rows.
  if (n >= 10) {
    double sum = 0, sum2 = 0;
    int64_t count = 0;
    auto add = [&](int64_t i, int64_t j) {
      const double cs = p.gu(i, j);
      sum += cs;
      sum2 += cs * cs;
      ++count;
    };
    if (n * (n - 1) / 2 <= 5000) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = i + 1; j < n; ++j) add(i, j);
    } else {
      LegacyRandom rng(seed);
      std::vector<int64_t> first(5000), second(5000);
      for (auto& v : first) v = rng.RandInt(n);
      for (auto& v : second) v = rng.RandInt(n);
      for (int q = 0; q < 5000; ++q)
        if (first[q] != second[q]) add(first[q], second[q]);
    }
    if (count > 0) {
      const double mu = sum / static_cast<double>(count);
      const double var =
          std::max(0.0, sum2 / static_cast<double>(count) - mu * mu);
      const double sigma = std::sqrt(var);
      const double e = 1.0 / std::sqrt(static_cast<double>(d));
      c.spherical = 0.5 * std::exp(-std::fabs(mu) * std::sqrt(double(d))) +
                    0.5 * std::exp(-std::fabs(sigma - e) / e);
    }
  }
  // Isotropy: geometric mean of the positive eigenvalues over the largest.
  if (k >= 1 && s.lambda[0] > 0) {
    double logs = 0;
    int64_t count = 0;
    for (int64_t j = 0; j < k; ++j)
      if (s.lambda[j] > 0) {
        logs += std::log(s.lambda[j] + 1e-10);
        ++count;
      }
    c.isotropy = std::exp(logs / static_cast<double>(count)) / s.lambda[0];
  }
  return c;
}

// ---- Grains (analyze_grains)

struct Grains {
  double eps = 0.5;
  std::vector<int64_t> labels;
  int64_t num = 0;
  double coverage = 0, mean_size = 0, mean_local_dim = 0, mean_aspect = 0;
  std::vector<int64_t> local_dims;
  std::vector<double> aspects;
  bool has_structure = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

// `whole`: the spectrum of all rows' normalised data when already computed
// (a grain of every row reuses it), else null.
Grains AnalyzeGrains(const Prepared& p, const Spectrum* whole, int threads) {
  Grains g;
  const int64_t n = p.n;
  const MatD& gu = p.gu;
  // eps: 1.5 x the median distance to the (k+1)-th nearest other row.
  const int64_t k = std::min<int64_t>(3, n - 1);
  std::vector<double> kth;
  if (k <= n - 2) {
    kth.resize(n);
    ParallelFor(n, threads, [&](int64_t i) {
      std::vector<double> dist;
      dist.reserve(n - 1);
      for (int64_t j = 0; j < n; ++j)
        if (j != i)
          dist.push_back(p.group[i] == p.group[j]
                             ? 0.0
                             : std::sqrt(std::max(
                                   0.0, gu(i, i) + gu(j, j) - 2 * gu(i, j))));
      std::nth_element(dist.begin(), dist.begin() + k, dist.end());
      kth[i] = dist[k];
    });
  }
  if (!kth.empty()) {
    const double e = 1.5 * Median(kth);
    if (std::isfinite(e) && e > 0) g.eps = e;
  }
  // DBSCAN (min_samples 3, cosine distance), scikit-learn's order.
  auto dist = [&](int64_t i, int64_t j) {
    if (p.group[i] == p.group[j]) return gu(i, i) > 0 || i == j ? 0.0 : 1.0;
    return std::clamp(1.0 - gu(i, j), 0.0, 2.0);
  };
  std::vector<char> core(n);
  ParallelFor(n, threads, [&](int64_t i) {
    int64_t c = 0;
    for (int64_t j = 0; j < n && c < 3; ++j) c += dist(i, j) <= g.eps;
    core[i] = c >= 3;
  });
  g.labels.assign(n, -1);
  int64_t label = 0;
  std::vector<int64_t> stack;
  for (int64_t start = 0; start < n; ++start) {
    if (g.labels[start] != -1 || !core[start]) continue;
    int64_t i = start;
    while (true) {
      if (g.labels[i] == -1) {
        g.labels[i] = label;
        if (core[i])
          for (int64_t j = 0; j < n; ++j)
            if (dist(i, j) <= g.eps && g.labels[j] == -1) stack.push_back(j);
      }
      if (stack.empty()) break;
      i = stack.back();
      stack.pop_back();
    }
    ++label;
  }
  g.num = label;
  int64_t noise = 0;
  for (int64_t l : g.labels) noise += l == -1;
  if (g.num == 0) return g;
  // Each grain's local PCA on its normalised rows.
  for (int64_t c = 0; c < g.num; ++c) {
    std::vector<int64_t> members;
    for (int64_t i = 0; i < n; ++i)
      if (g.labels[i] == c) members.push_back(i);
    const int64_t m = static_cast<int64_t>(members.size());
    int64_t local_dim = m;
    double aspect = 1.0;
    if (m >= 3) {
      const int64_t kk = std::min<int64_t>({m - 1, p.d, 10});
      Spectrum s;
      if (whole != nullptr && m == n) {
        s = *whole;
      } else if (m <= p.d) {
        MatD sub(m, m);
        for (int64_t b = 0; b < m; ++b)
          for (int64_t a = 0; a < m; ++a)
            sub(a, b) = gu(members[a], members[b]);
        s = SpectrumFromGram(sub, 0, AllSame(p, members));
      } else {
        RowMatD rows(m, p.d);
        for (int64_t a = 0; a < m; ++a)
          rows.row(a) = URow(p, members[a]).transpose();
        s = SpectrumFromRows(rows, 0, AllSame(p, members));
      }
      local_dim = FirstReaching(s, kk, 0.95);
      if (kk >= 2 && s.lambda[0] > 0)
        aspect = std::sqrt(s.lambda[kk - 1] / s.lambda[0]);
    }
    g.local_dims.push_back(local_dim);
    g.aspects.push_back(aspect);
  }
  const double num = static_cast<double>(g.num);
  g.mean_size = static_cast<double>(n - noise) / num;
  g.coverage = 1.0 - static_cast<double>(noise) / static_cast<double>(n);
  g.mean_local_dim =
      std::accumulate(g.local_dims.begin(), g.local_dims.end(), 0.0) / num;
  g.mean_aspect =
      std::accumulate(g.aspects.begin(), g.aspects.end(), 0.0) / num;
  g.has_structure = g.num > 1 && g.coverage > 0.5;
  return g;
}

// The spectrum of the normalised rows (their centered Gram matrix, or the
// covariance when n > d), with `top` principal components (d x top) when
// top > 0.
Spectrum NormalisedSpectrum(const Prepared& p, int64_t top) {
  if (p.n > p.d) {
    RowMatD u(p.n, p.d);
    for (int64_t i = 0; i < p.n; ++i) u.row(i) = URow(p, i).transpose();
    return SpectrumFromRows(u, top, AllSame(p));
  }
  Spectrum s = SpectrumFromGram(p.gu, top, AllSame(p));
  if (top > 0) {
    // Components: C^T w for each top eigenvector w of the centered Gram
    // matrix, C the centered normalised rows, each scaled to unit length.
    RowMatD u(p.n, p.d);
    for (int64_t i = 0; i < p.n; ++i) u.row(i) = URow(p, i).transpose();
    const Eigen::RowVectorXd mean = u.colwise().mean();
    u.rowwise() -= mean;
    MatD v = u.transpose() * s.vectors;  // d x top
    for (int64_t j = 0; j < top; ++j) {
      const double nv = v.col(j).norm();
      if (nv > 0) v.col(j) /= nv;
    }
    s.vectors = std::move(v);
  }
  return s;
}

}  // namespace

// ---- RNG

LegacyRandom::LegacyRandom(uint32_t seed) {
  mt_[0] = seed;
  for (int i = 1; i < 624; ++i)
    mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) +
             static_cast<uint32_t>(i);
}

uint32_t LegacyRandom::NextU32() {
  if (index_ >= 624) {
    for (int i = 0; i < 624; ++i) {
      const uint32_t y =
          (mt_[i] & 0x80000000u) | (mt_[(i + 1) % 624] & 0x7fffffffu);
      mt_[i] = mt_[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    index_ = 0;
  }
  uint32_t y = mt_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

double LegacyRandom::NextDouble() {
  const uint32_t a = NextU32() >> 5, b = NextU32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

double LegacyRandom::Uniform(double lo, double hi) {
  return lo + (hi - lo) * NextDouble();
}

double LegacyRandom::Gauss() {
  if (has_gauss_) {
    has_gauss_ = false;
    return gauss_;
  }
  double x1, x2, r2;
  do {
    x1 = 2.0 * NextDouble() - 1.0;
    x2 = 2.0 * NextDouble() - 1.0;
    r2 = x1 * x1 + x2 * x2;
  } while (r2 >= 1.0 || r2 == 0.0);
  const double f = std::sqrt(-2.0 * std::log(r2) / r2);
  gauss_ = f * x1;
  has_gauss_ = true;
  return f * x2;
}

int64_t LegacyRandom::RandInt(int64_t n) {
  const uint64_t rng = static_cast<uint64_t>(n - 1);
  if (rng == 0) return 0;
  uint64_t mask = rng;
  for (int s = 1; s < 64; s <<= 1) mask |= mask >> s;
  uint64_t v;
  do {
    v = NextU32() & mask;
  } while (v > rng);
  return static_cast<int64_t>(v);
}

// ---- Student's t

namespace {
// Continued fraction of the regularised incomplete beta function (modified
// Lentz), valid for x < (a + 1) / (a + b + 2).
double BetaFraction(double a, double b, double x) {
  const double tiny = 1e-300;
  double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0);
  if (std::fabs(d) < tiny) d = tiny;
  d = 1.0 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1.0) * (a + m2));
    d = 1.0 + aa * d;
    if (std::fabs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0));
    d = 1.0 + aa * d;
    if (std::fabs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1.0) < 1e-16) break;
  }
  return h;
}

// I_x(a, b).
double RegularisedBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double lbt = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                     a * std::log(x) + b * std::log1p(-x);
  if (x < (a + 1.0) / (a + b + 2.0))
    return std::exp(lbt) * BetaFraction(a, b, x) / a;
  return 1.0 - std::exp(lbt) * BetaFraction(b, a, 1.0 - x) / b;
}
}  // namespace

double StudentTwoSidedP(double t, double df) {
  if (std::isnan(t)) return t;
  if (std::isinf(t)) return 0.0;
  return RegularisedBeta(0.5 * df, 0.5, df / (df + t * t));
}

// ---- Routes' analyses

WolfResult WolfDensity(const Matrix& x, int regions, uint32_t seed,
                       int threads) {
  return Wolf(LoadRows(x), regions, seed, threads);
}

GeometryResult AnalyzeGeometry(const Matrix& x, uint32_t seed, int threads) {
  const Prepared p = Prepare(x, threads);
  GeometryResult r;
  r.num_vectors = p.n;
  r.ambient_dim = p.d;
  // The three parts are independent: the spectra (the costly part for
  // large inputs) run beside each other.
  Spectrum data, normalised;
  RunBeside(
      [&] {
        data = DataSpectrum(p);
        r.wolf = Wolf(p, 50, seed, threads);
      },
      [&] { normalised = NormalisedSpectrum(p, 0); });
  const Coverage c = DirectionalCoverage(p, data, seed);
  r.effective_dim = c.effective_dim;
  r.effective_dim_99 = c.effective_dim_99;
  r.coverage_ratio = c.ratio;
  r.coverage_quality = c.quality;
  r.spherical_uniformity = c.spherical;
  r.isotropy_score = c.isotropy;
  const Grains g = AnalyzeGrains(p, &normalised, threads);
  r.grain_eps = g.eps;
  r.labels = g.labels;
  r.num_grains = g.num;
  r.grain_coverage = g.coverage;
  r.mean_grain_size = g.mean_size;
  r.mean_local_dim = g.mean_local_dim;
  r.mean_aspect_ratio = g.mean_aspect;
  r.local_dims = g.local_dims;
  r.aspect_ratios = g.aspects;
  r.has_structure = g.has_structure;
  std::vector<std::string> issues;
  if (r.wolf.severity == "moderate" || r.wolf.severity == "severe")
    issues.push_back("density_violation");
  if (r.coverage_ratio < 0.1) issues.push_back("dimensional_collapse");
  if (!r.has_structure) issues.push_back("no_grain_structure");
  if (issues.empty()) {
    r.overall_health = "healthy";
  } else if (issues.size() == 1) {
    r.overall_health = "warning:" + issues[0];
  } else {
    r.overall_health = "unhealthy:" + issues[0];
    for (size_t i = 1; i < issues.size(); ++i)
      r.overall_health += "," + issues[i];
  }
  return r;
}

namespace {
// A number for a response: null when not finite (TheLoom answers 500 there).
json Num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
}  // namespace

json GeometryJson(const GeometryResult& g) {
  return {{"overall_health", g.overall_health},
          {"num_vectors", g.num_vectors},
          {"ambient_dim", g.ambient_dim},
          {"wolf_axiom",
           {{"max_density_ratio", Num(g.wolf.max_ratio)},
            {"mean_density_ratio", Num(g.wolf.mean_ratio)},
            {"uniformity_p_value", Num(g.wolf.p_value)},
            {"violation_count", g.wolf.violations},
            {"severity", g.wolf.severity}}},
          {"directional_coverage",
           {{"ambient_dim", g.ambient_dim},
            {"effective_dim", g.effective_dim},
            {"coverage_ratio", Num(g.coverage_ratio)},
            {"coverage_quality", g.coverage_quality},
            {"spherical_uniformity", Num(g.spherical_uniformity)},
            {"isotropy_score", Num(g.isotropy_score)}}},
          {"grain_analysis",
           {{"num_grains", g.num_grains},
            {"grain_coverage", Num(g.grain_coverage)},
            {"mean_grain_size", Num(g.mean_grain_size)},
            {"mean_aspect_ratio", Num(g.mean_aspect_ratio)}}}};
}

BilateralResult AnalyzeBilateral(const Matrix& s, const Matrix& r,
                                 uint32_t seed, int threads) {
  BilateralResult b;
  const int64_t k = std::min<int64_t>({10, s.cols, s.rows - 1, r.rows - 1});
  b.subspace_components = std::max<int64_t>(k, 0);
  struct SideWork {
    Prepared p;
    Spectrum data, normalised;
    Grains grains;
    WolfResult wolf;
    Eigen::VectorXd direction;
  };
  SideWork sides[2];
  const Matrix* inputs[2] = {&s, &r};
  const int inner = std::max(1, Threads(threads) / 2);
  auto work = [&](int i) {
    SideWork& w = sides[i];
    w.p = Prepare(*inputs[i], inner);
    w.data = DataSpectrum(w.p);
    w.normalised = NormalisedSpectrum(w.p, std::max<int64_t>(k, 0));
    w.grains = AnalyzeGrains(w.p, &w.normalised, inner);
    w.wolf = Wolf(w.p, 30, seed, inner);
    VecD mean = VecD::Zero(w.p.d);
    for (int64_t row = 0; row < w.p.n; ++row) mean += URow(w.p, row);
    mean /= static_cast<double>(w.p.n);
    w.direction = mean / (mean.norm() + 1e-10);
  };
  if (Threads(threads) > 1) {
    RunBeside([&] { work(0); }, [&] { work(1); });
  } else {
    work(0);
    work(1);
  }
  const SideWork &S = sides[0], &R = sides[1];
  b.directional_alignment = S.direction.dot(R.direction);
  if (k >= 1) {
    const MatD m = S.normalised.vectors.transpose() * R.normalised.vectors;
    b.subspace_overlap = m.squaredNorm() / static_cast<double>(k);
  }
  const Grains &gs = S.grains, &gr = R.grains;
  if (gs.num > 0 && gr.num > 0) {
    const double ns = static_cast<double>(gs.num),
                 nr = static_cast<double>(gr.num);
    b.grain_alignment =
        0.4 * (1.0 - std::fabs(ns - nr) / std::max(ns, nr)) +
        0.3 * (1.0 - std::fabs(gs.coverage - gr.coverage)) +
        0.3 * (1.0 - std::fabs(gs.mean_local_dim - gr.mean_local_dim) /
                         std::max({gs.mean_local_dim, gr.mean_local_dim, 1.0}));
  }
  const double da = S.wolf.mean_ratio, db = R.wolf.mean_ratio;
  b.density_similarity = 1.0 - std::fabs(da - db) / std::max({da, db, 1.0});
  const int64_t es = FirstReaching(S.data, std::min(S.p.n - 1, S.p.d), 0.95),
                er = FirstReaching(R.data, std::min(R.p.n - 1, R.p.d), 0.95);
  b.effective_dim_ratio = static_cast<double>(std::min(es, er)) /
                          static_cast<double>(std::max<int64_t>({es, er, 1}));
  auto clamp01 = [](double v) { return std::clamp(v, 0.0, 1.0); };
  b.overall_alignment = std::pow(clamp01(b.directional_alignment), 0.3) *
                        std::pow(clamp01(b.subspace_overlap), 0.3) *
                        std::pow(clamp01(b.grain_alignment), 0.2) *
                        std::pow(clamp01(b.density_similarity), 0.2);
  for (int i = 0; i < 2; ++i) {
    BilateralResult::Side& out = i == 0 ? b.sender : b.receiver;
    const SideWork& w = sides[i];
    out.num_grains = w.grains.num;
    out.grain_coverage = w.grains.coverage;
    out.mean_local_dim = w.grains.mean_local_dim;
    out.grain_eps = w.grains.eps;
    out.wolf_mean_density_ratio = w.wolf.mean_ratio;
    out.effective_dim = i == 0 ? es : er;
  }
  return b;
}

json BilateralJson(const BilateralResult& b) {
  return {{"directional_alignment", Num(b.directional_alignment)},
          {"subspace_overlap", Num(b.subspace_overlap)},
          {"grain_alignment", Num(b.grain_alignment)},
          {"density_similarity", Num(b.density_similarity)},
          {"effective_dim_ratio", Num(b.effective_dim_ratio)},
          {"overall_alignment", Num(b.overall_alignment)}};
}

json HiddenStateStatistics(const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  json out = {{"shape", {n}}, {"layer", -1}, {"dtype", "torch.float32"}};
  if (n == 0) {
    for (const char* k : {"mean", "std", "min", "max", "l2_norm", "sparsity"})
      out[k] = 0.0;
    out["embedding_shape"] = {n};
    return out;
  }
  double sum = 0, ss = 0;
  float mn = x[0], mx = x[0];
  int64_t sparse = 0;
  for (float v : x) {
    sum += v;
    ss += static_cast<double>(v) * v;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    sparse += std::fabs(v) < 1e-6f;  // float32 threshold, as numpy's
  }
  const double mean = sum / static_cast<double>(n);
  double var = 0;
  for (float v : x) var += (v - mean) * (v - mean);
  std::vector<float> sorted = x;
  std::sort(sorted.begin(), sorted.end());
  auto percentile = [&](double q) {
    const double pos = q / 100.0 * static_cast<double>(n - 1);
    const int64_t lo = static_cast<int64_t>(std::floor(pos));
    const int64_t hi = std::min(lo + 1, n - 1);
    const double t = pos - static_cast<double>(lo);
    const double a = sorted[lo], b = sorted[hi];
    return t >= 0.5 ? b - (b - a) * (1 - t) : a + (b - a) * t;
  };
  out["mean"] = mean;
  out["std"] = std::sqrt(var / static_cast<double>(n));
  out["min"] = mn;
  out["max"] = mx;
  out["l2_norm"] = std::sqrt(ss);
  out["sparsity"] = static_cast<double>(sparse) / static_cast<double>(n);
  out["percentile_25"] = percentile(25);
  out["percentile_50"] = percentile(50);
  out["percentile_75"] = percentile(75);
  out["embedding_shape"] = {n};
  return out;
}

// ---- Body parsing

namespace {

class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}
  void Ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' ||
                              s_[p_] == '\n' || s_[p_] == '\r'))
      ++p_;
  }
  bool Eat(char c) {
    Ws();
    if (p_ < s_.size() && s_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  char Peek() {
    Ws();
    return p_ < s_.size() ? s_[p_] : '\0';
  }
  bool AtEnd() {
    Ws();
    return p_ == s_.size();
  }
  // The text of one JSON value (not checked beyond its extent).
  bool SkipValue(std::string_view* text) {
    Ws();
    const size_t start = p_;
    int depth = 0;
    while (p_ < s_.size()) {
      const char c = s_[p_];
      if (c == '"') {
        if (!SkipString()) return false;
      } else if (c == '[' || c == '{') {
        ++depth;
        ++p_;
      } else if (c == ']' || c == '}') {
        if (depth == 0) break;
        --depth;
        ++p_;
      } else if (c == ',' && depth == 0) {
        break;
      } else {
        ++p_;
      }
    }
    *text = s_.substr(start, p_ - start);
    return !text->empty() && depth == 0;
  }
  bool SkipString() {
    ++p_;  // the opening quote
    while (p_ < s_.size()) {
      if (s_[p_] == '\\') {
        p_ += 2;
      } else if (s_[p_] == '"') {
        ++p_;
        return true;
      } else {
        ++p_;
      }
    }
    return false;
  }
  bool String(std::string_view* text) {
    Ws();
    if (p_ >= s_.size() || s_[p_] != '"') return false;
    const size_t start = p_;
    if (!SkipString()) return false;
    *text = s_.substr(start, p_ - start);
    return true;
  }
  // A JSON number; false for anything else (the caller falls back).
  bool Number(double* v) {
    Ws();
    if (p_ >= s_.size()) return false;
    const char c = s_[p_];
    if (c != '-' && (c < '0' || c > '9')) return false;
    const char* b = s_.data() + p_;
    const auto [end, ec] = std::from_chars(b, s_.data() + s_.size(), *v);
    if (ec != std::errc()) return false;
    p_ += static_cast<size_t>(end - b);
    return true;
  }

 private:
  std::string_view s_;
  size_t p_ = 0;
};

// The fast path: a JSON object whose matrix fields are lists of lists of
// plain numbers. Returns false for anything else (then the caller parses
// the body as a JSON tree, for the exact error).
bool FastParse(std::string_view body, const std::vector<std::string>& fields,
               std::vector<Matrix>* out, std::vector<bool>* seen, json* rest) {
  Scanner sc(body);
  if (!sc.Eat('{')) return false;
  if (sc.Eat('}')) return sc.AtEnd();
  while (true) {
    std::string_view key_text;
    if (!sc.String(&key_text) || !sc.Eat(':')) return false;
    std::string key;
    if (key_text.find('\\') == std::string_view::npos) {
      key = std::string(key_text.substr(1, key_text.size() - 2));
    } else {
      const json k = json::parse(key_text, nullptr, false);
      if (!k.is_string()) return false;
      key = k.get<std::string>();
    }
    const auto it = std::find(fields.begin(), fields.end(), key);
    if (it != fields.end()) {
      const size_t f = static_cast<size_t>(it - fields.begin());
      Matrix m;
      if (!sc.Eat('[')) return false;
      if (!sc.Eat(']')) {
        do {
          if (!sc.Eat('[')) return false;
          int64_t cols = 0;
          if (!sc.Eat(']')) {
            do {
              double v;
              if (!sc.Number(&v)) return false;
              m.values.push_back(static_cast<float>(v));
              ++cols;
            } while (sc.Eat(','));
            if (!sc.Eat(']')) return false;
          }
          if (m.rows == 0) m.cols = cols;
          if (cols != m.cols || cols == 0) return false;  // slow path names it
          ++m.rows;
        } while (sc.Eat(','));
        if (!sc.Eat(']')) return false;
      }
      (*out)[f] = std::move(m);
      (*seen)[f] = true;
    } else {
      std::string_view value;
      if (!sc.SkipValue(&value)) return false;
      json v = json::parse(value, nullptr, false);
      if (v.is_discarded()) return false;
      (*rest)[key] = std::move(v);
    }
    if (sc.Eat(',')) continue;
    if (!sc.Eat('}')) return false;
    return sc.AtEnd();
  }
}

// The slow path: a JSON tree, every problem named.
StatusOr<Matrix> MatrixOf(const json& v, const std::string& name) {
  if (!v.is_array())
    return InvalidArgumentError("field `" + name +
                                "`: expected a list of lists of numbers, got " +
                                std::string(v.type_name()));
  Matrix m;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& row = v[i];
    const std::string where = "field `" + name + "`: row " + std::to_string(i);
    if (!row.is_array())
      return InvalidArgumentError(where + ": expected a list of numbers, got " +
                                  std::string(row.type_name()));
    if (row.empty()) return InvalidArgumentError(where + " is empty");
    if (i == 0) m.cols = static_cast<int64_t>(row.size());
    if (static_cast<int64_t>(row.size()) != m.cols)
      return InvalidArgumentError(where + " has " + std::to_string(row.size()) +
                                  " values but row 0 has " +
                                  std::to_string(m.cols) +
                                  " (every vector must have the same length)");
    for (size_t j = 0; j < row.size(); ++j) {
      if (!row[j].is_number())
        return InvalidArgumentError(where + ", element " + std::to_string(j) +
                                    ": expected a number, got " +
                                    row[j].dump());
      m.values.push_back(static_cast<float>(row[j].get<double>()));
    }
    ++m.rows;
  }
  return m;
}

}  // namespace

StatusOr<AnalysisBody> ParseAnalysisBody(
    std::string_view body, const std::vector<std::string>& matrix_fields,
    int64_t min_rows, int64_t max_rows) {
  AnalysisBody out;
  out.matrices.resize(matrix_fields.size());
  std::vector<bool> seen(matrix_fields.size());
  if (!FastParse(body, matrix_fields, &out.matrices, &seen, &out.rest)) {
    ASSIGN_OR_RETURN(json b, ParseBody(body));
    out = AnalysisBody();
    out.matrices.resize(matrix_fields.size());
    seen.assign(matrix_fields.size(), false);
    for (auto& [k, v] : b.items()) {
      const auto it = std::find(matrix_fields.begin(), matrix_fields.end(), k);
      if (it == matrix_fields.end() || v.is_null()) {
        if (it == matrix_fields.end()) out.rest[k] = v;
        continue;
      }
      const size_t f = static_cast<size_t>(it - matrix_fields.begin());
      ASSIGN_OR_RETURN(out.matrices[f], MatrixOf(v, k));
      seen[f] = true;
    }
  }
  for (size_t f = 0; f < matrix_fields.size(); ++f) {
    const std::string& name = matrix_fields[f];
    if (!seen[f])
      return InvalidArgumentError("field `" + name +
                                  "` is required: a list of vectors (lists "
                                  "of numbers)");
    const Matrix& m = out.matrices[f];
    if (m.rows < min_rows)
      return InvalidArgumentError(
          "field `" + name + "`: need at least " + std::to_string(min_rows) +
          " vectors for analysis, got " + std::to_string(m.rows));
    if (m.rows > max_rows)
      return InvalidArgumentError(
          "field `" + name + "`: at most " + std::to_string(max_rows) +
          " vectors per set, got " + std::to_string(m.rows));
    for (size_t i = 0; i < m.values.size(); ++i)
      if (!std::isfinite(m.values[i]))
        return InvalidArgumentError(
            "field `" + name + "`: row " +
            std::to_string(static_cast<int64_t>(i) / m.cols) + ", element " +
            std::to_string(static_cast<int64_t>(i) % m.cols) +
            " is not finite as a float32");
  }
  return out;
}

StatusOr<uint32_t> SeedOf(const json& rest) {
  ASSIGN_OR_RETURN(int64_t seed,
                   GetInt(rest, "seed", kDefaultSeed, 0, 4294967295LL));
  return static_cast<uint32_t>(seed);
}

}  // namespace loom::serve::theloom
