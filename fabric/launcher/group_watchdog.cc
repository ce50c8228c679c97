#include "fabric/launcher/group_watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>
#include <vector>

namespace cofab {
namespace {

// The watchdog's life, in the forked child: async-signal-safe calls only (the parent may have
// threads), on a table allocated before the fork. Messages are 4-byte writes to a pipe, whole
// by POSIX: a positive group id to watch, its negation to forget, 0 for the normal end.
[[noreturn]] void watchUntilTheLauncherEnds(int fd, pid_t* groups, size_t capacity) {
  // A group of its own: what kills cofab-run's whole group (timeout -s KILL, kill -9 -PGID,
  // Ctrl-\) must not take the watchdog with it.
  ::setpgid(0, 0);
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  size_t count = 0;
  for (;;) {
    int32_t v = 0;
    const ssize_t n = ::read(fd, &v, sizeof(v));
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(v))) break;  // end of pipe: cofab-run is gone
    if (v == 0) ::_exit(0);
    if (v > 0) {
      if (count < capacity) groups[count++] = v;
      continue;
    }
    for (size_t i = 0; i < count; ++i) {
      if (groups[i] == -v) {
        groups[i] = groups[--count];
        break;
      }
    }
  }
  for (size_t i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

}  // namespace

StatusOr<GroupWatchdog> GroupWatchdog::start(size_t maxGroups) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return errnoStatus(StatusCode::kIoError, "pipe2", errno);
  std::vector<pid_t> table(maxGroups);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(p[0]);
    ::close(p[1]);
    return errnoStatus(StatusCode::kIoError, "fork", e);
  }
  if (pid == 0) {
    ::close(p[1]);
    watchUntilTheLauncherEnds(p[0], table.data(), table.size());
  }
  ::close(p[0]);
  return GroupWatchdog(p[1], pid);
}

GroupWatchdog::GroupWatchdog(GroupWatchdog&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), pid_(std::exchange(o.pid_, -1)) {}

GroupWatchdog::~GroupWatchdog() { release(); }

void GroupWatchdog::send(int value) {
  if (fd_ < 0) return;
  const int32_t v = value;
  // A watchdog that died (killed by hand) cannot be helped: EPIPE, with SIGPIPE ignored.
  while (::write(fd_, &v, sizeof(v)) < 0 && errno == EINTR) {
  }
}

void GroupWatchdog::watch(pid_t group) {
  if (group > 0) send(group);
}

void GroupWatchdog::forget(pid_t group) {
  if (group > 0) send(-group);
}

bool GroupWatchdog::reaped(pid_t pid) {
  if (pid_ < 0 || pid != pid_) return false;
  pid_ = -1;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return true;
}

void GroupWatchdog::release() {
  if (fd_ < 0) return;
  send(0);
  ::close(fd_);
  fd_ = -1;
  while (pid_ > 0 && ::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace cofab
