// The local launcher behind `cofab-run`: starts N worker processes (and optional processes of
// other roles, such as aggregator daemons) with the COFAB_* environment, hosts a TcpStore for
// them unless told to use another, prefixes every output line with its origin, forwards
// SIGINT/SIGTERM, and when a process fails stops the others and reports which one failed.
//
// Runs on the calling thread until every process has exited. Installs SIGINT, SIGTERM and
// SIGCHLD handlers for that duration; not for use inside a multi-threaded training process.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace cofab {

// Extra processes of another role: `count` copies of `command` (run with /bin/sh -c; a single
// simple command is exec'd, so that its own exit status is the one cofab-run sees), each with
// COFAB_ROLE=<name>, COFAB_ROLE_RANK=<i>, COFAB_ROLE_SIZE=<count> and COFAB_STORE set.
struct RoleSpec {
  std::string name;
  int count = 1;
  std::string command;
};

struct LaunchOptions {
  int nprocs = 0;
  std::vector<std::string> argv;  // the worker program and its arguments
  std::string storeUrl;           // empty: host a TcpStore on storeBind
  std::string storeBind = "127.0.0.1";
  std::vector<RoleSpec> roles;
  int killGraceMs = 5000;  // SIGTERM, then SIGKILL after this long
  bool prefixOutput = true;
  bool help = false;  // -h/--help: print launchUsage() and exit 0; nothing else is checked
};

// Parses `cofab-run` arguments (see usage()). InvalidArgument with the usage on bad input.
StatusOr<LaunchOptions> parseLaunchArgs(const std::vector<std::string>& args);
std::string launchUsage();

// Runs the job; returns the exit code cofab-run should exit with: 0 when every worker exited
// 0, else the first failure's exit status (128+signal for a signal) after naming it on stderr.
StatusOr<int> runLaunch(const LaunchOptions& options);

}  // namespace cofab
