#include "aggregator/aggregator_server.h"

#include <algorithm>
#include <thread>

#include "aggregator/model_store.h"
#include "core/log.h"
#include "core/param.h"
#include "fabric/ps/placement.h"
#include "fabric/transport/registry.h"

namespace cofab::aggregator {

using ps::RejectReason;

COFAB_PARAM_INT(kMaxPulledOnly, "COFAB_AGG_MAX_PULLED_ONLY", 65536, 1, int64_t{1} << 24,
                "chunks per engine that pulls may wait on before anyone pushed them (more are "
                "rejected pull_backlog): bounds what pulls for wrong keys cost the daemon");
COFAB_PARAM_INT(kPoolBytes, "COFAB_AGG_POOL_BYTES", int64_t{256} << 20, 0, int64_t{1} << 40,
                "idle receive buffers a daemon keeps for reuse by later pushes (payload_pool.h)");

AggregatorServer::AggregatorServer(const ServerOptions& options)
    : options_(options),
      metrics_(options.numWorkers, options.engineThreads),
      links_(static_cast<size_t>(std::max(0, options.numWorkers))) {
  metrics_.creditWindow = options.creditBytes;
}

StatusOr<std::unique_ptr<AggregatorServer>> AggregatorServer::create(const ServerOptions& options) {
  if (options.numWorkers <= 0 || options.numWorkers > 65536) {
    return InvalidArgument("aggregator: --workers must be in [1, 65536], got " +
                           std::to_string(options.numWorkers));
  }
  if (options.numServers <= 0 || options.id < 0 || options.id >= options.numServers) {
    return InvalidArgument("aggregator: id " + std::to_string(options.id) + " outside " +
                           std::to_string(options.numServers) + " daemons");
  }
  // Gradient coding: the group rule must fit the workers before any engine is built.
  COFAB_RETURN_IF_ERROR(
      GradientGroups::create(options.numWorkers, options.engine.gradientStragglers).status());
  if (options.engineThreads <= 0 || options.engineThreads > 256) {
    return InvalidArgument("aggregator: engine threads must be in [1, 256]");
  }
  if (options.replication && options.numServers < 2) {
    return InvalidArgument("aggregator: replication needs at least 2 daemons");
  }
  std::unique_ptr<AggregatorServer> s(new AggregatorServer(options));
  transport::ContextOptions co;
  co.localId = ps::aggregatorPeerId(options.id);
  // Oversized chunks up to twice the limit are read and rejected with a reason; beyond that the
  // transport refuses the frame before allocating and drops that one connection.
  co.maxPayload = std::max<uint64_t>(2 * options.maxChunkBytes, 1 << 20);
  COFAB_ASSIGN_OR_RETURN(s->ctx_, transport::Registry::create(options.transport, co));
  transport::ListenOptions lo;
  lo.address = options.listenAddress;
  COFAB_ASSIGN_OR_RETURN(s->listener_, s->ctx_->listen(lo));
  s->address_ = s->listener_->address();
  COFAB_ASSIGN_OR_RETURN(int64_t poolBytes, kPoolBytes.get());
  s->pool_ = PayloadPool::create(static_cast<size_t>(poolBytes));
  EngineOptions eo = options.engine;
  eo.numWorkers = options.numWorkers;
  eo.maxChunkBytes = options.maxChunkBytes;
  COFAB_ASSIGN_OR_RETURN(int64_t pulledOnly, kMaxPulledOnly.get());
  eo.maxPulledOnly = static_cast<size_t>(pulledOnly);
  AggregatorServer* self = s.get();
  for (int i = 0; i < options.engineThreads; ++i) {
    s->engines_.push_back(std::make_unique<Engine>(
        i, eo, s->metrics_,
        [self](const wire::Header& h, const Payload& p) { return self->forward(h, p); },
        [self](const std::string& why) { return self->onBackupSilent(why); }));
  }
  s->acceptNext();
  return s;
}

AggregatorServer::~AggregatorServer() { shutdown("the aggregator is being destroyed"); }

size_t AggregatorServer::engineFor(uint64_t key, uint32_t chunk) const {
  return static_cast<size_t>(ps::mix64(key * 31 + chunk) % engines_.size());
}

void AggregatorServer::acceptNext() {
  listener_->acceptAsync([this](const Status& st, std::shared_ptr<transport::Connection> conn) {
    if (!st.ok()) {
      if (st.code() != StatusCode::kCancelled) {
        COFAB_LOG(kWarn, "aggd") << "accept failed: " << st;
        if (!draining_) acceptNext();
      }
      return;
    }
    onAccepted(std::move(conn));
    acceptNext();
  });
}

StatusOr<std::shared_ptr<transport::PipeEnd>> AggregatorServer::connectInProcess(int workerRank) {
  if (workerRank < 0 || workerRank >= options_.numWorkers) {
    return InvalidArgument("aggregator: in-process worker rank " + std::to_string(workerRank) +
                           " outside " + std::to_string(options_.numWorkers) + " workers");
  }
  if (draining_) return FailedPrecondition("aggregator: shutting down");
  transport::PipeEnds ends =
      transport::makeInProcessPipe(ps::workerPeerId(workerRank), ps::aggregatorPeerId(options_.id),
                                   std::max<uint64_t>(2 * options_.maxChunkBytes, 1 << 20));
  // Under the lock shutdown() takes the ends with, the check, the push and the start of the
  // end's receives: with draining_ alone an end could be added after shutdown() had taken them
  // (never closed or joined), and with the start outside, shutdown() could close and join it
  // in between, after which its receives failed on the pipe's thread with `this` gone. (Pipe
  // callbacks never run inline, and onAccepted takes only locks shutdown() does not hold here.)
  std::lock_guard<std::mutex> lock(inProcessMu_);
  if (inProcessClosed_) return FailedPrecondition("aggregator: shutting down");
  inProcess_.push_back(ends.b);
  onAccepted(ends.b);
  return ends.a;
}

void AggregatorServer::onAccepted(std::shared_ptr<transport::Connection> conn) {
  metrics_.connectionsAccepted.fetch_add(1, std::memory_order_relaxed);
  auto peer = std::make_shared<Peer>();
  peer->conn = std::move(conn);
  peer->unsent = unsent_;
  const int w = ps::parseWorkerPeerId(peer->conn->peerId());
  if (w >= 0 && w < options_.numWorkers) {
    peer->workerRank = w;
    std::lock_guard<std::mutex> lock(linksMu_);
    WorkerLinks& links = links_[static_cast<size_t>(w)];
    ++links.open;
    // A worker that connects (again) is part of the job: rounds wait for it for the round
    // timeout, not the dead-worker deadline of its lost connection. Posted under linksMu_ like
    // every Gone and Back, so the engines get them in the order the links changed. No longer
    // marked gone either: a Goodbye on this connection must post its Gone again (it posted
    // nothing, and the rounds waited the round timeout naming it as connected).
    links.lost = false;
    workerBack(w);
  }
  const int a = ps::parseAggregatorPeerId(peer->conn->peerId());
  if (a >= 0 && a < options_.numServers) peer->aggregatorId = a;
  COFAB_LOG(kInfo, "aggd") << "accepted " << peer->describe();
  if (options_.creditBytes > 0 && peer->workerRank >= 0) {
    // The grant goes first, before anything else this daemon sends on the connection.
    auto window = std::make_shared<std::vector<uint8_t>>(8);
    for (size_t i = 0; i < 8; ++i) {
      (*window)[i] = static_cast<uint8_t>(static_cast<uint64_t>(options_.creditBytes) >> (8 * i));
    }
    wire::Header h;
    h.type = wire::MessageType::kControl;
    h.opcode = static_cast<uint8_t>(ps::ControlOp::kCredit);
    h.dtype = DType::kU8;
    h.senderRank = static_cast<uint32_t>(peer->workerRank);
    peer->send(h, window->data(), window->size(), window);
  }
  postRecv(peer);
}

void AggregatorServer::postRecv(const std::shared_ptr<Peer>& peer) {
  peer->conn->recvRouted(
      [this, peer](const wire::Header& h) { return routePush(*peer, h); },
      [this, peer](const Status& st, const wire::Header& h, std::vector<uint8_t>&& payload) {
        Payload pooled = std::move(peer->routed);
        if (!st.ok()) {
          onPeerError(peer, st);
          return;
        }
        onMessage(peer, h, std::move(payload), std::move(pooled));
        postRecv(peer);
      });
}

// Pushes land in a recycled buffer of their size (no allocation, zero-fill or copy per chunk);
// everything else, and sizes onMessage will reject anyway, in a transport buffer.
transport::MutableSlice AggregatorServer::routePush(Peer& peer, const wire::Header& h) {
  if (h.type != wire::MessageType::kPush || h.payloadLength == 0 ||
      h.payloadLength > options_.maxChunkBytes) {
    return {};
  }
  peer.routed = pool_->take(h.payloadLength);
  return {peer.routed->data(), peer.routed->size(), nullptr};
}

void AggregatorServer::onPeerError(const std::shared_ptr<Peer>& peer, const Status& st) {
  peer->conn->close();
  const bool cancelled = st.code() == StatusCode::kCancelled || stopped_;
  const bool orderly = peer->goodbye.load();
  if (!cancelled && !orderly) metrics_.connectionsBroken.fetch_add(1, std::memory_order_relaxed);
  if (peer->workerRank >= 0) {
    const bool wasActive = peer->active.exchange(false);
    bool lost = false;
    std::string link, reason;
    {
      std::lock_guard<std::mutex> lock(linksMu_);
      WorkerLinks& w = links_[static_cast<size_t>(peer->workerRank)];
      --w.open;
      if (wasActive) --w.active;
      // A link that broke before its first push counts too (the worker died while starting):
      // else its rounds would wait for the round timeout, naming it as connected. It does not
      // replace the loss of a link that carried state.
      if (w.active == 0 && !orderly && !cancelled && (wasActive || !w.broken)) {
        w.broken = true;
        w.link = peer->describe();
        w.reason = st.toString() + (wasActive ? "" : " (not yet pushed)");
      }
      // Lost once nothing of it is left; a connection still open (a reconnect, a second
      // client) may yet carry its state again (activateLink).
      lost = w.broken && w.open == 0 && w.active == 0;
      // Its last link closed with a Goodbye: not a failure, but nothing of it is left to push
      // to the rounds that wait for it, so they are released like a lost worker's (naming it as
      // left) rather than after the round timeout, naming it as connected.
      const bool left = orderly && !cancelled && !lost && !w.lost && w.open == 0 && w.active == 0;
      if (left) {
        Event e;
        e.kind = Event::Kind::kWorkerGone;
        e.rank = peer->workerRank;
        e.left = true;
        e.reason = "it closed its client (Goodbye) on " + peer->describe();
        broadcast(e);
        w.lost = true;
      }
      if (lost) {
        w.broken = false;
        link = std::move(w.link);
        reason = std::move(w.reason);
        // Posted under linksMu_: a connection of this worker accepted meanwhile posts its Back
        // after this Gone, never before (the engines would think a connected worker lost).
        Event e;
        e.kind = Event::Kind::kWorkerGone;
        e.rank = peer->workerRank;
        e.reason = reason;
        broadcast(e);
        w.lost = true;
      }
    }
    if (lost) {
      COFAB_LOG(kWarn, "aggd") << "worker " << peer->workerRank << " lost: " << link << ": "
                               << reason;
      // Counted after the engines have the event: whoever reads the count sees a daemon that
      // already acts on the loss.
      metrics_.workersLost.fetch_add(1, std::memory_order_relaxed);
    }
    if (wasActive || lost || cancelled) return;
  }
  if (!orderly && !cancelled) {
    COFAB_LOG(kInfo, "aggd") << peer->describe() << " closed: " << st.toString();
  }
}

void AggregatorServer::broadcast(const Event& e) {
  for (auto& engine : engines_) engine->post(e);
}

void AggregatorServer::workerBack(int rank) {
  Event e;
  e.kind = Event::Kind::kWorkerBack;
  e.rank = rank;
  broadcast(e);
}

void AggregatorServer::activateLink(int rank) {
  std::lock_guard<std::mutex> lock(linksMu_);  // Gone and Back in link order (onPeerError)
  WorkerLinks& w = links_[static_cast<size_t>(rank)];
  w.broken = false;  // a link carries its state again: not lost after all
  // Its first live link again (say its old link's loss was noticed only after this connection
  // was accepted): back once more.
  if (w.active++ == 0) {
    w.lost = false;
    workerBack(rank);
  }
}

void AggregatorServer::noteWorkerAliveElsewhere(int rank) {
  std::lock_guard<std::mutex> lock(linksMu_);  // Gone and Back in order, as above
  WorkerLinks& w = links_[static_cast<size_t>(rank)];
  if (!w.lost) return;  // one Back per loss, not one per forwarded push
  w.lost = false;
  COFAB_LOG(kInfo, "aggd") << "worker " << rank
                           << " lost here pushes through the replica partner: waited for again";
  workerBack(rank);
}

bool AggregatorServer::validatePush(const Peer& peer, const wire::Header& h, size_t size) {
  const bool forwarded = (h.opcode & ps::kPushForwarded) != 0;
  if (peer.aggregatorId < 0 && peer.workerRank < 0) {
    peer.reject(metrics_, RejectReason::kUnknownWorker, h,
                "connection '" + peer.conn->peerId() + "' is not a worker of this job (workers " +
                    "are 'worker 0'..'worker " + std::to_string(options_.numWorkers - 1) + "')");
    return false;
  }
  if (peer.workerRank >= 0 &&
      (forwarded || h.senderRank != static_cast<uint32_t>(peer.workerRank))) {
    peer.reject(metrics_, RejectReason::kUnknownWorker, h,
                forwarded ? "a worker may not send forwarded chunks"
                          : "sender rank " + std::to_string(h.senderRank) +
                                " on the connection of worker " + std::to_string(peer.workerRank));
    return false;
  }
  if (peer.aggregatorId >= 0 &&
      (!forwarded || h.senderRank >= static_cast<uint32_t>(options_.numWorkers))) {
    peer.reject(metrics_, RejectReason::kMalformed, h, "bad forwarded chunk");
    return false;
  }
  if ((h.opcode & ~ps::kKnownPushBits) != 0 || h.chunkCount == 0) {
    peer.reject(metrics_, RejectReason::kMalformed, h,
                "unknown opcode bits or chunkCount 0 (a push names chunk i of n)");
    return false;
  }
  switch (h.dtype) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
      break;
    default:
      peer.reject(
          metrics_, RejectReason::kUnsupportedDType, h,
          "aggregation supports f32, f64, f16 and bf16, not " + std::string(dtypeName(h.dtype)));
      return false;
  }
  if (size > options_.maxChunkBytes) {
    peer.reject(metrics_, RejectReason::kOversized, h,
                std::to_string(size) + " bytes exceed --max-chunk-bytes " +
                    std::to_string(options_.maxChunkBytes));
    return false;
  }
  if (size == 0 || size % dtypeSize(h.dtype) != 0) {
    peer.reject(metrics_, RejectReason::kWrongSize, h,
                std::to_string(size) + " bytes is not a positive number of " +
                    std::string(dtypeName(h.dtype)) + " elements");
    return false;
  }
  return true;
}

void AggregatorServer::onMessage(const std::shared_ptr<Peer>& peer, const wire::Header& h,
                                 std::vector<uint8_t>&& payload, Payload pooled) {
  switch (h.type) {
    case wire::MessageType::kPush: {
      // While draining, the engine decides: a push into an open round may complete it (shutdown()
      // waits for open rounds), one that would open a round is refused there.
      const bool draining = draining_.load();
      const size_t bytes = pooled ? pooled->size() : payload.size();
      if (!validatePush(*peer, h, bytes)) return;
      metrics_.bytesIn.fetch_add(bytes, std::memory_order_relaxed);
      if (metrics_.noteReceived(peer->creditUsed, bytes, peer->workerRank >= 0) &&
          !peer->creditWarned.exchange(true)) {
        COFAB_LOG(kWarn, "aggd") << peer->describe() << " pushed beyond its credit window of "
                                 << options_.creditBytes << " bytes (counted in "
                                 << "cofab_agg_credit_violations_total)";
      }
      if (peer->workerRank >= 0 && !peer->active.exchange(true)) {
        activateLink(peer->workerRank);
      }
      // The partner forwards a contribution to one of this daemon's own chunks only when the
      // worker sent it there instead of here (it failed over): the worker lives. (Its ordinary
      // forwards are of the partner's own chunks.)
      if (peer->aggregatorId >= 0 &&
          ps::primaryServer(h.key, h.chunkIndex, options_.numServers) == options_.id) {
        noteWorkerAliveElsewhere(static_cast<int>(h.senderRank));
      }
      Event e;
      e.kind = Event::Kind::kPush;
      e.peer = peer;
      e.header = h;
      e.draining = draining;
      e.payload =
          pooled ? std::move(pooled) : std::make_shared<std::vector<uint8_t>>(std::move(payload));
      engines_[engineFor(h.key, h.chunkIndex)]->post(std::move(e));
      return;
    }
    case wire::MessageType::kPull: {
      if (peer->workerRank < 0 || h.senderRank != static_cast<uint32_t>(peer->workerRank)) {
        peer->reject(metrics_, RejectReason::kUnknownWorker, h, "pull from a non-worker");
        return;
      }
      if (h.chunkCount == 0) {
        peer->reject(metrics_, RejectReason::kMalformed, h, "pull with chunkCount 0");
        return;
      }
      Event e;
      e.kind = Event::Kind::kPull;
      e.peer = peer;
      e.header = h;
      e.draining = draining_.load();
      engines_[engineFor(h.key, h.chunkIndex)]->post(std::move(e));
      return;
    }
    case wire::MessageType::kControl:
      if (h.opcode == static_cast<uint8_t>(ps::ControlOp::kPing)) {
        peer->sendControl(ps::ControlOp::kPong, h);
        return;
      }
      if (isModelRequest(h.opcode)) {
        onModelMessage(peer, h, std::move(payload));
        return;
      }
      if (h.opcode == static_cast<uint8_t>(ps::ControlOp::kFanOutRelease)) {
        onFanOutRelease(peer, h, std::move(payload));
        return;
      }
      break;
    case wire::MessageType::kGoodbye:
      peer->goodbye = true;
      return;
    default:
      break;
  }
  peer->reject(metrics_, RejectReason::kMalformed, h,
               "unexpected " + std::string(wire::messageTypeName(h.type)) +
                   " message on the aggregation port");
}

Status AggregatorServer::connectBackup(const std::string& backupAddress, Deadline deadline) {
  transport::ConnectOptions co;
  co.localId = ps::aggregatorPeerId(options_.id);
  COFAB_ASSIGN_OR_RETURN(auto link, ctx_->connect(backupAddress, co, deadline));
  {
    std::lock_guard<std::mutex> lock(backupMu_);
    backup_ = link;
  }
  backupHeardNs_ = nowNs();
  backupAlive_ = true;
  postBackupRecv(link);
  COFAB_LOG(kInfo, "aggd") << "replicating to backup " << link->describe();
  return OkStatus();
}

void AggregatorServer::postBackupRecv(std::shared_ptr<transport::Connection> link) {
  link->recvOwned(
      [this, link](const Status& st, const wire::Header& h, std::vector<uint8_t>&& payload) {
        if (!st.ok()) {
          onBackupError(st);
          return;
        }
        backupHeardNs_ = nowNs();
        if (h.type == wire::MessageType::kControl &&
            h.opcode == static_cast<uint8_t>(ps::ControlOp::kForwardAck)) {
          Event e;
          e.kind = Event::Kind::kForwardAck;
          e.header = h;
          engines_[engineFor(h.key, h.chunkIndex)]->post(std::move(e));
        } else if (h.type == wire::MessageType::kControl &&
                   h.opcode == static_cast<uint8_t>(ps::ControlOp::kReject)) {
          // The backup refused a forwarded chunk (it is draining, or configured otherwise): that
          // contribution would wait for an ack that never comes, its round until its timeout.
          // Replication ends here, as when the backup is gone; waiting contributions are durable.
          onBackupError(FailedPrecondition("the backup refused a forwarded chunk (" + h.describe() +
                                           "): " + ps::parseReject(payload).describe()));
          link->close();
          return;
        }
        postBackupRecv(link);
      });
}

bool AggregatorServer::forward(const wire::Header& h, const Payload& payload) {
  if (!backupAlive_) return false;
  // The backup link replicates this daemon's own chunks; a chunk whose primary is the daemon on
  // the other end (two daemons: a worker that failed over while that primary lives) goes back
  // to it. Any other chunk came here as a dead third daemon's backup: the daemon behind this
  // one holds no round for it (it rejected it as beyond its window, which ended replication of
  // this daemon's own chunks), so it stays unreplicated.
  const int primary = ps::primaryServer(h.key, h.chunkIndex, options_.numServers);
  if (primary != options_.id && primary != ps::backupServer(options_.id, options_.numServers)) {
    return false;
  }
  std::shared_ptr<transport::Connection> link;
  {
    std::lock_guard<std::mutex> lock(backupMu_);
    link = backup_;
  }
  if (!link) return false;
  link->send(h, payload->data(), payload->size(), [this, payload](const Status& st) {
    if (!st.ok()) onBackupError(st);
  });
  return true;
}

bool AggregatorServer::onBackupSilent(const std::string& why) {
  // A backup that acks other forwards is alive, only behind (a backlogged link): not lost.
  const int64_t quietMs = (nowNs() - backupHeardNs_.load()) / 1000000;
  if (quietMs < options_.engine.backupAckTimeoutMs) return false;
  onBackupError(DeadlineExceeded("the backup sent no ForwardAck within " +
                                 std::to_string(options_.engine.backupAckTimeoutMs) + " ms (" +
                                 why + ")"));
  std::shared_ptr<transport::Connection> link;
  {
    std::lock_guard<std::mutex> lock(backupMu_);
    link = backup_;
  }
  if (link) link->close();  // a late ack from a backup that wakes up changes nothing now
  return true;
}

void AggregatorServer::onBackupError(const Status& st) {
  if (!backupAlive_.exchange(false) || stopped_) return;
  metrics_.backupLost.fetch_add(1);
  COFAB_LOG(kWarn, "aggd") << "backup lost (" << st.toString()
                           << "); continuing without replication";
  Event e;
  e.kind = Event::Kind::kBackupLost;
  broadcast(e);
}

void AggregatorServer::shutdown(const std::string& why) {
  if (draining_.exchange(true)) return;
  COFAB_LOG(kInfo, "aggd") << "draining: " << why;
  if (listener_) listener_->close();
  const Deadline deadline = Deadline::afterMs(options_.drainTimeoutMs);
  for (;;) {
    uint64_t open = 0;
    for (auto& e : engines_) open += e->openRounds();
    if (open == 0 || deadline.expired()) break;
    std::this_thread::sleep_for(Millis(10));
  }
  Event drain;
  drain.kind = Event::Kind::kDrain;
  drain.reason = "the aggregator is shutting down (" + why + ")";
  broadcast(drain);
  stopped_ = true;
  for (auto& e : engines_) e->stop();
  // Let the answers already queued (results of rounds that completed while draining, the
  // RoundFailed texts) reach the sockets: closing the context cancels queued sends, and peers
  // saw a message cut off (a fixed 20 ms used to stand in for this). Bounded: a peer that does
  // not read holds its sends back.
  const Deadline flushed = Deadline::afterMs(std::max<int64_t>(options_.drainTimeoutMs, 100));
  while (unsent_->load(std::memory_order_acquire) > 0 && !flushed.expired()) {
    std::this_thread::sleep_for(Millis(1));
  }
  if (ctx_) {
    ctx_->close();
    ctx_->join();
  }
  std::vector<std::shared_ptr<transport::PipeEnd>> local;
  {
    std::lock_guard<std::mutex> lock(inProcessMu_);
    local.swap(inProcess_);
    inProcessClosed_ = true;
  }
  for (auto& end : local) {
    end->close();
    end->join();
  }
}

}  // namespace cofab::aggregator
