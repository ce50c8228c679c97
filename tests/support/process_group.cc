#include "tests/support/process_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/check.h"

namespace cofab::testing {

char processState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  // The command name in parentheses may hold spaces or ')': the state follows the last ')'.
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}

namespace {
// Every thread of `pid` stopped: /proc/<pid>/stat shows only the main thread, and another one
// may still finish the system call it was in (sending a grant) after the main one stopped.
bool allThreadsStopped(pid_t pid) {
  std::error_code ec;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  bool any = false;
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream f(t.path() / "stat");
    std::string line;
    std::getline(f, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'T') {
      return false;
    }
    any = true;
  }
  return !ec && any;
}
}  // namespace

bool stopAndWait(pid_t pid, Deadline deadline) {
  ::kill(pid, SIGSTOP);
  while (!deadline.expired()) {
    if (allThreadsStopped(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

std::string ProcessExit::describe() const {
  std::string who = "rank " + std::to_string(rank);
  if (timedOut) return who + " did not finish before the deadline (killed)";
  if (exited) return who + " exited with code " + std::to_string(code);
  return who + " died of signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

ProcessGroup::~ProcessGroup() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    ::kill(pids_[i], SIGKILL);
    ::waitpid(pids_[i], nullptr, 0);
  }
}

int ProcessGroup::spawn(const std::function<int()>& fn) {
  std::fflush(nullptr);  // do not duplicate buffered output into the child
  pid_t pid = ::fork();
  COFAB_CHECK(pid >= 0) << "fork: " << strerror(errno);
  if (pid == 0) {
    int code = fn();
    std::fflush(nullptr);
    ::_exit(code);
  }
  pids_.push_back(pid);
  reaped_.push_back(false);
  return static_cast<int>(pids_.size()) - 1;
}

void ProcessGroup::start(int n, const std::function<int(int rank)>& fn) {
  for (int r = 0; r < n; ++r) spawn([fn, r] { return fn(r); });
}

void ProcessGroup::signal(int rank, int sig) { ::kill(pid(rank), sig); }

ProcessExit ProcessGroup::wait(int rank, Deadline deadline) {
  ProcessExit e;
  e.rank = rank;
  size_t i = static_cast<size_t>(rank);
  COFAB_CHECK(!reaped_[i]) << "rank " << rank << " already reaped";
  int status = 0;
  while (true) {
    pid_t got = ::waitpid(pids_[i], &status, WNOHANG);
    if (got == pids_[i]) break;
    if (deadline.expired()) {
      ::kill(pids_[i], SIGKILL);
      ::waitpid(pids_[i], &status, 0);
      e.timedOut = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  reaped_[i] = true;
  e.exited = WIFEXITED(status);
  e.code = e.exited ? WEXITSTATUS(status) : -1;
  e.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return e;
}

std::vector<ProcessExit> ProcessGroup::waitAll(Deadline deadline) {
  std::vector<ProcessExit> out;
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (!reaped_[i]) out.push_back(wait(static_cast<int>(i), deadline));
  }
  return out;
}

std::string failures(const std::vector<ProcessExit>& exits) {
  std::string out;
  for (const auto& e : exits) {
    if (e.exited && e.code == 0 && !e.timedOut) continue;
    out += e.describe() + "\n";
  }
  return out;
}

int childFail(int rank, const std::string& message) {
  std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str());
  return 1;
}

bool handlesStopSignal(pid_t pid, int sig) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  bool blocked = false;
  bool caught = false;
  while (std::getline(in, line)) {
    const bool isBlk = line.rfind("SigBlk:", 0) == 0;
    const bool isCgt = line.rfind("SigCgt:", 0) == 0;
    if (!isBlk && !isCgt) continue;
    const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    const bool set = ((mask >> (sig - 1)) & 1u) != 0;
    (isBlk ? blocked : caught) = set;
  }
  return blocked && caught;
}

ShellRun runShell(const std::string& cmd) {
  ShellRun r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  if (WIFEXITED(status)) r.exitCode = WEXITSTATUS(status);
  return r;
}

pid_t spawnDaemon(const std::vector<std::string>& argv, const std::string& stderrPath) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  COFAB_CHECK(pid >= 0) << "fork failed";
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (!stderrPath.empty()) {
      const int fd = ::open(stderrPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, 2);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // what it blocks later is its own doing
    ::execv(cargs[0], cargs.data());
    ::_exit(127);
  }
  return pid;
}

bool reapBefore(pid_t pid, Deadline deadline, int* status) {
  while (::waitpid(pid, status, WNOHANG) != pid) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace cofab::testing
