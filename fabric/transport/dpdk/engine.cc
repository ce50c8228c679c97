#include "fabric/transport/dpdk/engine.h"

#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_prefetch.h>

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "fabric/transport/dpdk/dpdk_connection.h"
#include "fabric/transport/dpdk/eal.h"

namespace cofab::transport::dpdk {
namespace {

constexpr uint16_t kRxBurst = 32;
constexpr uint64_t kPreemptedNs = 200'000;
constexpr uint64_t kTickNs = 200'000;
// Sleep bound of ring ports (woken by their peer's switch); PMD ports cannot be woken, so they
// nap EngineOptions::idleNapNs (the idle policy: spin idleSpinNs, then nap).
constexpr auto kRingSleep = std::chrono::milliseconds(2);
constexpr uint64_t kMaxYieldNapNs = 500'000;  // see Engine::run's ack wait
// A TX backlog the port has taken nothing of for this long is dropped, as a wire would lose it
// (a memif peer that died, a link that is down): data frames stay with their connections.
constexpr uint64_t kTxStuckNs = 100'000'000;
// Data frames stop while fewer mbufs than this are free, so acks can always be built.
constexpr unsigned kPoolReserve = 512;
// poolAvail(): re-read the pool's count every this many calls, and at every call while fewer
// than kPoolExactBelow mbufs were free. Between reads at most kPoolRecheck frames of ours and
// the RX bursts of as many poller steps (acks and in-order data, freed in the same step, or
// frames held past a hole, each counted by a call) can go: far less than the margin.
constexpr unsigned kPoolRecheck = 32;
constexpr unsigned kPoolExactBelow = 2 * kPoolReserve + 1024;
constexpr uint64_t kSynFirstIntervalNs = 10'000'000;
constexpr uint64_t kSynMaxIntervalNs = 100'000'000;
constexpr unsigned kCommandRing = 4096;
constexpr unsigned kInjectRing = 256;

std::atomic<uint32_t> gEngineCount{0};

// The cofab header's kind byte, read without parsing (DpdkOptions::dropDataRate only).
bool isDataFrame(const rte_mbuf* m) {
  constexpr size_t kKindAt =
      kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize + offsetof(FrameHeader, kind);
  return rte_pktmbuf_data_len(m) > kKindAt &&
         rte_pktmbuf_mtod(m, const uint8_t*)[kKindAt] == static_cast<uint8_t>(FrameKind::kData);
}

void prefetchFrame(const rte_mbuf* m) {
  const auto* p = rte_pktmbuf_mtod(m, const uint8_t*);
  const uint32_t len = rte_pktmbuf_data_len(m);
  for (uint32_t off = 0; off < len; off += RTE_CACHE_LINE_SIZE) rte_prefetch0(p + off);
}

uint64_t macKey(const NetAddress& a) {
  uint64_t k = 0;
  for (uint8_t b : a.mac) k = (k << 8) | b;
  return k | (static_cast<uint64_t>(a.port) << 48);
}

}  // namespace

StatusOr<std::shared_ptr<Engine>> Engine::create(const EngineOptions& options) {
  COFAB_ASSIGN_OR_RETURN(Eal * eal, Eal::get());
  COFAB_ASSIGN_OR_RETURN(Port * port, eal->acquirePort(options.port));
  std::shared_ptr<Engine> e(new Engine(options, port));
  const uint32_t n = gEngineCount.fetch_add(1);
  const std::string cmd = "cofab_cmd" + std::to_string(n);
  e->commands_ =
      rte_ring_create(cmd.c_str(), kCommandRing, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
  const std::string inj = "cofab_inj" + std::to_string(n);
  e->injected_ = rte_ring_create(inj.c_str(), kInjectRing, SOCKET_ID_ANY, RING_F_SC_DEQ);
  if (e->commands_ == nullptr || e->injected_ == nullptr) {
    const int err = rte_errno;
    eal->releasePort(port);
    e->stopped_ = true;
    return dpdkError(StatusCode::kResourceExhausted, "rte_ring_create(" + cmd + ")", err);
  }
  // The poller keeps its engine alive while it runs, so that a callback dropping the last
  // outside reference cannot destroy the engine under it.
  e->thread_ = std::thread([self = e]() mutable {
    self->run();
    self.reset();  // may run ~Engine here, on this thread (it then detaches instead of joining)
  });
  return e;
}

Engine::Engine(const EngineOptions& options, Port* port)
    : options_(options), port_(port), nextConnId_(0) {
  local_.mac = port->mac();
  local_.ip = options.ip != 0 ? options.ip
                              : (10u << 24) | (static_cast<uint32_t>(port->mac()[3]) << 16) |
                                    (static_cast<uint32_t>(port->mac()[4]) << 8) | port->mac()[5];
  local_.port = options.udpPort;
  maxFramePayload_ =
      static_cast<uint16_t>(port->mtu() - kIpv4HeaderSize - kUdpHeaderSize - kFrameHeaderSize);
  // Connection ids start somewhere different in each context, so frames of a previous context
  // on the same port do not match a new one's connections.
  nextConnId_ = static_cast<uint32_t>(monoNs() * 2654435761u) | 1u;
  rng_ = (options.dropSeed * 0x9E3779B97F4A7C15ull) ^ macKey(local_) ^ 0xD1B54A32D192ED03ull;
  if (rng_ == 0) rng_ = 1;
  auto threshold = [](double rate) {
    return rate <= 0   ? 0
           : rate >= 1 ? UINT64_MAX
                       : static_cast<uint64_t>(rate * 18446744073709551616.0);
  };
  dropThreshold_ = threshold(options.dropRate);
  corruptThreshold_ = threshold(options.corruptRate);
  dropDataThreshold_ = threshold(options.dropDataRate);
}

Engine::~Engine() {
  stop();
  if (thread_.joinable() && thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // the poller's last act (see create()): run() has returned
  } else {
    join();
  }
  if (commands_ != nullptr) rte_ring_free(commands_);
  if (injected_ != nullptr) rte_ring_free(injected_);
}

bool Engine::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(postMu_);
    if (stopped_.load()) return false;
    // Never waits for ring space: only the poller makes it, and a poster may hold a lock the
    // poller needs (a callback posting, or an application lock also taken in a callback). A
    // full ring spills into the overflow queue, and once it holds anything every post goes
    // there too, so that commands keep their order (drainCommands empties the ring first).
    bool queued = false;
    if (overflow_.empty()) {
      auto* task = new std::function<void()>(std::move(fn));
      queued = rte_ring_sp_enqueue(commands_, task) == 0;
      if (!queued) {
        fn = std::move(*task);
        delete task;
      }
    }
    if (!queued) {
      overflow_.push_back(std::move(fn));
      overflowing_.store(true, std::memory_order_release);
    }
  }
  port_->waker().wake();
  return true;
}

void Engine::stop() {
  stopping_ = true;
  port_->waker().wake();
}

void Engine::join() {
  stop();
  std::lock_guard<std::mutex> lock(joinMu_);
  if (thread_.joinable()) {
    COFAB_CHECK(std::this_thread::get_id() != thread_.get_id())
        << "dpdk context joined from its own poller thread";
    thread_.join();
  }
}

int Engine::drainCommands() {
  void* batch[32];
  int total = 0;
  for (;;) {
    unsigned n;
    while ((n = rte_ring_sc_dequeue_burst(commands_, batch, 32, nullptr)) > 0) {
      for (unsigned i = 0; i < n; ++i) {
        auto* task = static_cast<std::function<void()>*>(batch[i]);
        (*task)();
        delete task;
      }
      total += static_cast<int>(n);
    }
    // The ring is empty, and everything in the overflow was posted after what it held.
    if (!overflowing_.load(std::memory_order_acquire)) break;
    std::deque<std::function<void()>> spilled;
    {
      std::lock_guard<std::mutex> lock(postMu_);
      spilled.swap(overflow_);
      overflowing_.store(false, std::memory_order_relaxed);
    }
    for (auto& task : spilled) task();
    total += static_cast<int>(spilled.size());
  }
  return total;
}

void Engine::run() {
  const bool registered = rte_thread_register() == 0;
  if (pthread_getcpuclockid(pthread_self(), &cpuClock_) == 0) cpuClockSet_ = true;
  uint64_t lastTick = 0;
  uint64_t idleSince = 0;
  uint64_t workStart = 0;  // start of the previous iteration when it did work
  // The yield below lasts up to two of the peer's naps past the spin, counting naps of at most
  // kMaxYieldNapNs: a user who raised the nap to save CPU does not get a core spun that long.
  const auto spinNs = static_cast<uint64_t>(std::max<int64_t>(options_.idleSpinNs, 0));
  const uint64_t ackWaitBoundNs = spinNs + 2 * std::min(options_.idleNapNs, kMaxYieldNapNs);
  while (!stopping_.load(std::memory_order_relaxed)) {
    const uint64_t now = monoNs();
    // An iteration longer than kPreemptedNs lost its core to another process (a busy one takes
    // a few microseconds): not counted, so the figure is the work and not the host's load.
    if (workStart != 0 && now - workStart < kPreemptedNs) {
      bump(counters_.pollerBusyNs, now - workStart);
    }
    const uint64_t takenBefore = txTaken_;
    int work = drainCommands();
    work += pollRx(now);
    if (now - lastTick > kTickNs) {
      timers(now);
      lastTick = now;
    }
    pumpAll(now);
    flushTx();
    reapDone();
    flushReleased();
    if (txCount_ == 0 || txTaken_ != takenBefore) {
      txStuckSince_ = 0;
      if (txCount_ > 0) ++work;  // a backlog the port is taking: no nap
    } else if (txStuckSince_ == 0) {
      txStuckSince_ = now;
    } else if (now - txStuckSince_ > kTxStuckNs) {
      // The port took nothing for kTxStuckNs. Counted as work, such a backlog kept the poller
      // spinning at 100% of a core for as long as the context lived after a memif peer died
      // (memif refuses every burst while its link is down); not counted, it naps meanwhile.
      flushTx(/*final=*/true);
      txStuckSince_ = 0;
    }
    workStart = work > 0 ? now : 0;
    if (work > 0) {
      idleSince = 0;
    } else if (idleSince == 0) {
      idleSince = now;
    } else if (options_.idleSpinNs >= 0 &&
               now - idleSince > static_cast<uint64_t>(options_.idleSpinNs)) {
      if (!port_->ringMode() && now - idleSince <= ackWaitBoundNs && awaitingAcks()) {
        // Acks are due, and a PMD port cannot wake us when they come: napping now could let
        // the two pollers fall into turns (the sender naps while the receiver acks, the
        // receiver naps while the next frames wait: one pipe per nap cycle, ~7 Gbit/s instead
        // of ~100). Give the core away instead (a peer sharing it runs), for up to two of the
        // peer's naps; a peer silent longer than that is let be.
        std::this_thread::yield();
        continue;
      }
      const Duration nap = port_->ringMode()
                               ? Duration(kRingSleep)
                               : Duration(std::chrono::nanoseconds(options_.idleNapNs));
      port_->waker().sleepFor(nap, [&] {
        return overflowing_.load() || rte_ring_count(commands_) > 0 ||
               rte_ring_count(injected_) > 0 || port_->rxPending() || stopping_.load();
      });
    }
  }
  shutdownAll();
  if (cpuClockSet_.load()) {
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) {
      finalCpuNs_ =
          static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
    }
  }
  if (registered) rte_thread_unregister();
}

void Engine::shutdownAll() {
  drainCommands();  // operations posted before the stop are cancelled, not refused
  std::map<uint16_t, std::shared_ptr<ListenerState>> ls;
  {
    std::lock_guard<std::mutex> lock(listenersMu_);
    ls.swap(listeners_);
  }
  for (auto& [port, l] : ls) l->queue().close();
  for (auto& [id, c] : connecting_) {
    finishConnect(*c, Cancelled("connect to " + c->conn->peerAddressText() +
                                ": the dpdk context was closed"));
    c->conn->fail(Cancelled("the dpdk context was closed"));
  }
  connecting_.clear();
  // Sends posted before the stop go into frames first (as far as the windows allow), then every
  // connection closes and what was sent drains, within a bound: the peer sees a Fin after the
  // last byte, like an orderly close.
  pumpAll(monoNs());
  flushTx();
  std::vector<std::shared_ptr<Conn>> all;
  for (auto& [id, c] : conns_) all.push_back(c);
  for (auto& c : all) c->close();
  const uint64_t until = monoNs() + options_.drainNs;
  reapDone();
  while (!conns_.empty() && monoNs() < until) {
    const uint64_t now = monoNs();
    drainCommands();
    pollRx(now);
    timers(now);
    pumpAll(now);
    flushTx();
    reapDone();
    if (!conns_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  all.clear();
  for (auto& [id, c] : conns_) all.push_back(c);
  for (auto& c : all) c->fail(Cancelled("the dpdk context was closed"));
  flushTx(true);
  reapDone();
  // What was posted before stopped_ runs here, against closed connections, before stopped_ is
  // set: once it is, posts fail and their callbacks run on the off-loop thread, which must not
  // overlap (or overtake) a callback of an earlier op of the same connection still run here.
  // Bounded: a callback that posts again on every failure would keep the ring busy for ever.
  for (int round = 0;; ++round) {
    {
      std::lock_guard<std::mutex> lock(postMu_);
      if (round == 64 || (rte_ring_empty(commands_) != 0 && overflow_.empty())) {
        stopped_ = true;
        break;
      }
    }
    drainCommands();
    reapDone();
  }
  drainCommands();  // only after 64 rounds of callbacks that kept posting
  reapDone();
  void* batch[32];
  unsigned n;
  while ((n = rte_ring_sc_dequeue_burst(injected_, batch, 32, nullptr)) > 0) {
    rte_pktmbuf_free_bulk(reinterpret_cast<rte_mbuf**>(batch), n);
  }
  if (dataStashCount_ > 0) rte_pktmbuf_free_bulk(dataStash_, dataStashCount_);
  dataStashCount_ = 0;
  flushReleased();
  if (auto eal = Eal::get(); eal.ok()) (*eal)->releasePort(port_);
}

uint64_t Engine::nextRandom() {
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return rng_ * 0x2545F4914F6CDD1Dull;
}

bool Engine::dropThisFrame() { return dropThreshold_ != 0 && nextRandom() < dropThreshold_; }

bool Engine::dropDataFrame(const rte_mbuf* m) {
  if (dropDataThreshold_ == 0 || !isDataFrame(m)) return false;
  return dropDataThreshold_ == UINT64_MAX || nextRandom() < dropDataThreshold_;
}

rte_mbuf* Engine::corruptedCopy(rte_mbuf* m) {
  const size_t len = rte_pktmbuf_data_len(m);
  if (m->nb_segs != 1 || len <= kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize) return nullptr;
  rte_mbuf* c = rte_pktmbuf_copy(m, m->pool, 0, UINT32_MAX);
  if (c == nullptr) return nullptr;
  // Anywhere in the frame: the Ethernet, IPv4 and UDP headers in front of the frame CRC's reach
  // as well (most of an ack's bytes), whose flips the receiver must survive without their
  // being checked by the CRC; set-up frames check theirs against the copy in their payload.
  const uint64_t bit = nextRandom() % (len * 8);
  rte_pktmbuf_mtod(c, uint8_t*)[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  return c;
}

int Engine::pollRx(uint64_t now) {
  rte_mbuf* pkts[kRxBurst];
  int total = 0;
  uint16_t n = port_->rxBurst(pkts, kRxBurst);
  // Frames another core or a device wrote: fetch the next one's lines while this one is parsed
  // and copied out, instead of stalling on each line of it when its turn comes (12 ns of ~100
  // per frame on memif zero-copy; bench/RESULTS.md, session 15).
  const bool prefetch = port_->rxArrivesCold();
  for (uint16_t i = 0; i < n; ++i) {
    if (prefetch && i + 1 < n) prefetchFrame(pkts[i + 1]);
    handleFrame(pkts[i], now);
  }
  total += n;
  const unsigned k =
      rte_ring_sc_dequeue_burst(injected_, reinterpret_cast<void**>(pkts), kRxBurst, nullptr);
  for (unsigned i = 0; i < k; ++i) handleFrame(pkts[i], now);
  return total + static_cast<int>(k);
}

void Engine::handleFrame(rte_mbuf* m, uint64_t now) {
  bump(counters_.rxFrames);
  if (dropThisFrame() || dropDataFrame(m)) {
    bump(counters_.rxInjectedDrops);
    release(m);
    return;
  }
  if (corruptThreshold_ != 0 && nextRandom() < corruptThreshold_) {
    if (rte_mbuf* c = corruptedCopy(m); c != nullptr) {
      bump(counters_.rxInjectedCorruptions);
      // Half the time the intact frame arrives first and the corrupted one as its duplicate.
      if ((nextRandom() & 1) != 0) {
        processFrame(m, now);
      } else {
        release(m);
      }
      m = c;
    }
  }
  processFrame(m, now);
}

void Engine::processFrame(rte_mbuf* m, uint64_t now) {
  ParsedFrame f;
  RxVerdict v = m->nb_segs != 1
                    ? RxVerdict::kBadLength
                    : parseFrame(rte_pktmbuf_mtod(m, const uint8_t*), rte_pktmbuf_data_len(m),
                                 local_.ip, &f, kPlaceMinBytes);
  // One lookup serves the CRC check below and the dispatch after it (nothing in between adds or
  // removes connections). It has no effect of its own, so an unchecked header may drive it.
  Conn* const conn = v == RxVerdict::kOk ? findConn(f.header.dstConn) : nullptr;
  if (v == RxVerdict::kOk && !f.crcChecked) v = checkDataCrc(f, conn);
  bool kept = false;
  switch (v) {
    case RxVerdict::kOk:
      break;
    case RxVerdict::kForeign:
      bump(counters_.rxForeign);
      break;
    case RxVerdict::kBadLength:
      bump(counters_.rxBadLength);
      break;
    case RxVerdict::kBadChecksum:
      bump(counters_.rxBadChecksum);
      break;
    case RxVerdict::kBadHeader:
      bump(counters_.rxBadHeader);
      break;
  }
  if (v == RxVerdict::kOk &&
      (f.header.kind == FrameKind::kSyn || f.header.kind == FrameKind::kSynAck) &&
      !setUpAddressesMatch(f)) {
    // Its Ethernet or UDP header is not what its sender wrote (or it is no cofab set-up frame):
    // set-up would take a wrong address from it. The sender repeats it.
    bump(counters_.rxBadHeader);
    v = RxVerdict::kBadHeader;
  }
  if (v == RxVerdict::kOk) {
    if (f.header.kind == FrameKind::kSyn) {
      handleSyn(f, now);
    } else if (f.dstPort != local_.port) {
      bump(counters_.rxForeign);
    } else if (f.header.kind == FrameKind::kSynAck) {
      handleSynAck(f);
    } else {
      if (conn != nullptr && conn->state() == Conn::State::kSynSent &&
          f.header.kind == FrameKind::kRst) {
        if (auto c = connecting_.find(f.header.dstConn); c != connecting_.end()) {
          c->second->lastProblem = "nobody listens at that address (the peer sent a reset)";
        }
      } else if (conn != nullptr && conn->state() == Conn::State::kSynSent) {
        // Our SynAck was lost and the server already talks (an ack, a keepalive): the Syn
        // retransmission brings the SynAck again; a Rst here would kill its side.
      } else if (conn != nullptr && conn->isFrom(f)) {
        kept = conn->onFrame(f, m, now);
      } else if (conn != nullptr && conn->peerConn() == f.header.srcConn) {
        // Both ids are this connection's, but the source MAC is not its peer's: a bit flipped
        // in the Ethernet header, which the frame CRC does not cover. A reset would carry the
        // ids of this connection's real peer and tear a healthy connection down: dropped.
        bump(counters_.rxUnknownConnection);
      } else {
        bump(counters_.rxUnknownConnection);
        if (f.header.kind != FrameKind::kRst) sendRst(f.src, f.header.srcConn, f.header.dstConn);
      }
    }
  }
  if (!kept) release(m);
}

Conn* Engine::findConn(uint32_t id) {
  if (lastConn_ != nullptr && id == lastConnId_) return lastConn_;
  const auto it = conns_.find(id);
  if (it == conns_.end()) return nullptr;
  lastConnId_ = id;
  lastConn_ = it->second.get();
  return lastConn_;
}

RxVerdict Engine::checkDataCrc(ParsedFrame& f, Conn* conn) {
  // The header is not to be trusted before the check, but a wrong target costs nothing (see
  // Conn::placeTarget): the frame fails its check and what it wrote is overwritten.
  if (conn != nullptr && f.dstPort == local_.port && conn->isFrom(f)) {
    if (uint8_t* dst = conn->placeTarget(f); dst != nullptr) {
      if (!checkFrameCrcCopy(f, dst)) return RxVerdict::kBadChecksum;
      f.placedAt = dst;  // counted in rxDataPlaced once delivered (it may still be dropped)
      return RxVerdict::kOk;
    }
  }
  return checkFrameCrc(f) ? RxVerdict::kOk : RxVerdict::kBadChecksum;
}

void Engine::flushReleased() {
  if (releasedCount_ > 0) rte_pktmbuf_free_bulk(released_, releasedCount_);
  releasedCount_ = 0;
}

void Engine::handleSyn(const ParsedFrame& f, uint64_t now) {
  const auto key =
      std::make_pair(macKey(f.src), (static_cast<uint64_t>(f.src.ip) << 32) | f.header.srcConn);
  std::shared_ptr<Conn> conn;
  if (auto it = synSeen_.find(key); it != synSeen_.end()) {
    if (auto c = conns_.find(it->second); c != conns_.end()) conn = c->second;
  }
  const bool fresh = conn == nullptr;
  // A repeated Syn (our SynAck was lost) gets the connection already accepted, also once its
  // listener is closed (Communicator closes it right after its last accept): a reset would fail
  // the connect while this side holds an accepted connection that then dies of silence.
  std::shared_ptr<ListenerState> l;
  if (fresh) {
    {
      std::lock_guard<std::mutex> lock(listenersMu_);
      auto it = listeners_.find(f.dstPort);
      if (it != listeners_.end()) l = it->second;
    }
    if (!l || l->queue().closed()) {
      bump(counters_.rxUnknownConnection);
      sendRst(f.src, f.header.srcConn, 0);
      return;
    }
  }
  if (fresh) {
    const uint32_t id = nextConnId_++;
    conn = std::make_shared<Conn>(this, id, f.src, f.src.toString());
    conn->setEstablished(f.src, f.header.srcConn, setUpPeerId(f));
    conn->lastHeardNs_ = now;
    conns_[id] = conn;
    synSeen_[key] = id;
  }
  FrameHeader h;
  h.kind = FrameKind::kSynAck;
  h.dstConn = f.header.srcConn;
  h.srcConn = conn->id();
  sendSetUp(f.src, h, options_.localId);
  if (fresh) l->queue().deliver(std::make_shared<DpdkConnection>(shared_from_this(), conn));
}

void Engine::sendSetUp(const NetAddress& peer, FrameHeader h, const std::string& localId) {
  const size_t idBytes = std::min<size_t>(localId.size(), maxFramePayload_ - kSetUpAddressBytes);
  h.length = static_cast<uint16_t>(kSetUpAddressBytes + idBytes);
  uint8_t* out = nullptr;
  if (rte_mbuf* m = allocFrame(peer, h, &out, false)) {
    std::memcpy(writeSetUpAddresses(out, local_, peer.port), localId.data(), idBytes);
    sealFrame(rte_pktmbuf_mtod(m, uint8_t*));
    queueTx(m);
  }
}

std::string Engine::setUpPeerId(const ParsedFrame& f) {
  return std::string(reinterpret_cast<const char*>(f.payload) + kSetUpAddressBytes,
                     f.header.length - kSetUpAddressBytes);
}

void Engine::handleSynAck(const ParsedFrame& f) {
  auto it = connecting_.find(f.header.dstConn);
  if (it == connecting_.end()) return;  // a duplicate: the connection is up already
  Connecting& c = *it->second;
  if (c.deadline.expired()) {
    // Received first (pollRx runs before timers) after the deadline: connect() has returned
    // DeadlineExceeded, or will; a connection set up now would be owned by nobody, its
    // keepalives holding the peer's accepted end open until this context is joined.
    expireConnect(c);
    connecting_.erase(it);
    return;
  }
  c.conn->setEstablished(f.src, f.header.srcConn, setUpPeerId(f));
  c.conn->lastHeardNs_ = monoNs();
  finishConnect(c, OkStatus());
  connecting_.erase(it);
}

void Engine::sendSyn(Connecting& c, uint64_t now) {
  FrameHeader h;
  h.kind = FrameKind::kSyn;
  h.srcConn = c.conn->id();
  sendSetUp(c.conn->peer(), h, c.localId);
  ++c.attempts;
  c.intervalNs =
      c.intervalNs == 0 ? kSynFirstIntervalNs : std::min(c.intervalNs * 2, kSynMaxIntervalNs);
  c.nextSynNs = now + c.intervalNs;
}

void Engine::expireConnect(Connecting& c) {
  const Status s = DeadlineExceeded(
      "connect to " + c.conn->peerAddressText() + ": no connection before the deadline after " +
      std::to_string(c.attempts) + " attempt(s); last: " + c.lastProblem);
  finishConnect(c, s);
  c.conn->fail(s);
}

void Engine::finishConnect(Connecting& c, const Status& s) {
  std::lock_guard<std::mutex> lock(c.mu);
  c.finished = true;
  c.result = s;
  c.cv.notify_all();
}

StatusOr<std::shared_ptr<Conn>> Engine::connect(const std::string& address,
                                                const std::string& localId, Deadline deadline) {
  COFAB_ASSIGN_OR_RETURN(NetAddress peer, parseNetAddress(address));
  auto c = std::make_shared<Connecting>();
  c->localId = localId;
  c->deadline = deadline;
  c->conn = std::make_shared<Conn>(this, 0, peer, address);
  auto self = shared_from_this();
  const bool posted = post([self, c] {
    if (self->stopping_.load()) {  // shutdownAll finished the connects it found; not this one
      self->finishConnect(*c, Cancelled("connect to " + c->conn->peerAddressText() +
                                        ": the dpdk context was closed"));
      return;
    }
    // The id is taken here, on the poller, which owns the id counter.
    auto conn = std::make_shared<Conn>(self.get(), self->nextConnId_++, c->conn->peer(),
                                       c->conn->peerAddressText());
    c->conn = conn;
    self->conns_[conn->id()] = conn;
    self->connecting_[conn->id()] = c;
    self->sendSyn(*c, monoNs());
  });
  if (!posted) return FailedPrecondition("connect to " + address + ": the dpdk context is closed");
  std::unique_lock<std::mutex> lock(c->mu);
  // The poller enforces the deadline; the extra second only guards against a stuck poller.
  const Deadline guard =
      deadline.isNever() ? deadline : Deadline::at(deadline.when() + Millis(1000));
  while (!c->finished) {
    if (guard.isNever()) {
      c->cv.wait(lock);
    } else if (c->cv.wait_until(lock, guard.when()) == std::cv_status::timeout) {
      return DeadlineExceeded("connect to " + address + ": the dpdk poller did not answer");
    }
  }
  if (!c->result.ok()) return c->result;
  return c->conn;
}

void Engine::timers(uint64_t now) {
  for (auto it = connecting_.begin(); it != connecting_.end();) {
    Connecting& c = *it->second;
    if (c.deadline.expired()) {
      expireConnect(c);
      it = connecting_.erase(it);
      continue;
    }
    if (now >= c.nextSynNs) sendSyn(c, now);
    ++it;
  }
  for (auto& [id, c] : conns_) c->tick(now);
}

void Engine::pumpAll(uint64_t now) {
  for (auto& [id, c] : conns_) {
    if (c->wantsPump()) c->pump(now);
  }
}

bool Engine::awaitingAcks() const {
  for (const auto& [id, c] : conns_) {
    if (c->awaitingAck()) return true;
  }
  return false;
}

void Engine::connDone(uint32_t id) { done_.push_back(id); }

void Engine::reapDone() {
  if (done_.empty()) return;
  for (uint32_t id : done_) {
    if (id == lastConnId_) lastConn_ = nullptr;
    conns_.erase(id);
    std::erase_if(synSeen_, [id](const auto& kv) { return kv.second == id; });
  }
  done_.clear();
}

unsigned Engine::poolAvail() {
  if (poolChecksLeft_ == 0 || poolAvail_ < kPoolExactBelow) {
    poolAvail_ = rte_mempool_avail_count(port_->pool());
    poolChecksLeft_ = kPoolRecheck;
  }
  --poolChecksLeft_;
  const unsigned avail = poolAvail_;
  if (poolAvail_ > 0) --poolAvail_;  // each call may be about to take one (never over-counts)
  return avail;
}

bool Engine::poolLow() { return poolAvail() < 2 * kPoolReserve; }

rte_mbuf* Engine::allocFrame(const NetAddress& peer, const FrameHeader& h, uint8_t** payload,
                             bool data) {
  if (data && poolAvail() < kPoolReserve) return nullptr;
  rte_mbuf* m = rte_pktmbuf_alloc(port_->pool());
  if (m == nullptr) return nullptr;
  auto* p = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(frameSize(h))));
  if (p == nullptr) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  *payload = writeFrameHeaders(p, local_, peer, h);
  return m;
}

rte_mbuf* Engine::allocDataFrame(const FrameTemplate& t, uint32_t seq, uint8_t** payload) {
  if (poolAvail() < kPoolReserve) return nullptr;
  if (dataStashCount_ == 0 && rte_pktmbuf_alloc_bulk(port_->pool(), dataStash_, kDataStash) == 0) {
    dataStashCount_ = kDataStash;
  }
  rte_mbuf* m =
      dataStashCount_ > 0 ? dataStash_[--dataStashCount_] : rte_pktmbuf_alloc(port_->pool());
  if (m == nullptr) return nullptr;
  auto* p = reinterpret_cast<uint8_t*>(
      rte_pktmbuf_append(m, static_cast<uint16_t>(kFrameOverhead + t.length)));
  if (p == nullptr) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  *payload = stampFrame(p, t, seq);
  return m;
}

bool Engine::queueTx(rte_mbuf* m) {
  if (txCount_ == kTxBuffer) flushTx();
  if (txCount_ == kTxBuffer) {
    // The port stayed full: this frame is lost as on a wire (a data frame is kept by its
    // connection and retransmitted; an ack is sent again, Conn::sendAck).
    bump(counters_.txDrops);
    rte_pktmbuf_free(m);
    return false;
  }
  tx_[txCount_++] = m;
  return true;
}

void Engine::flushTx(bool final) {
  int sent = 0;
  int stalls = 0;
  while (sent < txCount_ && stalls < 64) {
    const uint16_t n = port_->txBurst(tx_ + sent, static_cast<uint16_t>(txCount_ - sent));
    sent += n;
    txTaken_ += n;
    if (n == 0) {
      ++stalls;
      rte_pause();
    }
  }
  bump(counters_.txFrames, static_cast<uint64_t>(sent));
  if (sent < txCount_ && final) {
    bump(counters_.txDrops, static_cast<uint64_t>(txCount_ - sent));
    rte_pktmbuf_free_bulk(tx_ + sent, static_cast<unsigned>(txCount_ - sent));
    sent = txCount_;
  }
  // What the port did not take (its ring is full: the peer is behind) waits for the next
  // burst, and connections build no new data frames meanwhile (txBacklogged()). Dropping it
  // instead, as before, turned a full memif ring into losses the window then had to repair:
  // ~2000 retransmissions a second in the lossless bench with the 1024-frame window.
  std::memmove(tx_, tx_ + sent, static_cast<size_t>(txCount_ - sent) * sizeof(rte_mbuf*));
  txCount_ -= sent;
}

void Engine::sendRst(const NetAddress& to, uint32_t dstConn, uint32_t srcConn) {
  FrameHeader h;
  h.kind = FrameKind::kRst;
  h.dstConn = dstConn;
  h.srcConn = srcConn;
  NetAddress dst = to;
  uint8_t* out = nullptr;
  if (rte_mbuf* m = allocFrame(dst, h, &out, false)) {
    sealFrame(rte_pktmbuf_mtod(m, uint8_t*));
    queueTx(m);
  }
}

StatusOr<std::shared_ptr<ListenerState>> Engine::listen(const std::string& address) {
  if (stopping_.load()) return FailedPrecondition("listen: the dpdk context is closed");
  uint16_t want = 0;
  if (!address.empty()) {
    COFAB_ASSIGN_OR_RETURN(NetAddress a, parseNetAddress(address));
    if (a.mac != local_.mac || a.ip != local_.ip) {
      return InvalidArgument("listen on " + address + ": not this dpdk context's address (" +
                             NetAddress{local_.mac, local_.ip, a.port}.toString() + ")");
    }
    if (a.port == local_.port) {
      return InvalidArgument("listen on " + address + ": port " + std::to_string(a.port) +
                             " carries this context's connections; pick another");
    }
    want = a.port;
  }
  std::lock_guard<std::mutex> lock(listenersMu_);
  // Again under the lock that shutdownAll takes to close the listeners: a stop since the first
  // look would otherwise leave this one open, its accepts waiting for ever.
  if (stopping_.load()) return FailedPrecondition("listen: the dpdk context is closed");
  if (want == 0) {
    for (uint32_t p = local_.port + 1u; p < 65536u; ++p) {
      if (!listeners_.count(static_cast<uint16_t>(p))) {
        want = static_cast<uint16_t>(p);
        break;
      }
    }
    if (want == 0) return ResourceExhausted("listen: no free UDP port on this dpdk context");
  } else if (listeners_.count(want)) {
    return Unavailable("listen on " + address + ": address already in use");
  }
  NetAddress a{local_.mac, local_.ip, want};
  std::weak_ptr<Engine> weak = shared_from_this();
  auto l = std::make_shared<ListenerState>(a.toString(), want, [weak](std::function<void()> fn) {
    auto e = weak.lock();
    return e && e->post(std::move(fn));
  });
  listeners_[want] = l;
  return l;
}

void Engine::closeListener(const std::shared_ptr<ListenerState>& l) {
  {
    std::lock_guard<std::mutex> lock(listenersMu_);
    auto it = listeners_.find(l->port());
    if (it != listeners_.end() && it->second == l) listeners_.erase(it);
  }
  l->queue().close();
}

Status Engine::inject(std::span<const uint8_t> frame) {
  if (stopped_.load()) return FailedPrecondition("inject: the dpdk context is closed");
  if (frame.size() > 9000) {
    return InvalidArgument("inject: a frame of " + std::to_string(frame.size()) +
                           " bytes is longer than any port's frame");
  }
  rte_mbuf* m = rte_pktmbuf_alloc(port_->pool());
  if (m == nullptr) return ResourceExhausted("inject: the mbuf pool is empty");
  auto* p = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(frame.size())));
  if (p == nullptr) {
    rte_pktmbuf_free(m);
    return InvalidArgument("inject: a frame of " + std::to_string(frame.size()) +
                           " bytes does not fit an mbuf");
  }
  if (!frame.empty()) std::memcpy(p, frame.data(), frame.size());
  if (rte_ring_mp_enqueue(injected_, m) != 0) {
    rte_pktmbuf_free(m);
    return ResourceExhausted("inject: the injection queue is full");
  }
  port_->waker().wake();
  return OkStatus();
}

DpdkStats Engine::stats() const {
  const auto& c = counters_;
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  return DpdkStats{r(c.rxFrames),
                   r(c.txFrames),
                   r(c.rxForeign),
                   r(c.rxBadLength),
                   r(c.rxBadChecksum),
                   r(c.rxBadHeader),
                   r(c.rxUnknownConnection),
                   r(c.rxInjectedDrops),
                   r(c.rxDuplicates),
                   r(c.rxOutOfWindow),
                   r(c.retransmits),
                   r(c.timeouts),
                   r(c.txDrops),
                   r(c.txDataFrames),
                   r(c.rxDataDelivered),
                   pollerCpuNs(),
                   r(c.pollerBusyNs),
                   r(c.txStallInFlight),
                   r(c.txStallPeerWindow),
                   r(c.txStallPool),
                   r(c.txStallPipe),
                   r(c.rxInjectedCorruptions),
                   r(c.rxDataPlaced),
                   r(c.txStallBacklog)};
}

uint64_t Engine::pollerCpuNs() const {
  if (const uint64_t f = finalCpuNs_.load(); f != 0) return f;
  if (!cpuClockSet_.load()) return 0;
  timespec ts{};
  if (clock_gettime(cpuClock_, &ts) != 0) return finalCpuNs_.load();
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace cofab::transport::dpdk
