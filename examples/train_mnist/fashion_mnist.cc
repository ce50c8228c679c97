#include "examples/train_mnist/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <utility>

namespace cofab::examples {
namespace {

constexpr uint32_t kImagesMagic = 2051;  // IDX3: unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // IDX1: unsigned bytes, 1 dimension

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// One gzip file read front to back: the header first, then exactly the bytes it announces, then
// the end of the stream. Nothing is decompressed beyond what the header asked for, and every
// failure (a short read, corrupt data, a CRC or length mismatch, a stream cut before its
// trailer, bytes after the data) is DataLoss naming the file.
class GzReader {
 public:
  explicit GzReader(std::string path) : path_(std::move(path)) {}
  ~GzReader() {
    if (f_ != nullptr) gzclose(f_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  const std::string& path() const { return path_; }

  Status open() {
    f_ = gzopen(path_.c_str(), "rb");
    if (f_ == nullptr) {
      return InvalidArgument("cannot open " + path_ +
                             " (install the Debian package dataset-fashion-mnist, or pass "
                             "--data-dir)");
    }
    return OkStatus();
  }

  // Exactly `n` bytes into `out`.
  Status read(uint8_t* out, size_t n, const std::string& what) {
    size_t done = 0;
    while (done < n) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 20));
      const int got = gzread(f_, out + done, want);
      if (got < 0) return DataLoss(path_ + ": reading " + what + ": " + zlibMessage());
      if (got == 0) {
        std::string why = zlibMessage();
        return DataLoss(path_ + " is truncated: it ends after " + std::to_string(offset_) +
                        " bytes, in the " + what + (why.empty() ? "" : " (" + why + ")"));
      }
      done += static_cast<size_t>(got);
      offset_ += static_cast<uint64_t>(got);
    }
    return OkStatus();
  }

  // The stream ends right here, with an intact gzip trailer.
  Status expectEnd() {
    uint8_t extra = 0;
    const int got = gzread(f_, &extra, 1);
    if (got < 0) return DataLoss(path_ + ": " + zlibMessage());
    if (got > 0) {
      return DataLoss(path_ + " has trailing bytes after its " + std::to_string(offset_) +
                      " bytes of data");
    }
    // gzread reports a stream cut before its trailer (CRC-32 and length) as a short read with
    // Z_BUF_ERROR ("unexpected end of file"), not as -1: check the error state explicitly.
    int err = Z_OK;
    (void)gzerror(f_, &err);
    if (err != Z_OK) return DataLoss(path_ + ": " + zlibMessage());
    return OkStatus();
  }

 private:
  // zlib's message without the "<path>: " prefix gzerror puts in front; empty when none.
  std::string zlibMessage() {
    int err = Z_OK;
    const char* m = gzerror(f_, &err);
    if (err == Z_OK || m == nullptr) return "";
    std::string s = m;
    if (s.rfind(path_ + ": ", 0) == 0) s.erase(0, path_.size() + 2);
    return s;
  }

  std::string path_;
  gzFile f_ = nullptr;
  uint64_t offset_ = 0;  // uncompressed bytes read so far
};

}  // namespace

StatusOr<Dataset> loadFashionMnist(const std::string& dir, const std::string& split) {
  GzReader images(dir + "/" + split + "-images-idx3-ubyte.gz");
  GzReader labels(dir + "/" + split + "-labels-idx1-ubyte.gz");
  COFAB_RETURN_IF_ERROR(images.open());
  COFAB_RETURN_IF_ERROR(labels.open());

  // Both headers first: nothing large is read or allocated before they agree.
  uint8_t ih[16];
  COFAB_RETURN_IF_ERROR(images.read(ih, sizeof(ih), "IDX3 header"));
  if (be32(ih) != kImagesMagic) {
    return DataLoss(images.path() + " is not an IDX3 image file (magic " +
                    std::to_string(kImagesMagic) + "; it starts with " + std::to_string(be32(ih)) +
                    ")");
  }
  const uint32_t n = be32(ih + 4), rows = be32(ih + 8), cols = be32(ih + 12);
  if (rows != 28 || cols != 28) {  // compared apart: rows * cols would wrap in 32 bits
    return DataLoss(images.path() + ": images are " + std::to_string(rows) + "x" +
                    std::to_string(cols) + ", expected 28x28");
  }
  if (n > kMaxSamples) {
    return DataLoss(images.path() + " announces " + std::to_string(n) + " images, more than the " +
                    std::to_string(kMaxSamples) + " this loader accepts");
  }
  uint8_t lh[8];
  COFAB_RETURN_IF_ERROR(labels.read(lh, sizeof(lh), "IDX1 header"));
  if (be32(lh) != kLabelsMagic) {
    return DataLoss(labels.path() + " is not an IDX1 label file (magic " +
                    std::to_string(kLabelsMagic) + "; it starts with " + std::to_string(be32(lh)) +
                    ")");
  }
  if (be32(lh + 4) != n) {
    return DataLoss(labels.path() + " has " + std::to_string(be32(lh + 4)) + " labels for " +
                    std::to_string(n) + " images in " + images.path());
  }

  Dataset d;
  // Grown as the data arrives (reserve capped): a header promising more than the file holds
  // fails at the short read, not in an allocation.
  const size_t total = size_t{n} * kImagePixels;
  d.images.reserve(std::min<size_t>(total, size_t{70000} * kImagePixels));
  uint8_t buf[1 << 16];
  for (size_t done = 0; done < total;) {
    const size_t want = std::min(sizeof(buf), total - done);
    COFAB_RETURN_IF_ERROR(images.read(buf, want, "image data"));
    for (size_t i = 0; i < want; ++i) d.images.push_back(buf[i] * (1.0f / 255.0f));
    done += want;
  }
  COFAB_RETURN_IF_ERROR(images.expectEnd());
  d.labels.resize(n);
  if (n > 0) {
    COFAB_RETURN_IF_ERROR(labels.read(d.labels.data(), n, "label data"));
  }
  COFAB_RETURN_IF_ERROR(labels.expectEnd());
  for (uint8_t l : d.labels) {
    if (l >= kClasses) return DataLoss(labels.path() + " holds label " + std::to_string(l));
  }
  return d;
}

}  // namespace cofab::examples
