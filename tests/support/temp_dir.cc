#include "tests/support/temp_dir.h"

#include <cstdlib>
#include <filesystem>

#include "core/check.h"

namespace cofab::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/cofab-test-XXXXXX";
  char* made = ::mkdtemp(tmpl.data());
  COFAB_CHECK(made != nullptr) << "mkdtemp " << tmpl;
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace cofab::testing
