#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/param.h"

namespace cofab {
namespace {

COFAB_PARAM_ENUM(kLogLevel, "COFAB_LOG_LEVEL", "warn",
                 (std::vector<std::string>{"error", "warn", "info", "debug", "trace"}),
                 "log threshold written to stderr");
COFAB_PARAM_STRING(kLogSubsys, "COFAB_LOG_SUBSYS", "",
                   "comma-separated subsystems to log (empty: all), e.g. store,tcp");

struct LogConfig {
  std::atomic<int> level{static_cast<int>(LogLevel::kWarn)};
  std::atomic<int> rank{-1};
  std::mutex mu;  // guards subsystems
  std::vector<std::string> subsystems;
  std::atomic<bool> loaded{false};
};

LogConfig& config() {
  static LogConfig* c = new LogConfig();
  return *c;
}

void load(LogConfig& c) {
  int level = static_cast<int>(LogLevel::kWarn);
  auto lv = kLogLevel.get();
  if (lv.ok()) {
    const std::string& s = *lv;
    level = s == "error" ? 0 : s == "warn" ? 1 : s == "info" ? 2 : s == "debug" ? 3 : 4;
  } else {
    // Logging cannot fail its caller: say once that the variable is ignored.
    std::string m = "cofab: " + lv.status().message() + "; using warn\n";
    (void)!write(2, m.data(), m.size());
  }
  std::vector<std::string> subs;
  auto sv = kLogSubsys.get();
  if (sv.ok()) {
    std::string cur;
    for (char ch : *sv + ",") {
      if (ch == ',') {
        if (!cur.empty()) subs.push_back(cur);
        cur.clear();
      } else if (ch != ' ') {
        cur += ch;
      }
    }
  }
  std::lock_guard<std::mutex> lock(c.mu);
  c.subsystems = std::move(subs);
  c.level.store(level);
  c.loaded.store(true, std::memory_order_release);
}

const char kLevelChar[] = {'E', 'W', 'I', 'D', 'T'};

}  // namespace

bool logEnabled(LogLevel level, std::string_view subsystem) {
  auto& c = config();
  if (!c.loaded.load(std::memory_order_acquire)) load(c);
  if (static_cast<int>(level) > c.level.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.subsystems.empty()) return true;
  for (const auto& s : c.subsystems) {
    if (s == subsystem) return true;
  }
  return false;
}

void setLogRank(int rank) { config().rank.store(rank); }

void reloadLogConfig() { load(config()); }

namespace detail {

LogLine::LogLine(LogLevel level, std::string_view subsystem) {
  stream_ << wallTimestamp() << ' ' << kLevelChar[static_cast<int>(level)];
  int rank = config().rank.load(std::memory_order_relaxed);
  if (rank >= 0) stream_ << " rank " << rank;
  stream_ << ' ' << subsystem << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string s = stream_.str();
  // One write() per line; a short one (a pipe taking part of a long line, a signal) is
  // finished rather than cut.
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    const ssize_t n = ::write(2, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed or failing: nowhere to say it
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace detail
}  // namespace cofab
