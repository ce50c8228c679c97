// Peer: the daemon's view of one accepted connection (a worker, or a primary daemon forwarding
// to this one as its backup) plus helpers to answer it.
//
// Shared between the connection's receive loop (transport I/O thread) and the engine threads
// that answer it (shared_ptr). Sends are thread-safe (Connection contract); payload memory is
// kept alive by the send callback.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aggregator/metrics.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/transport/connection.h"

namespace cofab::aggregator {

struct Peer {
  std::shared_ptr<transport::Connection> conn;
  int workerRank = -1;    // "worker N" in the handshake, N < workers; else -1
  int aggregatorId = -1;  // "agg N": a primary that replicates to this daemon
  std::atomic<bool> goodbye{false};
  std::atomic<bool> active{false};  // has had a push accepted (it is that rank's live link)
  // Credits (--credit-bytes): payload bytes received on this connection that the engines have not
  // consumed yet. Grows on the I/O thread, shrinks on engine threads.
  std::atomic<uint64_t> creditUsed{0};
  std::atomic<bool> creditWarned{false};
  // The push being received into a pool buffer (AggregatorServer::routePush); I/O thread only.
  std::shared_ptr<std::vector<uint8_t>> routed;

  // Messages sent to any peer whose send has not completed yet (handed to the transport),
  // daemon-wide: shutdown() lets them reach the sockets before closing the connections, which
  // would cancel them. Null: not counted.
  std::shared_ptr<std::atomic<int64_t>> unsent;

  std::string describe() const { return conn ? conn->describe() : "(no connection)"; }

  // Every answer to the peer goes through here: `keep` holds `data` until the send completes.
  void send(const wire::Header& h, const void* data, size_t size,
            std::shared_ptr<const void> keep) const;

  void sendControl(ps::ControlOp op, const wire::Header& about) const;
  // kReject with the reason byte and text; counts it.
  void reject(Metrics& metrics, ps::RejectReason reason, const wire::Header& about,
              std::string_view text) const;
  void sendText(ps::ControlOp op, const wire::Header& about, std::string_view text) const;
  void sendResult(Metrics& metrics, const wire::Header& about,
                  const std::shared_ptr<const std::vector<uint8_t>>& result) const;
};

}  // namespace cofab::aggregator
