// cofab-run as a user runs it: a real binary starting real processes.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fabric/launcher/launcher.h"
#include "fabric/launcher/line_prefixer.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"

namespace cofab {
namespace {

using RunResult = testing::ShellRun;

RunResult runCofabRun(const std::string& args) {
  // Bounded: a launcher that never ends fails the test (exit 137) instead of hanging it.
  return testing::runShell("timeout -s KILL 120 " + std::string(COFAB_RUN_BINARY) + " " + args);
}

std::string writeScript(const testing::TempDir& dir, const std::string& body) {
  std::string path = dir.path() + "/job.sh";
  std::ofstream(path) << "#!/bin/sh\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

TEST(LauncherTest, EveryRankGetsItsEnvironmentAndPrefixedOutput) {
  testing::TempDir dir;
  auto script = writeScript(dir,
                            "echo \"r=$COFAB_RANK n=$COFAB_WORLD_SIZE l=$COFAB_LOCAL_RANK "
                            "s=${COFAB_STORE%%:*}\"\necho to-stderr >&2\n");
  auto r = runCofabRun("-n 3 " + script);
  EXPECT_EQ(r.exitCode, 0) << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    std::string rs = std::to_string(rank);
    EXPECT_NE(r.out.find("[rank " + rs + "] r=" + rs + " n=3 l=" + rs + " s=tcp"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("[rank " + rs + "] to-stderr"), std::string::npos) << r.out;
  }
}

TEST(LauncherTest, AFailingRankStopsTheOthersAndIsNamed) {
  testing::TempDir dir;
  auto script = writeScript(dir,
                            "if [ \"$COFAB_RANK\" = 1 ]; then sleep 0.2; exit 7; fi\n"
                            "sleep 30\necho should-not-finish\n");
  auto r = runCofabRun("-n 3 --grace-ms 2000 " + script);
  EXPECT_EQ(r.exitCode, 7) << r.out;
  EXPECT_NE(r.out.find("rank 1 (pid"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited with status 7"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("should-not-finish"), std::string::npos) << r.out;
}

TEST(LauncherTest, ARankKilledBySignalIsNamedWithTheSignal) {
  testing::TempDir dir;
  auto script = writeScript(dir, "if [ \"$COFAB_RANK\" = 0 ]; then kill -9 $$; fi\nsleep 30\n");
  auto r = runCofabRun("-n 2 --grace-ms 2000 " + script);
  EXPECT_EQ(r.exitCode, 128 + 9) << r.out;
  EXPECT_NE(r.out.find("rank 0 (pid"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("killed by signal 9"), std::string::npos) << r.out;
}

TEST(LauncherTest, RoleProcessesRunBesideWorkersAndAreStoppedAtTheEnd) {
  testing::TempDir dir;
  std::string marker = dir.path() + "/role";
  auto script = writeScript(dir, "sleep 0.2\necho worker-done\n");
  auto r = runCofabRun(
      "-n 2 --role 'aggd:2:echo role=$COFAB_ROLE.$COFAB_ROLE_RANK of "
      "$COFAB_ROLE_SIZE; exec sleep 60' " +
      script);
  EXPECT_EQ(r.exitCode, 0) << r.out;
  EXPECT_NE(r.out.find("[aggd.0] role=aggd.0 of 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[aggd.1] role=aggd.1 of 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] worker-done"), std::string::npos) << r.out;
}

// A daemon that crashes while it stops (here: SIGSEGV from its SIGTERM handler) fails the job
// and is named: any death by signal after cofab-run's SIGTERM used to count as the stop it asked
// for, so a crash or sanitizer abort in a daemon's drain went unseen and the job exited 0.
TEST(LauncherTest, ARoleThatCrashesWhileStoppingFailsTheJob) {
  // Also with a redirection: the & of 2>&1 is not a separator, the command is still exec'd (it
  // was left to a shell that died of the SIGTERM, and the crash went unseen).
  for (const std::string redirect : {"", " 2>&1", " >/dev/null 2>&1"}) {
    SCOPED_TRACE(redirect);
    testing::TempDir dir;
    const std::string role = dir.path() + "/role.sh";
    const std::string ready = dir.path() + "/ready";
    std::ofstream(role) << "#!/bin/sh\ntrap 'kill -SEGV $$' TERM\ntouch " << ready
                        << "\nsleep 60 & wait\n";
    ::chmod(role.c_str(), 0755);
    // The worker ends only once the role's trap is in place, however slow the machine.
    auto script = writeScript(dir, "i=0; while [ $i -lt 600 ] && [ ! -e " + ready +
                                       " ]; do sleep 0.1; i=$((i+1)); done\necho worker-done\n");
    // (The role's background sleep may start after the SIGTERM; the grace bounds its wait.)
    auto r = runCofabRun("-n 1 --grace-ms 1000 --role 'aggd:1:" + role + redirect + "' " + script);
    EXPECT_EQ(r.exitCode, 128 + SIGSEGV) << r.out;
    EXPECT_NE(r.out.find("[rank 0] worker-done"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("aggd.0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("signal 11"), std::string::npos) << r.out;
  }
}

// Starts 2 ranks that trap `sig` (by default: say so and exit 0; with `survive`: do nothing and
// keep waiting), sends it to cofab-run once both are ready, and returns cofab-run's wait status
// and output. cofab-run starts with `sig` at its default action (`env --default-signal`: the
// shell ignores SIGINT for a background command) unless `startIgnored`.
RunResult forwardSignal(const std::string& sig, bool survive = false, const std::string& flags = "",
                        bool startIgnored = false) {
  testing::TempDir dir;
  const std::string action = survive ? "true" : "echo got-" + sig + "; exit 0";
  // Started ignored, the signal cannot be trapped (the rank's shell inherits it ignored): the
  // ranks end on their own, 2 s after they are ready, unless something kills them.
  const std::string body = survive        ? "while :; do sleep 30 & wait; done"
                           : startIgnored ? "sleep 2"
                                          : "sleep 30 & wait";
  // Each rank says it is ready only after its trap is installed, so the signal below can never
  // arrive before the rank can report it, however slow the machine.
  auto script = writeScript(dir, "trap '" + action + "' " + sig + "\ntouch " + dir.path() +
                                     "/ready.$COFAB_RANK\n" + body + "\n");
  const std::string env =
      std::string("env --") + (startIgnored ? "ignore" : "default") + "-signal=" + sig + " ";
  std::string cmd = env + COFAB_RUN_BINARY + " -n 2 " + flags + " " + script + " > " + dir.path() +
                    "/out 2>&1 & pid=$!; i=0; while [ $i -lt 600 ] && ! { [ -e " + dir.path() +
                    "/ready.0 ] && [ -e " + dir.path() + "/ready.1 ]; }; do sleep 0.1; " +
                    "i=$((i+1)); done; kill -" + sig + " $pid; wait $pid";
  int status = std::system(("sh -c '" + cmd + "'").c_str());
  std::ifstream in(dir.path() + "/out");
  RunResult r;
  r.out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  r.exitCode = WEXITSTATUS(status);
  return r;
}

TEST(LauncherTest, SigtermIsForwardedAndReported) {
  auto r = forwardSignal("TERM");
  EXPECT_EQ(r.exitCode, 128 + SIGTERM) << r.out;
  EXPECT_NE(r.out.find("forwarding"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0] got-TERM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] got-TERM"), std::string::npos) << r.out;
}

// A hang-up (the ssh session running cofab-run went away) reaches the ranks, which are in
// their own process groups and would not see the terminal's.
TEST(LauncherTest, SighupIsForwardedAndReported) {
  auto r = forwardSignal("HUP");
  EXPECT_EQ(r.exitCode, 128 + SIGHUP) << r.out;
  EXPECT_NE(r.out.find("[rank 0] got-HUP"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] got-HUP"), std::string::npos) << r.out;
}

// A signal cofab-run was started with ignored (nohup's SIGHUP; a background command's SIGINT in a
// script) stays ignored, by cofab-run and by its ranks: the job finishes. cofab-run caught and
// forwarded it, and every rank died of it.
TEST(LauncherTest, ASignalIgnoredWhenCofabRunStartedStaysIgnored) {
  for (const char* sig : {"HUP", "INT"}) {
    auto r = forwardSignal(sig, /*survive=*/false, "", /*startIgnored=*/true);
    EXPECT_EQ(r.exitCode, 0) << sig << ": " << r.out;
    EXPECT_EQ(r.out.find("forwarding"), std::string::npos) << sig << ": " << r.out;
  }
}

// Ranks that ignore the forwarded signal get SIGKILL after the grace, and cofab-run names the
// signal the stop began with (it used to say SIGTERM whatever it had forwarded).
TEST(LauncherTest, TheKillMessageNamesTheSignalTheStopBeganWith) {
  auto r = forwardSignal("INT", /*survive=*/true, "--grace-ms 300");
  EXPECT_EQ(r.exitCode, 128 + SIGINT) << r.out;
  EXPECT_NE(r.out.find("300 ms after SIGINT; sending SIGKILL"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("after SIGTERM"), std::string::npos) << r.out;
}

// True when `pid` is gone or a zombie (killed, not yet reaped by whoever inherited it).
bool processEnded(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (text.empty()) return true;
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

// cofab-run -n 1 SCRIPT in a forked child, its output thrown away; its pid (-1 if fork failed).
pid_t startLauncher(const std::string& script) {
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execl(COFAB_RUN_BINARY, COFAB_RUN_BINARY, "-n", "1", script.c_str(), nullptr);
    ::_exit(127);
  }
  return launcher;
}

// SIGKILLs the launcher, reaps it, and waits (60 s at most) for `pid` to end; kills `pid`
// itself if it did not.
bool endsWhenTheLauncherIsKilled(pid_t launcher, pid_t pid) {
  ::kill(launcher, SIGKILL);
  int status = 0;
  if (::waitpid(launcher, &status, 0) != launcher) return false;
  bool ended = false;
  for (int i = 0; i < 600 && !(ended = processEnded(pid)); ++i) ::usleep(100 * 1000);
  if (!ended) ::kill(pid, SIGKILL);
  return ended;
}

std::string readWhenPresent(const std::string& path) {
  for (int i = 0; i < 600; ++i) {  // bounded: 60 s
    std::ifstream in(path);
    std::string v;
    if (in >> v && !v.empty()) return v;
    ::usleep(100 * 1000);
  }
  return {};
}

// cofab-run SIGKILLed (OOM killer, a scheduler's hard stop): its ranks die with it instead of
// living on with their ports and devices.
TEST(LauncherTest, RanksDieWhenTheLauncherIsKilled) {
  testing::TempDir dir;
  auto script = writeScript(dir, "echo $$ > " + dir.path() + "/rank.tmp; mv " + dir.path() +
                                     "/rank.tmp " + dir.path() + "/rank.pid\nexec sleep 600\n");
  const pid_t launcher = startLauncher(script);
  ASSERT_GE(launcher, 0);
  const std::string rankPid = readWhenPresent(dir.path() + "/rank.pid");
  ASSERT_FALSE(rankPid.empty()) << "the rank never started";
  const pid_t rank = static_cast<pid_t>(std::stol(rankPid));
  ASSERT_FALSE(processEnded(rank));
  EXPECT_TRUE(endsWhenTheLauncherIsKilled(launcher, rank))
      << "rank " << rank << " outlived its launcher";
}

// The same when the rank is a shell that keeps the real program as its child (a wrapper script
// without exec, a role's compound command): PDEATHSIG reached only the shell, and the program
// lived on after cofab-run's death. cofab-run's watchdog kills the whole group.
TEST(LauncherTest, ARanksChildrenDieWhenTheLauncherIsKilled) {
  testing::TempDir dir;
  auto script =
      writeScript(dir, "sleep 600 &\necho $! > " + dir.path() + "/child.tmp; mv " + dir.path() +
                           "/child.tmp " + dir.path() + "/child.pid\nwait\n");
  const pid_t launcher = startLauncher(script);
  ASSERT_GE(launcher, 0);
  const std::string childPid = readWhenPresent(dir.path() + "/child.pid");
  ASSERT_FALSE(childPid.empty()) << "the rank never started its child";
  const pid_t child = static_cast<pid_t>(std::stol(childPid));
  ASSERT_FALSE(processEnded(child));
  EXPECT_TRUE(endsWhenTheLauncherIsKilled(launcher, child))
      << "the rank's child " << child << " outlived the launcher";
}

// A rank that exits while a background process of its own still holds its output: cofab-run
// stops that process too and returns the rank's status instead of waiting for the pipe.
TEST(LauncherTest, LeftoverProcessesOfAnExitedRankAreStopped) {
  auto r = runCofabRun("-n 1 --grace-ms 5000 -- sh -c 'sleep 600 & exit 3'");
  EXPECT_EQ(r.exitCode, 3) << r.out;
  EXPECT_NE(r.out.find("exited with status 3"), std::string::npos) << r.out;
}

// A role's shell dies of the stop's SIGTERM, leaving a process of its group that ignores SIGTERM
// and holds none of cofab-run's pipes (its output goes to a file). It is still the job's:
// cofab-run used to exit at once and leave it running; it gets SIGKILL after the grace.
TEST(LauncherTest, AGroupMemberWithoutPipesOutlivingItsRoleIsKilled) {
  testing::TempDir dir;
  const std::string role = dir.path() + "/role.sh";
  const std::string pidFile = dir.path() + "/role.pid";
  std::ofstream(role) << "#!/bin/sh\ntrap '' TERM\necho $$ > " << pidFile << ".tmp; mv "
                      << pidFile << ".tmp " << pidFile << "\nexec sleep 600\n";
  ::chmod(role.c_str(), 0755);
  auto script = writeScript(dir, "i=0; while [ $i -lt 600 ] && [ ! -s " + pidFile +
                                     " ]; do sleep 0.1; i=$((i+1)); done\necho worker-done\n");
  // "; true" keeps the shell as the role's process (not exec'd), as any compound command does.
  auto r = runCofabRun("-n 1 --grace-ms 300 --role 'aggd:1:" + role + " >/dev/null 2>&1; true' " +
                       script);
  const std::string left = readWhenPresent(pidFile);
  ASSERT_FALSE(left.empty()) << r.out;
  const pid_t pid = static_cast<pid_t>(std::stol(left));
  const bool gone = processEnded(pid);
  if (!gone) ::kill(pid, SIGKILL);
  EXPECT_TRUE(gone) << "the role's sleep outlived cofab-run\n" << r.out;
  EXPECT_EQ(r.exitCode, 0) << r.out;
  EXPECT_NE(r.out.find("leftover processes"), std::string::npos) << r.out;
}

// One that escaped the rank's process group (setsid) is beyond cofab-run's signals: its output
// is given up after the grace periods, named, and cofab-run still ends.
TEST(LauncherTest, OutputHeldOutsideTheGroupIsGivenUpAfterTheGrace) {
  testing::TempDir dir;
  // The rank exits only once the escaped process has its own session (it writes its pid from
  // there), so cofab-run's signals to the rank's group cannot reach it.
  const std::string pidFile = dir.path() + "/escaped.pid";
  auto script = writeScript(dir, "setsid sh -c 'echo $$ > " + pidFile + ".tmp; mv " + pidFile +
                                     ".tmp " + pidFile + "; exec sleep 600' &\nwhile [ ! -s " +
                                     pidFile + " ]; do sleep 0.01; done\nexit 3\n");
  auto r = runCofabRun("-n 1 --grace-ms 200 " + script);
  const std::string escaped = readWhenPresent(pidFile);
  if (!escaped.empty()) ::kill(static_cast<pid_t>(std::stol(escaped)), SIGKILL);
  EXPECT_EQ(r.exitCode, 3) << r.out;
  EXPECT_NE(r.out.find("no longer reading it"), std::string::npos) << r.out;
}

// Under srun, mpirun or torchrun, cofab-run's own place in that launcher must not reach its
// ranks, whose bootstrap would otherwise see two disagreeing rank numbers and refuse to start.
TEST(LauncherTest, OtherLaunchersRankVariablesAreNotPassedOn) {
  const std::vector<std::pair<std::string, std::string>> outer = {
      {"SLURM_PROCID", "0"},        {"SLURM_NTASKS", "1"},
      {"SLURM_JOB_ID", "42"},       {"RANK", "5"},
      {"WORLD_SIZE", "9"},          {"OMPI_COMM_WORLD_RANK", "0"},
      {"OMPI_COMM_WORLD_SIZE", "1"}};
  for (const auto& [k, v] : outer) ::setenv(k.c_str(), v.c_str(), 1);
  testing::TempDir dir;
  auto script = writeScript(dir,
                            "echo \"slurm=${SLURM_PROCID-none}/${SLURM_NTASKS-none} "
                            "torch=${RANK-none}/${WORLD_SIZE-none} "
                            "ompi=${OMPI_COMM_WORLD_RANK-none} job=${SLURM_JOB_ID-none} "
                            "cofab=$COFAB_RANK/$COFAB_WORLD_SIZE\"\n");
  auto r = runCofabRun("-n 2 " + script);
  for (const auto& [k, v] : outer) ::unsetenv(k.c_str());
  EXPECT_EQ(r.exitCode, 0) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) +
                         "] slurm=none/none torch=none/none ompi=none job=42 cofab=" +
                         std::to_string(rank) + "/2"),
              std::string::npos)
        << r.out;
  }
}

// A child that never writes a newline: its output comes out in prefixed pieces of at most
// kMaxLine bytes instead of piling up in memory until it exits.
// cofab-run's output pipe closing under it (`cofab-run ... | tee log`, tee gone first) does not
// kill it with SIGPIPE: the rank finishes and cofab-run exits 0. It used to die at its next
// write (exit 141), and the ranks with it (PDEATHSIG), before they were done.
TEST(LauncherTest, AClosedOutputPipeDoesNotStopTheJob) {
  testing::TempDir dir;
  const std::string done = dir.path() + "/done";
  const std::string job =
      writeScript(dir, "echo a\nsleep 0.3\necho b\nsleep 0.3\ntouch " + done + "\n");
  // `true` exits at once, closing the pipe; pipefail reports cofab-run's own status.
  const RunResult r = testing::runShell("bash -c 'set -o pipefail; timeout -s KILL 60 " +
                                        std::string(COFAB_RUN_BINARY) + " -n 1 -- " + job +
                                        " | true; echo status=$?'");
  EXPECT_NE(r.out.find("status=0"), std::string::npos) << r.out;
  EXPECT_EQ(::access(done.c_str(), F_OK), 0) << "the rank did not finish: " << r.out;
}

// A rank started from a terminal reads /dev/null, not the terminal: it is not in the
// terminal's foreground process group, so a read there stopped it (SIGTTIN) for good. `script`
// gives cofab-run a terminal on stdin; a pipe or file would be passed on unchanged.
TEST(LauncherTest, RanksDoNotReadTheTerminal) {
  if (testing::runShell("command -v script").exitCode != 0) {
    GTEST_SKIP() << "util-linux script(1) is not installed: no terminal to test with";
  }
  const RunResult r =
      testing::runShell("timeout -s KILL 60 script -qec '" + std::string(COFAB_RUN_BINARY) +
                        " -n 1 -- readlink /proc/self/fd/0' /dev/null");
  EXPECT_NE(r.out.find("/dev/null"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("/dev/pts"), std::string::npos) << r.out;
  // Not a terminal: passed on (here the pipe runShell reads from is stdout; stdin is a pipe).
  const RunResult piped = testing::runShell("echo hello | timeout -s KILL 60 " +
                                            std::string(COFAB_RUN_BINARY) + " -n 1 -- cat");
  EXPECT_NE(piped.out.find("hello"), std::string::npos) << piped.out;
}

// An output inherited non-blocking (some CI runners) that is full is waited on, not taken for
// closed: every line arrives whole. EAGAIN used to end the line there, its rest dropped and the
// next line glued onto it.
TEST(LinePrefixerTest, AFullNonBlockingOutputLosesNothing) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK), 0);
  ::fcntl(fds[1], F_SETPIPE_SZ, 4096);  // smallest pipe: full after a few lines
  std::string expected;
  std::thread writer([&, out = fds[1]] {
    LinePrefixer p("[r] ", out, true);
    for (int i = 0; i < 2000; ++i) {
      const std::string line = "line " + std::to_string(i) + " " + std::string(100, 'x') + "\n";
      p.feed(line.data(), line.size());
    }
    p.finish();
    ::close(out);
  });
  // Read only once the writer has surely met a full pipe, then everything to the end.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  writer.join();
  ::close(fds[0]);
  for (int i = 0; i < 2000; ++i) {
    expected += "[r] line " + std::to_string(i) + " " + std::string(100, 'x') + "\n";
  }
  EXPECT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected) << "lines lost or cut";
}

TEST(LinePrefixerTest, ALineWithoutNewlineIsCutIntoBoundedPieces) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/out";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  std::string input;
  for (size_t i = 0; input.size() < 3 * LinePrefixer::kMaxLine + 1000; ++i) {
    input += static_cast<char>('a' + i % 26);
  }
  LinePrefixer p("[r] ", fd, true);
  for (size_t off = 0; off < input.size(); off += 4096) {
    p.feed(input.data() + off, std::min<size_t>(4096, input.size() - off));
  }
  // Three whole pieces are out before the stream ends; the rest waits for more or the end.
  std::ifstream before(path);
  std::string early((std::istreambuf_iterator<char>(before)), std::istreambuf_iterator<char>());
  EXPECT_EQ(early.size(), 3 * (4 + LinePrefixer::kMaxLine + 1));
  p.finish();
  ::close(fd);
  std::ifstream in(path);
  std::string line, joined;
  int lines = 0;
  while (std::getline(in, line)) {
    ASSERT_EQ(line.rfind("[r] ", 0), 0u) << "piece " << lines << " lacks the prefix";
    EXPECT_LE(line.size() - 4, LinePrefixer::kMaxLine);
    joined += line.substr(4);
    ++lines;
  }
  EXPECT_EQ(lines, 4);
  EXPECT_EQ(joined, input);
}

// The cap holds for a long line that ends in a later read (it used to come out whole, up to
// twice the cap), and a newline right after a cut piece adds no empty line; a real empty line
// is kept.
TEST(LinePrefixerTest, ALongLineEndedInALaterReadIsCutToo) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/out";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  const std::string a(60000, 'a'), b(10000, 'b'), exact(LinePrefixer::kMaxLine, 'c');
  LinePrefixer p("[r] ", fd, true);
  p.feed(a.data(), a.size());
  const std::string rest = b + "\n\n" + exact + "\nend\n";
  p.feed(rest.data(), rest.size());
  p.finish();
  ::close(fd);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    ASSERT_EQ(line.rfind("[r] ", 0), 0u) << "line " << lines.size() << " lacks the prefix";
    EXPECT_LE(line.size() - 4, LinePrefixer::kMaxLine) << "line " << lines.size();
    lines.push_back(line.substr(4));
  }
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0] + lines[1], a + b);
  EXPECT_EQ(lines[2], "");
  EXPECT_EQ(lines[3], exact);
  EXPECT_EQ(lines[4], "end");
}

// --help is a request, not a mistake: the usage on stdout and exit 0 (it used to print a bare
// "cofab-run:" line and the usage on stderr and exit 2, like a bad option).
TEST(LauncherTest, HelpPrintsTheUsageAndExitsZero) {
  for (const char* flag : {"--help", "-h"}) {
    // stdout only: the subshell's stderr goes nowhere before runShell joins the two.
    auto r = testing::runShell("(timeout -s KILL 60 " + std::string(COFAB_RUN_BINARY) + " " + flag +
                               " 2>/dev/null)");
    EXPECT_EQ(r.exitCode, 0) << flag << "\n" << r.out;
    EXPECT_NE(r.out.find("usage: cofab-run"), std::string::npos) << flag << "\n" << r.out;
  }
  auto parsed = parseLaunchArgs({"-n", "2", "--help"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->help);
}

TEST(LauncherArgsTest, BadArgumentsAreExplained) {
  EXPECT_FALSE(parseLaunchArgs({}).ok());
  auto noN = parseLaunchArgs({"prog"});
  ASSERT_FALSE(noN.ok());
  EXPECT_NE(noN.status().message().find("-n N is required"), std::string::npos);
  EXPECT_NE(parseLaunchArgs({"-n", "0", "prog"}).status().message().find("integer >= 1"),
            std::string::npos);
  for (const char* lenient : {" 2", "+2", "2 "}) {  // strtol took the first two
    EXPECT_FALSE(parseLaunchArgs({"-n", lenient, "prog"}).ok()) << "'" << lenient << "'";
  }
  EXPECT_NE(parseLaunchArgs({"-n", "2", "--role", "bad", "prog"})
                .status()
                .message()
                .find("NAME:COUNT:COMMAND"),
            std::string::npos);
  EXPECT_NE(parseLaunchArgs({"-n", "2", "--bogus", "prog"}).status().message().find("'--bogus'"),
            std::string::npos);
  auto ok =
      parseLaunchArgs({"-n", "4", "--role", "aggd:2:cofab-aggd --x", "--", "prog", "-n", "9"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->nprocs, 4);
  ASSERT_EQ(ok->roles.size(), 1u);
  EXPECT_EQ(ok->roles[0].command, "cofab-aggd --x");
  EXPECT_EQ(ok->argv, (std::vector<std::string>{"prog", "-n", "9"}));
}

}  // namespace
}  // namespace cofab
