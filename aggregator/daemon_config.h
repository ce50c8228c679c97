// DaemonConfig: everything cofab-aggd is told, from (highest precedence first) command-line
// flags, the optional key=value config file (--config), COFAB_* parameters (environment) and the
// launcher's COFAB_ROLE_RANK / COFAB_ROLE_SIZE / COFAB_WORLD_SIZE / COFAB_STORE. Pure parsing;
// called once from main().
#pragma once

#include <string>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "core/status.h"

namespace cofab::aggregator {

struct DaemonConfig {
  ServerOptions server;
  std::string storeUrl;  // where to register; empty with --peers
  std::string storePrefix = "cofab/agg";
  std::vector<std::string> peers;    // static deployment: every daemon's address, by id
  std::string http = "127.0.0.1:0";  // metrics endpoint host:port, or "off"
  int64_t connectTimeoutMs = 60000;  // store and backup
  bool help = false;
};

// Parses argv[1..] (the config file they name is read too). InvalidArgument with the usage.
StatusOr<DaemonConfig> parseDaemonArgs(const std::vector<std::string>& args);
std::string daemonUsage();

}  // namespace cofab::aggregator
