// TcpStoreServer: serves the Store protocol (tcp_store_protocol.h) on a TCP port, embedded in a
// rank or a launcher, or alone as `cofab-store`.
//
// One thread runs an epoll loop over all client connections; requests that wait (get, wait)
// are parked until their keys appear or their deadline passes, so a slow waiter never blocks
// others. A connection that sends a bad magic, an absurd length or a malformed body is closed
// and counted; buffered bytes per connection never exceed one maximal frame. Methods are
// thread-safe; destruction stops the loop and closes every connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.h"

namespace cofab {

struct TcpStoreServerOptions {
  std::string bindAddress = "127.0.0.1";  // "0.0.0.0" or "::" to serve other hosts
  uint16_t port = 0;                      // 0: pick an ephemeral port
  int maxConnections = 4096;              // further connections are accepted then closed
};

class TcpStoreServer {
 public:
  struct Stats {
    uint64_t acceptedConnections = 0;
    uint64_t requests = 0;
    uint64_t protocolErrors = 0;    // connections closed for malformed input
    uint64_t openConnections = 0;
    uint64_t bufferedBytes = 0;     // bytes held in connection buffers right now
    uint64_t keys = 0;
    // accept() failures for lack of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM):
    // each pauses accepting for 100 ms instead of retrying at once.
    uint64_t acceptFailures = 0;
  };

  static StatusOr<std::unique_ptr<TcpStoreServer>> start(const TcpStoreServerOptions& options);
  ~TcpStoreServer();

  uint16_t port() const { return port_; }
  // "tcp://<bind address>:<port>" (with 0.0.0.0 replaced by 127.0.0.1 for local clients).
  std::string url() const;
  Stats stats() const;
  // Stops the loop and closes the listener and every connection (the port is free again when
  // it returns); idempotent and safe to call from several threads.
  void stop();

 private:
  class Loop;
  TcpStoreServer() = default;

  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::mutex stopMu_;
  std::string host_;
  uint16_t port_ = 0;
};

}  // namespace cofab
