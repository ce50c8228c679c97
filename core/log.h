// Levelled logging to stderr: "2026-11-22T05:32:57.123Z W rank 3 tcp] message".
//
//   COFAB_LOG(kWarn, "tcp") << "peer " << peer << " closed";
//
// COFAB_LOG_LEVEL (error|warn|info|debug|trace, default warn) sets the threshold;
// COFAB_LOG_SUBSYS (comma list, default all) keeps only those subsystems. The rank prefix is set
// once per process by Bootstrap (setLogRank). Lines are written with one write() each, so lines
// from several threads do not interleave, up to PIPE_BUF (4096) bytes where stderr is a pipe
// (under cofab-run): a longer line may be split by another thread's. Not for hot paths: check
// logEnabled() first there.
#pragma once

#include <sstream>
#include <string_view>

namespace cofab {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

bool logEnabled(LogLevel level, std::string_view subsystem);
void setLogRank(int rank);  // -1 clears the prefix
// Re-reads COFAB_LOG_LEVEL / COFAB_LOG_SUBSYS (tests that override them).
void reloadLogConfig();

namespace detail {
class LogLine {
 public:
  LogLine(LogLevel level, std::string_view subsystem);
  ~LogLine();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace cofab

#define COFAB_LOG(level, subsys)                                           \
  if (!::cofab::logEnabled(::cofab::LogLevel::level, subsys)) {            \
  } else                                                                   \
    ::cofab::detail::LogLine(::cofab::LogLevel::level, subsys).stream()
