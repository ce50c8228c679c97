#include "fabric/launcher/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>

#include "core/clock.h"
#include "core/param.h"
#include "fabric/launcher/group_watchdog.h"
#include "fabric/launcher/line_prefixer.h"
#include "fabric/rendezvous/bootstrap.h"
#include "fabric/rendezvous/tcp_store_server.h"

namespace cofab {
namespace {

// Signals reach the poll loop through a self-pipe: the handler only writes one byte.
int gSignalPipe[2] = {-1, -1};
// SIGPIPE's disposition before cofab-run ignored it, for the ranks (run()).
sighandler_t gInheritedPipe = SIG_DFL;
// The forwarded signals, and whether cofab-run was started with each ignored (nohup's SIGHUP, a
// background job's SIGINT in a script): those stay ignored, in cofab-run and in its ranks, as a
// shell's other children would have them. Catching them forwarded a hang-up nohup meant to keep
// away, and a Ctrl-C meant for the script's foreground command, to every rank.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};
bool gInheritedIgnored[std::size(kForwardedSignals)] = {};

void onSignal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(gSignalPipe[1], &b, 1);
  errno = saved;
}

struct Child {
  std::string label;  // "rank 3" or "aggd.0"
  bool worker = true;
  pid_t pid = -1;
  int outFd = -1, errFd = -1;
  std::unique_ptr<LinePrefixer> out, err;
  bool exited = false;
  bool groupLeftBehind = false;  // reaped with processes of its group still alive
  // Still not reaped one grace period after SIGKILL (stuck in the kernel: a hung device or
  // mount): reported and no longer waited for, so that cofab-run's own wait stays bounded.
  bool abandoned = false;
  int status = 0;
  // The signals cofab-run sent this process's group (bit per signal): dying by one of them is
  // the expected end of a stop; dying by any other (a crash while draining) is reported.
  uint64_t signalsSent = 0;
  bool forgotten = false;  // the watchdog was told its group is gone
};

std::string describeExit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int exitCodeFor(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status) == 0 ? 1 : WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void say(const std::string& msg) {
  std::string line = "cofab-run: " + msg + "\n";
  (void)!::write(2, line.data(), line.size());
}

// True if `command` has more than one simple command or a subshell in it. The & of the
// redirections >& and <& (`2>&1`) is not a separator.
bool hasShellSeparator(const std::string& command) {
  for (size_t i = 0; i < command.size(); ++i) {
    const char ch = command[i];
    if (ch == '&' && i > 0 && (command[i - 1] == '>' || command[i - 1] == '<')) continue;
    if (std::strchr(";&|\n()`{}", ch) != nullptr) return true;
  }
  return false;
}

// The shell command a role runs. Debian's /bin/sh (dash) does not exec the last command of
// `sh -c`: the role's program would be a child of a shell that dies at once of the SIGTERM that
// stops the job, and the program's own end (a crash while it drains) would never be seen. A
// single simple command is therefore exec'd in place of the shell; a command with separators,
// subshells or a leading variable assignment is left to the shell as written.
std::string roleShellCommand(const std::string& command) {
  const size_t first = command.find_first_not_of(" \t");
  if (first == std::string::npos) return command;
  const std::string word = command.substr(first, command.find_first_of(" \t", first) - first);
  static const char* const kKeepAsWritten[] = {"exec", "!", "if", "case", "for", "while", "until"};
  const bool reserved = std::any_of(std::begin(kKeepAsWritten), std::end(kKeepAsWritten),
                                    [&](const char* w) { return word == w; });
  if (hasShellSeparator(command) || reserved || word.find('=') != std::string::npos) {
    return command;
  }
  return "exec " + command.substr(first);
}

// Signals cofab-run forwards to every process (and then reports as its own exit status).
bool isForwarded(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP; }

StatusOr<pid_t> spawn(Child& c, const std::vector<std::string>& argv,
                      const std::vector<std::pair<std::string, std::string>>& env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return errnoStatus(StatusCode::kIoError, "pipe2", errno);
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return errnoStatus(StatusCode::kIoError, "pipe2", errno);
  }
  // Build everything the child needs before fork: only async-signal-safe calls after it.
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::string> envStrings;
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  static const std::vector<std::string> dropped = otherLaunchersRankVariables();
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    bool replaced = false;
    for (const auto& [k, _] : env) replaced |= entry.rfind(k + "=", 0) == 0;
    for (const auto& k : dropped) replaced |= entry.rfind(k + "=", 0) == 0;
    if (!replaced) envStrings.push_back(entry);
  }
  std::vector<char*> cenv;
  for (auto& s : envStrings) cenv.push_back(s.data());
  cenv.push_back(nullptr);
  std::string execError = "cofab-run: cannot execute '" + argv[0] + "': ";

  const pid_t parent = ::getpid();
  // A rank is not in the terminal's foreground group (setpgid below): reading a terminal would
  // stop it with SIGTTIN for good (pdb, input(), a login prompt), and nothing would say why. It
  // reads /dev/null instead; a pipe or file on stdin is passed on as it is.
  const bool stdinIsTerminal = ::isatty(0) == 1;
  pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return errnoStatus(StatusCode::kIoError, "fork", e);
  }
  if (pid == 0) {
    // Dies with cofab-run, however cofab-run ends (SIGKILL, OOM killer): ranks must not live on
    // holding ports and devices. The check covers a parent that died before the prctl.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);  // its own group, so signals reach its whole process tree
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (stdinIsTerminal) {
      const int devNull = ::open("/dev/null", O_RDONLY);
      if (devNull >= 0) ::dup2(devNull, 0);
      if (devNull > 0) ::close(devNull);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
      signal(kForwardedSignals[i], gInheritedIgnored[i] ? SIG_IGN : SIG_DFL);
    }
    signal(SIGCHLD, SIG_DFL);
    // Ignored by cofab-run, and an ignored signal survives exec: the ranks get what cofab-run
    // itself inherited (the default, or SIG_IGN under systemd's IgnoreSIGPIPE=yes).
    signal(SIGPIPE, gInheritedPipe);
    ::execvpe(cargv[0], cargv.data(), cenv.data());
    int e = errno;
    (void)!::write(2, execError.data(), execError.size());
    const char* text = strerror(e);
    (void)!::write(2, text, strlen(text));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, to avoid the race with the child's call
  ::close(out[1]);
  ::close(err[1]);
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);  // the poll loop reads every stream each round
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  c.pid = pid;
  c.outFd = out[0];
  c.errFd = err[0];
  return pid;
}

}  // namespace

std::string launchUsage() {
  return "usage: cofab-run -n N [--store URL] [--store-bind ADDR] [--role NAME:COUNT:COMMAND]...\n"
         "                 [--grace-ms MS] [--no-prefix] [--] PROGRAM [ARGS...]\n"
         "  Starts N local ranks of PROGRAM with COFAB_RANK, COFAB_WORLD_SIZE, COFAB_LOCAL_RANK\n"
         "  and COFAB_STORE set. Without --store it hosts a TcpStore on --store-bind\n"
         "  (default 127.0.0.1). --role starts COUNT extra processes running COMMAND through\n"
         "  /bin/sh -c (a single command exec'd), with COFAB_ROLE, COFAB_ROLE_RANK,\n"
         "  COFAB_ROLE_SIZE and COFAB_STORE set. When a process fails, or dies of another\n"
         "  signal than the one that stopped it, the others get SIGTERM, then SIGKILL after\n"
         "  --grace-ms.\n"
         "  SIGINT, SIGTERM and SIGHUP are forwarded to every process (one ignored when\n"
         "  cofab-run started, as under nohup, stays ignored); if cofab-run itself is\n"
         "  killed, its processes are killed with it (their children and the rest of their\n"
         "  process groups too).\n";
}

StatusOr<LaunchOptions> parseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions o;
  auto bad = [](const std::string& why) { return InvalidArgument(why + "\n" + launchUsage()); };
  auto intArg = [&](const std::string& flag, const std::string& v, int min) -> StatusOr<int> {
    auto x = parseIntIn(v, flag, min, 1'000'000);  // whole decimal: no ' 2' or '+2'
    if (!x.ok()) {
      return bad(flag + " expects an integer >= " + std::to_string(min) + ", got '" + v + "'");
    }
    return static_cast<int>(*x);
  };
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> StatusOr<std::string> {
      if (i + 1 >= args.size()) return bad(a + " needs a value");
      return args[++i];
    };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "-n" || a == "--nprocs") {
      COFAB_ASSIGN_OR_RETURN(std::string v, value());
      COFAB_ASSIGN_OR_RETURN(o.nprocs, intArg(a, v, 1));
    } else if (a == "--store") {
      COFAB_ASSIGN_OR_RETURN(o.storeUrl, value());
    } else if (a == "--store-bind") {
      COFAB_ASSIGN_OR_RETURN(o.storeBind, value());
    } else if (a == "--grace-ms") {
      COFAB_ASSIGN_OR_RETURN(std::string v, value());
      COFAB_ASSIGN_OR_RETURN(o.killGraceMs, intArg(a, v, 0));
    } else if (a == "--no-prefix") {
      o.prefixOutput = false;
    } else if (a == "--role") {
      COFAB_ASSIGN_OR_RETURN(std::string v, value());
      size_t c1 = v.find(':');
      size_t c2 = c1 == std::string::npos ? c1 : v.find(':', c1 + 1);
      if (c2 == std::string::npos || c1 == 0 || c2 + 1 >= v.size()) {
        return bad("--role expects NAME:COUNT:COMMAND, got '" + v + "'");
      }
      RoleSpec r;
      r.name = v.substr(0, c1);
      COFAB_ASSIGN_OR_RETURN(r.count, intArg("--role count", v.substr(c1 + 1, c2 - c1 - 1), 1));
      r.command = v.substr(c2 + 1);
      o.roles.push_back(std::move(r));
    } else if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    } else if (!a.empty() && a[0] == '-') {
      return bad("unknown option '" + a + "'");
    } else {
      break;
    }
  }
  for (; i < args.size(); ++i) o.argv.push_back(args[i]);
  if (o.nprocs < 1) return bad("-n N is required");
  if (o.argv.empty()) return bad("no program to run");
  return o;
}

StatusOr<int> runLaunch(const LaunchOptions& options) {
  if (options.nprocs < 1 || options.argv.empty()) {
    return InvalidArgument("runLaunch: need nprocs >= 1 and a program");
  }
  std::unique_ptr<TcpStoreServer> server;
  std::string storeUrl = options.storeUrl;
  if (storeUrl.empty()) {
    TcpStoreServerOptions so;
    so.bindAddress = options.storeBind;
    COFAB_ASSIGN_OR_RETURN(server, TcpStoreServer::start(so));
    storeUrl = server->url();
  }

  // Kills the groups it starts below if cofab-run dies without stopping them (group_watchdog.h).
  size_t groups = static_cast<size_t>(options.nprocs);
  for (const auto& role : options.roles) groups += static_cast<size_t>(role.count);
  COFAB_ASSIGN_OR_RETURN(GroupWatchdog watchdog, GroupWatchdog::start(groups));

  if (::pipe2(gSignalPipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return errnoStatus(StatusCode::kIoError, "pipe2", errno);
  }
  // Processes a child leaves behind when it dies (a role shell's program) become this process's
  // children instead of init's, so the loop below reaps them when they end and their group
  // empties (an unreaped zombie would keep it looking alive).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  struct sigaction oldForwarded[std::size(kForwardedSignals)] = {}, oldChld{}, oldPipe{};
  // Output closed under it (`cofab-run ... | tee log`, tee killed by the same Ctrl-C) must not
  // kill cofab-run with SIGPIPE: the ranks would die by PDEATHSIG in the middle of their
  // shutdown. Writes to a closed pipe fail with EPIPE instead, and the output is dropped.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &oldPipe);
  gInheritedPipe = oldPipe.sa_handler;
  for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
    sigaction(kForwardedSignals[i], nullptr, &oldForwarded[i]);
    gInheritedIgnored[i] = oldForwarded[i].sa_handler == SIG_IGN;
    if (!gInheritedIgnored[i]) sigaction(kForwardedSignals[i], &sa, nullptr);
  }
  sigaction(SIGCHLD, &sa, &oldChld);

  std::vector<Child> children;
  children.reserve(static_cast<size_t>(options.nprocs) + 16);
  Status spawnError;
  // Roles first: daemons should be up before workers look for them in the store.
  for (const auto& role : options.roles) {
    for (int r = 0; r < role.count && spawnError.ok(); ++r) {
      Child& c = children.emplace_back();
      c.worker = false;
      c.label = role.name + "." + std::to_string(r);
      auto pid = spawn(c, {"/bin/sh", "-c", roleShellCommand(role.command)},
                       {{"COFAB_ROLE", role.name},
                        {"COFAB_ROLE_RANK", std::to_string(r)},
                        {"COFAB_ROLE_SIZE", std::to_string(role.count)},
                        {"COFAB_WORLD_SIZE", std::to_string(options.nprocs)},
                        {"COFAB_STORE", storeUrl}});
      if (!pid.ok()) spawnError = pid.status();
      if (pid.ok()) watchdog.watch(*pid);
    }
  }
  for (int r = 0; r < options.nprocs && spawnError.ok(); ++r) {
    Child& c = children.emplace_back();
    c.label = "rank " + std::to_string(r);
    auto pid = spawn(c, options.argv,
                     {{"COFAB_RANK", std::to_string(r)},
                      {"COFAB_WORLD_SIZE", std::to_string(options.nprocs)},
                      {"COFAB_LOCAL_RANK", std::to_string(r)},
                      {"COFAB_STORE", storeUrl}});
    if (!pid.ok()) spawnError = pid.status();
    if (pid.ok()) watchdog.watch(*pid);
  }
  for (auto& c : children) {
    if (c.pid < 0) continue;
    c.out = std::make_unique<LinePrefixer>("[" + c.label + "] ", 1, options.prefixOutput);
    c.err = std::make_unique<LinePrefixer>("[" + c.label + "] ", 2, options.prefixOutput);
  }

  int exitCode = 0;
  bool stopping = false;
  Deadline killAt = Deadline::never();
  // A child that exited may have left processes of its group behind (`sh -c 'server & exit
  // 3'`, or a role's shell killed by the stop while its program ignores SIGTERM), holding its
  // output pipes or not: they are the job's, so cofab-run stops them too and waits for them (up
  // to SIGKILL and one more grace period). Only while the group has members: an empty group's
  // id may be reused by an unrelated process, so groupLeftBehind, once false, stays false.
  auto lingers = [](const Child& c) {
    return c.pid > 0 && !c.abandoned &&
           (!c.exited || c.outFd >= 0 || c.errFd >= 0 || c.groupLeftBehind);
  };
  auto signalable = [](const Child& c) {
    return c.pid > 0 && !c.abandoned && (!c.exited || c.groupLeftBehind);
  };
  int stopSignal = SIGTERM;  // the signal the stop began with, named when SIGKILL follows it
  auto stopAll = [&](int sig) {
    for (auto& c : children) {
      if (signalable(c)) {
        if (!c.exited) c.signalsSent |= uint64_t{1} << sig;
        ::kill(-c.pid, sig);
      }
    }
    if (!stopping) {
      killAt = Deadline::afterMs(options.killGraceMs);
      stopSignal = sig;
    }
    stopping = true;
  };
  if (!spawnError.ok()) {
    say("could not start every process: " + spawnError.message());
    exitCode = 1;
    stopAll(SIGTERM);
  }

  auto workersLeft = [&] {
    int n = 0;
    for (auto& c : children) n += c.worker && c.pid > 0 && !c.exited;
    return n;
  };
  auto anyAlive = [&] {
    for (auto& c : children) {
      if (lingers(c)) return true;
    }
    return false;
  };
  // After SIGKILL, output still open belongs to processes that left the child's group (setsid):
  // cofab-run stops reading it after one more grace period instead of waiting forever.
  Deadline abandonAt = Deadline::never();

  while (anyAlive()) {
    std::vector<pollfd> fds;
    fds.push_back({gSignalPipe[0], POLLIN, 0});
    for (auto& c : children) {
      if (c.outFd >= 0) fds.push_back({c.outFd, POLLIN, 0});
      if (c.errFd >= 0) fds.push_back({c.errFd, POLLIN, 0});
    }
    int timeout = !stopping              ? 1000
                  : !killAt.isNever()    ? std::max(1, killAt.remainingMsForPoll())
                  : !abandonAt.isNever() ? std::max(1, abandonAt.remainingMsForPoll())
                                         : 1000;
    int rc = ::poll(fds.data(), fds.size(), timeout);
    if (rc < 0 && errno != EINTR) {
      // cofab-run can no longer watch the job: it must not look like a success, nor leave
      // the processes running (their grandchildren would outlive the PDEATHSIG of its
      // children).
      say(std::string("poll failed: ") + strerror(errno) + "; killing every process");
      if (exitCode == 0) exitCode = 1;
      for (auto& c : children) {
        if (signalable(c)) ::kill(-c.pid, SIGKILL);
      }
      break;
    }
    // Output first, so the lines before a failure are printed before the failure report.
    char buf[65536];
    for (auto& c : children) {
      for (int* fd : {&c.outFd, &c.errFd}) {
        if (*fd < 0) continue;
        ssize_t n = ::read(*fd, buf, sizeof(buf));
        if (n > 0) {
          (fd == &c.outFd ? c.out : c.err)->feed(buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          (fd == &c.outFd ? c.out : c.err)->finish();
          ::close(*fd);
          *fd = -1;
        }
      }
    }
    unsigned char sig;
    while (::read(gSignalPipe[0], &sig, 1) == 1) {
      if (isForwarded(sig)) {
        say(std::string("received ") + strsignal(sig) + ", forwarding to every process");
        if (exitCode == 0) exitCode = 128 + sig;
        stopAll(sig);
      }
    }
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      if (watchdog.reaped(pid)) {
        say("the watchdog (pid " + std::to_string(pid) + ") " + describeExit(status) +
            "; if cofab-run is killed now, the children of its processes may outlive it");
        continue;
      }
      for (auto& c : children) {
        if (c.pid != pid) continue;
        c.exited = true;
        c.status = status;
        c.groupLeftBehind = ::kill(-c.pid, 0) == 0;
        bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        bool expectedStop = WIFSIGNALED(status) && WTERMSIG(status) < 64 &&
                            (c.signalsSent & (uint64_t{1} << WTERMSIG(status))) != 0;
        if (!clean && !expectedStop && exitCode == 0) {
          say(c.label + " (pid " + std::to_string(pid) + ") " + describeExit(status) +
              "; stopping the other processes");
          exitCode = exitCodeFor(status);
          stopAll(SIGTERM);
        } else if (!clean && !expectedStop) {
          say(c.label + " (pid " + std::to_string(pid) + ") " + describeExit(status));
        }
      }
    }
    // After reaping: a leftover that just died is cofab-run's own zombie (it is their
    // subreaper) until waitpid took it, and would keep its group looking alive.
    bool groupsLeft = false;
    for (auto& c : children) {
      if (c.exited && c.groupLeftBehind) c.groupLeftBehind = ::kill(-c.pid, 0) == 0;
      groupsLeft = groupsLeft || (c.exited && c.groupLeftBehind);
      // An empty group's id may be reused by an unrelated process: the watchdog drops it.
      if (c.exited && !c.groupLeftBehind && !c.forgotten) {
        watchdog.forget(c.pid);
        c.forgotten = true;
      }
    }
    // A group left behind after the SIGKILL round (its leader reaped late): it gets one grace
    // more, like the others, so that no wait is unbounded.
    if (stopping && groupsLeft && killAt.isNever() && abandonAt.isNever()) {
      abandonAt = Deadline::afterMs(options.killGraceMs);
    }
    if (!stopping && workersLeft() == 0) stopAll(SIGTERM);  // done: stop the daemons
    if (stopping && killAt.expired()) {
      for (auto& c : children) {
        if (!signalable(c)) continue;
        say(c.label + (c.exited ? "'s leftover processes" : "") + " still running " +
            std::to_string(options.killGraceMs) + " ms after SIG" + sigabbrev_np(stopSignal) +
            "; sending SIGKILL");
        if (!c.exited) c.signalsSent |= uint64_t{1} << SIGKILL;
        ::kill(-c.pid, SIGKILL);
      }
      killAt = Deadline::never();
      abandonAt = Deadline::afterMs(options.killGraceMs);
    }
    if (abandonAt.expired()) {
      for (auto& c : children) {
        if (!c.exited || (c.outFd < 0 && c.errFd < 0)) continue;
        say(c.label +
            "'s output is still held open by a process outside its group; "
            "no longer reading it");
        for (int* fd : {&c.outFd, &c.errFd}) {
          if (*fd < 0) continue;
          (fd == &c.outFd ? c.out : c.err)->finish();
          ::close(*fd);
          *fd = -1;
        }
      }
      for (auto& c : children) {
        if (!c.exited || !c.groupLeftBehind) continue;
        say(c.label + "'s leftover processes did not end after SIGKILL; leaving them");
        c.groupLeftBehind = false;
      }
      for (auto& c : children) {
        if (c.pid <= 0 || c.exited || c.abandoned) continue;
        say(c.label + " (pid " + std::to_string(c.pid) +
            ") did not exit after SIGKILL (stuck in the kernel?); no longer waiting for it");
        c.abandoned = true;
        for (int* fd : {&c.outFd, &c.errFd}) {
          if (*fd < 0) continue;
          (fd == &c.outFd ? c.out : c.err)->finish();
          ::close(*fd);
          *fd = -1;
        }
      }
      abandonAt = Deadline::never();
    }
  }

  watchdog.release();
  for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
    sigaction(kForwardedSignals[i], &oldForwarded[i], nullptr);
  }
  sigaction(SIGCHLD, &oldChld, nullptr);
  sigaction(SIGPIPE, &oldPipe, nullptr);
  ::close(gSignalPipe[0]);
  ::close(gSignalPipe[1]);
  gSignalPipe[0] = gSignalPipe[1] = -1;
  return exitCode;
}

}  // namespace cofab
