// The tcp transport: epoll loops, non-blocking sockets, writev/readv straight from and into the
// callers' slices. The only header of fabric/transport/tcp/ meant for use outside it.
//
// Parameters (environment, see `cofab-info`): COFAB_TCP_LOOPS (I/O threads per context),
// COFAB_SOCKET_IFNAME (interface whose address listeners bind by default),
// COFAB_TCP_CONNECT_TIMEOUT_MS (bound on one connect attempt), COFAB_TCP_SOCKET_BUFFER (socket
// buffer bytes; 0 keeps the kernel's autotuning), COFAB_TCP_KEEPALIVE_S (keepalive idle time),
// COFAB_TCP_SOCKETS_PER_PEER (sockets per connection, messages round-robin over them; the
// connecting side chooses, listeners accept any count). Fields set in TcpOptions win over them.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "fabric/transport/context.h"

namespace cofab::transport::tcp {

struct TcpOptions {
  int loops = 0;              // 0: COFAB_TCP_LOOPS
  std::string ifname;         // empty: COFAB_SOCKET_IFNAME
  int socketBufferBytes = -1;  // -1: COFAB_TCP_SOCKET_BUFFER
  int socketsPerPeer = 0;      // 0: COFAB_TCP_SOCKETS_PER_PEER
};

StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const TcpOptions& tcp = {});

}  // namespace cofab::transport::tcp
