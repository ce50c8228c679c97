// cofab-store: a standalone TcpStore server for multi-host jobs.
//   cofab-store --bind 0.0.0.0 --port 29400
// Runs until SIGINT or SIGTERM; prints its URL on stdout once listening.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/param.h"
#include "core/stop_signals.h"
#include "fabric/rendezvous/tcp_store_server.h"

int main(int argc, char** argv) {
  cofab::TcpStoreServerOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--bind" || a == "--port") && i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "--bind") {
        options.bindAddress = v;
      } else {
        auto p = cofab::parseIntIn(v, "--port", 0, 65535);
        if (!p.ok()) {
          std::fprintf(stderr, "cofab-store: --port expects 0..65535, got '%s'\n", v.c_str());
          return 2;
        }
        options.port = static_cast<uint16_t>(*p);
      }
    } else {
      std::fprintf(stderr,
                   "usage: cofab-store [--bind ADDR (default 127.0.0.1)] [--port P (default 0: "
                   "ephemeral)]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  // Before the server thread starts (it inherits the block); the wait below takes them.
  cofab::StopSignals::install();
  auto server = cofab::TcpStoreServer::start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "cofab-store: %s\n", server.status().toString().c_str());
    return 1;
  }
  std::printf("cofab-store listening on tcp://%s:%u\n", options.bindAddress.c_str(),
              (*server)->port());
  std::fflush(stdout);
  const int sig = cofab::StopSignals::wait();
  auto stats = (*server)->stats();
  std::printf("cofab-store: stopping on signal %d after %llu requests from %llu connections\n", sig,
              static_cast<unsigned long long>(stats.requests),
              static_cast<unsigned long long>(stats.acceptedConnections));
  (*server)->stop();
  return 0;
}
