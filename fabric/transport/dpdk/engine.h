// Engine: one dpdk context's poller thread and everything it owns — the borrowed Port, the
// connection table, listeners, the handshake, loss injection and the counters. Internal to
// fabric/transport/dpdk.
//
// Threads: the poller runs RX bursts, parses and dispatches frames, runs connection timers,
// builds frames and TX bursts, and runs every callback of the context's connections and
// listeners. Application threads only post() commands into an rte_ring the poller drains (the
// posting side is serialised by a mutex, so the ring is single-producer/single-consumer; that
// is one lock per operation, never per packet). When idle the poller spins briefly, then sleeps
// on the port's Waker (woken by post() and, in ring mode, by the peer's software switch).
// Owned by the DpdkContext through shared_ptr; listeners and connections keep it alive.
#pragma once

#include <rte_ring.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/transport/accept_queue.h"
#include "fabric/transport/dpdk/conn.h"
#include "fabric/transport/dpdk/factory.h"
#include "fabric/transport/dpdk/port.h"

namespace cofab::transport::dpdk {

struct EngineOptions {
  std::string localId;
  uint64_t maxPayload = wire::kDefaultMaxPayload;
  std::string port;          // port name; empty: the first free one
  uint32_t ip = 0;           // 0: 10.<mac[3]>.<mac[4]>.<mac[5]>
  uint16_t udpPort = 47000;  // connections' port; listeners take the next free ones
  double dropRate = 0;
  uint64_t dropSeed = 1;
  double corruptRate = 0;   // DpdkOptions::corruptRate
  double dropDataRate = 0;  // DpdkOptions::dropDataRate
  uint64_t peerTimeoutNs = 3'000'000'000;
  uint64_t drainNs = 500'000'000;  // bound on the close drain at context shutdown
  // Idle policy: after this long without work the poller sleeps; < 0: never (busy-poll, for
  // latency-sensitive users with a core to spare).
  int64_t idleSpinNs = 50'000;
  // Sleep bound of a PMD port (it cannot wake the poller); ring ports are woken by their peer.
  uint64_t idleNapNs = 100'000;
  uint32_t pipeFrames = 128;  // DpdkOptions::pipeFrames
};

class ListenerState {
 public:
  ListenerState(std::string address, uint16_t port, AcceptQueue::Post post)
      : address_(std::move(address)), port_(port), queue_("dpdk " + address_, std::move(post)) {}
  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }
  AcceptQueue& queue() { return queue_; }

 private:
  const std::string address_;
  const uint16_t port_;
  AcceptQueue queue_;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  static StatusOr<std::shared_ptr<Engine>> create(const EngineOptions& options);
  ~Engine();

  // --- any thread ---
  // Runs `fn` on the poller; false (and `fn` dropped) once the poller has stopped.
  bool post(std::function<void()> fn);
  void stop();
  void join();
  bool running() const { return !stopped_.load(); }
  StatusOr<std::shared_ptr<ListenerState>> listen(const std::string& address);
  void closeListener(const std::shared_ptr<ListenerState>& l);
  StatusOr<std::shared_ptr<Conn>> connect(const std::string& address, const std::string& localId,
                                          Deadline deadline);
  Status inject(std::span<const uint8_t> frame);
  DpdkStats stats() const;
  const NetAddress& local() const { return local_; }
  const std::string& localId() const { return options_.localId; }
  uint64_t maxPayload() const { return options_.maxPayload; }
  const std::string& portName() const { return port_->name(); }

  // --- poller thread (Conn) ---
  // A frame with room for `payload` bytes after the headers, addressed to `peer`; null when the
  // pool is (nearly) empty. Data frames leave a reserve so acks can still be sent.
  rte_mbuf* allocFrame(const NetAddress& peer, const FrameHeader& h, uint8_t** payload, bool data);
  // A data frame stamped from a connection's template (frame.h) with `seq`.
  rte_mbuf* allocDataFrame(const FrameTemplate& t, uint32_t seq, uint8_t** payload);
  // Queues a sealed frame for the next TX burst; takes one reference. False when the port stayed
  // full and the frame was dropped (as on a wire).
  bool queueTx(rte_mbuf* m);
  // Drops one reference to an mbuf this poller is done with (a delivered or refused frame, an
  // acknowledged one). Freed in bulk at the end of the loop iteration, or once kReleaseBatch
  // wait: one rte_pktmbuf_free per frame cost the receiver ~12 ns of its ~200 per frame.
  void release(rte_mbuf* m) {
    released_[releasedCount_++] = m;
    if (releasedCount_ == kReleaseBatch) flushReleased();
  }
  uint16_t maxFramePayload() const { return maxFramePayload_; }
  // Few mbufs left: out-of-order frames are not held (conn.cc), so that holes can still be
  // received and repaired when many connections hold full reassembly windows.
  bool poolLow();
  // Frames the port refused are still queued: build no new data frames until they are out.
  bool txBacklogged() const { return txCount_ >= kTxBuffer / 2; }
  uint64_t peerTimeoutNs() const { return options_.peerTimeoutNs; }
  uint32_t pipeFrames() const { return options_.pipeFrames; }
  void sendRst(const NetAddress& to, uint32_t dstConn, uint32_t srcConn);
  void connDone(uint32_t id);  // the connection is finished: remove it after this step

  // Counters: written by the poller only (plain load+store), read by anyone.
  struct Counters {
    std::atomic<uint64_t> rxFrames{0}, txFrames{0}, rxForeign{0}, rxBadLength{0}, rxBadChecksum{0},
        rxBadHeader{0}, rxUnknownConnection{0}, rxInjectedDrops{0}, rxDuplicates{0},
        rxOutOfWindow{0}, retransmits{0}, timeouts{0}, txDrops{0}, txDataFrames{0},
        rxDataDelivered{0}, pollerBusyNs{0}, txStallInFlight{0}, txStallPeerWindow{0},
        txStallPool{0}, txStallPipe{0}, rxInjectedCorruptions{0}, rxDataPlaced{0},
        txStallBacklog{0};
  };
  static void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  Counters& counters() { return counters_; }

 private:
  struct Connecting {
    std::shared_ptr<Conn> conn;
    std::string localId;
    Deadline deadline = Deadline::never();
    uint64_t nextSynNs = 0;
    uint64_t intervalNs = 0;
    int attempts = 0;
    std::string lastProblem = "no answer";
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    Status result;
  };

  Engine(const EngineOptions& options, Port* port);
  void run();
  int drainCommands();
  int pollRx(uint64_t now);
  // A received frame: loss and corruption injection, then processFrame().
  void handleFrame(rte_mbuf* m, uint64_t now);
  void processFrame(rte_mbuf* m, uint64_t now);
  // The CRC of a Data frame parseFrame() left unchecked, copying its payload into the receive it
  // belongs to on the way when it can (Conn::placeTarget of `conn`, the connection its header
  // names, if any).
  RxVerdict checkDataCrc(ParsedFrame& f, Conn* conn);
  // conns_[id], or null.
  Conn* findConn(uint32_t id);
  void handleSyn(const ParsedFrame& f, uint64_t now);
  void handleSynAck(const ParsedFrame& f);
  void sendSyn(Connecting& c, uint64_t now);
  // A Syn or SynAck to `peer`: the set-up address block (frame.h), then `localId`.
  void sendSetUp(const NetAddress& peer, FrameHeader h, const std::string& localId);
  // The peer's id in a set-up frame whose block setUpAddressesMatch() accepted.
  static std::string setUpPeerId(const ParsedFrame& f);
  void finishConnect(Connecting& c, const Status& s);
  // The connect's deadline passed (timers, or a SynAck that came too late): it fails.
  void expireConnect(Connecting& c);
  void timers(uint64_t now);
  void pumpAll(uint64_t now);
  // Whether some connection waits for acks of frames it sent (Conn::awaitingAck).
  bool awaitingAcks() const;
  // Sends the queued frames; what the port refuses stays queued, or is freed when `final`.
  void flushTx(bool final = false);
  void reapDone();
  void flushReleased();
  void shutdownAll();
  uint64_t nextRandom();  // xorshift64*, seeded from dropSeed and the port's address
  bool dropThisFrame();
  bool dropDataFrame(const rte_mbuf* m);  // DpdkOptions::dropDataRate
  // A copy of `m` with one bit flipped anywhere in it (DpdkOptions::corruptRate); null when it
  // is empty or the pool is. A copy, because in ring mode `m` is the
  // sender's own frame, which it keeps for retransmission.
  rte_mbuf* corruptedCopy(rte_mbuf* m);
  // Free mbufs in the port's pool, for the reserve checks (allocFrame, poolLow). Exact while the
  // pool is anywhere near a threshold; with plenty free, re-read only every kPoolRecheck calls
  // and counted down by one per call meanwhile: rte_mempool_avail_count() reads the cache of
  // every possible lcore (RTE_MAX_LCORE cache lines, 8 KiB apart), which cost the sender tens
  // of ns per data frame when it ran for each one.
  unsigned poolAvail();

  const EngineOptions options_;
  Port* const port_;
  NetAddress local_;
  uint16_t maxFramePayload_ = 0;
  Counters counters_;
  // The poller's CPU clock (pthread_getcpuclockid), set once it runs; its final reading once it
  // stopped (the clock dies with the thread).
  std::atomic<bool> cpuClockSet_{false};
  clockid_t cpuClock_{};
  std::atomic<uint64_t> finalCpuNs_{0};
  uint64_t pollerCpuNs() const;

  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::mutex postMu_;
  rte_ring* commands_ = nullptr;
  // Commands posted while the ring was full, in order after it (Engine::post); under postMu_.
  std::deque<std::function<void()>> overflow_;
  std::atomic<bool> overflowing_{false};
  rte_ring* injected_ = nullptr;
  std::mutex joinMu_;

  std::unordered_map<uint32_t, std::shared_ptr<Conn>> conns_;
  // The connection findConn() returned last (frames arrive in bursts for one connection, and
  // conns_.find() divides by a prime bucket count: ~6 ns a frame); forgotten when it is reaped.
  uint32_t lastConnId_ = 0;
  Conn* lastConn_ = nullptr;
  std::vector<uint32_t> done_;
  std::map<uint32_t, std::shared_ptr<Connecting>> connecting_;
  // (peer MAC+IP, peer conn id) -> our conn id: a retransmitted Syn gets the same connection.
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> synSeen_;
  uint32_t nextConnId_;

  std::mutex listenersMu_;
  std::map<uint16_t, std::shared_ptr<ListenerState>> listeners_;

  // Data frames with this much payload have their CRC checked by checkDataCrc(), fused with the
  // copy into the posted receive where possible: one pass over the bytes instead of two (in
  // cache, ~43 against ~60 ns per 1440-byte frame with the folding CRC). Shorter ones go
  // through the crc32 instruction's copy, whose 8-byte stores lose to memcpy.
  static constexpr size_t kPlaceMinBytes = 256;
  static constexpr int kTxBuffer = 64;
  rte_mbuf* tx_[kTxBuffer];
  int txCount_ = 0;
  uint64_t txTaken_ = 0;       // frames the port has taken (flushTx), for run()'s stuck check
  uint64_t txStuckSince_ = 0;  // since when a backlog has not moved (0: none, or it moves)
  // Data frame mbufs taken from the pool kDataStash at a time (rte_pktmbuf_alloc_bulk): the
  // mbufs come back from acks a window later, cold, and one bulk call overlaps their header
  // misses where one alloc per frame paid each in turn. Freed at shutdown.
  static constexpr unsigned kDataStash = 32;
  rte_mbuf* dataStash_[kDataStash];
  unsigned dataStashCount_ = 0;
  static constexpr unsigned kReleaseBatch = 64;
  rte_mbuf* released_[kReleaseBatch];
  unsigned releasedCount_ = 0;
  unsigned poolAvail_ = 0;
  unsigned poolChecksLeft_ = 0;
  uint64_t rng_;
  uint64_t dropThreshold_ = 0;  // drop when rng < threshold (rate * 2^64)
  uint64_t corruptThreshold_ = 0;
  uint64_t dropDataThreshold_ = 0;
};

}  // namespace cofab::transport::dpdk
