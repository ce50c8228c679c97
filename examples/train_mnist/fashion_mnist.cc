#include "examples/train_mnist/fashion_mnist.h"

#include <zlib.h>

namespace cofab::examples {
namespace {

// Reads a whole gzip file; IoError naming it when it cannot be opened or read.
StatusOr<std::vector<uint8_t>> readGz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return InvalidArgument("cannot open " + path +
                           " (install the Debian package dataset-fashion-mnist, or pass "
                           "--data-dir)");
  }
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.insert(out.end(), buf, buf + n);
  int err = 0;
  std::string msg = n < 0 ? gzerror(f, &err) : "";
  gzclose(f);
  if (n < 0) return DataLoss("reading " + path + ": " + msg);
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

StatusOr<Dataset> loadFashionMnist(const std::string& dir, const std::string& split) {
  std::string imagesPath = dir + "/" + split + "-images-idx3-ubyte.gz";
  std::string labelsPath = dir + "/" + split + "-labels-idx1-ubyte.gz";
  COFAB_ASSIGN_OR_RETURN(auto images, readGz(imagesPath));
  COFAB_ASSIGN_OR_RETURN(auto labels, readGz(labelsPath));
  if (images.size() < 16 || be32(images.data()) != 2051) {
    return DataLoss(imagesPath + " is not an IDX3 image file (magic 2051)");
  }
  if (labels.size() < 8 || be32(labels.data()) != 2049) {
    return DataLoss(labelsPath + " is not an IDX1 label file (magic 2049)");
  }
  uint32_t n = be32(images.data() + 4), rows = be32(images.data() + 8), cols = be32(images.data() + 12);
  if (rows * cols != kImagePixels) {
    return DataLoss(imagesPath + ": images are " + std::to_string(rows) + "x" +
                    std::to_string(cols) + ", expected 28x28");
  }
  if (be32(labels.data() + 4) != n) {
    return DataLoss(labelsPath + " has " + std::to_string(be32(labels.data() + 4)) +
                    " labels for " + std::to_string(n) + " images");
  }
  if (images.size() != 16 + size_t{n} * kImagePixels || labels.size() != 8 + size_t{n}) {
    return DataLoss(split + " files are truncated or have trailing bytes");
  }
  Dataset d;
  d.images.resize(size_t{n} * kImagePixels);
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = images[16 + i] * (1.0f / 255.0f);
  d.labels.assign(labels.begin() + 8, labels.end());
  for (uint8_t l : d.labels) {
    if (l >= kClasses) return DataLoss(labelsPath + " holds label " + std::to_string(l));
  }
  return d;
}

}  // namespace cofab::examples
