// TempDir: a fresh directory under $TMPDIR (or /tmp), removed with its contents when destroyed.
#pragma once

#include <string>

namespace cofab::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cofab::testing
