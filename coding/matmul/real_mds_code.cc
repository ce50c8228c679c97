#include "coding/matmul/real_mds_code.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <random>

#include "coding/matmul/small_dense.h"

namespace cofab::coding {

const char* mdsFamilyName(MdsFamily family) {
  switch (family) {
    case MdsFamily::kLagrangeChebyshev:
      return "lagrange_chebyshev";
    case MdsFamily::kCauchyChebyshev:
      return "cauchy_chebyshev";
    case MdsFamily::kRandomGaussian:
      return "random_gaussian";
    case MdsFamily::kVandermondeEquispaced:
      return "vandermonde_equispaced";
  }
  return "?";
}

StatusOr<MdsFamily> parseMdsFamily(const std::string& name) {
  for (MdsFamily f : {MdsFamily::kLagrangeChebyshev, MdsFamily::kCauchyChebyshev,
                      MdsFamily::kRandomGaussian, MdsFamily::kVandermondeEquispaced}) {
    if (name == mdsFamilyName(f)) return f;
  }
  return InvalidArgument("unknown MDS code family '" + name +
                         "' (lagrange_chebyshev, cauchy_chebyshev, random_gaussian, "
                         "vandermonde_equispaced)");
}

namespace {

// Chebyshev points of the first kind split into k systematic and n-k parity nodes, the parity
// nodes spread evenly so that every parity node has systematic neighbours on both sides.
void chebyshevSplit(int n, int k, std::vector<double>* sys, std::vector<double>* par) {
  const int r = n - k;
  std::vector<bool> isParity(n, false);
  for (int j = 0; j < r; ++j) isParity[static_cast<int>((j + 0.5) * n / r)] = true;
  for (int i = 0; i < n; ++i) {
    const double x = std::cos((2.0 * i + 1.0) * std::numbers::pi / (2.0 * n));
    (isParity[i] ? par : sys)->push_back(x);
  }
}

void normaliseParityRows(std::vector<double>* g, int n, int k) {
  for (int i = k; i < n; ++i) {
    double s = 0;
    for (int j = 0; j < k; ++j) s += (*g)[i * k + j] * (*g)[i * k + j];
    s = std::sqrt(s);
    if (s > 0) {
      for (int j = 0; j < k; ++j) (*g)[i * k + j] /= s;
    }
  }
}

std::vector<double> identityTop(int n, int k) {
  std::vector<double> g(static_cast<size_t>(n) * k, 0.0);
  for (int i = 0; i < k; ++i) g[i * k + i] = 1.0;
  return g;
}

}  // namespace

std::vector<double> buildMdsGenerator(MdsFamily family, int n, int k, uint64_t seed) {
  std::vector<double> g = identityTop(n, k);
  if (n == k) return g;
  switch (family) {
    case MdsFamily::kLagrangeChebyshev: {
      std::vector<double> y, x;
      chebyshevSplit(n, k, &y, &x);
      for (int i = 0; i < n - k; ++i) {
        for (int j = 0; j < k; ++j) {
          double l = 1.0;  // l_j(x_i) = prod_{m != j} (x_i - y_m) / (y_j - y_m)
          for (int m = 0; m < k; ++m) {
            if (m != j) l *= (x[i] - y[m]) / (y[j] - y[m]);
          }
          g[(k + i) * k + j] = l;
        }
      }
      break;
    }
    case MdsFamily::kCauchyChebyshev: {
      std::vector<double> y, x;
      chebyshevSplit(n, k, &y, &x);
      for (int i = 0; i < n - k; ++i) {
        for (int j = 0; j < k; ++j) g[(k + i) * k + j] = 1.0 / (x[i] - y[j]);
      }
      break;
    }
    case MdsFamily::kRandomGaussian: {
      std::mt19937_64 rng(seed);
      std::normal_distribution<double> normal;
      for (int i = k; i < n; ++i) {
        for (int j = 0; j < k; ++j) g[i * k + j] = normal(rng);
      }
      break;
    }
    case MdsFamily::kVandermondeEquispaced: {
      // V[i][j] = (i+1)^j, G = V * inv(V_top): the textbook construction, ill-conditioned.
      std::vector<double> v(static_cast<size_t>(n) * k), top(static_cast<size_t>(k) * k),
          inv(static_cast<size_t>(k) * k);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < k; ++j) v[i * k + j] = std::pow(i + 1.0, j);
      }
      std::copy_n(v.begin(), k * k, top.begin());
      if (!dense::invert(top, inv, k)) break;
      for (int i = k; i < n; ++i) {
        for (int j = 0; j < k; ++j) {
          double s = 0;
          for (int t = 0; t < k; ++t) s += v[i * k + t] * inv[t * k + j];
          g[i * k + j] = s;
        }
      }
      break;
    }
  }
  normaliseParityRows(&g, n, k);
  // Coded tasks are fp32: round the coefficients to floats here so that the parity the GPU or
  // BLAS encodes with and the coefficients the FP64 decode inverts are the same numbers.
  for (double& v : g) v = static_cast<double>(static_cast<float>(v));
  return g;
}

namespace {

double subsetCondition(const std::vector<double>& g, int k, const std::vector<int>& rows) {
  std::vector<double> sub(static_cast<size_t>(k) * k);
  for (int r = 0; r < k; ++r) std::copy_n(&g[static_cast<size_t>(rows[r]) * k], k, &sub[r * k]);
  return dense::conditionNumber(sub, k);
}

// Induced 1-norm of the n x n row-major matrix: the largest column sum of magnitudes (NaN
// propagates, so that a broken inverse never looks well conditioned).
double norm1(const std::vector<double>& m, int n) {
  double worst = 0;
  for (int c = 0; c < n; ++c) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += std::fabs(m[static_cast<size_t>(r) * n + c]);
    if (!(s <= worst)) worst = s;
  }
  return worst;
}

double binomial(int n, int k) {
  double c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return c;
}

}  // namespace

ConditionSurvey surveyConditions(const std::vector<double>& generator, int n, int k,
                                 int64_t exhaustiveLimit, int samples, uint64_t seed) {
  ConditionSurvey s;
  s.worstRows.resize(k);
  std::iota(s.worstRows.begin(), s.worstRows.end(), 0);
  auto consider = [&](const std::vector<int>& rows) {
    ++s.checked;
    if (rows.back() < k) return;  // all systematic: the identity, condition 1
    const double c = subsetCondition(generator, k, rows);
    if (!(c <= s.worst)) {  // also catches NaN / inf
      s.worst = c;
      s.worstRows = rows;
    }
  };
  if (binomial(n, k) <= static_cast<double>(exhaustiveLimit)) {
    std::vector<int> rows(k);
    std::iota(rows.begin(), rows.end(), 0);
    while (true) {
      consider(rows);
      int i = k - 1;
      while (i >= 0 && rows[i] == n - k + i) --i;
      if (i < 0) break;
      ++rows[i];
      for (int j = i + 1; j < k; ++j) rows[j] = rows[j - 1] + 1;
    }
  } else {
    s.exhaustive = false;
    std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
    std::vector<int> all(n);
    std::iota(all.begin(), all.end(), 0);
    for (int t = 0; t < samples; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      std::vector<int> rows(all.begin(), all.begin() + k);
      std::sort(rows.begin(), rows.end());
      consider(rows);
    }
  }
  return s;
}

StatusOr<RealMdsCode> RealMdsCode::create(const RealMdsOptions& o) {
  if (o.k < 1 || o.n <= o.k || o.n > 64) {
    return InvalidArgument("RealMdsCode needs 1 <= k < n <= 64; got n=" + std::to_string(o.n) +
                           " k=" + std::to_string(o.k));
  }
  if (o.randomTrials < 1 || o.sampledPatterns < 1 || o.exhaustiveLimit < 0 || o.refineSteps < 0) {
    return InvalidArgument(
        "RealMdsCode: randomTrials and sampledPatterns must be >= 1, exhaustiveLimit and "
        "refineSteps >= 0");
  }
  RealMdsCode code;
  code.n_ = o.n;
  code.k_ = o.k;
  code.family_ = o.family;
  const int trials = o.family == MdsFamily::kRandomGaussian ? o.randomTrials : 1;
  ConditionSurvey best;
  best.worst = std::numeric_limits<double>::infinity();
  for (int t = 0; t < trials; ++t) {
    std::vector<double> g = buildMdsGenerator(o.family, o.n, o.k, o.seed + t);
    ConditionSurvey s = surveyConditions(g, o.n, o.k, o.exhaustiveLimit, o.sampledPatterns, o.seed);
    if (t == 0 || s.worst < best.worst) {
      best = s;
      code.generator_ = std::move(g);
    }
  }
  // Optional hill climb on the parity rows (any family): perturb, renormalise, keep the change
  // when the worst condition number drops. Each step costs one full survey.
  if (o.refineSteps > 0) {
    std::mt19937_64 rng(o.seed ^ 0x5bd1e995u);
    std::normal_distribution<double> normal;
    double sigma = 0.1;
    for (int step = 0; step < o.refineSteps; ++step) {
      std::vector<double> g = code.generator_;
      for (int i = o.k; i < o.n; ++i) {
        double norm = 0;
        for (int j = 0; j < o.k; ++j) {
          double& v = g[static_cast<size_t>(i) * o.k + j];
          v += sigma * normal(rng) / std::sqrt(static_cast<double>(o.k));
          norm += v * v;
        }
        norm = std::sqrt(norm);
        for (int j = 0; j < o.k; ++j) {
          double& v = g[static_cast<size_t>(i) * o.k + j];
          v = static_cast<double>(static_cast<float>(v / norm));  // fp32 coefficients, as built
        }
      }
      ConditionSurvey s =
          surveyConditions(g, o.n, o.k, o.exhaustiveLimit, o.sampledPatterns, o.seed);
      if (s.worst < best.worst) {
        best = s;
        code.generator_ = std::move(g);
      } else {
        sigma = std::max(0.005, sigma * 0.97);  // smaller steps once big ones stop helping
      }
    }
  }
  code.worstCondition_ = best.worst;
  code.worstPattern_ = best.worstRows;
  code.exhaustive_ = best.exhaustive;
  code.patternsChecked_ = best.checked;
  code.maxCondition_ = o.maxCondition;
  if (!(best.worst <= o.maxCondition)) {
    return InvalidArgument(std::string("RealMdsCode ") + mdsFamilyName(o.family) +
                           " (n=" + std::to_string(o.n) + ", k=" + std::to_string(o.k) +
                           ") has a worst-case condition number of " + std::to_string(best.worst) +
                           ", above maxCondition " + std::to_string(o.maxCondition) +
                           ": decoding would amplify rounding errors that much; use fewer parity "
                           "blocks (n-k), a smaller n or another family");
  }
  return code;
}

Status RealMdsCode::validateRows(std::span<const int> rows, const char* what) const {
  std::vector<bool> seen(n_, false);
  for (int r : rows) {
    if (r < 0 || r >= n_) {
      return InvalidArgument(std::string(what) + ": task index " + std::to_string(r) +
                             " is outside [0, " + std::to_string(n_) + ")");
    }
    if (seen[r]) {
      return InvalidArgument(std::string(what) + ": task index " + std::to_string(r) +
                             " is listed twice");
    }
    seen[r] = true;
  }
  return OkStatus();
}

StatusOr<double> RealMdsCode::conditionOf(std::span<const int> rows) const {
  if (static_cast<int>(rows.size()) != k_) {
    return InvalidArgument("conditionOf needs exactly k=" + std::to_string(k_) + " rows, got " +
                           std::to_string(rows.size()));
  }
  COFAB_RETURN_IF_ERROR(validateRows(rows, "conditionOf"));
  return subsetCondition(generator_, k_, std::vector<int>(rows.begin(), rows.end()));
}

StatusOr<std::vector<double>> RealMdsCode::decodeCoefficients(std::span<const int> returned,
                                                              std::span<const int> wanted,
                                                              double* condition) const {
  if (static_cast<int>(returned.size()) < k_) {
    return DataLoss("decoding needs results from k=" + std::to_string(k_) +
                    " distinct tasks, got " + std::to_string(returned.size()));
  }
  if (static_cast<int>(returned.size()) > k_) {
    // Not a loss: the caller has enough results and must choose k of them.
    return InvalidArgument("decodeCoefficients: give exactly k=" + std::to_string(k_) +
                           " task results, got " + std::to_string(returned.size()));
  }
  COFAB_RETURN_IF_ERROR(validateRows(returned, "decodeCoefficients returned"));
  for (int w : wanted) {
    if (w < 0 || w >= k_) {
      return InvalidArgument("decodeCoefficients: wanted data block " + std::to_string(w) +
                             " is outside [0, " + std::to_string(k_) + ")");
    }
  }
  const size_t kk = static_cast<size_t>(k_) * k_;
  std::vector<double> sub(kk), inv(kk);
  for (int r = 0; r < k_; ++r) {
    std::copy_n(&generator_[static_cast<size_t>(returned[r]) * k_], k_, &sub[r * k_]);
  }
  if (!dense::invert(sub, inv, k_)) {
    return Internal("RealMdsCode: the submatrix for these tasks is singular (broken MDS code)");
  }
  // create() bounded the condition number of the patterns its survey checked; a sampled survey
  // may have missed this one. kappa_1 = ||S||_1 ||S^-1||_1 costs O(k^2) now that the inverse is
  // known, and kappa_2 <= k kappa_1, so below maxCondition / k the pattern is within the bound.
  // Otherwise the exact 2-norm condition number (the measure create() uses) decides.
  const double kappa1 = norm1(sub, k_) * norm1(inv, k_);
  if (condition != nullptr) *condition = kappa1;
  if (!(kappa1 * k_ <= maxCondition_)) {
    const double kappa2 = dense::conditionNumber(sub, k_);
    if (!(kappa2 <= maxCondition_)) {
      std::string tasks;
      for (int r : returned) tasks += (tasks.empty() ? "" : ", ") + std::to_string(r);
      return DataLoss("RealMdsCode: decoding from tasks {" + tasks +
                      "} would solve a system with condition number " + std::to_string(kappa2) +
                      " (2-norm), above maxCondition " + std::to_string(maxCondition_) +
                      ": the result would amplify rounding errors that much (create() checked " +
                      std::to_string(patternsChecked_) + " erasure patterns" +
                      (exhaustive_ ? "" : ", a sample") +
                      "); use results from other tasks, or create the code with a larger "
                      "exhaustiveLimit / sampledPatterns to find such patterns at construction");
    }
  }
  std::vector<double> d(wanted.size() * k_);
  for (size_t w = 0; w < wanted.size(); ++w) {
    std::copy_n(&inv[static_cast<size_t>(wanted[w]) * k_], k_, &d[w * k_]);
  }
  return d;
}

}  // namespace cofab::coding
