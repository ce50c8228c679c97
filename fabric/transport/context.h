// Context: one instance of a transport (tcp, loopback, later dpdk, rdma) and the I/O threads it
// owns. Create it through Registry::create() (fabric/transport/registry.h) or a backend's
// factory.h.
//
// The context owns its threads; listeners and connections it creates keep its internal state
// alive, but stop working once it is closed. Several contexts may live in one process (threads
// acting as ranks): none of them shares mutable state with another except what the kernel
// shares (ports) or, for loopback, the in-process address table. All methods are thread-safe;
// they may be called from any thread except close()/join() from one of its own I/O threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/transport/connection.h"
#include "fabric/transport/listener.h"
#include "fabric/transport/memory_region.h"

namespace cofab::transport {

struct ListenOptions {
  // Where to listen. Empty: the transport's default (tcp: the address of COFAB_SOCKET_IFNAME, or
  // 127.0.0.1, with a kernel-chosen port). tcp accepts "host:port", "[v6]:port", "host" (port 0).
  std::string address;
};

struct ConnectOptions {
  // Sent to the listener in the handshake; the accepting side reads it as peerId() ("rank 3").
  std::string localId;
};

struct ContextOptions {
  // This side's id for handshakes initiated by listeners' accepts (their peerId()).
  std::string localId;
  // Largest payload accepted from a peer; bigger announced lengths fail the connection with
  // InvalidArgument before anything is read or allocated.
  uint64_t maxPayload = wire::kDefaultMaxPayload;
};

class Context {
 public:
  virtual ~Context() = default;

  // "tcp", "loopback", ...
  virtual const std::string& name() const = 0;

  // Whether this context can carry traffic (its threads run, the device exists). A context that
  // cannot is never returned by Registry::create(): it reports Unavailable with the reason.
  virtual bool isViable() const = 0;

  virtual StatusOr<std::unique_ptr<Listener>> listen(const ListenOptions& options) = 0;

  // Connects to a listener's address(), retrying with exponential backoff while the peer is not
  // yet listening, until `deadline` (DeadlineExceeded naming the address and the last error).
  // Returns once the handshake has completed.
  virtual StatusOr<std::shared_ptr<Connection>> connect(const std::string& address,
                                                        const ConnectOptions& options,
                                                        Deadline deadline) = 0;

  // Registers [data, data + size) for zero-copy use in slices (a no-op on tcp and loopback).
  virtual StatusOr<std::unique_ptr<MemoryRegion>> registerMemory(void* data, size_t size) = 0;

  // Closes every listener and connection (pending operations fail with Cancelled) and tells the
  // I/O threads to finish. Idempotent; does not wait.
  virtual void close() = 0;
  // close() and waits until the I/O threads have exited; every callback has run when it returns.
  virtual void join() = 0;
};

}  // namespace cofab::transport
