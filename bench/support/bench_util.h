// Small helpers shared by the bench programs: command-line look-ups and sizes, a wall clock in ms,
// seeded random data, and spawning a helper process (cofab-aggd, ...) that dies with the bench
// (PR_SET_PDEATHSIG). Header-only; bench code only.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace cofab::bench {

// The value after `name` on the command line, or `def`.
inline std::string argValue(int argc, char** argv, const std::string& name,
                            const std::string& def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return def;
}

inline bool hasFlag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == name) return true;
  }
  return false;
}

// "64M" -> bytes: a number with an optional K, M or G (binary) suffix.
inline size_t parseSize(const std::string& text) {
  char* end = nullptr;
  size_t v = std::strtoull(text.c_str(), &end, 10);
  if (end && (*end == 'K' || *end == 'k')) v <<= 10;
  if (end && (*end == 'M' || *end == 'm')) v <<= 20;
  if (end && (*end == 'G' || *end == 'g')) v <<= 30;
  return v;
}

inline double nowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// n floats uniform in [-1, 1), the same for the same seed.
inline std::vector<float> randomFloats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// A fresh directory /tmp/<prefix>-<6 random characters> (mkdtemp) for a bench's stores and
// sockets; "" with the reason on stderr when it cannot be made. The caller removes it.
inline std::string makeTempDir(const std::string& prefix) {
  std::string path = "/tmp/" + prefix + "-XXXXXX";  // mkdtemp replaces the X's
  if (::mkdtemp(path.data()) == nullptr) {
    std::perror(("mkdtemp " + path).c_str());
    return "";
  }
  return path;
}

// fork + execv(path, args) with SIGKILL on the bench's death; the child's pid (or -1).
inline pid_t spawnChild(const std::string& path, const std::vector<std::string>& args) {
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace cofab::bench
