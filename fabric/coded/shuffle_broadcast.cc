#include "fabric/coded/shuffle_broadcast.h"

#include <rte_mbuf.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "core/param.h"
#include "fabric/coded/shuffle_relay.h"
#include "fabric/coded/shuffle_segments.h"
#include "fabric/transport/dpdk/eal.h"
#include "fabric/transport/dpdk/frame.h"
#include "fabric/transport/dpdk/port.h"

namespace cofab::coded {

using transport::dpdk::Eal;
using transport::dpdk::FrameHeader;
using transport::dpdk::FrameKind;
using transport::dpdk::MacAddress;
using transport::dpdk::NetAddress;
using transport::dpdk::ParsedFrame;
using transport::dpdk::Port;
using transport::dpdk::RxVerdict;

COFAB_PARAM_INT(kRoundMs, "COFAB_SHUFFLE_BCAST_ROUND_MS", 20, 1, 10000,
                "broadcast shuffle: ms between the master's Fin rounds (gap reports, done checks)");
COFAB_PARAM_INT(kDropEvery, "COFAB_SHUFFLE_BCAST_DROP_EVERY", 0, 0, 1000000,
                "broadcast shuffle, for tests: a worker discards every Nth data frame it needs "
                "(as a full af_packet ring would), 0 = never");

namespace {

constexpr MacAddress kBroadcastMac{0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
constexpr uint32_t kBroadcastIp = 0xFFFFFFFFu;
constexpr uint32_t kMasterIp = (10u << 24) | (208u << 16) | 254u;  // 10.208.0.254
constexpr size_t kBurst = 32;

// Distinct for every epoch shuffleCheckPlan() admits ([0, 2^30), so epoch << 1 fits 31 bits).
uint32_t epochTag(int64_t epoch, bool coded) {
  return (static_cast<uint32_t>(epoch) << 1) | (coded ? 1u : 0u);
}

// A worker's outcome for one epoch: kDoneOk once it has everything, else why it gave up.
std::string doneKey(const std::string& prefix, uint32_t tag, int worker) {
  return prefix + "/done/" + std::to_string(tag) + "/" + std::to_string(worker);
}
const Bytes kDoneOk{1};
// The master's shufflePlanTag of the epoch (8 bytes, little-endian), set before its first frame:
// a worker compares its own before it trusts what it decoded.
std::string planKey(const std::string& prefix, uint32_t tag) {
  return prefix + "/plan/" + std::to_string(tag);
}
Bytes tagBytes(uint64_t tag) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[size_t(i)] = static_cast<uint8_t>(tag >> (8 * i));
  return b;
}

// Sends frames built into mbufs, retrying what the TX queue did not take, until the deadline.
class Sender {
 public:
  Sender(Port* port, NetAddress src) : port_(port), src_(src) {}

  Status frame(const NetAddress& dst, const FrameHeader& h, const uint8_t* payload,
               Deadline deadline) {
    rte_mbuf* m = rte_pktmbuf_alloc(port_->pool());
    while (m == nullptr) {
      COFAB_RETURN_IF_ERROR(flush(deadline));  // mbufs come back as the PMD sends
      if (deadline.expired()) return DeadlineExceeded("broadcast shuffle: no free mbuf");
      m = rte_pktmbuf_alloc(port_->pool());
    }
    const size_t size = transport::dpdk::frameSize(h);
    auto* f = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(size)));
    COFAB_CHECK(f != nullptr);  // size <= the port's MTU + Ethernet header, checked by callers
    uint8_t* p = transport::dpdk::writeFrameHeaders(f, src_, dst, h);
    if (h.length > 0) std::memcpy(p, payload, h.length);
    transport::dpdk::sealFrame(f);
    pending_[count_++] = m;
    bytes_ += size;
    ++frames_;
    if (count_ == kBurst) return flush(deadline);
    return OkStatus();
  }

  Status flush(Deadline deadline) {
    size_t done = 0;
    while (done < count_) {
      done += port_->txBurst(pending_ + done, static_cast<uint16_t>(count_ - done));
      if (done < count_) {
        if (deadline.expired()) {
          for (size_t i = done; i < count_; ++i) rte_pktmbuf_free(pending_[i]);
          count_ = 0;
          return DeadlineExceeded("broadcast shuffle: the port's TX queue stayed full");
        }
        std::this_thread::yield();
      }
    }
    count_ = 0;
    return OkStatus();
  }

  uint64_t bytes() const { return bytes_; }
  int64_t frames() const { return frames_; }

 private:
  Port* port_;
  NetAddress src_;
  rte_mbuf* pending_[kBurst];
  size_t count_ = 0;
  uint64_t bytes_ = 0;
  int64_t frames_ = 0;
};

// Receives up to a burst; fn(const ParsedFrame&) for each shuffle frame; returns frames seen.
template <typename Fn>
size_t poll(Port* port, int64_t* ignored, Fn fn) {
  rte_mbuf* pkts[kBurst];
  const uint16_t n = port->rxBurst(pkts, kBurst);
  for (uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = pkts[i];
    ParsedFrame f;
    if (m->nb_segs == 1 &&
        transport::dpdk::parseFrame(rte_pktmbuf_mtod(m, const uint8_t*), rte_pktmbuf_data_len(m), 0,
                                    &f) == RxVerdict::kOk &&
        f.dstPort == kShuffleUdpPort) {
      if (!fn(f)) ++*ignored;
    } else {
      ++*ignored;
    }
    rte_pktmbuf_free(m);
  }
  return n;
}

// A frame names its message (srcConn) and its offset in the row (seq) in 32 bits each: beyond
// that they would wrap, and workers would wait out their deadline for pieces that never fit.
Status checkBroadcastEpochSize(size_t rowBytes, int64_t messages) {
  if (rowBytes > UINT32_MAX || messages > static_cast<int64_t>(UINT32_MAX)) {
    return InvalidArgument("broadcast shuffle: rows of " + std::to_string(rowBytes) +
                           " bytes and " + std::to_string(messages) +
                           " messages per epoch; frames address at most 2^32 - 1 of each");
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<BroadcastShuffleEndpoint>> BroadcastShuffleEndpoint::open(
    Store& store, std::string prefix, int rank) {
  COFAB_ASSIGN_OR_RETURN(Eal * eal, Eal::get());
  COFAB_ASSIGN_OR_RETURN(Port * port, eal->acquirePort(""));
  if (port->ringMode()) {
    eal->releasePort(port);
    return FailedPrecondition(
        "broadcast shuffle needs a port on a shared Ethernet segment (e.g. COFAB_DPDK_VDEV="
        "net_af_packet0,iface=<veth in a bridge>); in-process ring ports have no broadcast");
  }
  std::unique_ptr<BroadcastShuffleEndpoint> e(new BroadcastShuffleEndpoint);
  e->store_ = &store;
  e->prefix_ = std::move(prefix);
  e->rank_ = rank;
  e->port_ = port;
  return e;
}

BroadcastShuffleEndpoint::~BroadcastShuffleEndpoint() {
  if (port_ == nullptr) return;
  if (auto eal = Eal::get(); eal.ok()) (*eal)->releasePort(port_);
}

StatusOr<BroadcastShuffleStats> BroadcastShuffleEndpoint::sendEpoch(
    const coding::CodedShuffle& shuffle, const coding::ShufflePlan& plan, bool coded,
    std::span<const uint8_t> data, size_t rowBytes, Deadline deadline) {
  if (rank_ >= 0) return FailedPrecondition("broadcast shuffle: sendEpoch on a worker endpoint");
  COFAB_ASSIGN_OR_RETURN(int64_t roundMs, kRoundMs.get());
  COFAB_RETURN_IF_ERROR(checkBroadcastEpochSize(rowBytes, 0));  // before the messages are built
  COFAB_ASSIGN_OR_RETURN(std::vector<uint8_t> messages,
                         shuffleEpochMessages(shuffle, plan, coded, data, rowBytes));
  const uint32_t tag = epochTag(plan.epoch, coded);
  const int64_t count = static_cast<int64_t>(rowBytes == 0 ? 0 : messages.size() / rowBytes);
  COFAB_RETURN_IF_ERROR(checkBroadcastEpochSize(rowBytes, count));
  const size_t segBytes = port_->mtu() - transport::dpdk::kIpv4HeaderSize -
                          transport::dpdk::kUdpHeaderSize - transport::dpdk::kFrameHeaderSize;
  const uint32_t segments = shuffleSegmentCount(rowBytes, segBytes);
  const NetAddress self{port_->mac(), kMasterIp, kShuffleUdpPort};
  const NetAddress all{kBroadcastMac, kBroadcastIp, kShuffleUdpPort};
  Sender tx(port_, self);
  // What an earlier attempt at this epoch left (a worker that gave up after the master had
  // stopped): a reason there would fail this attempt at its first round.
  COFAB_RETURN_IF_ERROR(removeDoneKeys(tag, static_cast<int>(plan.batch.size())));
  COFAB_RETURN_IF_ERROR(
      store_->set(planKey(prefix_, tag), tagBytes(shufflePlanTag(shuffle, plan, coded, rowBytes))));

  auto sendMessage = [&](int64_t id) -> Status {
    for (uint32_t s = 0; s < segments; ++s) {
      const size_t off = s * segBytes;
      FrameHeader h;
      h.kind = FrameKind::kData;
      h.length = static_cast<uint16_t>(std::min(segBytes, rowBytes - off));
      h.dstConn = tag;
      h.srcConn = static_cast<uint32_t>(id);
      h.seq = static_cast<uint32_t>(off);
      h.ack = s;
      h.window = segments;
      COFAB_RETURN_IF_ERROR(tx.frame(all, h, messages.data() + id * rowBytes + off, deadline));
    }
    return OkStatus();
  };

  BroadcastShuffleStats stats;
  stats.messages = count;
  stats.payloadBytes = messages.size();
  for (int64_t id = 0; id < count; ++id) COFAB_RETURN_IF_ERROR(sendMessage(id));
  COFAB_RETURN_IF_ERROR(tx.flush(deadline));
  stats.firstPassBytes = tx.bytes();

  const int n = static_cast<int>(plan.batch.size());
  std::vector<bool> done(n, false);
  int doneCount = 0;
  std::set<uint32_t> resendThisRound;
  for (uint32_t round = 1;; ++round) {
    // Whoever has everything said so in the store.
    for (int w = 0; w < n; ++w) {
      if (done[w]) continue;
      COFAB_ASSIGN_OR_RETURN(bool has, store_->check({doneKey(prefix_, tag, w)}));
      if (!has) continue;
      COFAB_ASSIGN_OR_RETURN(Bytes outcome, store_->get(doneKey(prefix_, tag, w), deadline));
      if (outcome != kDoneOk) {
        removeDoneKeys(tag, n).ignoreError();  // best effort: the error is what matters
        return RemoteError("broadcast shuffle: epoch " + std::to_string(plan.epoch) +
                           (coded ? " (coded)" : " (uncoded)") + ": worker " + std::to_string(w) +
                           " gave up: " + std::string(outcome.begin(), outcome.end()));
      }
      done[w] = true;
      ++doneCount;
    }
    if (doneCount == n) break;
    if (deadline.expired()) {
      std::string missing;
      for (int w = 0; w < n; ++w) {
        if (!done[w]) missing += (missing.empty() ? "" : ", ") + std::to_string(w);
      }
      removeDoneKeys(tag, n).ignoreError();  // best effort: a retry of the epoch starts clean
      return DeadlineExceeded("broadcast shuffle: epoch " + std::to_string(plan.epoch) +
                              (coded ? " (coded)" : " (uncoded)") + ": worker(s) " + missing +
                              " did not receive every message in time (" +
                              std::to_string(stats.resentMessages) + " re-sends, " +
                              std::to_string(round - 1) + " rounds)");
    }
    FrameHeader fin;
    fin.kind = FrameKind::kFin;
    fin.dstConn = tag;
    fin.seq = round;
    COFAB_RETURN_IF_ERROR(tx.frame(all, fin, nullptr, deadline));
    COFAB_RETURN_IF_ERROR(tx.flush(deadline));
    stats.rounds = round;
    // Serve NACKs until the next round.
    resendThisRound.clear();
    const Deadline roundEnd = Deadline::afterMs(roundMs);
    bool recheck = false;
    while (!recheck && !roundEnd.expired() && !deadline.expired()) {
      std::vector<uint32_t> wanted;
      const size_t got = poll(port_, &ignored_, [&](const ParsedFrame& f) {
        if (f.header.kind != FrameKind::kAck || f.header.dstConn != tag) return false;
        if (f.header.length == 0) recheck = true;  // "done" hint: look at the store now
        for (size_t i = 0; i + 4 <= f.header.length; i += 4) {
          uint32_t id;
          std::memcpy(&id, f.payload + i, 4);
          if (id < count && resendThisRound.insert(id).second) wanted.push_back(id);
        }
        return true;
      });
      for (uint32_t id : wanted) {
        COFAB_RETURN_IF_ERROR(sendMessage(id));
        ++stats.resentMessages;
      }
      if (!wanted.empty()) COFAB_RETURN_IF_ERROR(tx.flush(deadline));
      if (got == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  stats.egressBytes = tx.bytes();
  stats.frames = tx.frames();
  // Nobody reads an epoch's done keys again: keep the store from growing with the run.
  COFAB_RETURN_IF_ERROR(removeDoneKeys(tag, n));
  return stats;
}

Status BroadcastShuffleEndpoint::removeDoneKeys(uint32_t tag, int workers) {
  Status first = store_->remove(planKey(prefix_, tag)).status();
  for (int w = 0; w < workers; ++w) {
    Status s = store_->remove(doneKey(prefix_, tag, w)).status();
    if (first.ok()) first = s;
  }
  return first;
}

Status BroadcastShuffleEndpoint::receiveEpoch(const coding::CodedShuffle& shuffle,
                                              const coding::ShufflePlan& plan, bool coded,
                                              const coding::WorkerCache& cache, size_t rowBytes,
                                              std::span<uint8_t> batchOut, Deadline deadline) {
  Status s = receiveEpochOnce(shuffle, plan, coded, cache, rowBytes, batchOut, deadline);
  const uint32_t tag = epochTag(plan.epoch, coded);
  // Whatever made this worker give up, the master learns it now, through the done key, and
  // fails the epoch with it. It sent rounds until its deadline and then blamed reception ("did
  // not receive every message in time") for a wrong cache, plan or batch size. Only while a
  // master runs the epoch (its plan key is there): a reason left for no one would fail the next
  // attempt at its first round. Best effort: the master also stops at its own deadline.
  if (!s.ok() && rank_ >= 0) {
    StatusOr<bool> running = store_->check({planKey(prefix_, tag)});
    if (running.ok() && *running) {
      const std::string why = s.message();
      store_->set(doneKey(prefix_, tag, rank_), Bytes(why.begin(), why.end())).ignoreError();
    }
  }
  return s;
}

Status BroadcastShuffleEndpoint::receiveEpochOnce(const coding::CodedShuffle& shuffle,
                                                  const coding::ShufflePlan& plan, bool coded,
                                                  const coding::WorkerCache& cache, size_t rowBytes,
                                                  std::span<uint8_t> batchOut, Deadline deadline) {
  if (rank_ < 0 || cache.worker() != rank_) {
    return FailedPrecondition("broadcast shuffle: receiveEpoch needs this worker's cache");
  }
  COFAB_ASSIGN_OR_RETURN(int64_t dropEvery, kDropEvery.get());
  COFAB_RETURN_IF_ERROR(shuffleCheckPlan(plan));
  COFAB_RETURN_IF_ERROR(checkBroadcastEpochSize(rowBytes, 0));
  int64_t ownFrames = 0;
  const uint32_t tag = epochTag(plan.epoch, coded);
  const std::vector<int64_t> offsets = shuffleOffsetsFor(plan, rank_, coded);
  // Message id -> slot in `received`.
  std::vector<int64_t> slotOf;
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] >= static_cast<int64_t>(slotOf.size())) slotOf.resize(offsets[i] + 1, -1);
    slotOf[offsets[i]] = static_cast<int64_t>(i);
  }
  std::vector<uint8_t> received(offsets.size() * rowBytes);
  std::vector<std::vector<bool>> segs(offsets.size());  // per slot: segments seen
  std::vector<uint32_t> segsLeft(offsets.size(), 0);
  std::vector<size_t> segSize(offsets.size(), 0);  // per slot: the cut its pieces agree on
  size_t complete = 0;
  std::vector<bool> isComplete(offsets.size(), false);
  NetAddress master{};
  bool haveMaster = false;
  uint32_t lastNackRound = 0;
  const NetAddress self{port_->mac(), (10u << 24) | (208u << 16) | (1u << 8) | uint32_t(rank_ + 1),
                        kShuffleUdpPort};
  Sender tx(port_, self);

  // A frame of a message this worker needs that passed its CRCs but is no piece of a row of
  // rowBytes: the master cuts rows of another size. No re-send can fix that, so the worker
  // fails now and tells the master (through its done key) instead of NACKing until the deadline.
  std::string misfit;
  // The master's plan against this worker's: decoded against another plan (a CodedShuffle with
  // another seed, cacheFraction or rows, a std::shuffle of another standard library) the rows
  // would be garbage returned OK. Read once everything arrived (the master set the key before
  // its first frame, so it is this epoch's, not an earlier run's), or at the deadline, where a
  // mismatch explains the messages that never came.
  const Bytes mine = tagBytes(shufflePlanTag(shuffle, plan, coded, rowBytes));
  auto samePlan = [&](Deadline d) -> Status {
    StatusOr<Bytes> theirs = store_->get(planKey(prefix_, tag), d);
    if (!theirs.ok()) return theirs.status().withContext("broadcast shuffle: the master's plan");
    if (*theirs == mine) return OkStatus();
    return FailedPrecondition(
        "broadcast shuffle: worker " + std::to_string(rank_) + " epoch " +
        std::to_string(plan.epoch) + (coded ? " (coded)" : " (uncoded)") +
        ": the master planned another epoch: the master and the workers must plan the same "
        "epoch and mode with the same CodedShuffle options (workers, cacheFraction, rows, seed), "
        "rowBytes and standard library");
  };
  while (complete < offsets.size()) {
    if (!misfit.empty()) {
      const std::string why =
          "rowBytes " + std::to_string(rowBytes) + " does not match the " + "master's: " + misfit;
      return InvalidArgument("broadcast shuffle: worker " + std::to_string(rank_) + " epoch " +
                             std::to_string(plan.epoch) + (coded ? " (coded)" : " (uncoded)") +
                             ": " + why);
    }
    if (deadline.expired()) {
      if (Status p = samePlan(Deadline::afterMs(100));
          p.code() == StatusCode::kFailedPrecondition) {
        return p;
      }
      return DeadlineExceeded("broadcast shuffle: worker " + std::to_string(rank_) + " epoch " +
                              std::to_string(plan.epoch) + (coded ? " (coded)" : " (uncoded)") +
                              ": " + std::to_string(offsets.size() - complete) + " of " +
                              std::to_string(offsets.size()) + " messages missing from the " +
                              (haveMaster ? "master" : "master (never heard)"));
    }
    uint32_t finRound = 0;
    const size_t got = poll(port_, &ignored_, [&](const ParsedFrame& f) {
      const FrameHeader& h = f.header;
      if (h.dstConn != tag) return false;  // another epoch or mode (late re-sends)
      if (h.kind == FrameKind::kFin) {
        master = f.src;
        haveMaster = true;
        finRound = std::max(finRound, h.seq);
        return true;
      }
      if (h.kind != FrameKind::kData) return false;
      master = f.src;
      haveMaster = true;
      if (h.srcConn >= slotOf.size() || slotOf[h.srcConn] < 0) return true;  // not ours
      const auto slot = static_cast<size_t>(slotOf[h.srcConn]);
      if (isComplete[slot]) return true;
      // Trusted only as a piece of the one cut of this row its other pieces agree on: then
      // counting distinct pieces means every byte of the row arrived.
      const size_t cut = shuffleSegmentSize(rowBytes, h.window, h.ack, h.seq, h.length);
      if (cut == 0) {
        misfit = "message " + std::to_string(h.srcConn) + " arrived as piece " +
                 std::to_string(h.ack) + " of " + std::to_string(h.window) + " (" +
                 std::to_string(h.length) + " bytes at offset " + std::to_string(h.seq) +
                 "), no cut of a " + std::to_string(rowBytes) + "-byte row";
        return false;
      }
      if (!segs[slot].empty() && (segs[slot].size() != h.window || segSize[slot] != cut)) {
        return false;  // disagrees with the cut its other pieces used: not ours to trust
      }
      if (segs[slot].empty()) {
        segs[slot].assign(h.window, false);
        segsLeft[slot] = h.window;
        segSize[slot] = cut;
      }
      if (segs[slot][h.ack]) return true;
      if (dropEvery > 0 && ++ownFrames % dropEvery == 0) return true;  // injected loss
      segs[slot][h.ack] = true;
      std::memcpy(received.data() + slot * rowBytes + h.seq, f.payload, h.length);
      if (--segsLeft[slot] == 0) {
        isComplete[slot] = true;
        ++complete;
      }
      return true;
    });
    if (finRound > lastNackRound && complete < offsets.size() && haveMaster) {
      // The master finished a pass and we still miss messages: name them (as many as fit).
      lastNackRound = finRound;
      const size_t maxIds = (port_->mtu() - transport::dpdk::kIpv4HeaderSize -
                             transport::dpdk::kUdpHeaderSize - transport::dpdk::kFrameHeaderSize) /
                            4;
      std::vector<uint32_t> missing;
      for (size_t i = 0; i < offsets.size() && missing.size() < maxIds; ++i) {
        if (!isComplete[i]) missing.push_back(static_cast<uint32_t>(offsets[i]));
      }
      FrameHeader h;
      h.kind = FrameKind::kAck;
      h.dstConn = tag;
      h.srcConn = static_cast<uint32_t>(rank_);
      h.length = static_cast<uint16_t>(missing.size() * 4);
      COFAB_RETURN_IF_ERROR(
          tx.frame(master, h, reinterpret_cast<const uint8_t*>(missing.data()), deadline));
      COFAB_RETURN_IF_ERROR(tx.flush(deadline));
    }
    if (got == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  COFAB_RETURN_IF_ERROR(samePlan(deadline));
  COFAB_RETURN_IF_ERROR(
      shuffleBuildBatch(shuffle, plan, coded, cache, rowBytes, offsets, received, batchOut));
  COFAB_RETURN_IF_ERROR(store_->set(doneKey(prefix_, tag, rank_), kDoneOk));
  if (haveMaster) {
    // An empty NACK tells the master to look at the store now rather than at its next round
    // (a hint only: if it is lost, the round timer finds the key; the batch is built, so its
    // failure fails nothing).
    FrameHeader h;
    h.kind = FrameKind::kAck;
    h.dstConn = tag;
    h.srcConn = static_cast<uint32_t>(rank_);
    if (tx.frame(master, h, nullptr, deadline).ok()) tx.flush(deadline).ignoreError();
  }
  return OkStatus();
}

}  // namespace cofab::coded
