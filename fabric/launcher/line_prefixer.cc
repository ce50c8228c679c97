#include "fabric/launcher/line_prefixer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace cofab {

void LinePrefixer::emit(const char* data, size_t len) {
  std::string line = enabled_ ? prefix_ : std::string();
  line.append(data, len);
  line += '\n';
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(outFd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // output closed: nothing useful to do
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void LinePrefixer::feed(const char* data, size_t len) {
  size_t start = 0;
  for (size_t i = 0; i < len; ++i) {
    if (data[i] != '\n') continue;
    if (partial_.empty()) {
      emit(data + start, i - start);
    } else {
      partial_.append(data + start, i - start);
      emit(partial_.data(), partial_.size());
      partial_.clear();
    }
    start = i + 1;
  }
  while (len - start > 0) {
    const size_t take = std::min(len - start, kMaxLine - partial_.size());
    partial_.append(data + start, take);
    start += take;
    if (partial_.size() == kMaxLine) {
      emit(partial_.data(), partial_.size());
      partial_.clear();
    }
  }
}

void LinePrefixer::finish() {
  if (!partial_.empty()) emit(partial_.data(), partial_.size());
  partial_.clear();
}

}  // namespace cofab
