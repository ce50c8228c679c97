#include "fabric/launcher/line_prefixer.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // An output inherited non-blocking (some CI runners hand one over) is full, not closed:
      // wait for room, as a blocking write would, instead of dropping the rest of the line.
      pollfd pfd{outFd_, POLLOUT, 0};
      if (::poll(&pfd, 1, -1) < 0 && errno != EINTR) return;
      continue;
    }
    if (n <= 0) return;  // output closed: nothing useful to do
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void LinePrefixer::feed(const char* data, size_t len) {
  size_t start = 0;
  while (start < len) {
    const auto* nl = static_cast<const char*>(std::memchr(data + start, '\n', len - start));
    const size_t end = nl != nullptr ? static_cast<size_t>(nl - data) : len;
    // The cap holds however the line arrives: in one piece or across reads.
    while (start < end) {
      const size_t take = std::min(end - start, kMaxLine - partial_.size());
      partial_.append(data + start, take);
      start += take;
      cutJustNow_ = false;
      if (partial_.size() == kMaxLine) {
        emit(partial_.data(), partial_.size());
        partial_.clear();
        cutJustNow_ = true;
      }
    }
    if (nl == nullptr) break;
    // A newline right after a cut ends the piece already written, not an empty line.
    if (!cutJustNow_) emit(partial_.data(), partial_.size());
    partial_.clear();
    cutJustNow_ = false;
    start = end + 1;
  }
}

void LinePrefixer::finish() {
  if (!partial_.empty()) emit(partial_.data(), partial_.size());
  partial_.clear();
}

}  // namespace cofab
