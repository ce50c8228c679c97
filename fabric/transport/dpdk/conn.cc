#include "fabric/transport/dpdk/conn.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "fabric/transport/dpdk/engine.h"
#include "fabric/wire/crc32c.h"

namespace cofab::transport::dpdk {
namespace {

constexpr uint64_t kInitialRtoNs = 5'000'000;
constexpr uint64_t kMinRtoNs = 1'000'000;
constexpr uint64_t kMaxRtoNs = 200'000'000;
constexpr uint64_t kKeepaliveNs = 100'000'000;
// Backup hole retransmission (retransmitHoles(); RACK does the fast part): a hole below a SACKed
// frame is also resent once it is SRTT + max(4 RTTVAR, this) old, from the timer when acks stop.
constexpr uint64_t kFastRetransmitSlackNs = 50'000;
// Retransmissions per timer tick per connection: bounds the burst after a long stall.
constexpr int kMaxRetransmitsPerTick = 64;

// Time since `then`; 0 when `then` was sampled after `now` (timestamps from different reads).
uint64_t elapsed(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

}  // namespace

Conn::Conn(Engine* engine, uint32_t id, NetAddress peer, std::string peerAddressText)
    : engine_(engine),
      id_(id),
      peer_(peer),
      peerAddressText_(std::move(peerAddressText)),
      rtoNs_(kInitialRtoNs) {}

Conn::~Conn() {
  // The engine fails every connection before it lets go of it; this only frees what is left.
  releaseInFlight();
}

std::string Conn::describe() const {
  return "dpdk connection to '" + peerName_ + "' (" + peerAddressText_ + ")";
}

Status Conn::statusSnapshot() const {
  std::lock_guard<std::mutex> lock(statusMu_);
  return status_;
}

void Conn::setError(const Status& s) {
  if (!error_.ok()) return;
  error_ = s;
  std::lock_guard<std::mutex> lock(statusMu_);
  if (status_.ok()) status_ = s;  // a close the poller has not run yet already set it
}

void Conn::noteClosedByApp() {
  std::lock_guard<std::mutex> lock(statusMu_);
  if (status_.ok()) status_ = Cancelled(describe() + " was closed locally");
}

void Conn::setEstablished(const NetAddress& peer, uint32_t peerConn, std::string peerName) {
  peer_ = peer;  // connections send from the peer's connection port, not its listener's
  peerConn_ = peerConn;
  peerName_ = std::move(peerName);
  state_ = State::kEstablished;
}

void Conn::send(const wire::Header& header, std::vector<ConstSlice> payload, SendCallback done) {
  Status bad;
  for (size_t i = 0; i < payload.size() && bad.ok(); ++i) {
    if (payload[i].data == nullptr && payload[i].size > 0) {
      bad =
          InvalidArgument("send on " + describe() + ": slice " + std::to_string(i) +
                          " has a null pointer and " + std::to_string(payload[i].size) + " bytes");
    }
  }
  wire::Header h = header;
  if (bad.ok()) {
    h.payloadLength = totalSize(ConstSlices(payload));
    h.payloadCrc = 0;
    if (h.hasPayloadCrc()) {
      for (const auto& s : payload) h.payloadCrc = wire::crc32c(h.payloadCrc, s.data, s.size);
    }
    bad = wire::validateHeader(h, wire::DecodeOptions{UINT64_MAX});
    if (!bad.ok()) bad = bad.withContext("send on " + describe());
  }
  if (bad.ok() && closedByApp_) {
    bad = FailedPrecondition("send on " + describe() + ": the connection is closed");
  }
  if (bad.ok() && !error_.ok()) bad = error_;
  if (bad.ok() && peerGone_) bad = goneWhy_;  // what status() says (nothing reaches the peer)
  if (!bad.ok()) {
    if (sends_.empty()) {
      if (done) done(bad);
    } else {
      // Earlier sends are still being framed: this one's callback comes after theirs.
      SendOp refused;
      refused.done = std::move(done);
      refused.refused = bad;
      sends_.push_back(std::move(refused));
    }
    return;
  }
  SendOp op;
  wire::encodeHeader(h, op.header.data());
  op.total = wire::kHeaderSize + h.payloadLength;
  std::erase_if(payload, [](const ConstSlice& s) { return s.size == 0; });
  op.slices = std::move(payload);
  op.done = std::move(done);
  sends_.push_back(std::move(op));
  pumpWanted_ = true;
}

void Conn::recv(std::vector<MutableSlice> dest, RecvCallback done) {
  RecvOp op;
  op.done = std::move(done);
  Status bad;
  for (size_t i = 0; i < dest.size(); ++i) {
    if (dest[i].data == nullptr && dest[i].size > 0 && bad.ok()) {
      bad = InvalidArgument("recv on " + describe() + ": slice " + std::to_string(i) +
                            " has a null pointer and " + std::to_string(dest[i].size) + " bytes");
    }
    op.expected += dest[i].size;
  }
  if (bad.ok() && closedByApp_) {
    bad = FailedPrecondition("recv on " + describe() + ": the connection is closed");
  }
  if (bad.ok() && !error_.ok()) bad = error_;
  if (!bad.ok()) {
    if (recvs_.empty()) {
      if (op.done) op.done(bad, wire::Header{});
    } else {  // after the earlier receives' callbacks
      op.refused = bad;
      recvs_.push_back(std::move(op));
    }
    return;
  }
  std::erase_if(dest, [](const MutableSlice& s) { return s.size == 0; });
  op.dest = std::move(dest);
  recvs_.push_back(std::move(op));
  deliver();
}

void Conn::recvOwned(RecvOwnedCallback done) { recvRouted(nullptr, std::move(done)); }

void Conn::recvRouted(RecvRoute route, RecvOwnedCallback done) {
  Status bad;
  if (closedByApp_)
    bad = FailedPrecondition("recv on " + describe() + ": the connection is closed");
  if (bad.ok() && !error_.ok()) bad = error_;
  if (!bad.ok()) {
    if (recvs_.empty()) {
      if (done) done(bad, wire::Header{}, {});
    } else {  // after the earlier receives' callbacks
      RecvOp op;
      op.owned = true;
      op.ownedDone = std::move(done);
      op.refused = bad;
      recvs_.push_back(std::move(op));
    }
    return;
  }
  RecvOp op;
  op.owned = true;
  op.ownedDone = std::move(done);
  op.route = std::move(route);
  recvs_.push_back(std::move(op));
  deliver();
}

void Conn::completeRecv(RecvOp& op, const Status& s, const wire::Header& h,
                        std::vector<uint8_t>&& owned) {
  if (op.ownedDone) {
    op.ownedDone(s, h, std::move(owned));
  } else if (op.done) {
    op.done(s, h);
  }
}

void Conn::failOps(const Status& s) {
  // Pop before calling: a callback may post more operations (they run later, as commands).
  while (!recvs_.empty()) {
    RecvOp op = std::move(recvs_.front());
    recvs_.pop_front();
    completeRecv(op, op.refused.ok() ? s : op.refused, wire::Header{}, {});
  }
  failSends(s);
}

void Conn::failSends(const Status& s) {
  while (!sends_.empty()) {
    SendOp op = std::move(sends_.front());
    sends_.pop_front();
    if (op.done) op.done(op.refused.ok() ? s : op.refused);
  }
}

void Conn::completeRefusedSends() {
  while (!sends_.empty() && !sends_.front().refused.ok() && state_ != State::kDone) {
    SendOp op = std::move(sends_.front());
    sends_.pop_front();
    if (op.done) op.done(op.refused);
  }
}

void Conn::completeRefusedRecvs() {
  while (!recvs_.empty() && !recvs_.front().refused.ok() && state_ != State::kDone) {
    RecvOp op = std::move(recvs_.front());
    recvs_.pop_front();
    completeRecv(op, op.refused, wire::Header{}, {});
  }
}

void Conn::close() {
  if (closedByApp_ || state_ == State::kDone) return;
  closedByApp_ = true;
  const bool healthy = error_.ok();
  setError(Cancelled(describe() + " was closed locally"));
  // A half-segmented message cannot be taken back from the stream: the peer sees the Fin in the
  // middle of it and fails its receive, which is what a cancelled send means to it.
  failOps(error_);
  // Nothing more will be read: what waits in the reassembly window goes now.
  releaseReceived();
  headOffset_ = 0;
  if (!healthy || state_ != State::kEstablished || peerGone_) {  // no one to drain to
    state_ = State::kDone;
    releaseInFlight();
    engine_->connDone(id_);
    return;
  }
  state_ = State::kClosing;
  finQueued_ = true;
  closeNs_ = monoNs();
  pumpWanted_ = true;
}

void Conn::finish() {
  // A frame the peer sent last (its Fin, say) still gets its ack, or the peer would drain until
  // its own bound.
  if (ackPending_ && peerConn_ != 0 && !peerGone_) sendAck(monoNs());
  state_ = State::kDone;
  releaseInFlight();
  engine_->connDone(id_);
}

void Conn::fail(const Status& s) {
  if (state_ == State::kDone) return;
  if (ackPending_ && peerConn_ != 0 && state_ != State::kSynSent && !peerGone_) {
    sendAck(monoNs());
  }
  setError(s);
  failOps(error_);
  state_ = State::kDone;
  releaseInFlight();
  engine_->connDone(id_);
}

void Conn::releaseSent() {
  for (uint32_t s = una_; s != nxt_; ++s) {
    auto& f = inflight_[s % kWindow];
    if (f.m != nullptr) rte_pktmbuf_free(f.m);
    f = InFlight{};
  }
  una_ = nxt_;
}

void Conn::peerWentAway(const Status& why) {
  peerGone_ = true;
  goneWhy_ = why;
  ackPending_ = false;
  releaseSent();
  {
    // status() reports it from now on, in the failed sends' callbacks too (the contract's
    // sticky first error), while what the peer sent before its Fin stays readable: error_,
    // which fails receives, is left alone, as tcp keeps reading queued data after its failure.
    std::lock_guard<std::mutex> lock(statusMu_);
    if (status_.ok()) status_ = why;
  }
  failSends(why);
}

void Conn::releaseReceived() {
  for (auto& slot : rx_) {
    if (slot.m != nullptr) rte_pktmbuf_free(slot.m);
    slot = RxSlot{};
  }
  rcvHead_ = rcvNxt_;
}

void Conn::releaseInFlight() {
  releaseSent();
  releaseReceived();
}

void Conn::transmit(uint32_t seq, uint64_t now) {
  auto& f = inflight_[seq % kWindow];
  // Ours stays; the PMD (or the peer, in ring mode) frees one. A frame never sent is ours
  // alone, so its count is simply set (no locked add); a resend may race the peer's free.
  if (f.transmissions == 0) {
    if (seq == una_) progressNs_ = now;  // the pipe was empty: the wait for acks starts here
    rte_mbuf_refcnt_set(f.m, 2);
  } else {
    rte_mbuf_refcnt_update(f.m, 1);
  }
  engine_->queueTx(f.m);
  f.sentNs = now;
  f.order = ++xmitOrder_;
  ++f.transmissions;
}

bool Conn::buildDataFrame(uint64_t now) {
  if (sends_.empty()) return false;
  if (nxt_ - una_ >= kWindow - 1 || !seqLess(nxt_ + 1, peerWindowEnd_) || pipeFull()) {
    return false;  // the window's last frame is the Fin's (buildFin)
  }
  if (engine_->txBacklogged()) {
    pumpWanted_ = true;  // again at the next step, after the port took the backlog
    return false;
  }
  size_t avail = 0;
  for (const auto& op : sends_) {
    avail += op.total - op.offset;
    if (avail >= engine_->maxFramePayload()) break;
  }
  FrameHeader h;
  h.kind = FrameKind::kData;
  h.dstConn = peerConn_;
  h.srcConn = id_;
  h.seq = nxt_;
  h.length = static_cast<uint16_t>(std::min<size_t>(avail, engine_->maxFramePayload()));
  uint8_t* out = nullptr;
  rte_mbuf* m;
  const bool full = h.length == engine_->maxFramePayload();
  if (full) {
    if (dataTemplate_.length != h.length) {
      dataTemplate_ = makeFrameTemplate(engine_->local(), peer_, h);
    }
    m = engine_->allocDataFrame(dataTemplate_, nxt_, &out);
  } else {
    m = engine_->allocFrame(peer_, h, &out, true);  // a message's tail: a shorter frame
  }
  if (m == nullptr) {
    // The pool's reserve: mbufs come back when acked frames are freed at the end of this step
    // (Engine::flushReleased) or a peer frees ours, with nothing that would pump us again
    // (an ack that already came, a peer that only sends keepalives): retry at the next step.
    pumpWanted_ = true;
    return false;
  }
  uint8_t* const payload = out;
  // The frame CRC is computed while the payload is copied in: one pass over the bytes.
  uint32_t crc = full ? frameCrcStart(dataTemplate_, nxt_) : frameCrcStart(payload);
  size_t room = h.length;
  while (room > 0) {
    SendOp& op = sends_.front();
    // The op's stream: the 64 header bytes, then its slices.
    while (room > 0 && op.offset < op.total) {
      size_t take;
      if (op.offset < wire::kHeaderSize) {
        take = std::min(room, wire::kHeaderSize - op.offset);
        crc = wire::crc32cCopy(crc, out, op.header.data() + op.offset, take);
      } else {
        size_t off = op.offset - wire::kHeaderSize;
        size_t i = 0;
        while (off >= op.slices[i].size) off -= op.slices[i++].size;
        take = std::min(room, op.slices[i].size - off);
        crc =
            wire::crc32cCopy(crc, out, static_cast<const uint8_t*>(op.slices[i].data) + off, take);
      }
      out += take;
      room -= take;
      op.offset += take;
    }
    if (op.offset == op.total) {
      // Every byte is in a frame we own: the caller's memory is free again.
      SendOp done = std::move(op);
      sends_.pop_front();
      if (done.done) done.done(OkStatus());
      completeRefusedSends();
      if (state_ == State::kDone) {  // the callback cannot fail us, but stay defensive
        rte_pktmbuf_free(m);
        return false;
      }
    }
  }
  setFrameCrc(payload, crc);
  auto& f = inflight_[nxt_ % kWindow];
  f = InFlight{m, 0, 0, false};
  Engine::bump(engine_->counters().txDataFrames);
  transmit(nxt_, now);
  ++nxt_;
  return true;
}

bool Conn::buildFin(uint64_t now) {
  if (!finQueued_ || finSent_ || !sends_.empty()) return false;
  // Data frames leave the window's last frame free, so the Fin always fits, also when the peer
  // reads nothing more: a Fin that waited for window space made such a close give up without
  // one, and the peer, which held everything sent before it, then took our later reset for a
  // failure and dropped messages we had reported sent (with the Fin held, they stay readable).
  if (nxt_ - una_ >= kWindow || !seqLess(nxt_, peerWindowEnd_)) return false;
  FrameHeader h;
  h.kind = FrameKind::kFin;
  h.dstConn = peerConn_;
  h.srcConn = id_;
  h.seq = nxt_;
  uint8_t* out = nullptr;
  rte_mbuf* m = engine_->allocFrame(peer_, h, &out, true);
  if (m == nullptr) {  // the pool's reserve: again at the next step (as buildDataFrame)
    pumpWanted_ = true;
    return false;
  }
  sealFrame(rte_pktmbuf_mtod(m, uint8_t*));
  inflight_[nxt_ % kWindow] = InFlight{m, 0, 0, false};
  transmit(nxt_, now);
  ++nxt_;
  finSent_ = true;
  return true;
}

bool Conn::pipeFull() const {
  // The pipe: frames sent after the newest one known delivered (acked or SACKed). What lies
  // below it is either delivered or a hole being repaired, and is not queued in the rings. Why
  // bound it separately from the window: a ring between the pollers as deep as the window
  // (memif's default 1024 slots) fills to the window under a receiver-bound load, and then a
  // hole's retransmission queues behind a full ring, the window runs out behind the hole, and
  // the sender stalls for a ring's drain per hole: at 10% loss, most of the time.
  const uint32_t delivered = seqLess(una_, highestSacked_) ? highestSacked_ : una_;
  return nxt_ - delivered >= engine_->pipeFrames();
}

void Conn::sendAck(uint64_t now) {
  FrameHeader h;
  h.kind = FrameKind::kAck;
  h.dstConn = peerConn_;
  h.srcConn = id_;
  h.ack = rcvNxt_;
  h.window = rcvHead_ + kWindow;
  // Nothing is held past rcvMax_ (one past the highest frame held; rcvNxt_ is missing): without
  // holes, the common case, the ack carries no bitmap at all, so neither side builds, checksums
  // or scans 128 zero bytes per ack (one ack per receive burst).
  const bool holes = seqLess(rcvNxt_ + 1, rcvMax_);
  h.length = holes ? kSackBytes : 0;
  uint8_t* out = nullptr;
  rte_mbuf* m = engine_->allocFrame(peer_, h, &out, false);
  if (m == nullptr) {  // the pool's reserve: retried at the next step (ackPending_ stays)
    pumpWanted_ = true;
    return;
  }
  if (holes) {
    std::memset(out, 0, kSackBytes);
    for (uint32_t i = 0; i < kSackBits; ++i) {
      const uint32_t seq = rcvNxt_ + 1 + i;
      if (!seqLess(seq, rcvMax_) || !seqLess(seq, rcvHead_ + kWindow)) break;
      if (rx_[seq % kWindow].m != nullptr) out[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
  }
  sealFrame(rte_pktmbuf_mtod(m, uint8_t*));
  if (!engine_->queueTx(m)) {
    // Dropped before it left: it may be the window update a blocked sender waits for, and
    // nothing else would repeat it before the keepalive (100 ms). Again at the next step.
    pumpWanted_ = true;
    return;
  }
  ackPending_ = false;
  advertisedEnd_ = h.window;
  lastAckNs_ = now;
}

void Conn::pump(uint64_t now) {
  pumpWanted_ = false;
  if (state_ != State::kEstablished && state_ != State::kClosing) return;
  if (peerGone_) return;  // sends failed, and acks would only draw resets
  while (buildDataFrame(now)) {
  }
  if (!sends_.empty()) {
    auto& c = engine_->counters();
    Engine::bump(nxt_ - una_ >= kWindow - 1           ? c.txStallInFlight
                 : !seqLess(nxt_ + 1, peerWindowEnd_) ? c.txStallPeerWindow
                 : pipeFull()                         ? c.txStallPipe
                 : engine_->txBacklogged()            ? c.txStallBacklog
                                                      : c.txStallPool);
  }
  buildFin(now);
  if (ackPending_) sendAck(now);
}

void Conn::updateRtt(uint64_t sample) {
  // RFC 6298 smoothing.
  if (srttNs_ == 0) {
    srttNs_ = sample;
    rttvarNs_ = sample / 2;
  } else {
    const uint64_t diff = sample > srttNs_ ? sample - srttNs_ : srttNs_ - sample;
    rttvarNs_ = (3 * rttvarNs_ + diff) / 4;
    srttNs_ = (7 * srttNs_ + sample) / 8;
  }
  rtoNs_ = std::clamp(srttNs_ + 4 * rttvarNs_, kMinRtoNs, kMaxRtoNs);
}

void Conn::onAck(const ParsedFrame& f, uint64_t now) {
  const uint32_t ack = f.header.ack;
  if (seqLess(nxt_, ack)) return;  // acks something never sent: ignore
  if (seqLess(peerWindowEnd_, f.header.window)) {
    peerWindowEnd_ = f.header.window;
    pumpWanted_ = true;
  }
  if (seqLess(una_, ack)) {
    const auto& last = inflight_[(ack - 1) % kWindow];
    // RTT samples only from frames sent once (Karn) and acknowledged for the first time now: a
    // frame SACKed earlier was held back behind a hole, and its late cumulative ack says
    // nothing about the path's round trip. Under steady loss there is nearly always a hole, so
    // SACKs give samples too (below); without them SRTT froze at its first value and the holes'
    // fast retransmit waited on a stale, often inflated, estimate.
    if (last.transmissions == 1 && last.m != nullptr) {
      rackOrder_ = std::max(rackOrder_, last.order);
    }
    if (!last.sacked && last.transmissions == 1 && last.m != nullptr) {
      updateRtt(elapsed(now, last.sentNs));
    } else if (srttNs_ != 0) {
      rtoNs_ = std::clamp(srttNs_ + 4 * rttvarNs_, kMinRtoNs, kMaxRtoNs);  // progress: no backoff
    }
    for (uint32_t s = una_; s != ack; ++s) {
      auto& fl = inflight_[s % kWindow];
      if (fl.m != nullptr) engine_->release(fl.m);
      fl = InFlight{};
    }
    una_ = ack;
    progressNs_ = now;
    if (state_ == State::kClosing) closeNs_ = now;             // the drain made progress
    if (seqLess(highestSacked_, una_)) highestSacked_ = una_;  // keeps it within 2^31 of una_
    pumpWanted_ = true;
  }
  if (f.header.length >= kSackBytes) {
    uint32_t highest = una_;
    bool any = false;
    uint64_t newestSample = 0;  // sent time of the latest frame SACKed for the first time
    uint64_t newestOrder = 0;   // and its transmission order
    for (uint32_t i = 0; i < kSackBits; ++i) {
      if (f.payload[i / 8] == 0) {  // skip empty bytes: most of a 1024-bit bitmap
        i |= 7;
        continue;
      }
      if ((f.payload[i / 8] >> (i % 8)) & 1u) {
        const uint32_t seq = ack + 1 + i;
        if (seqLess(seq, una_) || !seqLess(seq, nxt_)) continue;
        auto& fl = inflight_[seq % kWindow];
        if (!fl.sacked && fl.transmissions == 1 && fl.m != nullptr) {
          newestSample = std::max(newestSample, fl.sentNs);
          newestOrder = std::max(newestOrder, fl.order);
        }
        if (!fl.sacked) progressNs_ = now;  // frames get through, if not the oldest one yet
        fl.sacked = true;
        highest = seq;
        any = true;
      }
    }
    if (newestSample != 0) {
      updateRtt(elapsed(now, newestSample));
      rackOrder_ = std::max(rackOrder_, newestOrder);
    }
    if (any && seqLess(highestSacked_, highest + 1)) {
      highestSacked_ = highest + 1;
      pumpWanted_ = true;  // the pipe emptied by that much
    }
    if (any) retransmitHoles(now);
  }
  if (state_ == State::kClosing && finSent_ && una_ == nxt_) {
    finish();  // drained: the peer has everything, including the Fin
  }
}

void Conn::retransmitHoles(uint64_t now) {
  if (!seqLess(una_, highestSacked_)) return;
  // Old enough that the ack of its previous transmission should be back: SRTT plus the RTO's
  // variance term (at least the slack). 1.25 × SRTT + 50 µs resent holes again while acks built
  // before the retransmission arrived were still coming (under a loaded host's RTT spread, up to
  // 1.7 retransmissions per injected drop; about 1.05 with the variance term).
  //
  // RACK without a reordering window: a point-to-point link (memif, a cable, one switch) does
  // not reorder, so a hole whose last transmission went out before a frame known delivered
  // was lost, and it is resent at once rather than a variance-padded SRTT later. Only frames
  // sent once advance rackOrder_ (Karn: the ack of a retransmitted frame may be its first
  // copy's), and a resent hole waits until a frame sent after the resend is delivered, so a
  // hole is not resent again while its retransmission is still on the way. "Before" is by
  // transmission order: compared by send time, a hole and the frames after it in one burst
  // (one timestamp) were never before one another, and such holes waited out the SRTT.
  const uint64_t age = srttNs_ + std::max<uint64_t>(4 * rttvarNs_, kFastRetransmitSlackNs);
  for (uint32_t s = una_; seqLess(s, highestSacked_) && seqLess(s, nxt_); ++s) {
    auto& fl = inflight_[s % kWindow];
    if (fl.m != nullptr && !fl.sacked && (fl.order < rackOrder_ || elapsed(now, fl.sentNs) > age)) {
      transmit(s, now);
      Engine::bump(engine_->counters().retransmits);
    }
  }
}

void Conn::onSequenced(const ParsedFrame& f, rte_mbuf* m, bool& kept) {
  const uint32_t seq = f.header.seq;
  ackPending_ = true;
  if (seqLess(seq, rcvNxt_)) {
    Engine::bump(engine_->counters().rxDuplicates);
    return;
  }
  if (!seqLess(seq, rcvHead_ + kWindow)) {
    Engine::bump(engine_->counters().rxOutOfWindow);
    return;
  }
  RxSlot& slot = rx_[seq % kWindow];
  if (slot.m != nullptr) {
    Engine::bump(engine_->counters().rxDuplicates);
    return;
  }
  // Frames held past a hole come from the receiving port's pool. With 1024-frame windows a
  // handful of connections with holes could empty it, and then the retransmissions that fill
  // the holes could not be received: past a hole, frames are dropped (resent later) when the
  // pool runs low, so the in-order frame can always get in.
  if (seq != rcvNxt_ && engine_->poolLow()) {
    Engine::bump(engine_->counters().rxOutOfWindow);
    return;
  }
  slot.m = m;
  slot.payload = f.payload;
  slot.length = f.header.length;
  slot.fin = f.header.kind == FrameKind::kFin;
  slot.frameCrc = f.header.crc;
  slot.headerCrc = f.headerCrc;
  slot.placedAt = f.placedAt;
  kept = true;
  if (slot.fin) {
    finHeld_ = true;
    finSeq_ = seq;
  }
  if (!seqLess(seq, rcvMax_)) rcvMax_ = seq + 1;
  while (rx_[rcvNxt_ % kWindow].m != nullptr && seqLess(rcvNxt_, rcvHead_ + kWindow)) ++rcvNxt_;
}

bool Conn::onFrame(const ParsedFrame& f, rte_mbuf* m, uint64_t now) {
  if (state_ == State::kDone || state_ == State::kSynSent) return false;
  lastHeardNs_ = now;
  bool kept = false;
  switch (f.header.kind) {
    case FrameKind::kData:
    case FrameKind::kFin:
      if (state_ == State::kClosing) {  // we will not read any more: just keep the peer going
        if (f.header.seq == rcvNxt_) {
          ++rcvNxt_;
          ++rcvHead_;
        }
        ackPending_ = true;
        pumpWanted_ = true;
        return false;
      }
      onSequenced(f, m, kept);
      deliver();
      pumpWanted_ = true;
      return kept;
    case FrameKind::kAck:
      onAck(f, now);
      return false;
    case FrameKind::kRst:
      if (state_ == State::kClosing) {
        finish();
      } else if (peerFinished()) {
        // It finished and forgot the connection (it answers our acks with a reset): what it
        // sent stays readable up to its Fin.
        if (!peerGone_) {
          peerWentAway(RemoteError(describe() + ": the peer closed the connection and reset it"));
        }
      } else {
        fail(RemoteError(describe() + ": the peer reset the connection (its context closed, or "
                                      "it does not know this connection)"));
      }
      return false;
    default:
      return false;  // Syn/SynAck duplicates after set-up
  }
}

uint8_t* Conn::placeTarget(const ParsedFrame& f) {
  const uint32_t seq = f.header.seq;
  const size_t full = engine_->maxFramePayload();
  // A frame already held is never placed again: a corrupted copy of it would overwrite bytes
  // that delivery counts on finding in place.
  if (state_ != State::kEstablished || f.header.kind != FrameKind::kData || !inPayload_ ||
      recvs_.empty() || f.header.length > full || seqLess(seq, rcvNxt_) ||
      !seqLess(seq, rcvHead_ + kWindow) || rx_[seq % kWindow].m != nullptr) {
    return nullptr;
  }
  // Where the frame starts, counted from the next byte to consume, if every frame before it is
  // full: a sender cuts a message into full frames (only its last can be short, and no frame
  // past that one is placed, as it would not fit in the message). Each frame's guess is its own
  // full-frame slot, so a wrong guess (a header that fails its CRC) overlaps no right one, and
  // consume() copies any frame whose bytes turn out to belong elsewhere.
  const uint64_t start = static_cast<uint64_t>(seq - rcvHead_) * full;
  if (start < headOffset_) return nullptr;  // (a held head frame: refused above already)
  const uint64_t ahead = start - headOffset_;
  if (curHeader_.payloadLength - payloadDone_ < ahead + f.header.length) return nullptr;
  RecvOp& op = recvs_.front();
  if (op.owned) return ownedBuf_.data() + payloadDone_ + ahead;
  if (destIndex_ >= op.dest.size()) return nullptr;
  const MutableSlice& d = op.dest[destIndex_];
  if (d.size - destOffset_ < ahead + f.header.length) return nullptr;
  return static_cast<uint8_t*>(d.data) + destOffset_ + ahead;
}

bool Conn::consume(const uint8_t* data, size_t n, size_t* used, const uint32_t* dataCrc,
                   const uint8_t* placedAt) {
  *used = 0;
  while (*used < n || (inPayload_ && payloadDone_ == curHeader_.payloadLength)) {
    if (!inPayload_) {
      if (recvs_.empty()) return false;  // messages wait until a receive is posted
      const size_t take = std::min(n - *used, wire::kHeaderSize - hdrGot_);
      std::memcpy(hdrBuf_.data() + hdrGot_, data + *used, take);
      hdrGot_ += take;
      *used += take;
      if (hdrGot_ < wire::kHeaderSize) return true;
      hdrGot_ = 0;
      auto h = wire::decodeHeader(hdrBuf_, {engine_->maxPayload()});
      RecvOp& op = recvs_.front();
      if (!h.ok()) {
        const Status s = h.status().withContext("recv on " + describe());
        RecvOp failed = std::move(op);
        recvs_.pop_front();
        setError(s);  // sticky already in the callback (status())
        completeRecv(failed, s, wire::Header{}, {});
        fail(s);
        return false;
      }
      if (op.route) {
        // recvRouted: the header decides where the payload goes (called once, here).
        const MutableSlice d = std::exchange(op.route, nullptr)(*h);
        if (d.data != nullptr) {
          op.owned = false;
          op.expected = d.size;
          if (d.size > 0) op.dest = {d};
        }
      }
      if (!op.owned && h->payloadLength != op.expected) {
        const Status s = InvalidArgument(
            "recv on " + describe() + ": message payload is " + std::to_string(h->payloadLength) +
            " bytes but the posted receive expects " + std::to_string(op.expected) + " bytes (" +
            h->describe() + ")");
        RecvOp failed = std::move(op);
        recvs_.pop_front();
        setError(s);  // sticky already in the callback (status())
        completeRecv(failed, s, *h, {});
        fail(s);
        return false;
      }
      curHeader_ = *h;
      inPayload_ = true;
      payloadDone_ = 0;
      payloadCrc_ = 0;
      destIndex_ = 0;
      destOffset_ = 0;
      if (op.owned) ownedBuf_.assign(h->payloadLength, 0);
      continue;
    }
    RecvOp& op = recvs_.front();
    const uint64_t left = curHeader_.payloadLength - payloadDone_;
    size_t take = static_cast<size_t>(std::min<uint64_t>(n - *used, left));
    const uint8_t* src = data + *used;
    // The payload checksum: when these bytes are all of `data` and its CRC is known (the frame
    // check computed it), joined in without reading them again; otherwise computed while the
    // bytes are copied out, in one pass.
    bool crc = curHeader_.hasPayloadCrc();
    if (crc && dataCrc != nullptr && *used == 0 && take == n) {
      payloadCrc_ = wire::crc32cCombine(payloadCrc_, *dataCrc, n);
      crc = false;
    }
    auto copy = [&](uint8_t* dst, const uint8_t* from, size_t c) {
      if (dst == placedAt && from == data) {  // copied while the frame was checked
        if (crc) payloadCrc_ = wire::crc32c(payloadCrc_, from, c);
        return;
      }
      if (crc) {
        payloadCrc_ = wire::crc32cCopy(payloadCrc_, dst, from, c);
      } else {
        std::memcpy(dst, from, c);
      }
    };
    if (op.owned) {
      if (take > 0) copy(ownedBuf_.data() + payloadDone_, src, take);  // may be empty
    } else {
      size_t rest = take;
      while (rest > 0) {
        const MutableSlice& d = op.dest[destIndex_];
        const size_t c = std::min(rest, d.size - destOffset_);
        copy(static_cast<uint8_t*>(d.data) + destOffset_, src, c);
        src += c;
        rest -= c;
        destOffset_ += c;
        if (destOffset_ == d.size) {
          ++destIndex_;
          destOffset_ = 0;
        }
      }
    }
    payloadDone_ += take;
    *used += take;
    if (payloadDone_ == curHeader_.payloadLength) {
      inPayload_ = false;
      RecvOp done = std::move(op);
      recvs_.pop_front();
      if (curHeader_.hasPayloadCrc() && payloadCrc_ != curHeader_.payloadCrc) {
        const Status s = DataLoss("recv on " + describe() + ": payload CRC32C mismatch (" +
                                  curHeader_.describe() + "): corrupted in transit");
        setError(s);  // sticky already in the callback (status())
        completeRecv(done, s, curHeader_, {});
        fail(s);
        return false;
      }
      completeRecv(done, OkStatus(), curHeader_, std::move(ownedBuf_));
      ownedBuf_ = {};
      completeRefusedRecvs();
      if (state_ == State::kDone) return false;
    }
  }
  return true;
}

void Conn::deliver() {
  while (state_ == State::kEstablished && rcvHead_ != rcvNxt_) {
    RxSlot& slot = rx_[rcvHead_ % kWindow];
    if (slot.fin) {
      if (inPayload_ || hdrGot_ > 0) {
        fail(RemoteError(describe() + ": the peer closed the connection in the middle of a "
                                      "message"));
      } else if (peerGone_) {
        fail(goneWhy_);  // the receives meet the error status() has said since it went away
      } else {
        fail(RemoteError(describe() + ": the peer closed the connection"));
      }
      return;
    }
    size_t used = 0;
    // A full frame that is all payload of a message with a payload CRC: the frame check's CRC
    // gives the payload's own, so consume() need not read the bytes for it (one fixed length:
    // crc32cCombine keeps a table per length).
    uint32_t dataCrc = 0;
    const bool known = headOffset_ == 0 && inPayload_ && curHeader_.hasPayloadCrc() &&
                       slot.length == engine_->maxFramePayload() &&
                       curHeader_.payloadLength - payloadDone_ >= slot.length;
    if (known) dataCrc = payloadCrcOf(slot.frameCrc, slot.headerCrc, slot.length);
    const bool more =
        consume(slot.payload + headOffset_, slot.length - headOffset_, &used,
                known ? &dataCrc : nullptr, headOffset_ == 0 ? slot.placedAt : nullptr);
    if (state_ == State::kDone) return;
    headOffset_ += used;
    if (headOffset_ < slot.length) return;  // waits for a receive
    (void)more;
    engine_->release(slot.m);
    // Placed frames are counted here, delivered: one placed and then dropped (past a hole with
    // the pool low) is placed again when resent, and counting at placement counted it twice.
    if (slot.placedAt != nullptr) Engine::bump(engine_->counters().rxDataPlaced);
    slot = RxSlot{};
    ++rcvHead_;
    Engine::bump(engine_->counters().rxDataDelivered);
    headOffset_ = 0;
    // Tell the sender the window moved once a quarter of it opened up.
    if (static_cast<uint32_t>(rcvHead_ + kWindow - advertisedEnd_) >= kWindow / 4) {
      ackPending_ = true;
      pumpWanted_ = true;
    }
  }
  // A zero-length message completes with the header alone; consume() handled it above when
  // its last header byte arrived.
}

void Conn::tick(uint64_t now) {
  if (state_ == State::kDone || state_ == State::kSynSent) return;
  if (peerGone_) return;  // nothing to resend or time out: held frames wait for receives
  if (lastHeardNs_ == 0) lastHeardNs_ = now;
  // A closing connection whose drain has made no progress for the peer timeout gives up, even
  // if the peer still answers (it keeps its window shut: its application reads no more).
  const bool drainStuck =
      state_ == State::kClosing && elapsed(now, closeNs_) > engine_->peerTimeoutNs();
  if (elapsed(now, lastHeardNs_) > engine_->peerTimeoutNs() || drainStuck) {
    if (state_ == State::kClosing) {
      state_ = State::kDone;
      releaseInFlight();
      engine_->connDone(id_);
      return;
    }
    if (peerFinished()) {  // its context closed after its Fin: what it sent stays readable
      peerWentAway(RemoteError(describe() + ": the peer closed the connection, then went silent"));
      return;
    }
    fail(RemoteError(describe() + ": nothing heard from the peer for " +
                     std::to_string(engine_->peerTimeoutNs() / 1'000'000) +
                     " ms (its process died or the link is down)"));
    return;
  }
  // The peer answers (acks, keepalives) but acknowledges none of our frames: they do not reach
  // it. Without this the sends would retry forever while the peer's keepalives kept the
  // connection alive.
  if (state_ == State::kEstablished && una_ != nxt_ &&
      elapsed(now, progressNs_) > engine_->peerTimeoutNs()) {
    fail(RemoteError(describe() + ": the peer answers but acknowledged none of our frames for " +
                     std::to_string(engine_->peerTimeoutNs() / 1'000'000) + " ms (" +
                     std::to_string(inflight_[una_ % kWindow].m != nullptr
                                        ? rte_pktmbuf_data_len(inflight_[una_ % kWindow].m)
                                        : 0) +
                     "-byte frames lost on the way: is the link's MTU below COFAB_DPDK_MTU?)"));
    return;
  }
  // Holes below a SACKed frame are resent from here too, in case the acks that would trigger it
  // stopped (the window is full behind the hole).
  retransmitHoles(now);
  if (una_ != nxt_) {
    const auto& oldest = inflight_[una_ % kWindow];
    if (oldest.m != nullptr && elapsed(now, oldest.sentNs) > rtoNs_) {
      Engine::bump(engine_->counters().timeouts);
      int budget = kMaxRetransmitsPerTick;
      for (uint32_t s = una_; s != nxt_ && budget > 0; ++s) {
        auto& fl = inflight_[s % kWindow];
        if (fl.m != nullptr && !fl.sacked && elapsed(now, fl.sentNs) > rtoNs_) {
          transmit(s, now);
          Engine::bump(engine_->counters().retransmits);
          --budget;
        }
      }
      rtoNs_ = std::min(rtoNs_ * 2, kMaxRtoNs);  // backoff until an ack makes progress
    }
  }
  // Counted from the last ack, not the last frame: data frames carry no ack or window, so a
  // window update that was lost is repeated here even while this side streams data (a peer
  // blocked on our window, with everything acknowledged, has nothing to resend that would draw
  // a new one).
  // At least four keepalives per peer timeout: a timeout under 100 ms (50 ms is allowed) must
  // not declare a healthy idle peer dead.
  if (elapsed(now, lastAckNs_) > std::min(kKeepaliveNs, engine_->peerTimeoutNs() / 4)) {
    ackPending_ = true;
  }
  if (ackPending_) pumpWanted_ = true;
}

}  // namespace cofab::transport::dpdk
