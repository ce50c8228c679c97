// cofab-aggd's health and metrics endpoint: what it serves, and that stopping it right after
// start returns (cpp-httplib 0.11 ignores a stop() that comes before its loop runs).
#include "aggregator/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <string>

namespace cofab::aggregator {
namespace {

// One plain HTTP/1.0 GET on 127.0.0.1:port; the whole response, or "" when it failed.
std::string get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
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
