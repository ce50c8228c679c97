// DelayModel: how long a task straggles before it runs, for the straggler executor. Injected
// delays let a laptop reproduce the tail behaviour of a shared cluster.
//
//   NoDelay                  tasks run as soon as a thread takes them
//   ShiftedExponentialDelay  load x (shift + Exp(mean tail)), the model of Lee et al.: a task
//                            doing a fraction `load` of the whole product takes proportionally long
//   TraceDelay               delays replayed from a measured trace file
//
// Delays are a pure function of (run, task): the same seed gives the same straggler pattern, so
// coded, uncoded and replicated runs can be compared on equal terms. Delays too long for a
// Duration (above ~9.2e12 ms, e.g. a trace's 1e16 for "never finishes") saturate to
// Duration::max(): the executor then waits for the task's cancellation only. Immutable;
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace cofab::coding {

// Milliseconds as a Duration, saturating: more than Duration::max() (~292 years; think "never
// finishes") is Duration::max(), not an overflowed int64 (undefined; INT64_MIN on x86, which
// would run a straggler at once). Negative or NaN (a model given a negative load) is no delay.
Duration durationFromMs(double ms);

struct DelayQuery {
  int64_t run = 0;    // which repetition (changes the random draw)
  int task = 0;       // task index within the run
  int tasks = 1;      // tasks in the run
  double load = 1.0;  // fraction of the whole product this task computes
};

class DelayModel {
 public:
  virtual ~DelayModel() = default;
  virtual Duration delay(const DelayQuery& query) const = 0;
  virtual std::string describe() const = 0;
};

class NoDelay final : public DelayModel {
 public:
  Duration delay(const DelayQuery&) const override { return Duration(0); }
  std::string describe() const override { return "none"; }
};

struct ShiftedExponentialOptions {
  double shiftMs = 0;     // deterministic part for load 1
  double tailMeanMs = 0;  // mean of the exponential part for load 1
  uint64_t seed = 1;
};

class ShiftedExponentialDelay final : public DelayModel {
 public:
  static StatusOr<ShiftedExponentialDelay> create(const ShiftedExponentialOptions& options);
  Duration delay(const DelayQuery& query) const override;
  std::string describe() const override;

 private:
  explicit ShiftedExponentialDelay(const ShiftedExponentialOptions& o) : options_(o) {}
  ShiftedExponentialOptions options_;
};

// Trace format: one delay in milliseconds per line; blank lines and '#' comments are ignored.
// Task i of run r gets entry (r * tasks + i) mod N, as recorded (not scaled by load).
class TraceDelay final : public DelayModel {
 public:
  static StatusOr<TraceDelay> load(const std::string& path);
  static StatusOr<TraceDelay> fromMillis(std::vector<double> delaysMs);
  Duration delay(const DelayQuery& query) const override;
  std::string describe() const override;
  size_t size() const { return delaysMs_.size(); }

 private:
  explicit TraceDelay(std::vector<double> d) : delaysMs_(std::move(d)) {}
  std::vector<double> delaysMs_;
};

}  // namespace cofab::coding
