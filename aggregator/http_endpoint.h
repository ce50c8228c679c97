// HttpEndpoint: the daemon's health and Prometheus metrics endpoint (GET /healthz, GET /metrics),
// served by Debian's cpp-httplib on its own thread. The handlers call the functions given at
// start() from that thread; they must be thread-safe. The only translation unit that includes
// httplib.h is http_endpoint.cc (header-only library, compiled once).
#pragma once

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
  int port() const;
  void stop();

  struct Impl;

 private:
  explicit HttpEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cofab::aggregator
