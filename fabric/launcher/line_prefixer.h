// LinePrefixer: turns the byte stream of one child's stdout or stderr into whole lines, each
// written to `outFd` with a prefix ("[rank 3] "), so lines from many children never interleave
// mid-line. A partial last line is flushed (with a newline) at end of stream.
#pragma once

#include <string>

namespace cofab {

class LinePrefixer {
 public:
  LinePrefixer(std::string prefix, int outFd, bool enabled)
      : prefix_(std::move(prefix)), outFd_(outFd), enabled_(enabled) {}
  void feed(const char* data, size_t len);
  void finish();

 private:
  void emit(const char* data, size_t len);
  std::string prefix_;
  int outFd_;
  bool enabled_;
  std::string partial_;
};

}  // namespace cofab
