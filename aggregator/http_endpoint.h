// HttpEndpoint: the daemon's health and Prometheus metrics endpoint (GET /healthz, GET /metrics),
// served by Debian's cpp-httplib on its own thread. The handlers call the functions given at
// start() from that thread; they must be thread-safe. The only translation unit that includes
// httplib.h is http_endpoint.cc (header-only library, compiled once).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"

namespace cofab::aggregator {

struct HttpEndpointOptions {
  std::string host = "127.0.0.1";
  int port = 0;                          // 0: a kernel-chosen port (see port())
  std::function<std::string()> metrics;  // Prometheus text
  std::function<bool()> healthy;         // 200 "ok" when true, 503 "draining" when false
};

class HttpEndpoint {
 public:
  static StatusOr<std::unique_ptr<HttpEndpoint>> start(HttpEndpointOptions options);
  ~HttpEndpoint();  // stop()
  int port() const { return port_; }
  // Closes the port and waits for the connections being served, at most kStopMs: a client
  // holding its request open past that is left to a thread that is no longer waited for. Either
  // way, once stop() returns the callbacks (metrics, healthy) are never called again.
  void stop();
  static constexpr int64_t kStopMs = 2000;

  struct Impl;

 private:
  explicit HttpEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace cofab::aggregator
