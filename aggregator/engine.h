// Engine: one aggregation shard thread. Every (key, chunk) slot is pinned to exactly one engine
// (AggregatorServer::engineFor), so slot state is touched by that thread only and needs no lock;
// the only lock is the event queue's, taken once per batch by the engine.
//
// A slot runs one round at a time: round `cur` collects one contribution per worker (buffered,
// deduplicated by rank), and completes when all `numWorkers` are durable (applied here and, with
// replication, acknowledged by the backup); then it reduces in rank order (reducer.h), answers
// the waiting pullers / push-back contributors, keeps the result for late duplicates and pulls,
// and moves on to cur + 1. Pushes for the round just finished are answered from that result
// (a retransmission or a failover resend); older ones are rejected as finished, newer ones as
// beyond the window. A round missing a worker whose connection broke is released after
// deadWorkerMs, one missing live workers after roundTimeoutMs: everyone waiting gets kRoundFailed
// naming the missing workers.
//
// Events are posted from transport I/O threads (post()); results and acks are sent from the
// engine thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "aggregator/chunk_id.h"
#include "aggregator/gradient_groups.h"
#include "aggregator/metrics.h"
#include "aggregator/peer.h"
#include "core/status.h"
#include "fabric/wire/header.h"

namespace cofab::aggregator {

struct EngineOptions {
  int numWorkers = 1;
  uint64_t firstIteration = 0;
  int64_t roundTimeoutMs = 60000;
  int64_t deadWorkerMs = 2000;
  // Replication: a contribution forwarded to the backup and not acknowledged within this long
  // means the backup went silent (stopped, or gone without a reset): replication ends, as when
  // its connection breaks, instead of every round waiting until roundTimeoutMs.
  int64_t backupAckTimeoutMs = 5000;
  // --max-chunk-bytes, which bounds a compressed chunk's decoded size too. Copied by
  // AggregatorServer::create from ServerOptions::maxChunkBytes.
  size_t maxChunkBytes = 64u << 20;
  // Slots a pull may create for chunks nobody has pushed yet, per engine (kPullBacklog beyond).
  size_t maxPulledOnly = 65536;
  int64_t staleness = 3;          // model store: SSP bound tau in clocks (model_store.h)
  int64_t versionStaleness = 16;  // model store: bound tau_v in model versions (model_store.h)
  // Gradient coding (gradient_groups.h): a round completes once every group of s+1 workers has
  // one contribution. -1: off (every worker needed). Validated by AggregatorServer::create.
  int gradientStragglers = -1;
};

using Payload = std::shared_ptr<std::vector<uint8_t>>;

struct Event {
  enum class Kind : uint8_t {
    kPush,
    kPull,
    kForwardAck,
    kWorkerGone,
    kWorkerBack,  // a connection from that worker again: rounds no longer count it as lost
    kBackupLost,
    kDrain,
    kModel,    // a model store request (model_store.h)
    kRelease,  // ControlOp::kFanOutRelease: free fan-out slots (every engine gets one)
  };
  Kind kind = Kind::kPush;
  std::shared_ptr<Peer> peer;
  wire::Header header;
  Payload payload;
  int rank = -1;
  std::string reason;
  // kWorkerGone: the worker closed its last link with a Goodbye (it left; not a failure, and not
  // a model-store leave, which has its own op), rather than losing it.
  bool left = false;
  // kPush or kPull received while the daemon drains: taken only into a round already open (it
  // may complete it) or for the round just finished, refused (kDraining) where it would open one.
  bool draining = false;
  // kRelease: engines still to release; the last one acknowledges.
  std::shared_ptr<std::atomic<int>> enginesLeft;
};

// Forwards a contribution to the backup; false when there is no live backup (then the
// contribution is durable at once).
class ModelStore;

using ForwardFn = std::function<bool(const wire::Header&, const Payload&)>;
// Called (from the engine thread) when a forwarded contribution waited longer than
// EngineOptions::backupAckTimeoutMs for its ack; `why` names it. True when the server ended
// replication (the backup sent nothing at all for that long); false when the backup is alive and
// only behind (a backlogged link), and the engine asks again later.
using BackupSilentFn = std::function<bool(const std::string& why)>;

class Engine {
 public:
  Engine(int index, EngineOptions options, Metrics& metrics, ForwardFn forward,
         BackupSilentFn backupSilent = {});
  ~Engine();  // stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void post(Event event);
  // Rounds with contributions or pullers still waiting (approximate, for draining).
  uint64_t openRounds() const { return openRounds_.load(std::memory_order_relaxed); }
  // Finishes the queue and joins the thread.
  void stop();

 private:
  struct Slot;
  void run();
  void handle(Event& e);
  void onPush(Event& e);
  void onPull(Event& e);
  void onForwardAck(const Event& e);
  void onWorkerGone(const Event& e);
  void onWorkerBack(const Event& e);
  void adoptPushShape(Slot& slot, const wire::Header& push);
  // Frees the fan-out slots of the released key range and remembers the range (bounded) so
  // that a late pull is rejected as released instead of waiting for a round that never comes.
  void onRelease(const Event& e);
  bool wasReleased(uint64_t key) const;
  void onBackupLost();
  void failOpenRounds(const std::string& why);
  void tick();
  // A slot for h's (key, chunk), not yet kept in slots_.
  std::unique_ptr<Slot> newSlot(const wire::Header& h) const;
  Slot& slotFor(const wire::Header& h, bool* created);
  void markDurable(Slot& slot, int rank);
  void maybeComplete(Slot& slot);
  void complete(Slot& slot);
  // Answers everyone waiting on the open round with `result` and moves to the next round.
  void finishRound(Slot& slot, Payload result);
  // `sends` compressed results of `s` (resultBytes each) went out: at the end of its round, or
  // resent from the kept one (a pull after the push that completed the round, a straggler's
  // resend); nothing for an uncompressed slot.
  void countCompressedOut(const Slot& s, uint64_t sends, size_t resultBytes);
  void failRound(Slot& slot, const std::string& why);
  void resetRound(Slot& slot);
  // Counts the slot's round in open_rounds exactly while it is open (contributions or pullers
  // waiting), whichever way it opened or closed: call after either may have changed.
  void noteOpen(Slot& slot);
  std::string missingWorkers(const Slot& slot, int64_t now, bool* anyGone) const;

  const int index_;
  const EngineOptions options_;
  Metrics& metrics_;
  ForwardFn forward_;
  BackupSilentFn backupSilent_;
  bool backupSilentReported_ = false;
  const GradientGroups groups_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> queue_;
  bool stop_ = false;
  std::thread thread_;

  // Engine-thread state.
  ChunkMap<std::unique_ptr<Slot>> slots_;
  size_t pulledOnly_ = 0;             // slots created by a pull that no push has reached yet
  std::vector<int64_t> goneSinceNs_;  // 0: connected
  std::vector<std::string> goneReason_;
  std::vector<bool> goneLeft_;  // gone with a Goodbye (Event::left)
  std::atomic<uint64_t> openRounds_{0};
  std::unique_ptr<ModelStore> models_;
  std::deque<std::pair<uint64_t, uint64_t>> released_;  // [first, first + count) key ranges
};

}  // namespace cofab::aggregator
