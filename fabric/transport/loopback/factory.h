// The loopback transport: connections between contexts of one process, with fault injection,
// for testing the layers above without sockets. The only header of fabric/transport/loopback/
// meant for use outside it.
//
// Addresses are "loopback:<name>", in a process-wide table (the in-process analogue of the
// kernel's port table). Messages are framed exactly as on tcp (the wire header is encoded,
// checked and decoded), so corrupting a byte exercises the real decoder. Each context runs one
// worker thread that runs its connections' callbacks.
#pragma once

#include <cstdint>
#include <memory>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/transport/context.h"

namespace cofab::transport::loopback {

// Faults applied to the bytes a connection sends (header + payload, counted from the first byte
// the connection sent).
struct FaultPlan {
  Duration delay{0};            // each message reaches the peer this much later
  int64_t dropAfterBytes = -1;  // >= 0: after this many bytes the connection breaks (both sides
                                // see RemoteError; the peer receives the bytes before the cut)
  int64_t corruptByteAt = -1;   // >= 0: this byte of the stream is bit-flipped (0xFF xor)
};

struct LoopbackOptions {
  FaultPlan faults;  // for every connection this context creates or accepts
};

StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const LoopbackOptions& loopback = {});

// Replaces the fault plan of one loopback connection (for bytes it sends from now on; byte
// offsets still count from its first byte). InvalidArgument if `conn` is not a loopback one.
Status injectFaults(Connection& conn, const FaultPlan& faults);

}  // namespace cofab::transport::loopback
