#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace cofab::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << file << ":" << line << ": COFAB_CHECK(" << condition << ") failed: ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", stream_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace cofab::detail
