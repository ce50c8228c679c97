// cofab-aggd's health and metrics endpoint: what it serves, and that stopping it right after
// start returns (cpp-httplib 0.11 ignores a stop() that comes before its loop runs).
#include "aggregator/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

namespace cofab::aggregator {
namespace {

// A socket connected to 127.0.0.1:port (receives time out after 10 s), or -1.
int connectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` on a new connection; the whole response, or "" when it failed.
std::string httpExchange(int port, const std::string& request) {
  const int fd = connectTo(port);
  if (fd < 0) return {};
  std::string out;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Starts a GET on `fd` and then sends its header line a byte every 100 ms, `ticks` times or
// until `done`, without ending the request.
void trickleRequest(int fd, int ticks, const std::atomic<bool>& done) {
  const std::string header = "GET /metrics HTTP/1.1\r\nX-Slow: ";
  ::send(fd, header.data(), header.size(), MSG_NOSIGNAL);
  for (int i = 0; i < ticks && !done; ++i) {
    ::send(fd, "a", 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// One plain HTTP/1.0 GET on 127.0.0.1:port.
std::string get(int port, const std::string& path) {
  return httpExchange(port, "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n");
}

TEST(HttpEndpointTest, ServesMetricsAndHealth) {
  std::atomic<bool> healthy{true};
  auto ep = HttpEndpoint::start({.host = "127.0.0.1",
                                 .port = 0,
                                 .metrics = [] { return std::string("cofab_up 1\n"); },
                                 .healthy = [&] { return healthy.load(); }});
  ASSERT_TRUE(ep.ok()) << ep.status();
  const int port = (*ep)->port();
  const std::string metrics = get(port, "/metrics");
  EXPECT_NE(metrics.find(" 200 "), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("cofab_up 1"), std::string::npos) << metrics;
  EXPECT_NE(get(port, "/healthz").find(" 200 "), std::string::npos);
  healthy = false;
  const std::string draining = get(port, "/healthz");
  EXPECT_NE(draining.find(" 503 "), std::string::npos) << draining;
  EXPECT_NE(draining.find("draining"), std::string::npos) << draining;
  (*ep)->stop();
  EXPECT_EQ(get(port, "/healthz"), "") << "still serving after stop()";
}

// A daemon that fails right after starting its endpoint stops it at once. Each round used to
// risk a stop() before httplib's loop ran, after which join() waited forever.
TEST(HttpEndpointTest, StoppingRightAfterStartReturns) {
  for (int i = 0; i < 200; ++i) {
    auto ep = HttpEndpoint::start({});
    ASSERT_TRUE(ep.ok()) << ep.status();
    (*ep)->stop();
  }
}

// Only GET and HEAD are served; any other method is refused before its body is read. httplib
// read bodies into memory without a limit (a POST streaming /dev/zero grew the daemon until the
// OOM killer came); here a POST announcing 100 GB that never sends it got 400 only after the
// read timed out, its body read as far as it came.
TEST(HttpEndpointTest, AMethodOtherThanGetIsRefusedBeforeItsBodyIsRead) {
  auto ep = HttpEndpoint::start({.metrics = [] { return std::string("cofab_up 1\n"); }});
  ASSERT_TRUE(ep.ok()) << ep.status();
  const std::string refused = httpExchange(
      (*ep)->port(), "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n");
  EXPECT_NE(refused.find(" 405 "), std::string::npos) << refused;
  EXPECT_NE(refused.find("Allow: GET, HEAD"), std::string::npos) << refused;
  EXPECT_NE(get((*ep)->port(), "/metrics").find("cofab_up 1"), std::string::npos);
}

// One request per connection: after the 405, the unread body is not parsed as more requests (a
// GET smuggled in a POST's body was served; a body of /dev/zero grew httplib's line buffer
// without a limit).
TEST(HttpEndpointTest, ARefusedRequestsBodyIsNeverReadAsAnotherRequest) {
  auto ep = HttpEndpoint::start({.metrics = [] { return std::string("cofab_up 1\n"); }});
  ASSERT_TRUE(ep.ok()) << ep.status();
  const std::string smuggled = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string out =
      httpExchange((*ep)->port(), "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                                      std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
  EXPECT_NE(out.find(" 405 "), std::string::npos) << out;
  EXPECT_EQ(out.find("cofab_up"), std::string::npos) << "the body was served as a request:\n"
                                                     << out;
  EXPECT_EQ(out.find("HTTP/1.1", 1), std::string::npos) << "more than one response:\n" << out;
}

// Once stop() has returned, the endpoint's callbacks are not called again, also when it had to
// leave a client's connection behind (they may use what the daemon frees right after).
TEST(HttpEndpointTest, NoCallbackRunsAfterStopReturns) {
  std::atomic<bool> stopped{false};
  std::atomic<int> lateCalls{0};
  auto ep = HttpEndpoint::start({.metrics = [&] {
    if (stopped) lateCalls++;
    return std::string("cofab_up 1\n");
  }});
  ASSERT_TRUE(ep.ok()) << ep.status();
  const int fd = connectTo((*ep)->port());
  ASSERT_GE(fd, 0);
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    trickleRequest(fd, 60, done);  // past stop()'s bound, then the request ends
    ::send(fd, "\r\n\r\n", 4, MSG_NOSIGNAL);
    char buf[4096];
    while (::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*ep)->stop();
  stopped = true;
  trickle.join();
  ::close(fd);
  EXPECT_EQ(lateCalls.load(), 0) << "metrics() ran after stop() returned";
}

// A client that holds a request open, a byte at a time, does not hold stop() (and so the
// daemon's exit after SIGTERM) for good: httplib waits for every connection's worker.
TEST(HttpEndpointTest, AClientTricklingARequestDoesNotHoldStop) {
  auto ep = HttpEndpoint::start({});
  ASSERT_TRUE(ep.ok()) << ep.status();
  const int fd = connectTo((*ep)->port());
  ASSERT_GE(fd, 0);
  std::atomic<bool> done{false};
  std::thread trickle([&] { trickleRequest(fd, 600, done); });  // 60 s at most
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its request is being read
  auto stopped = std::async(std::launch::async, [&] { (*ep)->stop(); });
  const bool returned = stopped.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  done = true;
  trickle.join();
  stopped.wait();
  ::close(fd);
  EXPECT_TRUE(returned) << "stop() waited for the trickling client";
}

TEST(HttpEndpointTest, APortInUseIsAClearError) {
  auto first = HttpEndpoint::start({});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = HttpEndpoint::start({.port = (*first)->port()});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(std::to_string((*first)->port())), std::string::npos)
      << second.status();
}

}  // namespace
}  // namespace cofab::aggregator
