// Command-line helpers shared by the coding benchmarks.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace cofab::coding::benchargs {

// argv without the "--<name>=value" options listed in `own` (this bench's own flags, which
// Google Benchmark would reject), their values stored.
class Args {
 public:
  Args(int argc, char** argv, const std::vector<std::pair<std::string, std::string*>>& own) {
    storage_.push_back(argv[0]);
    for (int i = 1; i < argc; ++i) {
      bool taken = false;
      for (const auto& [name, out] : own) {
        const std::string prefix = "--" + name + "=";
        if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
          *out = argv[i] + prefix.size();
          taken = true;
        }
      }
      if (!taken) storage_.push_back(argv[i]);
    }
    for (auto& s : storage_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
    argc_ = static_cast<int>(storage_.size());
  }
  int* argc() { return &argc_; }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<char*> ptrs_;
  int argc_ = 0;
};

// bench/support's console reporter always colours and leaves a reset escape after its last
// newline, which would prefix the first RESULT line (so `grep '^RESULT'` would miss it): end that
// line before printing RESULT lines.
inline void endConsoleOutput() {
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace cofab::coding::benchargs
