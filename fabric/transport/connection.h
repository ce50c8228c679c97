// Connection: one ordered, reliable, bidirectional message stream to one peer.
//
// A message is a wire::Header (fabric/wire/header.h) plus a payload given as a scatter list.
// Every operation is asynchronous and completes exactly once through its callback, which carries
// a Status:
//   - callbacks never run inline from the call that started the operation (not even on error);
//   - they run on one of the transport context's I/O threads (never two at once for one
//     connection), so a callback must not block; it may start further operations or close();
//   - send callbacks fire in the order the sends were posted, receive callbacks in the order the
//     receives were posted; messages are matched to posted receives in arrival order;
//   - the first error is sticky: it fails every pending operation and every later one with the
//     same Status (RemoteError naming the peer when it closed or died, DataLoss for a corrupt
//     stream, InvalidArgument for a payload-size mismatch, ...), already inside the callback of
//     the operation that failed first (status() says it there; a send posted there fails);
//   - close() fails pending operations with Cancelled; operations posted after close() fail with
//     FailedPrecondition.
// The caller owns payload memory and lends it until the operation's callback has run. Sending
// fills header.payloadLength (and the payload CRC32C when header.flags has kFlagPayloadCrc).
// Connections are shared_ptr-owned; dropping the last reference closes the connection. All
// methods are thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "fabric/transport/slice.h"
#include "fabric/wire/header.h"

namespace cofab::transport {

// Completion of a send: OK once the payload has been handed to the transport (the memory may be
// reused); it says nothing about the peer having received it.
using SendCallback = std::function<void(const Status&)>;
// Completion of a receive into posted memory. `header` is the received header (valid also when
// the status is a size mismatch, so the caller can name what arrived); default on other errors.
using RecvCallback = std::function<void(const Status&, const wire::Header& header)>;
// Completion of a receive into a buffer the transport allocated (exactly payloadLength bytes).
using RecvOwnedCallback =
    std::function<void(const Status&, const wire::Header& header, std::vector<uint8_t>&& payload)>;
// Where a message's payload goes, chosen once its header has arrived: memory of exactly
// header.payloadLength bytes, or a null slice to have the transport allocate it (as recvOwned).
// Runs on the I/O thread that completes the receive, before the payload is read; it must not
// block and must not call into the connection.
using RecvRoute = std::function<MutableSlice(const wire::Header& header)>;

class Connection {
 public:
  virtual ~Connection() = default;

  // Sends `header` followed by the concatenation of `payload`. The slices' memory must stay valid
  // and unchanged until `done` runs. A null slice with a non-zero size, or a header that
  // wire::validateHeader() rejects, completes with InvalidArgument.
  virtual void send(const wire::Header& header, ConstSlices payload, SendCallback done) = 0;

  // Receives the next message, whose payload must be exactly totalSize(dest) bytes, directly
  // into `dest` (no intermediate copy on tcp). A message of any other length fails this receive
  // and the connection with InvalidArgument naming both sizes and the header.
  virtual void recv(MutableSlices dest, RecvCallback done) = 0;

  // Receives the next message whatever its size into a vector the transport allocates: for
  // control messages and messages whose size is not known in advance.
  virtual void recvOwned(RecvOwnedCallback done) = 0;

  // Receives the next message whatever its size into memory `route` picks from its header: the
  // payload lands there directly (no intermediate buffer on tcp) and `done` gets an empty vector,
  // or, when route returns a null slice, into a transport-allocated vector as with recvOwned.
  // A non-null slice whose size differs from the payload's fails the receive with InvalidArgument
  // (on tcp also the connection, as with recv). `route` is called at most once, and only for a
  // header that arrived; `done` always runs exactly once. Transports without a native path receive
  // into a vector and copy it to the routed memory (the default below).
  virtual void recvRouted(RecvRoute route, RecvOwnedCallback done) {
    recvOwned([route = std::move(route), done = std::move(done)](
                  const Status& s, const wire::Header& h, std::vector<uint8_t>&& payload) {
      if (!s.ok()) return done(s, h, std::move(payload));
      const MutableSlice dest = route(h);
      if (dest.data == nullptr) return done(s, h, std::move(payload));
      if (dest.size != payload.size()) {
        return done(InvalidArgument("recvRouted: message payload is " +
                                    std::to_string(payload.size()) + " bytes but the route gave " +
                                    std::to_string(dest.size) + " (" + h.describe() + ")"),
                    h, {});
      }
      if (!payload.empty()) std::memcpy(dest.data, payload.data(), payload.size());
      done(s, h, {});
    });
  }

  // Cancels pending operations (Cancelled) and releases the connection's resources. Idempotent;
  // returns without waiting for the cancellation callbacks (they may run before it returns, on
  // an I/O thread). The peer sees the connection closed.
  virtual void close() = 0;

  // OK while healthy, else the sticky error (Cancelled from the moment close() returns).
  virtual Status status() const = 0;

  // The id string the peer gave in the handshake (e.g. "rank 3").
  virtual const std::string& peerId() const = 0;
  // The peer's address, e.g. "127.0.0.1:41234".
  virtual const std::string& peerAddress() const = 0;
  // "tcp connection to 'rank 3' (127.0.0.1:41234)" — for error messages.
  virtual std::string describe() const = 0;

  // Conveniences for a single contiguous buffer.
  void send(const wire::Header& header, const void* data, size_t size, SendCallback done) {
    const ConstSlice s{data, size, nullptr};
    send(header, ConstSlices(&s, 1), std::move(done));
  }
  void recv(void* data, size_t size, RecvCallback done) {
    const MutableSlice s{data, size, nullptr};
    recv(MutableSlices(&s, 1), std::move(done));
  }
};

}  // namespace cofab::transport
