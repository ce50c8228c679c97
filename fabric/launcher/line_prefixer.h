// LinePrefixer: turns the byte stream of one child's stdout or stderr into whole lines, each
// written to `outFd` with a prefix ("[rank 3] "), so lines from many children never interleave
// mid-line. A partial last line is flushed (with a newline) at end of stream, and a line longer
// than kMaxLine is cut into prefixed pieces of that size, so a child writing without newlines
// (a progress bar redrawn with '\r') costs bounded memory and still shows up.
#pragma once

#include <string>

namespace cofab {

class LinePrefixer {
 public:
  LinePrefixer(std::string prefix, int outFd, bool enabled)
      : prefix_(std::move(prefix)), outFd_(outFd), enabled_(enabled) {}
  static constexpr size_t kMaxLine = 64 * 1024;
  void feed(const char* data, size_t len);
  void finish();

 private:
  void emit(const char* data, size_t len);
  std::string prefix_;
  int outFd_;
  bool enabled_;
  std::string partial_;
  bool cutJustNow_ = false;  // the last byte fed completed a kMaxLine piece
};

}  // namespace cofab
