// cofab-run: start N local ranks (and optional daemons) that meet through a TcpStore.
//   cofab-run -n 4 -- ./my_trainer --epochs 3
//   cofab-run -n 4 --role aggd:2:"cofab-aggd --transport tcp" -- ./my_trainer
#include <cstdio>
#include <string>
#include <vector>

#include "fabric/launcher/launcher.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto options = cofab::parseLaunchArgs(args);
  if (!options.ok()) {
    std::fprintf(stderr, "cofab-run: %s\n", options.status().message().c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(cofab::launchUsage().c_str(), stdout);
    return 0;
  }
  auto code = cofab::runLaunch(*options);
  if (!code.ok()) {
    std::fprintf(stderr, "cofab-run: %s\n", code.status().toString().c_str());
    return 1;
  }
  return *code;
}
