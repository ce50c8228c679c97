// Command-line helpers shared by the coding benchmarks.
#pragma once

#include <cstring>
#include <string>
#include <vector>

namespace cofab::coding::benchargs {

// argv with "--benchmark_color=false" added up front (a flag given by the user still wins, being
// later): colour escapes on stdout would otherwise prefix the RESULT lines. Also removes
// "--<name>=value" options listed in `own`, storing their values.
class Args {
 public:
  Args(int argc, char** argv, const std::vector<std::pair<std::string, std::string*>>& own) {
    storage_.push_back(argv[0]);
    storage_.push_back("--benchmark_color=false");
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

}  // namespace cofab::coding::benchargs
