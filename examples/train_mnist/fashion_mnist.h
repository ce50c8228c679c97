// Fashion-MNIST from Debian's dataset-fashion-mnist package: IDX files, gzip-compressed, under
// /usr/share/datasets/fashion-mnist/. Images become floats in [0, 1], row-major 784 per sample.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace cofab::examples {

inline constexpr int kImagePixels = 28 * 28;
inline constexpr int kClasses = 10;
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";
// Most samples a split may announce (Fashion-MNIST has 60000 and 10000).
inline constexpr uint32_t kMaxSamples = 1000000;

struct Dataset {
  std::vector<float> images;    // count * kImagePixels
  std::vector<uint8_t> labels;  // count
  size_t count() const { return labels.size(); }
};

// Reads "<split>-images-idx3-ubyte.gz" and "<split>-labels-idx1-ubyte.gz" (split: "train" or
// "t10k"). Both headers are read and checked first (IDX magic, 28x28 images, at most kMaxSamples,
// equal counts), then exactly the bytes they announce, then the end of each gzip stream (its
// CRC and length trailer). InvalidArgument for a file that cannot be opened; DataLoss for bad
// magic, other dimensions, inconsistent counts, a truncated or corrupt stream or trailing
// bytes; each naming the file.
StatusOr<Dataset> loadFashionMnist(const std::string& dir, const std::string& split);

}  // namespace cofab::examples
