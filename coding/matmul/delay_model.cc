#include "coding/matmul/delay_model.h"

#include <cmath>
#include <fstream>
#include <sstream>

namespace cofab::coding {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Duration durationFromMs(double ms) {
  if (!(ms > 0)) return Duration(0);
  // 2^63 ns, exactly representable; every double below it converts to int64 without overflow.
  constexpr double kLimitNs = 9223372036854775808.0;
  if (ms * 1e6 >= kLimitNs) return Duration::max();
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(ms));
}

StatusOr<ShiftedExponentialDelay> ShiftedExponentialDelay::create(
    const ShiftedExponentialOptions& o) {
  if (!(o.shiftMs >= 0) || !(o.tailMeanMs >= 0) || !std::isfinite(o.shiftMs) ||
      !std::isfinite(o.tailMeanMs)) {
    return InvalidArgument(
        "shifted exponential delay needs finite shiftMs >= 0 and tailMeanMs >= "
        "0; got shift=" +
        std::to_string(o.shiftMs) + " tail=" + std::to_string(o.tailMeanMs));
  }
  return ShiftedExponentialDelay(o);
}

Duration ShiftedExponentialDelay::delay(const DelayQuery& q) const {
  const uint64_t h = splitmix(options_.seed ^ splitmix(static_cast<uint64_t>(q.run) * 1315423911u +
                                                       static_cast<uint64_t>(q.task)));
  // Uniform in (0, 1]: 53 random bits, never 0 so the log is finite.
  const double u = (static_cast<double>(h >> 11) + 1.0) / 9007199254740992.0;
  const double ms = q.load * (options_.shiftMs - options_.tailMeanMs * std::log(u));
  return durationFromMs(ms);
}

std::string ShiftedExponentialDelay::describe() const {
  std::ostringstream os;
  os << "shifted_exponential(shift=" << options_.shiftMs << "ms, tail_mean=" << options_.tailMeanMs
     << "ms, seed=" << options_.seed << ")";
  return os.str();
}

StatusOr<TraceDelay> TraceDelay::fromMillis(std::vector<double> d) {
  if (d.empty()) return InvalidArgument("delay trace is empty");
  for (size_t i = 0; i < d.size(); ++i) {
    if (!(d[i] >= 0) || !std::isfinite(d[i])) {
      return InvalidArgument("delay trace entry " + std::to_string(i) + " is " +
                             std::to_string(d[i]) + ": delays must be finite and >= 0 ms");
    }
  }
  return TraceDelay(std::move(d));
}

StatusOr<TraceDelay> TraceDelay::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError("cannot open delay trace '" + path + "'");
  std::vector<double> d;
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    double v;
    if (!(ls >> v)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      return InvalidArgument("delay trace '" + path + "' line " + std::to_string(lineNo) +
                             ": expected a delay in ms, got '" + line + "'");
    }
    std::string rest;
    if (ls >> rest) {
      return InvalidArgument("delay trace '" + path + "' line " + std::to_string(lineNo) +
                             ": one number per line, got extra '" + rest + "'");
    }
    d.push_back(v);
  }
  auto t = fromMillis(std::move(d));
  if (!t.ok()) return t.status().withContext("delay trace '" + path + "'");
  return t;
}

Duration TraceDelay::delay(const DelayQuery& q) const {
  const uint64_t idx = (static_cast<uint64_t>(q.run) * q.tasks + q.task) % delaysMs_.size();
  return durationFromMs(delaysMs_[idx]);
}

std::string TraceDelay::describe() const {
  return "trace(" + std::to_string(delaysMs_.size()) + " entries)";
}

}  // namespace cofab::coding
