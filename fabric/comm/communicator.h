// Communicator: a group of `size` ranks with one transport connection between every pair,
// set up through a rendezvous Store. Collectives (fabric/comm/collectives.h) run on it.
//
// Ownership: the caller owns the Store and keeps it alive as long as the communicator (and its
// sub-communicators from split()); the communicator owns its connections and shares its
// transport Context with the communicators split from it. No process-wide state: several
// communicators may live in one process (threads as ranks over a HashStore).
//
// Threads: create(), split() and the collectives may be called from any thread. Collectives
// run one at a time, in the order they were issued on this rank, driven by the transport's I/O
// threads (callbacks); every rank must issue the same collectives in the same order. The first
// failure (a peer's death, a mismatch, a timeout, abort()) is sticky: every pending and later
// operation fails with it, and it is published in the store so that the other ranks report the
// same cause. Destroying the communicator aborts what is still pending and waits for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/comm/allreduce_path.h"
#include "fabric/rendezvous/prefix_store.h"
#include "fabric/rendezvous/store.h"
#include "fabric/transport/connection.h"
#include "fabric/transport/context.h"

namespace cofab::comm {

class CollectiveOp;
struct OpSignature;

struct CommOptions {
  // Transport name for transport::Registry ("tcp", "loopback", ...).
  std::string transport = "tcp";
  // Store namespace of this communicator. Communicators created on one store at the same time
  // need distinct names; re-creating one with the same name is fine, and so is retrying a
  // setup that failed (every rank of an attempt agrees on its outcome: docs/COLLECTIVES.md).
  std::string name = "cofab-comm";
  // Where to listen (empty: the transport's default, see transport::ListenOptions).
  std::string listenAddress;
  // Bound on the whole setup (store rendezvous + connections): DeadlineExceeded names the ranks
  // that did not show up. Zero: COFAB_COMM_SETUP_TIMEOUT_MS.
  Duration setupTimeout{0};
  // Where allreduce runs: null over the peers; else the allreduces it serves go to this path
  // (the aggregator daemons: ps::aggregatorAllreducePath). Set on every rank or on none.
  std::shared_ptr<AllreducePath> allreducePath;
};

class Communicator {
 public:
  // Collective over all `size` ranks: each calls it with its own rank and the same store/name.
  static StatusOr<std::unique_ptr<Communicator>> create(int rank, int size, Store* store,
                                                        const CommOptions& options = {});
  // As create(), with a transport context the caller made (shared with other communicators).
  static StatusOr<std::unique_ptr<Communicator>> create(int rank, int size, Store* store,
                                                        std::shared_ptr<transport::Context> context,
                                                        const CommOptions& options = {});

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  // CommOptions::allreducePath (null: the peers).
  AllreducePath* allreducePath() const { return allreducePath_.get(); }

  // Collective over this communicator (like MPI_Comm_split): ranks passing the same `color`
  // form a sub-communicator ordered by (key, rank). A negative color takes no part and gets a
  // null pointer. The sub-communicator shares the transport context, and has its own
  // connections and store namespace; it listens on the parent's CommOptions::listenAddress
  // host with a kernel-chosen port ("h:p" -> "h:0").
  StatusOr<std::unique_ptr<Communicator>> split(int color, int key, Duration timeout = Duration{0});

  // OK while healthy, else the sticky error that failed (or will fail) every operation. From
  // the first failure (abort() included) on, never OK: while the failure procedure still runs
  // (up to COFAB_COMM_DIAG_GRACE_MS), the failure it started from; a peer's published cause may
  // then replace it.
  Status asyncError() const;

  // Fails every pending and later operation with Aborted, here and (through closed
  // connections) on the peers. Returns without waiting; any thread.
  void abort();

  // --- Used by the collectives (fabric/comm/collective_op.h); not for applications. ---
  transport::Connection* connection(int peer) const {
    return conns_[static_cast<size_t>(peer)].get();
  }
  // Scratch memory for the running operation (operations run one at a time), at least `bytes`;
  // ResourceExhausted when it cannot be had. Kept (and grown) for later operations.
  StatusOr<uint8_t*> scratch(size_t bytes);
  // Gives `op` its sequence number (the next collective one, or the next of its point-to-point
  // direction and peer) and queues it; starts it when the operations issued before it have
  // finished. Numbered under the queue's lock: two threads issuing at once would otherwise
  // queue two operations in the other order than they numbered them, and the ranks would
  // disagree about which is which.
  void submit(const std::shared_ptr<CollectiveOp>& op);
  // Called by the running op when it completed (any thread, no op lock held).
  void opFinished(CollectiveOp* op);
  // The earliest deadline of the ops `self` waits behind: the running op, the posted
  // point-to-point ones and the ops queued ahead of it (never while the communicator is
  // failing: the failure ends them all).
  Deadline pendingDeadline(const CollectiveOp* self) const;
  // Reports the timeout of such an op whose deadline has passed and which is not done: a caller
  // waiting on (or polling) a later op enforces it, as the op's own waiter would.
  void enforcePendingDeadlines(const CollectiveOp* self);
  // Held by an op's wait()/test() while it calls the communicator with its own lock released;
  // taken while the op is not done (so the communicator still waits for it to be): the
  // destructor waits for every one to be let go before it frees anything.
  class OpCall {
   public:
    explicit OpCall(Communicator& c) : c_(c) { c_.opCalls_.fetch_add(1); }
    ~OpCall() { c_.opCalls_.fetch_sub(1); }
    OpCall(const OpCall&) = delete;
    OpCall& operator=(const OpCall&) = delete;

   private:
    Communicator& c_;
  };
  // An allreduce started on the CommOptions::allreducePath, outside the queue: tracked so that
  // the communicator's failure (abort() included) and its destruction cancel it while it runs.
  // Cancelled at once when the communicator has failed already.
  void notePathOp(const std::shared_ptr<PendingOp>& op);
  // A point-to-point op has posted all its messages: it leaves the queue (its transfers go on,
  // tracked until opFinished) and the next op starts. A send completes only once its bytes are
  // out, and over tcp they go out only as the peer posts the matching receive: held in the
  // queue, two ranks that each send to the other and then receive (a ring shift) would wait on
  // each other's receive, queued behind each other's send, as soon as a message outgrows the
  // socket buffers. Per-connection order keeps later ops' messages matched.
  void opPosted(CollectiveOp* op);
  // Records that a message of collective `sequence` arrived from `peer` (for timeout reports).
  void noteArrived(int peer, uint64_t sequence);
  // Starts the failure procedure for the running op (first failure only): publish, close,
  // fail everything. `peer` is the rank blamed by a transport error (or -1). Any thread; never
  // blocks (the procedure runs on a helper thread).
  void reportFailure(CollectiveOp* op, const Status& status, int peer);
  // The running op's deadline passed: find who did not arrive, then fail as above.
  void reportTimeout(CollectiveOp* op);
  // How long timeout reports wait for the other ranks' reports.
  Duration diagnosticGrace() const;

 private:
  // Under mu_: the ops pendingDeadline() counts.
  std::vector<std::shared_ptr<CollectiveOp>> opsAheadOf(const CollectiveOp* self) const;
  // The path's allreduces not yet destroyed (notePathOp), done or not.
  std::vector<std::shared_ptr<PendingOp>> livePathOps() const;
  Communicator(int rank, int size, Store* store, std::string name, std::string prefix,
               std::shared_ptr<transport::Context> context);
  Status connectMesh(const CommOptions& options, Deadline deadline);
  // After connectMesh(): every rank of the generation agrees on one outcome (see create()); OK
  // only when it is "ok" and `connected` is.
  Status agreeOutcome(const Status& connected, Deadline deadline);
  void handleFailure(CollectiveOp* op, Status status, int peer, bool timeout);
  // Starts `op`, and whatever its start lets start in turn, in a loop on this thread.
  void launch(std::shared_ptr<CollectiveOp> op);
  // Under mu_: `op` itself when it is a posted point-to-point op, else the running op.
  std::shared_ptr<CollectiveOp> failureTarget(CollectiveOp* op) const;
  // Under mu_: nothing running, queued or posted.
  bool idle() const { return running_ == nullptr && queue_.empty() && posted_.empty(); }
  Status timeoutStatus(CollectiveOp* op);
  void failQueued(const Status& status);
  std::string failKey(uint64_t sequence, int rank) const;

  const int rank_;
  const int size_;
  Store* const baseStore_;
  const std::string name_;
  const std::string prefix_;  // "<name>/<generation>"
  PrefixStore store_;
  std::shared_ptr<transport::Context> context_;
  std::shared_ptr<AllreducePath> allreducePath_;
  // CommOptions::listenAddress as given (split() listens on the same host).
  std::string listenAddress_;
  std::vector<std::shared_ptr<transport::Connection>> conns_;
  std::unique_ptr<std::atomic<uint64_t>[]> arrived_;  // per peer: highest sequence seen + 1

  std::vector<uint64_t> p2pSendSeq_;  // under mu_
  std::vector<uint64_t> p2pRecvSeq_;  // under mu_
  // Under mu_: the next sequence number for an op with signature `sig`.
  uint64_t takeSequence(const OpSignature& sig);

  // Scratch: owned here, lent to the one running op.
  std::unique_ptr<uint8_t, void (*)(void*)> scratch_{nullptr, nullptr};
  size_t scratchBytes_ = 0;

  mutable std::mutex mu_;
  std::condition_variable idle_;  // signalled when the queue drains (destructor waits on it)
  uint64_t sequence_ = 0;
  std::deque<std::shared_ptr<CollectiveOp>> queue_;
  std::shared_ptr<CollectiveOp> running_;
  // Point-to-point ops that left the queue (opPosted) and still have transfers running.
  // Keyed by the op, so a completion finds its op in O(1) with thousands outstanding.
  std::unordered_map<CollectiveOp*, std::shared_ptr<CollectiveOp>> posted_;
  Status error_;            // sticky, set once the failure procedure has finished
  bool failing_ = false;    // the failure procedure has started
  // What the failure procedure started from, for asyncError() until error_ is set (the store
  // write and the wait for a peer's published cause can take the diagnostic grace).
  Status failingWith_;
  std::vector<std::weak_ptr<PendingOp>> pathOps_;  // notePathOp; expired ones pruned there
  std::atomic<int> opCalls_{0};                    // OpCall
  std::thread failThread_;  // runs handleFailure() (joined by the destructor)
  uint64_t splits_ = 0;
};

}  // namespace cofab::comm
