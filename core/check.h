// COFAB_CHECK(cond) << "context": aborts with file:line when an internal invariant is broken.
//
// Only for bugs in cofab itself. Bad input from users or peers is a Status, never a CHECK.
#pragma once

#include <sstream>

namespace cofab::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `COFAB_CHECK(x) << ...` compile to nothing when x holds.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace cofab::detail

#define COFAB_CHECK(cond)                   \
  (cond) ? (void)0                          \
         : ::cofab::detail::Voidify() &     \
               ::cofab::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define COFAB_CHECK_EQ(a, b) COFAB_CHECK((a) == (b)) << #a " == " #b " (" << (a) << " vs " << (b) << ") "
