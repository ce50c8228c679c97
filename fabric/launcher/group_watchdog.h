// GroupWatchdog: a small process cofab-run forks first, which kills the job's process groups
// if cofab-run dies without stopping them (SIGKILL, the OOM killer).
//
// PR_SET_PDEATHSIG reaches only cofab-run's own children. A rank that is a shell or a wrapper
// script without `exec`, or a role's compound command, keeps the real program as its child,
// which would outlive the job and go on holding ports and GPUs. The watchdog learns each group
// as it is created, and forgets it once it is empty (its id may then be reused by an unrelated
// process); it notices cofab-run's death as the end of its pipe, since only cofab-run holds
// the write end, and then sends SIGKILL to every group it still knows. It ignores the signals
// cofab-run forwards (SIGINT, SIGTERM, SIGHUP), so a Ctrl-C on the terminal's group leaves it
// watching; it runs in a process group of its own, so that a SIGKILL to cofab-run's whole
// group does not end it too. Internal to the launcher.
#pragma once

#include <sys/types.h>

#include <cstddef>

#include "core/status.h"

namespace cofab {

class GroupWatchdog {
 public:
  // Forks the watchdog, able to hold up to maxGroups groups at once.
  static StatusOr<GroupWatchdog> start(size_t maxGroups);

  GroupWatchdog(GroupWatchdog&& o) noexcept;
  GroupWatchdog& operator=(GroupWatchdog&&) = delete;
  ~GroupWatchdog();  // release()

  void watch(pid_t group);
  void forget(pid_t group);
  // The job ended as it should: the watchdog exits without killing anything, and is reaped.
  void release();
  // For cofab-run's reaping loop: true when `pid` is the watchdog, which ended early (killed by
  // hand); it is forgotten, and the job goes on without one.
  bool reaped(pid_t pid);

 private:
  GroupWatchdog(int fd, pid_t pid) : fd_(fd), pid_(pid) {}
  void send(int value);

  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace cofab
