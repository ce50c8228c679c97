#include "fabric/transport/rdma/rdma_endpoint.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "core/clock.h"
#include "core/log.h"
#include "fabric/wire/crc32c.h"

namespace cofab::transport::rdma {
namespace {

// wr_id = kind << 32 | index.
constexpr uint64_t kWrWrite = 1;
constexpr uint64_t kWrCtrlSend = 2;
constexpr uint64_t kWrRecv = 3;
uint64_t wrId(uint64_t kind, uint32_t index) { return kind << 32 | index; }

// Control messages (SEND payload, 8 bytes: type, value; little-endian host order is fine: both
// ends decode with the same code, and the value never crosses hosts of different byte order in
// practice — documented in docs/RDMA.md).
constexpr uint32_t kCtrlCredit = 1;
constexpr uint32_t kCtrlGoodbye = 2;
constexpr uint32_t kCtrlBytes = 16;
constexpr uint32_t kCtrlSends = 8;
constexpr int64_t kGoodbyeWaitNs = 1'000'000'000;

// Timeouts and retries for RTR/RTS (ibv_modify_qp(3) fields; values as NCCL and Gloo pick them):
// min_rnr_timer 12 = 0.64 ms (IBA Table 45), timeout 14 = 4.096 us * 2^14 ~ 67 ms per ack,
// retry_cnt 7, rnr_retry 7 = retry forever (receive buffers are always reposted, so RNR only
// means "slow", never "gone": the side channel reports a dead peer).
constexpr uint8_t kMinRnrTimer = 12;
constexpr uint8_t kAckTimeout = 14;
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetry = 7;

}  // namespace

StatusOr<std::shared_ptr<Endpoint>> Endpoint::create(std::shared_ptr<RdmaDevice> device,
                                                     std::shared_ptr<Worker> worker,
                                                     const EndpointOptions& options) {
  std::shared_ptr<Endpoint> ep(new Endpoint(std::move(device), std::move(worker), options));
  Status s = ep->init();
  if (!s.ok()) {
    ep->abandon();
    return s;
  }
  return ep;
}

Endpoint::Endpoint(std::shared_ptr<RdmaDevice> device, std::shared_ptr<Worker> worker,
                   const EndpointOptions& options)
    : device_(std::move(device)),
      verbs_(device_->verbs()),
      worker_(std::move(worker)),
      options_(options) {}

Endpoint::~Endpoint() { abandon(); }

Status Endpoint::init() {
  const uint32_t slots = options_.slots;
  ctrlRecvCount_ = 2 * slots + kCtrlSends + 4;  // see postRecvBuffer(): never RNR in practice
  ctrlSendCount_ = kCtrlSends;
  const std::string dev = device_->name();
  errno = 0;
  // ibv_create_cq(3): cqe is a minimum; every WR that can be outstanding at once fits.
  const int cqe = static_cast<int>(slots + ctrlSendCount_ + ctrlRecvCount_ + 16);
  cq_ = verbs_.createCq(device_->context(), cqe, nullptr, nullptr, 0);
  if (cq_ == nullptr) return verbsError(StatusCode::kIoError, "ibv_create_cq(" + dev + ")", errno);

  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = slots + ctrlSendCount_ + 2;
  qa.cap.max_recv_wr = ctrlRecvCount_;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  errno = 0;
  qp_ = verbs_.createQp(device_->pd(), &qa);
  if (qp_ == nullptr)
    return verbsError(StatusCode::kIoError, "ibv_create_qp(RC, " + dev + ")", errno);

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = device_->port();
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  // ibv_modify_qp(3), RC table: Init requires STATE, PKEY_INDEX, PORT, ACCESS_FLAGS.
  if (int rc = verbs_.modifyQp(
          qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    return verbsError(StatusCode::kIoError, "ibv_modify_qp(RESET->INIT)", rc);
  }

  recvSlots_.assign(size_t{slots} * options_.slotBytes, 0);
  stageSlots_.assign(size_t{slots} * options_.slotBytes, 0);
  ctrlRecv_.assign(size_t{ctrlRecvCount_} * kCtrlBytes, 0);
  ctrlSend_.assign(size_t{ctrlSendCount_} * kCtrlBytes, 0);
  COFAB_ASSIGN_OR_RETURN(recvMr_,
                         RdmaMemoryRegion::create(device_, recvSlots_.data(), recvSlots_.size(),
                                                  IBV_ACCESS_REMOTE_WRITE));
  COFAB_ASSIGN_OR_RETURN(
      stageMr_, RdmaMemoryRegion::create(device_, stageSlots_.data(), stageSlots_.size(), 0));
  COFAB_ASSIGN_OR_RETURN(ctrlRecvMr_,
                         RdmaMemoryRegion::create(device_, ctrlRecv_.data(), ctrlRecv_.size(), 0));
  COFAB_ASSIGN_OR_RETURN(ctrlSendMr_,
                         RdmaMemoryRegion::create(device_, ctrlSend_.data(), ctrlSend_.size(), 0));
  stageBusy_.assign(slots, false);
  stageOp_.assign(slots, nullptr);
  ctrlSendBusy_.assign(ctrlSendCount_, false);
  // ibv_post_recv(3): receives may be posted once the QP is in INIT, before it can receive.
  for (uint32_t i = 0; i < ctrlRecvCount_; ++i) COFAB_RETURN_IF_ERROR(postRecvBuffer(i));
  std::random_device rd;
  psn_ = rd() & 0xffffff;  // 24-bit PSN (IBA §9.4.1.1)
  return OkStatus();
}

QpInfo Endpoint::localInfo() const {
  QpInfo i;
  i.qpNum = qp_->qp_num;
  i.psn = psn_;
  i.lid = device_->lid();
  i.mtu = static_cast<uint8_t>(device_->activeMtu());
  i.gid = device_->gid();
  i.slotAddr = reinterpret_cast<uint64_t>(recvSlots_.data());
  i.slotRkey = recvMr_->rkey();
  i.slotCount = options_.slots;
  i.slotBytes = options_.slotBytes;
  return i;
}

Status Endpoint::connectQp(const QpInfo& remote) {
  remote_ = remote;
  credits_ = remote.slotCount;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(remote.mtu, device_->activeMtu()));
  a.dest_qp_num = remote.qpNum;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = kMinRnrTimer;
  // Address vector: always with a GRH (required on RoCE, where the GID is the address; harmless
  // inside an InfiniBand subnet), plus the LID for InfiniBand.
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = remote.gid;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->gidIndex());
  a.ah_attr.grh.hop_limit = 255;
  a.ah_attr.dlid = remote.lid;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.port_num = device_->port();
  // ibv_modify_qp(3), RC table: RTR requires STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN,
  // MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER.
  if (int rc =
          verbs_.modifyQp(qp_, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return verbsError(StatusCode::kIoError,
                      "ibv_modify_qp(INIT->RTR, remote qp " + std::to_string(remote.qpNum) +
                          " gid " + gidToString(remote.gid) + ")",
                      rc);
  }
  ibv_qp_attr b{};
  b.qp_state = IBV_QPS_RTS;
  b.sq_psn = psn_;
  b.timeout = kAckTimeout;
  b.retry_cnt = kRetryCount;
  b.rnr_retry = kRnrRetry;
  b.max_rd_atomic = 1;
  // ibv_modify_qp(3), RC table: RTS requires STATE, SQ_PSN, MAX_QP_RD_ATOMIC, RETRY_CNT,
  // RNR_RETRY, TIMEOUT.
  if (int rc = verbs_.modifyQp(qp_, &b,
                               IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return verbsError(StatusCode::kIoError, "ibv_modify_qp(RTR->RTS)", rc);
  }
  return OkStatus();
}

void Endpoint::start(std::string peerId, std::string peerAddress,
                     std::shared_ptr<Connection> sideChannel) {
  peerId_ = std::move(peerId);
  peerAddress_ = std::move(peerAddress);
  side_ = std::move(sideChannel);
  started_ = true;
  // Liveness: any end of the side channel (EOF, error, even an unexpected message) means the
  // peer is gone or confused; the worker sorts out whether its goodbye came first.
  std::weak_ptr<Endpoint> weak = weak_from_this();
  side_->recvOwned([weak](const Status& s, const wire::Header& h, std::vector<uint8_t>&& b) {
    if (auto ep = weak.lock()) {
      std::string why;
      if (s.ok() && h.type == wire::MessageType::kControl && h.opcode == kOpcodeFailed) {
        why.assign(b.begin(), b.end());
      }
      ep->worker_->post([ep, s, why] { ep->onSideChannelEnd(s, why); });
    }
  });
  if (!worker_->add(shared_from_this())) {
    // The context closed while this connection was being set up.
    std::lock_guard<std::mutex> lock(statusMu_);
    status_ = FailedPrecondition(describe() + ": its transport context has been closed");
  }
}

std::string Endpoint::describe() const {
  return "rdma connection to '" + peerId_ + "' (" + peerAddress_ + ")";
}

Status Endpoint::status() const {
  std::lock_guard<std::mutex> lock(statusMu_);
  if (peerGoneFirst_) return peerGoneSeen_;
  if (!status_.ok()) return status_;
  if (!peerGoneSeen_.ok()) return peerGoneSeen_;  // the first error, also after close()
  if (appClosed_) return Cancelled(describe() + " was closed");
  return status_;
}

Status Endpoint::stickyError() const {
  std::lock_guard<std::mutex> lock(statusMu_);
  return status_;
}

// --- operations: validated where called, run on the worker ---------------------------------

void Endpoint::send(const wire::Header& header, ConstSlices payload, SendCallback done) {
  auto op = std::make_shared<SendOp>();
  op->done = std::move(done);
  wire::Header h = header;
  h.payloadLength = totalSize(payload);
  Status bad;
  for (const auto& s : payload) {
    if (s.data == nullptr && s.size > 0) {
      bad = InvalidArgument("send on " + describe() + ": a null slice of " +
                            std::to_string(s.size) + " bytes");
    }
  }
  if (bad.ok()) bad = wire::validateHeader(h, {.maxPayload = options_.maxPayload});
  if (!bad.ok()) {
    // Queued like any send (total 0: nothing to post), so that it completes after the sends
    // posted before it; completing it through a task of its own overtook them.
    op->error = std::move(bad);
  } else {
    if (h.hasPayloadCrc()) {
      h.payloadCrc = 0;
      for (const auto& s : payload) h.payloadCrc = wire::crc32c(h.payloadCrc, s.data, s.size);
    }
    wire::encodeHeader(h, op->header.data());
    op->slices.assign(payload.begin(), payload.end());
    op->total = wire::kHeaderSize + h.payloadLength;
  }
  auto self = shared_from_this();
  worker_->postOrDetach([self, op]() mutable { self->doSend(std::move(op)); });
}

void Endpoint::recv(MutableSlices dest, RecvCallback done) {
  RecvOp op;
  op.dest.assign(dest.begin(), dest.end());
  op.expected = totalSize(dest);
  op.done = std::move(done);
  for (const auto& d : dest) {
    if (d.data == nullptr && d.size > 0) {
      // Queued like any receive and completed in its turn (processRecvs()).
      op.error = InvalidArgument("recv on " + describe() + ": a null slice of " +
                                 std::to_string(d.size) + " bytes");
      break;
    }
  }
  auto self = shared_from_this();
  worker_->postOrDetach([self, op = std::move(op)]() mutable { self->doRecv(std::move(op)); });
}

void Endpoint::recvOwned(RecvOwnedCallback done) {
  RecvOp op;
  op.owned = true;
  op.ownedDone = std::move(done);
  auto self = shared_from_this();
  worker_->postOrDetach([self, op = std::move(op)]() mutable { self->doRecv(std::move(op)); });
}

void Endpoint::close() {
  {
    std::lock_guard<std::mutex> lock(statusMu_);
    appClosed_ = true;
  }
  auto self = shared_from_this();
  worker_->postOrDetach([self] { self->doClose(Cancelled(self->describe() + " was closed")); });
}

void Endpoint::shutdown() { doClose(Cancelled(describe() + ": its transport context was closed")); }

// Once the connection is closed, failed or its peer gone, nothing is queued (fail() and
// peerGone() emptied the queue), so refusing an operation at once keeps the posting order. An
// operation's own validation error wins over the connection's state, as on loopback.
void Endpoint::doSend(std::shared_ptr<SendOp> op) {
  Status refused;
  if (closed_ || finished_) {
    refused = FailedPrecondition("send on " + describe() + ": the connection is closed");
  } else if (Status s = stickyError(); !s.ok()) {
    refused = s;
  } else if (!peerClosed_.ok()) {
    refused = peerClosed_;
  }
  if (!refused.ok()) return op->done(op->error.ok() ? refused : op->error);
  sends_.push_back(std::move(op));
  pumpSends();
  completeSends();  // an invalid send with nothing before it completes now
}

void Endpoint::doRecv(RecvOp op) {
  Status refused;
  if (closed_ || finished_) {
    refused = FailedPrecondition("recv on " + describe() + ": the connection is closed");
  } else if (Status s = stickyError(); !s.ok()) {
    refused = s;
  }
  if (!refused.ok()) return finishRecv(op, op.error.ok() ? refused : op.error);
  recvOps_.push_back(std::move(op));
  processRecvs();
}

void Endpoint::finishRecv(RecvOp& op, const Status& s) {
  const wire::Header h = op.started ? op.header : wire::Header{};
  if (op.owned) {
    op.ownedDone(s, h, s.ok() ? std::move(op.payload) : std::vector<uint8_t>{});
  } else {
    op.done(s, h);
  }
}

// --- sending ------------------------------------------------------------------------------

void Endpoint::pumpSends() {
  const uint32_t localSlots = options_.slots;
  const uint64_t chunkBytes = std::min(options_.slotBytes, remote_.slotBytes);
  while (status_.ok() && !closed_ && peerClosed_.ok() && credits_ > 0) {
    SendOp* op = nullptr;
    for (auto& o : sends_) {
      if (o->posted < o->total) {
        op = o.get();
        break;
      }
    }
    if (op == nullptr) return;
    const uint32_t stage = static_cast<uint32_t>(chunksSent_ % localSlots);
    if (stageBusy_[stage]) return;  // its previous WRITE has not completed yet
    const uint32_t rslot = static_cast<uint32_t>(chunksSent_ % remote_.slotCount);
    const uint64_t n = std::min(chunkBytes, op->total - op->posted);
    uint8_t* dst = stageSlots_.data() + size_t{stage} * options_.slotBytes;
    uint64_t filled = 0;
    if (op->posted == 0) {
      std::memcpy(dst, op->header.data(), wire::kHeaderSize);
      filled = wire::kHeaderSize;
    }
    while (filled < n) {
      const ConstSlice& s = op->slices[op->slice];
      const size_t take = std::min<uint64_t>(s.size - op->sliceOffset, n - filled);
      if (take > 0) {
        std::memcpy(dst + filled, static_cast<const uint8_t*>(s.data) + op->sliceOffset, take);
      }
      filled += take;
      op->sliceOffset += take;
      if (op->sliceOffset == s.size) {
        ++op->slice;
        op->sliceOffset = 0;
      }
    }
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(dst);
    sge.length = static_cast<uint32_t>(n);
    sge.lkey = stageMr_->lkey();
    ibv_send_wr wr{};
    wr.wr_id = wrId(kWrWrite, stage);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(rslot);  // ibv_post_send(3): imm_data is in network byte order
    wr.wr.rdma.remote_addr = remote_.slotAddr + uint64_t{rslot} * remote_.slotBytes;
    wr.wr.rdma.rkey = remote_.slotRkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = verbs_.postSend(qp_, &wr, &bad); rc != 0) {
      return fail(
          verbsError(StatusCode::kIoError, "ibv_post_send(RDMA_WRITE_WITH_IMM)", rc, describe()));
    }
    stageBusy_[stage] = true;
    stageOp_[stage] = op;
    --credits_;
    ++chunksSent_;
    op->posted += n;
    ++op->inFlight;
  }
}

void Endpoint::completeSends() {
  while (!sends_.empty() && sends_.front()->posted == sends_.front()->total &&
         sends_.front()->inFlight == 0) {
    auto op = std::move(sends_.front());
    sends_.pop_front();
    op->done(op->error);  // OK, or the validation error of a send that posted nothing
  }
}

bool Endpoint::postControl(uint32_t type, uint32_t value) {
  const uint32_t idx = ctrlSendNext_;
  if (ctrlSendBusy_[idx]) return false;
  uint8_t* buf = ctrlSend_.data() + size_t{idx} * kCtrlBytes;
  std::memcpy(buf, &type, 4);
  std::memcpy(buf + 4, &value, 4);
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(buf);
  sge.length = 8;
  sge.lkey = ctrlSendMr_->lkey();
  ibv_send_wr wr{};
  wr.wr_id = wrId(kWrCtrlSend, idx);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int rc = verbs_.postSend(qp_, &wr, &bad); rc != 0) {
    fail(verbsError(StatusCode::kIoError, "ibv_post_send(SEND control)", rc, describe()));
    return false;
  }
  ctrlSendBusy_[idx] = true;
  ctrlSendNext_ = (idx + 1) % ctrlSendCount_;
  if (type == kCtrlGoodbye) goodbyeIndex_ = idx;
  return true;
}

void Endpoint::returnCredits(bool force) {
  const uint32_t batch = std::max<uint32_t>(1, options_.slots / 4);
  if (freedSinceCredit_ == 0 || (!force && freedSinceCredit_ < batch)) return;
  // After the peer's goodbye (or its death) nobody takes credits: its QP may be destroyed, and
  // the SEND's error completion would fail what it sent before leaving, still unread here.
  if (!status_.ok() || closed_ || !peerClosed_.ok()) return;
  if (postControl(kCtrlCredit, freedSinceCredit_)) freedSinceCredit_ = 0;
}

// --- receiving ----------------------------------------------------------------------------

Status Endpoint::postRecvBuffer(uint32_t index) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(ctrlRecv_.data() + size_t{index} * kCtrlBytes);
  sge.length = kCtrlBytes;
  sge.lkey = ctrlRecvMr_->lkey();
  ibv_recv_wr wr{};
  wr.wr_id = wrId(kWrRecv, index);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = verbs_.postRecv(qp_, &wr, &bad); rc != 0) {
    return verbsError(StatusCode::kIoError, "ibv_post_recv", rc, describe());
  }
  return OkStatus();
}

void Endpoint::processRecvs() {
  while (!recvOps_.empty() && status_.ok()) {
    if (!recvOps_.front().error.ok()) {
      // Failed validation when posted: its turn has come; it consumes no message.
      RecvOp bad = std::move(recvOps_.front());
      recvOps_.pop_front();
      const Status s = bad.error;
      finishRecv(bad, s);
      continue;
    }
    RecvOp& op = recvOps_.front();
    if (arrived_.empty()) break;
    const Chunk chunk = arrived_.front();
    const uint8_t* data = recvSlots_.data() + size_t{chunk.slot} * options_.slotBytes;
    if (!op.started) {
      auto h = wire::decodeHeader(
          std::span<const uint8_t>(data, std::min<uint32_t>(chunk.length, wire::kHeaderSize)),
          {.maxPayload = options_.maxPayload});
      if (!h.ok()) return fail(h.status().withContext("recv on " + describe()));
      op.started = true;
      op.header = *h;
      chunkOffset_ = wire::kHeaderSize;
      if (!op.owned && h->payloadLength != op.expected) {
        return fail(InvalidArgument("recv on " + describe() + ": the peer sent " + h->describe() +
                                    " of " + std::to_string(h->payloadLength) +
                                    " bytes but the posted receive expects " +
                                    std::to_string(op.expected)));
      }
      if (op.owned) op.payload.resize(h->payloadLength);
    }
    const uint64_t remaining = op.header.payloadLength - op.copied;
    const uint64_t avail = chunk.length - chunkOffset_;
    if (avail > remaining) {
      return fail(DataLoss("recv on " + describe() + ": a chunk carries " + std::to_string(avail) +
                           " bytes past the end of " + op.header.describe()));
    }
    const uint8_t* src = data + chunkOffset_;
    if (op.header.hasPayloadCrc()) op.crc = wire::crc32c(op.crc, src, avail);
    if (op.owned) {
      if (avail > 0) std::memcpy(op.payload.data() + op.copied, src, avail);
    } else {
      uint64_t left = avail;
      while (left > 0) {
        const MutableSlice& d = op.dest[op.slice];
        const size_t take = std::min<uint64_t>(d.size - op.sliceOffset, left);
        if (take > 0) std::memcpy(static_cast<uint8_t*>(d.data) + op.sliceOffset, src, take);
        src += take;
        left -= take;
        op.sliceOffset += take;
        if (op.sliceOffset == d.size) {
          ++op.slice;
          op.sliceOffset = 0;
        }
      }
    }
    op.copied += avail;
    arrived_.pop_front();
    chunkOffset_ = 0;
    ++freedSinceCredit_;
    if (op.copied == op.header.payloadLength) {
      RecvOp done = std::move(op);
      recvOps_.pop_front();
      Status s;
      if (done.header.hasPayloadCrc() && done.crc != done.header.payloadCrc) {
        s = DataLoss("recv on " + describe() + ": payload CRC32C mismatch for " +
                     done.header.describe());
        {
          // Sticky already in the callback (status()), as the contract wants.
          std::lock_guard<std::mutex> lock(statusMu_);
          if (status_.ok()) status_ = s;
        }
        finishRecv(done, s);
        return fail(s);
      }
      finishRecv(done, s);
    }
  }
  returnCredits(false);
  // After the peer's goodbye (or its disappearance) everything that arrived before it has been
  // delivered once nothing is left: from then on the close is the sticky error.
  if (!peerClosed_.ok() && status_.ok() && arrived_.empty()) fail(peerClosed_);
}

void Endpoint::handleCompletion(const ibv_wc& wc) {
  const uint64_t kind = wc.wr_id >> 32;
  const auto idx = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  if (wc.status != IBV_WC_SUCCESS) {
    if (kind == kWrCtrlSend && idx < ctrlSendCount_) {
      ctrlSendBusy_[idx] = false;
      if (closing_ && idx == goodbyeIndex_) goodbyeDone_ = true;  // the peer is gone anyway
    }
    if (closed_) return;  // flushes of our own teardown
    // After the peer's goodbye or death its QP may be gone: an error completion now (a WRITE
    // or credit posted before we saw the goodbye) is its teardown, not a failure of ours; the
    // outcome is its close, reported once what arrived before it has been read.
    if (!peerClosed_.ok()) return;
    // ibv_poll_cq(3): after an error completion the QP is in the error state; only wr_id,
    // status, qp_num and vendor_err are valid.
    return fail(wcError(wc, kind == kWrWrite      ? "RDMA WRITE WITH IMM"
                            : kind == kWrCtrlSend ? "SEND"
                                                  : "RECV"));
  }
  if (kind == kWrWrite) {
    stageBusy_[idx] = false;
    SendOp* op = stageOp_[idx];
    stageOp_[idx] = nullptr;
    // Null when the op was failed (and destroyed) while this chunk was in flight: the QP stays
    // in RTS after our orderly close or the peer's goodbye, so such WRITEs still complete.
    if (op != nullptr) --op->inFlight;
    completeSends();
  } else if (kind == kWrCtrlSend) {
    ctrlSendBusy_[idx] = false;
    if (closing_ && idx == goodbyeIndex_) goodbyeDone_ = true;
  } else if (kind == kWrRecv) {
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      const uint32_t slot = ntohl(wc.imm_data);
      const auto expected = static_cast<uint32_t>(chunksArrived_ % options_.slots);
      if (slot != expected || wc.byte_len > options_.slotBytes) {
        return fail(DataLoss("recv on " + describe() + ": chunk for slot " + std::to_string(slot) +
                             " (" + std::to_string(wc.byte_len) + " bytes) where slot " +
                             std::to_string(expected) +
                             " was next: the peer broke the slot protocol"));
      }
      arrived_.push_back({slot, wc.byte_len});
      ++chunksArrived_;
    } else if (wc.opcode == IBV_WC_RECV) {
      uint32_t type = 0, value = 0;
      const uint8_t* buf = ctrlRecv_.data() + size_t{idx} * kCtrlBytes;
      std::memcpy(&type, buf, 4);
      std::memcpy(&value, buf + 4, 4);
      if (type == kCtrlCredit) {
        credits_ += value;
      } else if (type == kCtrlGoodbye) {
        goodbyeSeen_ = true;
        peerGone(RemoteError("rdma: peer '" + peerId_ + "' (" + peerAddress_ +
                             ") closed the connection"));
      }
    }
    if (Status s = postRecvBuffer(idx); !s.ok() && !closed_) return fail(s);
  }
}

Status Endpoint::wcError(const ibv_wc& wc, const char* what) const {
  return RemoteError("rdma: " + std::string(what) + " on " + describe() + " completed with '" +
                     verbs_.wcStatusStr(wc.status) + "' (ibv_wc_status " +
                     std::to_string(wc.status) + ", vendor_err " + std::to_string(wc.vendor_err) +
                     ")");
}

bool Endpoint::poll() {
  if (finished_ || !started_) return false;
  ibv_wc wc[32];
  const int n = verbs_.pollCq(cq_, 32, wc);
  if (n < 0) {
    // ibv_poll_cq(3): a negative value is an error (the CQ itself is broken).
    fail(IoError("ibv_poll_cq failed (" + std::to_string(n) + ") on " + describe()));
  }
  for (int i = 0; i < n; ++i) handleCompletion(wc[i]);
  if (closing_) {
    if (goodbyeIndex_ == UINT32_MAX && !goodbyeDone_) postControl(kCtrlGoodbye, 0);
    if (goodbyeDone_ || nowNs() > goodbyeDeadlineNs_) teardown();
    return n > 0;
  }
  if (n > 0) {
    pumpSends();
    processRecvs();
  }
  return n > 0;
}

// --- errors and closing -------------------------------------------------------------------

void Endpoint::fail(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(statusMu_);
    if (status_.ok()) status_ = s;
  }
  const Status sticky = stickyError();
  auto sends = takeSends();
  auto recvs = std::move(recvOps_);
  recvOps_.clear();
  for (auto& op : sends) op->done(op->error.ok() ? sticky : op->error);
  for (auto& op : recvs) finishRecv(op, op.error.ok() ? sticky : op.error);
  // A local failure must reach the peer too, with its reason (else it would take the end of the
  // side channel for this process's death); the channel closes once that is sent.
  if (!closed_ && side_) {
    auto why = std::make_shared<std::string>(sticky.message());
    wire::Header h;
    h.type = wire::MessageType::kControl;
    h.opcode = kOpcodeFailed;
    h.dtype = DType::kU8;
    std::shared_ptr<Connection> side = side_;
    side->send(h, why->data(), why->size(), [why, side](const Status&) { side->close(); });
  }
}

void Endpoint::peerGone(const Status& s) {
  if (peerClosed_.ok()) peerClosed_ = s;
  {
    // status() reports it from now on, in the failed sends' callbacks too; status_, which
    // refuses new operations, waits until what arrived before it has been read.
    std::lock_guard<std::mutex> lock(statusMu_);
    if (peerGoneSeen_.ok()) peerGoneSeen_ = s;
  }
  // Nothing more will be read by the peer: sends still waiting fail now.
  auto sends = takeSends();
  for (auto& op : sends) op->done(op->error.ok() ? peerClosed_ : op->error);
  processRecvs();
}

std::deque<std::shared_ptr<Endpoint::SendOp>> Endpoint::takeSends() {
  auto sends = std::move(sends_);
  sends_.clear();
  // Chunks of these sends may still be in flight, and their WRITEs still complete successfully
  // when the QP stays in RTS (our orderly close waits for the goodbye; a goodbye received
  // leaves it as it is). Their stage slots stay busy until then, but the completions must not
  // reach the ops, which die with `sends`. Every op a stage slot names is in sends_ (an op
  // leaves it through completeSends() only once none of its chunks is in flight), and all of
  // them are being failed, so every entry goes.
  std::fill(stageOp_.begin(), stageOp_.end(), nullptr);
  return sends;
}

void Endpoint::onSideChannelEnd(const Status& s, const std::string& peerFailure) {
  if (closed_ || finished_) return;
  // A goodbye completed before the side channel closed (the closer waits for it), so it is in
  // the CQ by now: drain first, then decide whether this was an orderly close or a death.
  while (!finished_ && poll()) {
  }
  if (goodbyeSeen_ || finished_) return;
  if (!peerFailure.empty()) {
    peerGone(RemoteError("rdma: peer '" + peerId_ + "' (" + peerAddress_ +
                         ") failed the connection on its side: " + peerFailure));
    return;
  }
  peerGone(RemoteError("rdma: peer '" + peerId_ + "' (" + peerAddress_ +
                       ") went away without closing the connection (side channel: " + s.message() +
                       ")"));
}

void Endpoint::doClose(Status why) {
  if (closed_ || finished_) return;
  const bool healthy = started_ && status_.ok() && peerClosed_.ok();
  closed_ = true;  // first: fail() must not end the side channel before the goodbye is out
  {
    // The peer's goodbye (seen, its data perhaps still read since) came before this close: it
    // stays the first error, while the operations still pending fail with `why`.
    std::lock_guard<std::mutex> lock(statusMu_);
    if (status_.ok() && !peerGoneSeen_.ok()) peerGoneFirst_ = true;
  }
  fail(why);
  if (!healthy) return teardown();
  // Orderly: a goodbye SEND after everything already posted; tear down once it completed (the
  // peer has it) or after a bounded wait.
  closing_ = true;
  goodbyeDeadlineNs_ = nowNs() + kGoodbyeWaitNs;
  postControl(kCtrlGoodbye, 0);
}

void Endpoint::teardown() {
  if (finished_) return;
  finished_ = true;
  closed_ = true;
  if (side_) side_->close();
  releaseVerbs();
}

void Endpoint::abandon() {
  finished_ = true;
  releaseVerbs();
}

void Endpoint::releaseVerbs() {
  // ibv_destroy_qp(3) before ibv_destroy_cq(3) (a CQ with a QP attached is EBUSY), memory
  // regions after the QP that could still access them.
  if (qp_ != nullptr) verbs_.destroyQp(qp_);
  qp_ = nullptr;
  if (cq_ != nullptr) verbs_.destroyCq(cq_);
  cq_ = nullptr;
  recvMr_.reset();
  stageMr_.reset();
  ctrlRecvMr_.reset();
  ctrlSendMr_.reset();
}

}  // namespace cofab::transport::rdma
