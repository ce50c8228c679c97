// InProcessPipe: a connected pair of Connections inside one process, for two components that
// speak a message protocol to each other and happen to share a process — a worker and the
// aggregator shard it hosts (colocated push-pull, docs/AGGREGATOR.md) — so that they keep one
// code path for local and remote peers without paying for sockets.
//
// Contract: fabric/transport/connection.h, with these specifics:
//   - a message is copied once, from the sender's slices straight into the receiver's memory
//     (the posted slices, the routed slice, or a vector for recvOwned); no header encoding, no
//     kernel, no syscalls. The send completes after that copy, so it says the receiver has it;
//   - one thread per pipe does the copies and runs every callback of both ends (never inline);
//   - close() on one end fails its pending operations with Cancelled and the other end's with
//     RemoteError ("peer closed"), as a socket closing would;
//   - join(): after close(), waits until no callback of this end is running or will run
//     (the tcp equivalent is Context::join()); never call it from one of the pipe's callbacks.
// Headers are checked with wire::validateHeader like a network transport would (payloadLength
// is filled in by send). maxPayload bounds messages as ContextOptions::maxPayload does.
#pragma once

#include <memory>
#include <string>

#include "fabric/transport/connection.h"

namespace cofab::transport {

class PipeEnd : public Connection {
 public:
  // Waits until this end is closed and every callback of it has run (see above).
  virtual void join() = 0;
};

struct PipeEnds {
  std::shared_ptr<PipeEnd> a;  // peerId() == idB
  std::shared_ptr<PipeEnd> b;  // peerId() == idA
};

// `idA`/`idB` play the handshake ids ("worker 3", "agg 3").
PipeEnds makeInProcessPipe(const std::string& idA, const std::string& idB,
                           uint64_t maxPayload = wire::kDefaultMaxPayload);

}  // namespace cofab::transport
