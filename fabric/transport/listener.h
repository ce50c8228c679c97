// Listener: accepts connections from peers at one address.
//
// Created by Context::listen(). The transport completes each incoming connection's handshake on
// its I/O threads as soon as it arrives (so connecting peers never wait for accept() to be
// called) and queues it; accept() hands them out in arrival order. Owned by the caller through
// unique_ptr; destroying it closes it (queued, not yet accepted connections are closed). All
// methods are thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/transport/connection.h"

namespace cofab::transport {

using AcceptCallback = std::function<void(const Status&, std::shared_ptr<Connection>)>;

class Listener {
 public:
  virtual ~Listener() = default;

  // The address peers pass to Context::connect(), e.g. "127.0.0.1:39417" (port 0 in the listen
  // address is replaced by the port the kernel chose).
  virtual const std::string& address() const = 0;

  // Waits for the next connection until `deadline`: DeadlineExceeded if none arrived, Cancelled
  // once the listener or its context is closed.
  virtual StatusOr<std::shared_ptr<Connection>> accept(Deadline deadline) = 0;

  // Asynchronous accept: `done` runs once, on an I/O thread (never inline), with the next
  // connection or with Cancelled when the listener closes first.
  virtual void acceptAsync(AcceptCallback done) = 0;

  // Stops accepting; pending accepts fail with Cancelled. Idempotent.
  virtual void close() = 0;
};

}  // namespace cofab::transport
