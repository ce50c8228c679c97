#include "aggregator/http_endpoint.h"

#include <httplib.h>

#include <thread>

namespace cofab::aggregator {

struct HttpEndpoint::Impl {
  httplib::Server server;
  std::thread thread;
  int port = 0;
};

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::start(HttpEndpointOptions options) {
  auto impl = std::make_unique<Impl>();
  auto metrics = options.metrics;
  auto healthy = options.healthy;
  impl->server.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics ? metrics() : std::string(), "text/plain; version=0.0.4");
  });
  impl->server.Get("/healthz", [healthy](const httplib::Request&, httplib::Response& res) {
    const bool ok = !healthy || healthy();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ok\n" : "draining\n", "text/plain");
  });
  if (options.port == 0) {
    impl->port = impl->server.bind_to_any_port(options.host);
    if (impl->port <= 0) {
      return IoError("metrics endpoint: cannot bind " + options.host + ":0");
    }
  } else {
    if (!impl->server.bind_to_port(options.host, options.port)) {
      return IoError("metrics endpoint: cannot bind " + options.host + ":" +
                     std::to_string(options.port) + " (in use? pick another --http port)");
    }
    impl->port = options.port;
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

HttpEndpoint::HttpEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpEndpoint::~HttpEndpoint() { stop(); }
int HttpEndpoint::port() const { return impl_->port; }

void HttpEndpoint::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace cofab::aggregator
