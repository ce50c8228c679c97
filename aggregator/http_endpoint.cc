#include "aggregator/http_endpoint.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "core/clock.h"
#include "core/log.h"

namespace cofab::aggregator {

// Whether the endpoint's callbacks may still be called: stop() closes it (waiting for a
// callback in progress) before it may leave the loop's thread behind, so that no callback runs
// into what the daemon frees after stop() returns.
struct CallbackGate {
  std::shared_mutex mu;
  bool open = true;
};

struct HttpEndpoint::Impl {
  std::shared_ptr<CallbackGate> gate = std::make_shared<CallbackGate>();
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listenReturned{false};
  // Set by whichever of the loop's thread (when it ends) and an abandoning stop() comes first;
  // the second one deletes the Impl. Only an abandoned one: a joined thread never deletes.
  std::atomic<bool> handedOff{false};
  bool abandoned = false;  // written before the hand-off, read after it
  int port = 0;
};

namespace {

// No callback runs once this returns (one in progress is waited for).
void closeGate(HttpEndpoint::Impl& impl) {
  std::unique_lock<std::shared_mutex> lock(impl.gate->mu);
  impl.gate->open = false;
}

// Leaves the loop's thread running, no longer waited for: whichever of it and this ends last
// frees the Impl (the thread does when its loop returns).
void abandonLoop(std::unique_ptr<HttpEndpoint::Impl> impl) {
  closeGate(*impl);
  impl->thread.detach();
  HttpEndpoint::Impl* raw = impl.release();
  raw->abandoned = true;
  if (raw->handedOff.exchange(true)) delete raw;  // the loop ended meanwhile
}

}  // namespace

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::start(HttpEndpointOptions options) {
  auto impl = std::make_unique<Impl>();
  auto metrics = options.metrics;
  auto healthy = options.healthy;
  auto gate = impl->gate;
  impl->server.Get("/metrics", [metrics, gate](const httplib::Request&, httplib::Response& res) {
    std::shared_lock<std::shared_mutex> lock(gate->mu);
    if (!gate->open) {
      res.status = 503;
      return;
    }
    res.set_content(metrics ? metrics() : std::string(), "text/plain; version=0.0.4");
  });
  impl->server.Get("/healthz", [healthy, gate](const httplib::Request&, httplib::Response& res) {
    std::shared_lock<std::shared_mutex> lock(gate->mu);
    const bool ok = gate->open && (!healthy || healthy());
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ok\n" : "draining\n", "text/plain");
  });
  // httplib's default sets SO_REUSEPORT: a second daemon given the same --http port would
  // bind it too and the kernel would spread scrapes over both. SO_REUSEADDR alone still allows
  // a restart while old connections linger in TIME_WAIT.
  impl->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // An idle keep-alive connection (Prometheus keeps its scrape connection open) holds stop()
  // for up to this long: cpp-httplib's default of 5 s, added to the daemon's drain, outlasted
  // cofab-run's grace and got the daemon SIGKILLed before its last log line.
  impl->server.set_keep_alive_timeout(1);
  // Only GET and HEAD are served, and nothing reads a body: httplib 0.11 would read any body
  // into memory before routing, without a limit (chunked bodies pass payload_max_length), so
  // one POST streaming /dev/zero grew the daemon until the OOM killer ended it. Other methods
  // are answered 405 before anything of their body is read.
  impl->server.set_payload_max_length(4096);
  // One request per connection: httplib decides keep-alive from the request alone, so after a
  // 405 it would parse the unread body as the next request line, growing its line buffer
  // without a limit until a newline (a POST of /dev/zero), or serve a request smuggled in the
  // body. Scrapers reconnect; that costs one connect per scrape.
  impl->server.set_keep_alive_max_count(1);
  // Nor is a client invited to send a body (httplib answers 100 Continue by default).
  impl->server.set_expect_100_continue_handler([](const httplib::Request& req, httplib::Response&) {
    return req.method == "GET" || req.method == "HEAD" ? 100 : 417;
  });
  impl->server.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  // A client that stops mid-request holds a worker for this long per silent gap (5 s by
  // default), and stop() waits for every worker.
  impl->server.set_read_timeout(1);
  impl->server.set_write_timeout(1);
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
  impl->thread = std::thread([raw] {
    raw->server.listen_after_bind();
    raw->listenReturned = true;
    if (raw->handedOff.exchange(true) && raw->abandoned) delete raw;
  });
  // cpp-httplib (0.11) ignores a stop() that comes before its listen loop has marked itself
  // running, and then serves forever: a daemon stopped right after it started hung in join().
  // So the endpoint is handed out only once the loop runs (or has already ended).
  const Deadline ready = Deadline::afterMs(10000);
  while (!raw->server.is_running() && !raw->listenReturned && !ready.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!raw->server.is_running()) {
    raw->server.stop();
    if (!raw->listenReturned) {
      // Still not running after 10 s: leave the thread (and what it uses) rather than hang;
      // whichever of it and this ends last frees the Impl.
      Status late = Internal("metrics endpoint on port " + std::to_string(raw->port) +
                             ": its HTTP loop did not start within 10 s");
      abandonLoop(std::move(impl));
      return late;
    }
    raw->thread.join();
    return IoError("metrics endpoint on port " + std::to_string(raw->port) +
                   ": its HTTP loop ended at once");
  }
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

HttpEndpoint::HttpEndpoint(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), port_(impl_->port) {}
HttpEndpoint::~HttpEndpoint() { stop(); }

void HttpEndpoint::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  closeGate(*impl_);
  impl_->server.stop();
  // httplib's loop returns only once every connection's worker has: a client trickling a
  // request a byte at a time (under the read timeout each) would hold the daemon's exit for
  // good. Bounded: past kStopMs the loop's thread is left behind, with what it uses.
  const Deadline bound = Deadline::afterMs(kStopMs);
  while (!impl_->listenReturned && !bound.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (impl_->listenReturned) {
    impl_->thread.join();
    return;
  }
  COFAB_LOG(kWarn, "aggd") << "metrics endpoint on port " << impl_->port
                           << ": a client still holds a request " << kStopMs
                           << " ms after stop; leaving its thread behind";
  abandonLoop(std::move(impl_));
}

}  // namespace cofab::aggregator
