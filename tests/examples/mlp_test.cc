// The training example's model and data loader: gradients against finite differences, and the
// Debian Fashion-MNIST files parsed with their documented shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "examples/train_mnist/fashion_mnist.h"
#include "examples/train_mnist/mlp.h"
#include "tests/support/temp_dir.h"

namespace cofab::examples {
namespace {

double lossOf(Mlp& m, const std::vector<float>& x, const std::vector<uint8_t>& y, int n) {
  std::vector<float> g(m.params().size());
  return m.gradient(x.data(), y.data(), n, float(n), g.data()) / n;
}

TEST(MlpTest, GradientMatchesFiniteDifferences) {
  constexpr int kIn = 12, kHidden = 7, kClasses = 4, kN = 5;
  Mlp m(kIn, kHidden, kClasses, 42);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(kIn * kN);
  for (auto& v : x) v = u(rng);
  std::vector<uint8_t> y = {0, 3, 1, 2, 3};
  for (auto& p : m.params()) p += 0.1f * u(rng);  // biases non-zero too
  std::vector<float> g(m.params().size());
  m.gradient(x.data(), y.data(), kN, float(kN), g.data());
  int checked = 0;
  for (size_t i = 0; i < m.params().size(); i += 3) {
    float saved = m.params()[i];
    const float h = 1e-2f;
    m.params()[i] = saved + h;
    double up = lossOf(m, x, y, kN);
    m.params()[i] = saved - h;
    double down = lossOf(m, x, y, kN);
    m.params()[i] = saved;
    double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(g[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "parameter " << i;
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

TEST(MlpTest, GradientsOfSlicesSumToTheGradientOfTheBatch) {
  // What data-parallel training relies on: per-rank gradients normalised by the global batch
  // add up to the single-process gradient.
  constexpr int kIn = 10, kN = 8;
  Mlp m(kIn, 6, 3, 7);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> x(kIn * kN);
  for (auto& v : x) v = u(rng);
  std::vector<uint8_t> y = {0, 1, 2, 0, 1, 2, 2, 1};
  std::vector<float> whole(m.params().size()), a(whole.size()), b(whole.size());
  m.gradient(x.data(), y.data(), kN, kN, whole.data());
  m.gradient(x.data(), y.data(), kN / 2, kN, a.data());
  m.gradient(x.data() + kIn * kN / 2, y.data() + kN / 2, kN / 2, kN, b.data());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(a[i] + b[i], whole[i], 1e-5) << i;
}

TEST(FashionMnistTest, DebianFilesHaveTheDocumentedShape) {
  auto test = loadFashionMnist(kDefaultDataDir, "t10k");
  if (!test.ok() &&
      std::ifstream(std::string(kDefaultDataDir) + "/t10k-labels-idx1-ubyte.gz").fail()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed: " << test.status();
  }
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->count(), 10000u);
  EXPECT_EQ(test->images.size(), 10000u * kImagePixels);
  std::vector<int> perClass(kClasses);
  for (uint8_t l : test->labels) ++perClass[l];
  for (int c : perClass) EXPECT_EQ(c, 1000);  // the test split is balanced
}

TEST(FashionMnistTest, MissingOrCorruptFilesAreNamed) {
  testing::TempDir dir;
  auto missing = loadFashionMnist(dir.path(), "train");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("dataset-fashion-mnist"), std::string::npos);
  // A gzip stream whose content is not IDX: gzread passes plain files through unchanged.
  std::ofstream(dir.path() + "/train-images-idx3-ubyte.gz") << "not an idx file at all";
  std::ofstream(dir.path() + "/train-labels-idx1-ubyte.gz") << "nope";
  auto corrupt = loadFashionMnist(dir.path(), "train");
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(corrupt.status().message().find("magic 2051"), std::string::npos) << corrupt.status();
}

}  // namespace
}  // namespace cofab::examples
