#include "core/clock.h"

#include <climits>
#include <ctime>

namespace cofab {

Deadline Deadline::after(Duration d) {
  auto now = Clock::now();
  if (d >= Clock::time_point::max() - now) return never();
  return Deadline(now + d);
}

Duration Deadline::remaining() const {
  if (isNever()) return Duration::max();
  auto left = when_ - Clock::now();
  return left.count() > 0 ? std::chrono::duration_cast<Duration>(left) : Duration::zero();
}

int Deadline::remainingMsForPoll() const {
  if (isNever()) return INT_MAX;
  auto ns = remaining().count();
  int64_t ms = (ns + 999'999) / 1'000'000;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

std::string wallTimestamp() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t{};
  gmtime_r(&ts.tv_sec, &t);
  char buf[40];
  size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &t);
  snprintf(buf + n, sizeof(buf) - n, ".%03ldZ", ts.tv_nsec / 1'000'000);
  return buf;
}

}  // namespace cofab
