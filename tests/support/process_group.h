// ProcessGroup: forked processes as ranks, for multi-process tests.
//
// start() forks `n` children; child r runs fn(r) and exits with its return value (exit-code
// protocol: 0 = success, anything else = the failure the child printed to stderr). The parent
// can stop, continue or kill a rank, and waitAll() reaps every child before a deadline, killing
// the ones still running then. Children never return into the test framework: they _exit.
// Fork before creating threads in the parent test (fork copies only the calling thread).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "core/clock.h"

namespace cofab::testing {

struct ProcessExit {
  int rank = -1;
  bool exited = false;  // normal exit (code valid)
  int code = -1;
  int signal = 0;  // terminating signal, when !exited
  bool timedOut = false;
  std::string describe() const;
};

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ~ProcessGroup();  // kills and reaps whatever is still running
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  void start(int n, const std::function<int(int rank)>& fn);
  // Starts one more child running fn(); returns its index.
  int spawn(const std::function<int()>& fn);
  pid_t pid(int rank) const { return pids_.at(static_cast<size_t>(rank)); }
  void signal(int rank, int sig);
  // Waits for one child; kills it at the deadline.
  ProcessExit wait(int rank, Deadline deadline);
  std::vector<ProcessExit> waitAll(Deadline deadline);

 private:
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
};

// Linux process state letter from /proc ('T' = stopped, '?' = unreadable).
char processState(pid_t pid);

// Sends SIGSTOP and waits until the kernel shows every thread of `pid` stopped; false at the
// deadline. SIGSTOP is asynchronous: a multi-threaded process stops only once one of its
// threads has taken the signal, and the others keep running meanwhile (on a loaded machine,
// long enough to answer a request sent after kill() returned).
bool stopAndWait(pid_t pid, Deadline deadline);

// "" if every child exited 0, else one line per failed child.
std::string failures(const std::vector<ProcessExit>& exits);

// In a child: prints "rank R: message" to stderr and returns 1 (use as `return fail(...)`).
int childFail(int rank, const std::string& message);

// A shell command's exit status (-1: it did not exit normally) and its stdout and stderr.
struct ShellRun {
  int exitCode = -1;
  std::string out;
};
ShellRun runShell(const std::string& cmd);

// Starts a daemon binary (argv[0] is its path) in a child that dies with this process, with an
// empty signal mask and, when `stderrPath` is given, its stderr in that file. Its pid.
pid_t spawnDaemon(const std::vector<std::string>& argv, const std::string& stderrPath = "");

// Reaps `pid` once it exits, waiting until `deadline`: false (nothing reaped) past it.
bool reapBefore(pid_t pid, Deadline deadline, int* status);

// Whether process `pid` has a handler for `sig` and its main thread blocks it (the SigCgt and
// SigBlk lines of /proc/<pid>/status): how a test sees that a daemon has reached
// StopSignals::install(), i.e. started up. Blocked alone is not enough: before main, a library
// constructor blocks every signal in the main thread while it starts a thread (seen in 17 of
// 30 cofab-aggd starts), and a child between fork() and exec() carries its parent's mask. A
// test that sent SIGTERM then killed the daemon with it ("killed by signal 15": the CI failure
// of DaemonStartup.SigtermWhileWaitingForTheBackupStopsBeforeServing).
bool handlesStopSignal(pid_t pid, int sig);

}  // namespace cofab::testing
