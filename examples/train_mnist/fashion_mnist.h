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

struct Dataset {
  std::vector<float> images;   // count * kImagePixels
  std::vector<uint8_t> labels; // count
  size_t count() const { return labels.size(); }
};

// Reads "<split>-images-idx3-ubyte.gz" and "<split>-labels-idx1-ubyte.gz" (split: "train" or
// "t10k"). InvalidArgument / DataLoss for missing files, bad magic, inconsistent counts or a
// truncated file, naming the file.
StatusOr<Dataset> loadFashionMnist(const std::string& dir, const std::string& split);

}  // namespace cofab::examples
