// AggregatorServer: the aggregation service behind cofab-aggd — listens on a transport, accepts
// workers (and, as a backup, its primary), validates every message, and hands chunks to K engine
// threads (engine.h) by a fixed hash of (key, chunk), so each slot lives on one thread.
//
// Ownership and threads: the server owns its transport context (whose I/O threads run the
// receive loops and message validation), the engines, and the link to its backup. Everything a
// peer sends that is wrong (bad rank, dtype, size, opcode, iteration) is answered with a kReject
// naming the reason and counted in metrics(); nothing a peer sends can crash the daemon.
// create(), connectBackup() and shutdown() are called from the daemon's main thread;
// renderMetrics() from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "aggregator/metrics.h"
#include "aggregator/payload_pool.h"
#include "aggregator/peer.h"
#include "core/status.h"
#include "fabric/transport/context.h"
#include "fabric/transport/inproc_pipe.h"

namespace cofab::aggregator {

struct ServerOptions {
  int id = 0;  // this daemon's index among numServers
  int numServers = 1;
  int numWorkers = 1;  // contributions per round
  std::string transport = "tcp";
  std::string listenAddress;  // empty: the transport's default with a kernel-chosen port
  int engineThreads = 2;
  bool replication = false;  // forward every contribution to the backup before acking
  size_t maxChunkBytes = 64u << 20;
  int64_t drainTimeoutMs = 5000;
  // Receiver-driven credits: grant every worker connection this many bytes of unconsumed pushes
  // (ControlOp::kCredit); 0: off. Pushes beyond the grant are counted, not refused.
  size_t creditBytes = 0;
  EngineOptions engine;  // numWorkers is copied from above
};

class AggregatorServer {
 public:
  static StatusOr<std::unique_ptr<AggregatorServer>> create(const ServerOptions& options);
  ~AggregatorServer();  // shutdown("destroyed")
  AggregatorServer(const AggregatorServer&) = delete;
  AggregatorServer& operator=(const AggregatorServer&) = delete;

  // The address workers connect to.
  const std::string& address() const { return address_; }
  const ServerOptions& options() const { return options_; }

  // With replication: connects to this daemon's backup (daemon (id + 1) % numServers) and
  // forwards every accepted contribution to it from then on.
  Status connectBackup(const std::string& backupAddress, Deadline deadline);

  // Colocated shard in the worker's own process: a connection to this server for worker
  // `workerRank` that skips sockets (transport/inproc_pipe.h: one copy per message). Give it to
  // ps::ClientOptions::inProcess; the server treats it like an accepted connection.
  StatusOr<std::shared_ptr<transport::PipeEnd>> connectInProcess(int workerRank);
  // Graceful stop: refuses new chunks (kDraining), waits up to drainTimeoutMs for open rounds
  // to finish, fails the rest with kRoundFailed(`why`), closes everything. Idempotent.
  void shutdown(const std::string& why);

  bool draining() const { return draining_.load(); }
  std::string renderMetrics() const { return metrics_.render(options_.id, draining()); }
  const Metrics& metrics() const { return metrics_; }
  // Which engine owns chunk `chunk` of `key`.
  size_t engineFor(uint64_t key, uint32_t chunk) const;

 private:
  explicit AggregatorServer(const ServerOptions& options);
  void acceptNext();
  void onAccepted(std::shared_ptr<transport::Connection> conn);
  void postRecv(const std::shared_ptr<Peer>& peer);
  // `pooled`: a push received straight into a pool buffer (routePush); `payload` is then empty.
  void onMessage(const std::shared_ptr<Peer>& peer, const wire::Header& h,
                 std::vector<uint8_t>&& payload, Payload pooled = nullptr);
  transport::MutableSlice routePush(Peer& peer, const wire::Header& h);
  void onPeerError(const std::shared_ptr<Peer>& peer, const Status& st);
  bool validatePush(const Peer& peer, const wire::Header& h, size_t payloadSize);
  bool forward(const wire::Header& h, const Payload& payload);
  void onBackupError(const Status& st);
  // An engine saw a forwarded contribution wait past backupAckTimeoutMs: replication ends if
  // the backup sent nothing for that long either (see BackupSilentFn).
  bool onBackupSilent(const std::string& why);
  // A forwarded push for one of this daemon's own chunks came from the replica partner: worker
  // `rank` failed over to the partner and is alive, whatever its links here say.
  void noteWorkerAliveElsewhere(int rank);
  void postBackupRecv(std::shared_ptr<transport::Connection> link);
  void broadcast(const Event& e);
  // Worker `rank` connected again, or has a live link again: engines stop counting it as lost.
  // Called with linksMu_ held.
  void workerBack(int rank);
  // A connection of worker `rank` starts carrying its state (its loss is a lost worker).
  void activateLink(int rank);
  // Model store requests (aggregator_server_model.cc): validated here, run on the slot's engine.
  void onModelMessage(const std::shared_ptr<Peer>& peer, const wire::Header& h,
                      std::vector<uint8_t>&& payload);
  // ControlOp::kFanOutRelease (aggregator_server_fanout.cc): every engine frees its share.
  void onFanOutRelease(const std::shared_ptr<Peer>& peer, const wire::Header& h,
                       std::vector<uint8_t>&& payload);

  ServerOptions options_;
  Metrics metrics_;
  std::shared_ptr<transport::Context> ctx_;
  std::unique_ptr<transport::Listener> listener_;
  std::string address_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::shared_ptr<PayloadPool> pool_;  // receive buffers for pushes (payload_pool.h)
  std::mutex inProcessMu_;
  std::vector<std::shared_ptr<transport::PipeEnd>> inProcess_;  // server ends, joined at shutdown
  bool inProcessClosed_ = false;  // shutdown took inProcess_: no end may be added after it
  std::atomic<bool> draining_{false};
  // Sends to peers not completed yet (Peer::unsent): shutdown() waits for them, bounded.
  const std::shared_ptr<std::atomic<int64_t>> unsent_ = std::make_shared<std::atomic<int64_t>>(0);
  std::atomic<bool> stopped_{false};
  // Per worker rank: its connections, and whether it is lost. A worker is lost once the link
  // that carried its state broke (no goodbye) and no connection of it is left: while another
  // is open (it reconnected, or has a second client) that one decides.
  struct WorkerLinks {
    int open = 0;         // accepted, not ended
    int active = 0;       // of those, carrying its state (Peer::active)
    bool broken = false;  // its last active link ended without a goodbye
    bool lost = false;    // kWorkerGone posted, no kWorkerBack since
    std::string link;     // which connection that was
    std::string reason;   // why it ended
  };
  // Also held while posting kWorkerGone / kWorkerBack, so that the engines get them in the order
  // the links changed (lock order: linksMu_, then an engine's queue lock).
  std::mutex linksMu_;
  std::vector<WorkerLinks> links_;

  std::mutex backupMu_;
  std::shared_ptr<transport::Connection> backup_;
  std::atomic<bool> backupAlive_{false};
  std::atomic<int64_t> backupHeardNs_{0};  // when the backup link last delivered a message
};

}  // namespace cofab::aggregator
