// RealMdsCode: a systematic (n, k) MDS code over the reals, for coded matrix multiplication.
// Generator G is n x k: identity on top (tasks 0..k-1 carry the data blocks unchanged), then
// n-k parity rows. Any k rows of G are invertible, so any k task results rebuild the product.
//
// Over the reals "invertible" is not enough: decoding multiplies rounding errors by the condition
// number of the k x k submatrix used. create() therefore measures every erasure pattern (all
// C(n, k) row subsets, or a seeded sample when there are too many), reports the worst condition
// number and refuses codes worse than `maxCondition`. A sample can miss the worst patterns, so
// decodeCoefficients checks the pattern it is given against the same bound and refuses (DataLoss)
// one that create() did not see and that is worse. Parity rows are scaled to unit 2-norm, the
// norm of the identity rows, which keeps the submatrices balanced.
//
// Families (DESIGN.md §6; bench/coding compares them, the default is picked on that evidence):
//   kLagrangeChebyshev  polynomial-evaluation code: parity = Lagrange interpolation from the
//                       systematic nodes to the parity nodes, all nodes Chebyshev points
//                       (computed in the Lagrange form, never through a monomial Vandermonde)
//   kCauchyChebyshev    real Cauchy matrix 1/(x_i - y_j) on interleaved Chebyshev points
//   kRandomGaussian     seeded Gaussian parity, best of `randomTrials` by the exhaustive check
//   kVandermondeEquispaced  monomial Vandermonde at 1..n, systematised: the ill-conditioned
//                       construction DESIGN.md forbids, kept only as the bench's baseline
//
// Immutable after create(); safe to share between threads.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace cofab::coding {

enum class MdsFamily : uint8_t {
  kLagrangeChebyshev,
  kCauchyChebyshev,
  kRandomGaussian,
  kVandermondeEquispaced,
};

const char* mdsFamilyName(MdsFamily family);
StatusOr<MdsFamily> parseMdsFamily(const std::string& name);

struct RealMdsOptions {
  int n = 0;  // coded blocks (tasks), k < n <= 64
  int k = 0;  // data blocks, k >= 1
  // Default chosen on evidence (bench/coding family comparison, docs/CODING.md): the best of a
  // few seeded Gaussian candidates has the lowest worst-case condition number of the families.
  MdsFamily family = MdsFamily::kRandomGaussian;
  uint64_t seed = 1;      // kRandomGaussian only
  int randomTrials = 16;  // kRandomGaussian only: candidates tried, the best kept
  // Hill-climbing steps on the parity rows after construction (each one full survey; 0 = off).
  // About halves the worst condition number at (12, 9) and (16, 12) for 100-200 steps, at
  // 0.01-0.1 s a step there: worth it for a code built once and used for a long job.
  int refineSteps = 0;
  // Up to this many k-subsets are checked exhaustively; above it a seeded sample of
  // `sampledPatterns` subsets is checked (worstCondition is then a lower bound).
  int64_t exhaustiveLimit = 20000;
  int sampledPatterns = 2000;
  // create() fails (InvalidArgument) when the worst condition number found exceeds this, and
  // decodeCoefficients fails (DataLoss) for an erasure pattern whose condition number exceeds it
  // (only possible for patterns the survey did not check, i.e. when it sampled).
  double maxCondition = 1e6;
};

class RealMdsCode {
 public:
  static StatusOr<RealMdsCode> create(const RealMdsOptions& options);

  int n() const { return n_; }
  int k() const { return k_; }
  MdsFamily family() const { return family_; }
  // n x k, row-major.
  const std::vector<double>& generator() const { return generator_; }
  double at(int row, int col) const { return generator_[static_cast<size_t>(row) * k_ + col]; }

  // Worst 2-norm condition number over the erasure patterns checked, and which rows gave it.
  double worstCondition() const { return worstCondition_; }
  const std::vector<int>& worstPattern() const { return worstPattern_; }
  bool checkedExhaustively() const { return exhaustive_; }
  int64_t patternsChecked() const { return patternsChecked_; }
  // The bound given to create(), which decodeCoefficients also enforces.
  double maxCondition() const { return maxCondition_; }

  // Condition number of the k x k submatrix made of `rows` (k distinct rows).
  StatusOr<double> conditionOf(std::span<const int> rows) const;

  // Decode coefficients: with the results of tasks `returned` (k distinct indices, in the order
  // the results will be given), data block `wanted[w]` = sum_c D[w * k + c] * result[c].
  // Computed in FP64 from the inverse of the k x k submatrix S.
  // Fewer than k tasks is DataLoss; more than k, a repeated or out-of-range task, or a wanted
  // block outside [0, k) is InvalidArgument (the caller picks the k results). When S's 2-norm
  // condition number exceeds maxCondition() the result would carry that much amplified rounding
  // error: DataLoss naming the tasks (wait for other results instead). The check costs O(k^2)
  // (the 1-norm condition number ||S||_1 ||S^-1||_1 bounds the 2-norm one within a factor k);
  // only a pattern within a factor k of the bound pays an exact O(k^3) singular value check.
  // `condition`, when not null, receives the 1-norm condition number of S.
  StatusOr<std::vector<double>> decodeCoefficients(std::span<const int> returned,
                                                   std::span<const int> wanted,
                                                   double* condition = nullptr) const;

 private:
  RealMdsCode() = default;
  Status validateRows(std::span<const int> rows, const char* what) const;

  int n_ = 0;
  int k_ = 0;
  MdsFamily family_ = MdsFamily::kCauchyChebyshev;
  std::vector<double> generator_;
  double worstCondition_ = 1.0;
  std::vector<int> worstPattern_;
  bool exhaustive_ = true;
  int64_t patternsChecked_ = 0;
  double maxCondition_ = std::numeric_limits<double>::infinity();
};

// The generator of `family` without any check (bench and tests use it to study families).
std::vector<double> buildMdsGenerator(MdsFamily family, int n, int k, uint64_t seed);

// Worst condition number of k-row submatrices of `generator` (n x k): exhaustive when
// C(n, k) <= exhaustiveLimit, else over `samples` seeded random subsets.
struct ConditionSurvey {
  double worst = 1.0;
  std::vector<int> worstRows;
  int64_t checked = 0;
  bool exhaustive = true;
};
ConditionSurvey surveyConditions(const std::vector<double>& generator, int n, int k,
                                 int64_t exhaustiveLimit, int samples, uint64_t seed);

}  // namespace cofab::coding
