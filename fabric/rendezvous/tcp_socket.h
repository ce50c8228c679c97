// Small blocking-with-deadline socket helpers for the store client and server: address
// parsing, resolution, connect with retry and backoff, and full sends/receives bounded by a
// Deadline. Not used on the data path (fabric/transport has its own event loop).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/status.h"

namespace cofab {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string toString() const;
};

// "host:port", "1.2.3.4:5", "[::1]:5". InvalidArgument with the accepted form otherwise.
StatusOr<HostPort> parseHostPort(std::string_view text);

// Connects a TCP socket (TCP_NODELAY, close-on-exec), retrying refused or unreachable
// attempts, and a host name that does not resolve yet (EAI_NONAME, EAI_AGAIN, EAI_FAIL), with
// exponential backoff until the deadline: DeadlineExceeded then names the last error. Each
// round tries every address, each for at most 2 s, so that one address that drops SYNs cannot
// use up the deadline; the name is resolved again after a round where it did not resolve or
// an attempt ran out its slice (the host may have moved), not after quick refusals. Returns
// the fd.
StatusOr<int> connectTcp(const HostPort& addr, Deadline deadline);

// Binds and listens on addr (port 0: ephemeral). Returns the fd; *boundPort gets the port.
StatusOr<int> listenTcp(const HostPort& addr, int backlog, uint16_t* boundPort);

// Sends/receives exactly len bytes on a (possibly non-blocking) socket before the deadline.
// A closed peer is RemoteError naming `peer`; a timeout is DeadlineExceeded.
Status sendAll(int fd, const void* data, size_t len, Deadline deadline, std::string_view peer);
Status recvAll(int fd, void* data, size_t len, Deadline deadline, std::string_view peer);

}  // namespace cofab
