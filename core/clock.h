// Clocks and deadlines. Every wait in cofab takes a Deadline (DESIGN.md §2): an absolute point
// on the monotonic clock, so that a deadline passed down through several calls keeps its meaning.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace cofab {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::nanoseconds;
using Millis = std::chrono::milliseconds;

class Deadline {
 public:
  // A deadline that never expires. Use sparingly: prefer after().
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  static Deadline after(Duration d);
  // Milliseconds past what nanoseconds can count (about 292 years, INT64_MAX say, for
  // "forever") are never, like after()'s; converting them overflowed into a negative duration,
  // a deadline already past.
  static Deadline afterMs(int64_t ms) {
    if (ms > std::chrono::duration_cast<Millis>(Duration::max()).count()) return never();
    if (ms < std::chrono::duration_cast<Millis>(Duration::min()).count())
      return after(Duration::zero());
    return after(Millis(ms));
  }
  static Deadline at(Clock::time_point t) { return Deadline(t); }

  bool isNever() const { return when_ == Clock::time_point::max(); }
  bool expired() const { return !isNever() && Clock::now() >= when_; }
  // Time left, clamped at zero; Duration::max() for never().
  Duration remaining() const;
  // Remaining milliseconds rounded up, clamped to [0, INT32_MAX]: for poll()/epoll_wait().
  int remainingMsForPoll() const;
  Clock::time_point when() const { return when_; }
  // The earlier of the two.
  Deadline min(Deadline other) const { return other.when_ < when_ ? other : *this; }

 private:
  explicit Deadline(Clock::time_point when) : when_(when) {}
  Clock::time_point when_;
};

// Monotonic nanoseconds, for timing and traces.
inline int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Wall-clock timestamp "2026-11-22T05:32:57.123Z" for logs.
std::string wallTimestamp();

}  // namespace cofab
