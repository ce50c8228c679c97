// The Fashion-MNIST loader against hostile or damaged .gz files written here with zlib: the
// header is checked before any data is read (rows * cols is not computed in 32 bits, where
// 16 x 268435505 wraps to 784), the gzip trailer must be intact, nothing may follow the data,
// and every failure is DataLoss naming the file.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "examples/train_mnist/fashion_mnist.h"
#include "tests/support/temp_dir.h"

namespace cofab::examples {
namespace {

void putBe32(std::vector<uint8_t>& v, uint32_t x) {
  v.push_back(uint8_t(x >> 24));
  v.push_back(uint8_t(x >> 16));
  v.push_back(uint8_t(x >> 8));
  v.push_back(uint8_t(x));
}

uint8_t pixel(size_t i) { return uint8_t((i * 7 + 3) % 256); }

// An IDX3 image file: the header, then `dataBytes` pixel bytes.
std::vector<uint8_t> imagesIdx(uint32_t n, uint32_t rows, uint32_t cols, size_t dataBytes,
                               uint32_t magic = 2051) {
  std::vector<uint8_t> v;
  putBe32(v, magic);
  putBe32(v, n);
  putBe32(v, rows);
  putBe32(v, cols);
  for (size_t i = 0; i < dataBytes; ++i) v.push_back(pixel(i));
  return v;
}

std::vector<uint8_t> labelsIdx(uint32_t n, uint32_t magic = 2049) {
  std::vector<uint8_t> v;
  putBe32(v, magic);
  putBe32(v, n);
  for (uint32_t i = 0; i < n; ++i) v.push_back(uint8_t(i % 10));
  return v;
}

bool writeGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = true;
  if (!bytes.empty()) {
    ok = gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
         static_cast<int>(bytes.size());
  }
  return gzclose(f) == Z_OK && ok;
}

class FashionMnistLoader : public ::testing::Test {
 protected:
  std::string imagesPath() const { return dir_.path() + "/train-images-idx3-ubyte.gz"; }
  std::string labelsPath() const { return dir_.path() + "/train-labels-idx1-ubyte.gz"; }
  void write(const std::vector<uint8_t>& images, const std::vector<uint8_t>& labels) {
    ASSERT_TRUE(writeGz(imagesPath(), images));
    ASSERT_TRUE(writeGz(labelsPath(), labels));
  }
  StatusOr<Dataset> load() { return loadFashionMnist(dir_.path(), "train"); }
  // Loading fails with DataLoss naming `path` (and mentioning `what`, when given).
  void expectDataLoss(const std::string& path, const std::string& what = "") {
    auto d = load();
    ASSERT_FALSE(d.ok()) << "loaded " << d->count() << " samples";
    EXPECT_EQ(d.status().code(), StatusCode::kDataLoss) << d.status();
    EXPECT_NE(d.status().message().find(path), std::string::npos) << d.status();
    EXPECT_NE(d.status().message().find(what), std::string::npos) << d.status();
  }

  cofab::testing::TempDir dir_;
};

TEST_F(FashionMnistLoader, ValidTinyFilesLoad) {
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(3, 28, 28, 3 * kImagePixels), labelsIdx(3)));
  auto d = load();
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->count(), 3u);
  ASSERT_EQ(d->images.size(), 3u * kImagePixels);
  const size_t last = 3 * size_t{kImagePixels} - 1;
  for (size_t i : {size_t{0}, size_t{5}, size_t{kImagePixels + 1}, last}) {
    EXPECT_FLOAT_EQ(d->images[i], pixel(i) * (1.0f / 255.0f)) << i;
  }
  EXPECT_EQ(d->labels, (std::vector<uint8_t>{0, 1, 2}));
}

TEST_F(FashionMnistLoader, DimensionsWhoseProductWrapsTo784AreRejected) {
  // 16 * 268435505 = 2^32 + 784: accepted as 28x28 when multiplied in uint32_t.
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(1, 16, 268435505, kImagePixels), labelsIdx(1)));
  expectDataLoss(imagesPath(), "16x268435505");
}

TEST_F(FashionMnistLoader, GzipCutInItsTrailerIsDataLoss) {
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(2, 28, 28, 2 * kImagePixels), labelsIdx(2)));
  ASSERT_TRUE(load().ok());  // intact, the same files load
  // The last 4 bytes (the uncompressed length) gone: every data byte still decompresses.
  std::filesystem::resize_file(imagesPath(), std::filesystem::file_size(imagesPath()) - 4);
  expectDataLoss(imagesPath());
}

TEST_F(FashionMnistLoader, LabelGzipCutInItsTrailerIsDataLoss) {
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(2, 28, 28, 2 * kImagePixels), labelsIdx(2)));
  std::filesystem::resize_file(labelsPath(), std::filesystem::file_size(labelsPath()) - 4);
  expectDataLoss(labelsPath());
}

TEST_F(FashionMnistLoader, WrongMagicIsDataLoss) {
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(1, 28, 28, kImagePixels, 2049), labelsIdx(1)));
  expectDataLoss(imagesPath(), "magic 2051");
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(1, 28, 28, kImagePixels), labelsIdx(1, 2051)));
  expectDataLoss(labelsPath(), "magic 2049");
}

TEST_F(FashionMnistLoader, HeaderPromisingMoreThanTheFileHoldsIsDataLoss) {
  // Beyond the cap: refused from the header alone, before any data is decompressed.
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(kMaxSamples + 1, 28, 28, kImagePixels), labelsIdx(1)));
  expectDataLoss(imagesPath(), std::to_string(kMaxSamples + 1));
  // Within the cap, but the data stops after 2 of 5 images.
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(5, 28, 28, 2 * kImagePixels), labelsIdx(5)));
  expectDataLoss(imagesPath(), "truncated");
}

TEST_F(FashionMnistLoader, TrailingBytesAndCountMismatchAreDataLoss) {
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(2, 28, 28, 2 * kImagePixels + 1), labelsIdx(2)));
  expectDataLoss(imagesPath(), "trailing");
  ASSERT_NO_FATAL_FAILURE(write(imagesIdx(2, 28, 28, 2 * kImagePixels), labelsIdx(3)));
  expectDataLoss(labelsPath(), "3 labels for 2 images");
}

}  // namespace
}  // namespace cofab::examples
