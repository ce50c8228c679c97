// StripedConnection: one Connection (contract: fabric/transport/connection.h) made of N tcp
// connections to the same peer (COFAB_TCP_SOCKETS_PER_PEER), for links where one TCP stream
// cannot fill the pipe (one core's worth of kernel copies per stream, or per-flow limits).
//
// Messages go round-robin: the i-th send travels on socket i mod N and the i-th posted receive
// takes the next message of socket i mod N. Both ends count the same way, and each socket is
// FIFO, so messages are matched to receives in the order they were sent, exactly as on one
// socket; a message is never split (the collectives pipeline large tensors in many messages).
// Completions from the N sockets (possibly on different loop threads) are released in posting
// order by one sequencer per direction, one callback at a time for both directions together.
// The first failure of any socket is sticky from its place in the stream: the operations posted
// before it (on the other sockets) complete with their own outcome, so messages a closing peer
// sent are still delivered; then it closes the others and every later operation, in either
// direction, fails with it. (So a failure stays invisible while an earlier operation on a
// healthy socket waits: the caller's deadline bounds that, see docs/TRANSPORT.md.)
//
// Built by the tcp context: connect() opens the N sockets (each Hello carries a group token and
// the socket's index), the listener waits for all N of a token before accept() returns one.
// Thread-safe like every Connection.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/transport/connection.h"

namespace cofab::transport::tcp {

class StripedConnection final : public Connection {
 public:
  // `subs` are established connections to one peer, in the group's index order (at least 2).
  explicit StripedConnection(std::vector<std::shared_ptr<Connection>> subs);
  ~StripedConnection() override;

  using Connection::recv;
  using Connection::send;
  void send(const wire::Header& header, ConstSlices payload, SendCallback done) override;
  void recv(MutableSlices dest, RecvCallback done) override;
  void recvOwned(RecvOwnedCallback done) override;
  void close() override;
  Status status() const override;
  const std::string& peerId() const override { return peerId_; }
  const std::string& peerAddress() const override { return peerAddress_; }
  std::string describe() const override;

  size_t sockets() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  const std::string peerId_;
  const std::string peerAddress_;
};

}  // namespace cofab::transport::tcp
