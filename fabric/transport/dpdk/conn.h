// Conn: the state of one dpdk connection — message segmentation and reassembly, sequence
// numbers, cumulative + selective acks, retransmission with backoff, duplicate suppression, the
// flow-control window and the close drain. Internal to fabric/transport/dpdk.
//
// Everything here runs on the owning Engine's poller thread (engine.h); application threads
// reach it only through commands the engine runs. The one exception is statusSnapshot(), read
// under a mutex by Connection::status(). Data frames are immutable once built: a sent frame's
// mbuf is kept (one extra reference) until it is acknowledged and retransmitted as is, so the
// receiver may still be reading the previous copy (ring mode hands the mbuf itself over).
#pragma once

#include <rte_mbuf.h>

#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/transport/connection.h"
#include "fabric/transport/dpdk/frame.h"

namespace cofab::transport::dpdk {

class Engine;

// Frames in flight per direction, and the receiver's reassembly window. Also the SACK span.
inline constexpr uint32_t kWindow = static_cast<uint32_t>(kSackBits);

// Monotonic nanoseconds as unsigned, for the timer arithmetic.
inline uint64_t monoNs() { return static_cast<uint64_t>(nowNs()); }

// Serial-number comparison for 32-bit sequence numbers.
inline bool seqLess(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }

class Conn : public std::enable_shared_from_this<Conn> {
 public:
  enum class State { kSynSent, kEstablished, kClosing, kDone };

  Conn(Engine* engine, uint32_t id, NetAddress peer, std::string peerAddressText);
  ~Conn();

  // --- poller thread only ---
  void setEstablished(const NetAddress& peer, uint32_t peerConn, std::string peerName);
  void send(const wire::Header& header, std::vector<ConstSlice> payload, SendCallback done);
  void recv(std::vector<MutableSlice> dest, RecvCallback done);
  void recvOwned(RecvOwnedCallback done);
  // Connection::recvRouted natively: `route` picks the memory once the header is in, and the
  // payload's frames go there directly (placed while checked, like a recv) instead of into a
  // vector copied afterwards; a null slice makes it a recvOwned.
  void recvRouted(RecvRoute route, RecvOwnedCallback done);
  // Application close: cancels pending operations, then drains what was sent, then Fin.
  void close();
  // Context shutdown: like close(), but the engine bounds the drain.
  void shutdown() { close(); }
  // A frame for this connection (header already checked). Returns true when it kept `m`.
  bool onFrame(const ParsedFrame& f, rte_mbuf* m, uint64_t now);
  // Where the payload of `f`, a Data frame not yet checked, belongs if it can be copied there
  // now: a frame not received before, in the window, all of whose bytes are payload of the
  // message being received (taking the frames before it as full, as a sender cuts them) with
  // room in the current destination slice. Null otherwise. The engine copies the payload there
  // while it checks the frame CRC (checkFrameCrcCopy) and only then hands the frame to onFrame;
  // delivery, in order, finds the bytes in place (or copies them from the mbuf, still held, if
  // they belong elsewhere). Out-of-order frames are placed too, so a frame held behind a hole
  // is not read a second time when the hole fills. A frame that fails the check (its header may
  // be garbage too) has written only past what this receive has delivered, which the frames
  // that really go there overwrite before the receive completes.
  uint8_t* placeTarget(const ParsedFrame& f);
  // Timers: retransmission, keepalive, peer silence, drain bound.
  void tick(uint64_t now);
  // Builds and queues what the windows allow; sends the ack if one is due.
  void pump(uint64_t now);
  // Fails everything with `s` and frees every frame; the engine removes it.
  void fail(const Status& s);
  // Completes the refused operations that reached the front of their queue (SendOp::refused).
  void completeRefusedSends();
  void completeRefusedRecvs();

  uint32_t id() const { return id_; }
  uint32_t peerConn() const { return peerConn_; }
  // The frame comes from this connection's peer (its connection id and MAC).
  bool isFrom(const ParsedFrame& f) const {
    return peerConn_ == f.header.srcConn && sameMac(peer_.mac, f.src.mac);
  }
  State state() const { return state_; }
  const NetAddress& peer() const { return peer_; }
  bool wantsPump() const { return pumpWanted_; }
  // Frames sent and not yet acknowledged (their acks are due within a round trip and a nap of
  // the peer's poller).
  bool awaitingAck() const { return una_ != nxt_; }

  // --- any thread ---
  Status statusSnapshot() const;
  // The application called close(): statusSnapshot() says Cancelled from now on, before the
  // poller runs the close itself.
  void noteClosedByApp();
  const std::string& peerName() const { return peerName_; }
  const std::string& peerAddressText() const { return peerAddressText_; }
  std::string describe() const;

 private:
  struct SendOp {
    std::array<uint8_t, wire::kHeaderSize> header;
    std::vector<ConstSlice> slices;
    size_t total = 0;  // header + payload bytes
    size_t offset = 0;
    SendCallback done;
    // Refused when posted behind others (bad arguments): completes with this when it reaches
    // the front, so callbacks keep their posting order (completeRefusedSends).
    Status refused;
  };
  struct RecvOp {
    bool owned = false;
    std::vector<MutableSlice> dest;
    size_t expected = 0;
    RecvCallback done;
    RecvOwnedCallback ownedDone;  // recvOwned, and recvRouted wherever it lands
    RecvRoute route;              // recvRouted until its header arrives
    Status refused;               // as SendOp::refused (completeRefusedRecvs)
  };
  struct InFlight {
    rte_mbuf* m = nullptr;
    uint64_t sentNs = 0;
    uint16_t transmissions = 0;
    bool sacked = false;
    uint64_t order = 0;  // of its last transmission, among this connection's (xmitOrder_)
  };
  struct RxSlot {
    rte_mbuf* m = nullptr;
    const uint8_t* payload = nullptr;
    uint16_t length = 0;
    bool fin = false;
    uint32_t frameCrc = 0;  // checked: with headerCrc, the payload's own CRC (payloadCrcOf)
    uint32_t headerCrc = 0;
    uint8_t* placedAt = nullptr;  // where the payload was copied already (placeTarget)
  };

  void setError(const Status& s);
  void finish();
  void completeRecv(RecvOp& op, const Status& s, const wire::Header& h,
                    std::vector<uint8_t>&& owned);
  void failOps(const Status& s);  // receives, then sends (failSends)
  void failSends(const Status& s);
  bool buildDataFrame(uint64_t now);
  bool pipeFull() const;  // DpdkOptions::pipeFrames reached (conn.cc says why)
  bool buildFin(uint64_t now);
  void transmit(uint32_t seq, uint64_t now);
  void sendAck(uint64_t now);
  void onAck(const ParsedFrame& f, uint64_t now);
  void onSequenced(const ParsedFrame& f, rte_mbuf* m, bool& kept);
  void retransmitHoles(uint64_t now);
  void deliver();
  // Consumes payload bytes for the message being reassembled; false when it must wait.
  // `dataCrc`: crc32c(0, data, n) when known (a whole frame's payload), else null. `placedAt`:
  // where `data` was copied already (placeTarget), else null: not copied again.
  bool consume(const uint8_t* data, size_t n, size_t* used, const uint32_t* dataCrc = nullptr,
               const uint8_t* placedAt = nullptr);
  void releaseInFlight();
  // Frees the frames sent and not acknowledged (the send side's state), or those held for
  // delivery (the receive side's); releaseInFlight does both.
  void releaseSent();
  void releaseReceived();
  // The peer finished and then reset or went silent: sends fail with `why`, receives go on.
  void peerWentAway(const Status& why);
  void updateRtt(uint64_t sampleNs);

  Engine* const engine_;
  const uint32_t id_;
  NetAddress peer_;
  const std::string peerAddressText_;
  std::string peerName_;
  uint32_t peerConn_ = 0;
  State state_ = State::kSynSent;

  mutable std::mutex statusMu_;
  Status status_;  // sticky; mirrored from error_ for status()
  Status error_;   // poller copy
  bool closedByApp_ = false;

  // Send side.
  std::deque<SendOp> sends_;
  std::array<InFlight, kWindow> inflight_{};
  uint32_t una_ = 1;  // oldest unacknowledged
  uint32_t nxt_ = 1;  // next to send
  uint32_t peerWindowEnd_ = 1 + kWindow;
  bool finQueued_ = false;
  bool finSent_ = false;
  uint64_t rtoNs_;
  uint64_t srttNs_ = 0;
  uint64_t rttvarNs_ = 0;
  uint32_t highestSacked_ = 1;  // one past the highest SACKed frame
  // Transmissions so far, and the latest one of a frame known delivered (sent once, then acked
  // or SACKed): a hole transmitted before it is lost (RACK, RFC 8985, with no reordering window:
  // see retransmitHoles()). By order, not time: a burst's frames share one timestamp.
  uint64_t xmitOrder_ = 0;
  uint64_t rackOrder_ = 0;
  // Headers of this connection's full-size Data frames (built at the first one).
  FrameTemplate dataTemplate_;

  // Receive side.
  std::deque<RecvOp> recvs_;
  std::array<RxSlot, kWindow> rx_{};
  uint32_t rcvHead_ = 1;  // oldest frame not fully consumed
  uint32_t rcvNxt_ = 1;   // first missing
  uint32_t rcvMax_ = 1;   // one past the highest frame held (SACK bitmaps stop there)
  size_t headOffset_ = 0;
  uint32_t advertisedEnd_ = 1 + kWindow;
  bool ackPending_ = false;
  // The peer's Fin has arrived (finSeq_), and peerFinished() once every frame before it has:
  // then everything it will ever send is here, so neither its reset nor its silence afterwards
  // (its side finished, or its context closed) may cost what is held, and such a connection
  // serves receives until the Fin is consumed (peerWentAway).
  bool finHeld_ = false;
  uint32_t finSeq_ = 0;
  bool peerFinished() const { return finHeld_ && seqLess(finSeq_, rcvNxt_); }
  bool peerGone_ = false;  // ...and it answers no more: nothing is sent to it
  Status goneWhy_;         // why (peerWentAway): the sticky Status, for later sends and the Fin
  // Reassembly of the current message.
  std::array<uint8_t, wire::kHeaderSize> hdrBuf_{};
  size_t hdrGot_ = 0;
  bool inPayload_ = false;
  wire::Header curHeader_;
  uint64_t payloadDone_ = 0;
  uint32_t payloadCrc_ = 0;
  size_t destIndex_ = 0;
  size_t destOffset_ = 0;
  std::vector<uint8_t> ownedBuf_;

  uint64_t lastHeardNs_ = 0;
  // When the oldest unacknowledged frame was first sent into an empty pipe, una_ last moved, or
  // a frame was first SACKed.
  uint64_t progressNs_ = 0;
  uint64_t lastAckNs_ = 0;  // keepalive: an ack every min(kKeepaliveNs, timeout / 4) (conn.cc)
  uint64_t closeNs_ = 0;  // close(), or the last ack that advanced its drain since
  bool pumpWanted_ = false;

  friend class Engine;
};

}  // namespace cofab::transport::dpdk
