#include "fabric/transport/tcp/tcp_connection.h"

#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <thread>

#include "fabric/transport/tcp/lingering_close.h"
#include "fabric/wire/crc32c.h"

namespace cofab::transport::tcp {
namespace {

// writev/readv accept at most IOV_MAX entries; gathering a few hundred already amortises the
// syscall over many small messages.
constexpr size_t kMaxGather = 256;

// Sends up to this size are written by the calling thread when nothing is queued ahead of them:
// the data leaves without waiting for the loop to wake (the latency of small collectives). Larger
// ones go through the loop so a caller never blocks the loop for long on writeMu_.
constexpr size_t kInlineWriteMax = 256 * 1024;

// writev() with MSG_NOSIGNAL: a peer that went away must turn into EPIPE -> RemoteError, not a
// SIGPIPE that kills the process.
ssize_t writeIov(int fd, iovec* iov, size_t count) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = count;
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL);
}

template <typename Slice>
Status checkSlices(std::span<const Slice> slices, const char* what) {
  size_t total = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].data == nullptr && slices[i].size > 0) {
      return InvalidArgument(std::string(what) + ": slice " + std::to_string(i) +
                             " has a null pointer and " + std::to_string(slices[i].size) +
                             " bytes");
    }
    // The total must not wrap (a small payloadLength over huge iovecs: readv/sendmsg then fail
    // the whole connection) nor pass what one readv/sendmsg can report.
    if (__builtin_add_overflow(total, slices[i].size, &total) ||
        total > static_cast<size_t>(SSIZE_MAX)) {
      return InvalidArgument(std::string(what) + ": the slices add up to more than " +
                             std::to_string(SSIZE_MAX) + " bytes");
    }
  }
  return OkStatus();
}

}  // namespace

Status checkSendable(const wire::Header& header, ConstSlices payload) {
  COFAB_RETURN_IF_ERROR(checkSlices(payload, "send"));
  wire::Header h = header;
  h.payloadLength = totalSize(payload);
  return wire::validateHeader(h, wire::DecodeOptions{UINT64_MAX});
}

Status checkReceivable(MutableSlices dest) { return checkSlices(dest, "recv"); }

TcpConnectionImpl::TcpConnectionImpl(Params p)
    : peerId_(std::move(p.peerId)),
      peerAddress_(std::move(p.peerAddress)),
      maxPayload_(p.maxPayload),
      loop_(std::move(p.loop)),
      fd_(std::move(p.fd)) {}

TcpConnectionImpl::~TcpConnectionImpl() = default;

std::string TcpConnectionImpl::describe() const {
  return "tcp connection to '" + peerId_ + "' (" + peerAddress_ + ")";
}

Status TcpConnectionImpl::status() const {
  std::lock_guard<std::mutex> lock(submitMu_);
  return error_;
}

Status TcpConnectionImpl::attach() {
  auto self = shared_from_this();
  const bool ok = loop_->post([self] {
    if (self->failed_) return;
    Status s = self->loop_->add(self->fd_.get(), EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, self);
    if (!s.ok()) {
      self->fail(s.withContext(self->describe()));
      return;
    }
    self->attached_ = true;
    {
      std::lock_guard<std::mutex> w(self->writeMu_);
      self->writeReady_ = true;
    }
    self->pumpReads();
    self->flushWrites();
  });
  if (!ok) return Cancelled("tcp: the transport context is closed");
  return OkStatus();
}

std::unique_ptr<TcpConnectionImpl::SendOp> TcpConnectionImpl::takeSendOp() {
  if (freeSends_.empty()) return std::make_unique<SendOp>();
  auto op = std::move(freeSends_.back());
  freeSends_.pop_back();
  return op;
}

std::unique_ptr<TcpConnectionImpl::RecvOp> TcpConnectionImpl::takeRecvOp() {
  if (freeRecvs_.empty()) return std::make_unique<RecvOp>();
  auto op = std::move(freeRecvs_.back());
  freeRecvs_.pop_back();
  return op;
}

void TcpConnectionImpl::send(const wire::Header& header, ConstSlices payload, SendCallback done) {
  std::unique_ptr<SendOp> op;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    op = takeSendOp();
  }
  op->done = std::move(done);
  op->next = 0;
  op->written = false;
  op->iov.clear();
  // The peer would reject what it cannot decode: fail here, naming the caller's mistake.
  op->error = checkSendable(header, payload);
  if (op->error.ok()) {
    wire::Header h = header;
    h.payloadLength = totalSize(payload);
    if (h.hasPayloadCrc()) {
      uint32_t crc = 0;
      for (const auto& s : payload) crc = wire::crc32c(crc, s.data, s.size);
      h.payloadCrc = crc;
    } else {
      h.payloadCrc = 0;
    }
    wire::encodeHeader(h, op->header.data());
    op->iov.push_back({op->header.data(), wire::kHeaderSize});
    for (const auto& s : payload) {
      if (s.size > 0) op->iov.push_back({const_cast<void*>(s.data), s.size});
    }
  } else {
    op->error = op->error.withContext("send on " + describe());
  }
  submitSend(std::move(op));
}

void TcpConnectionImpl::recv(MutableSlices dest, RecvCallback done) {
  std::unique_ptr<RecvOp> op;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    op = takeRecvOp();
  }
  op->owned = false;
  op->routed = false;
  op->done = std::move(done);
  op->dest.clear();
  op->expected = 0;
  op->error = checkReceivable(dest);
  if (op->error.ok()) {
    for (const auto& s : dest) {
      if (s.size > 0) op->dest.push_back({s.data, s.size});
      op->expected += s.size;
    }
  }
  submitRecv(std::move(op));
}

void TcpConnectionImpl::recvOwned(RecvOwnedCallback done) {
  std::unique_ptr<RecvOp> op;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    op = takeRecvOp();
  }
  op->owned = true;
  op->routed = false;
  op->route = nullptr;
  op->ownedDone = std::move(done);
  op->dest.clear();
  op->expected = 0;
  op->error = OkStatus();
  submitRecv(std::move(op));
}

void TcpConnectionImpl::recvRouted(RecvRoute route, RecvOwnedCallback done) {
  std::unique_ptr<RecvOp> op;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    op = takeRecvOp();
  }
  op->owned = true;
  op->routed = false;
  op->route = std::move(route);
  op->ownedDone = std::move(done);
  op->dest.clear();
  op->expected = 0;
  op->error = OkStatus();
  submitRecv(std::move(op));
}

void TcpConnectionImpl::submitSend(std::unique_ptr<SendOp> op) {
  bool needSchedule = false;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    if (closed_ && op->error.ok()) {
      op->error = FailedPrecondition("send on " + describe() + ": the connection is closed");
    }
    tryInlineWrite(op);
    if (op) submittedSends_.push_back(std::move(op));
    needSchedule = !scheduled_;
    scheduled_ = true;
  }
  if (needSchedule && !loop_->schedule(shared_from_this())) failOffLoop();
}

void TcpConnectionImpl::submitRecv(std::unique_ptr<RecvOp> op) {
  bool needSchedule = false;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    if (closed_ && op->error.ok()) {
      op->error = FailedPrecondition("recv on " + describe() + ": the connection is closed");
    }
    submittedRecvs_.push_back(std::move(op));
    needSchedule = !scheduled_;
    scheduled_ = true;
  }
  if (needSchedule && !loop_->schedule(shared_from_this())) failOffLoop();
}

void TcpConnectionImpl::failOffLoop() {
  std::vector<std::unique_ptr<SendOp>> sends;
  std::vector<std::unique_ptr<RecvOp>> recvs;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    {
      // Already written ones first, and they succeeded: keep that.
      std::lock_guard<std::mutex> w(writeMu_);
      for (auto& op : doneSends_) op->written = true;
      sends.swap(doneSends_);
    }
    for (auto& op : submittedSends_) sends.push_back(std::move(op));
    submittedSends_.clear();
    recvs.swap(submittedRecvs_);
    scheduled_ = false;
  }
  completeOffLoop(std::move(sends), std::move(recvs),
                  FailedPrecondition(describe() + ": its transport context has been closed"));
}

void TcpConnectionImpl::tryInlineWrite(std::unique_ptr<SendOp>& op) {
  if (!op->error.ok() || !error_.ok() || !submittedSends_.empty() || sendsInTransit_) return;
  size_t total = 0;
  for (const auto& v : op->iov) total += v.iov_len;
  if (total > kInlineWriteMax) return;
  std::unique_lock<std::mutex> w(writeMu_, std::try_to_lock);
  if (!w.owns_lock() || !writeReady_ || !writable_ || sendHead_ != sendQueue_.size()) return;
  const ssize_t n = writeIov(fd_.get(), op->iov.data(), op->iov.size());
  if (n == static_cast<ssize_t>(total)) {
    // Its callback waits for the loop, behind every send completed before it: one list keeps
    // them all in posting order, whoever wrote them.
    doneSends_.push_back(std::move(op));
    return;
  }
  // Partly written, or not at all: the loop carries on from here (and reports any error).
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) writable_ = false;
  } else {
    size_t left = static_cast<size_t>(n);
    while (op->next < op->iov.size() && left >= op->iov[op->next].iov_len) {
      left -= op->iov[op->next].iov_len;
      ++op->next;
    }
    auto& v = op->iov[op->next];
    v.iov_base = static_cast<uint8_t*>(v.iov_base) + left;
    v.iov_len -= left;
  }
  sendQueue_.push_back(std::move(op));
}

void TcpConnectionImpl::completeOffLoop(std::vector<std::unique_ptr<SendOp>> sends,
                                        std::vector<std::unique_ptr<RecvOp>> recvs, Status why) {
  if (sends.empty() && recvs.empty()) return;
  // Rare misuse path (operations after Context::join()): the runner keeps the "never inline"
  // promise, and runs this connection's completions one batch at a time in posting order (a
  // thread per batch let them overlap and reorder).
  auto batch = std::make_shared<
      std::pair<std::vector<std::unique_ptr<SendOp>>, std::vector<std::unique_ptr<RecvOp>>>>(
      std::move(sends), std::move(recvs));
  offLoop_->post([batch, why] {
    auto& [sends, recvs] = *batch;
    for (auto& op : sends) {
      if (op->done) op->done(op->written ? OkStatus() : op->error.ok() ? why : op->error);
    }
    for (auto& op : recvs) {
      const Status& s = op->error.ok() ? why : op->error;
      if (op->owned) {
        if (op->ownedDone) op->ownedDone(s, wire::Header{}, {});
      } else if (op->done) {
        op->done(s, wire::Header{});
      }
    }
  });
}

void TcpConnectionImpl::close() {
  bool needSchedule = false;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    if (closed_) return;
    closed_ = true;
    closing_.store(true, std::memory_order_relaxed);
    // Now, not when the loop gets to it: status() right after close() must not say OK.
    if (error_.ok()) error_ = Cancelled(describe() + " was closed locally");
    closeRequested_ = true;
    needSchedule = !scheduled_;
    scheduled_ = true;
  }
  if (needSchedule && !loop_->schedule(shared_from_this())) {
    // The loop is gone (context joined): it already failed everything queued before. A send or
    // recv another thread submitted since saw scheduled_ set and left its completion to this
    // call, so fail what is queued now (as submitSend/submitRecv do) rather than only
    // clearing the flag, which left such an operation without a callback.
    failOffLoop();
  }
}

void TcpConnectionImpl::runScheduled() {
  bool closeNow = false;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    batchSends_.swap(submittedSends_);
    sendsInTransit_ = !batchSends_.empty();
    batchRecvs_.swap(submittedRecvs_);
    closeNow = closeRequested_;
    closeRequested_ = false;
    scheduled_ = false;
  }
  if (failed_) {
    for (auto& op : batchSends_) {
      Status s = op->error.ok() ? status() : op->error;  // before the move: argument order
      completeSend(std::move(op), std::move(s));
    }
  } else if (!batchSends_.empty()) {
    std::lock_guard<std::mutex> w(writeMu_);
    for (auto& op : batchSends_) sendQueue_.push_back(std::move(op));
  }
  if (!batchSends_.empty()) {
    std::lock_guard<std::mutex> lock(submitMu_);
    sendsInTransit_ = false;
  }
  batchSends_.clear();
  for (auto& op : batchRecvs_) {
    if (failed_) {
      Status s = op->error.ok() ? status() : op->error;  // before the move: argument order
      completeRecv(std::move(op), std::move(s), wire::Header{});
    } else {
      recvQueue_.push_back(std::move(op));
    }
  }
  batchRecvs_.clear();
  if (closeNow) {
    fail(Cancelled(describe() + " was closed locally"), /*linger=*/true);
    return;
  }
  if (!attached_ || failed_) return;
  flushWrites();
  pumpReads();
}

void TcpConnectionImpl::handleEvents(uint32_t events) {
  if (failed_) return;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) readable_ = true;
  pumpReads();
  flushWrites((events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0);
  if (!failed_ && (events & EPOLLERR) && recvHead_ == recvQueue_.size()) {
    // Nothing pending would notice: pick up the socket error now so that status() and later
    // ops see it. While input is queued only as the sticky error: messages that arrived before
    // a reset are still the peer's, and the receives that read them meet the error after them.
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
      if (inputQueued()) {
        markFailed(ioError("socket", err));
      } else {
        fail(ioError("socket", err));
      }
    }
  }
}

bool TcpConnectionImpl::inputQueued() const {
  int queued = 0;
  return ::ioctl(fd_.get(), FIONREAD, &queued) == 0 && queued > 0;
}

Status TcpConnectionImpl::ioError(const char* call, int err) const {
  if (err == ECONNRESET || err == EPIPE || err == ETIMEDOUT || err == EHOSTUNREACH ||
      err == ENETUNREACH) {
    return RemoteError("tcp: peer '" + peerId_ + "' (" + peerAddress_ +
                       ") failed: " + errnoStatus(StatusCode::kRemoteError, call, err).message());
  }
  return errnoStatus(StatusCode::kIoError, call, err, "'" + peerId_ + "' " + peerAddress_);
}

Status TcpConnectionImpl::peerClosed() const {
  return RemoteError("tcp: peer '" + peerId_ + "' (" + peerAddress_ + ") closed the connection" +
                     (inPayload_ || headerGot_ > 0 ? " in the middle of a message" : "") +
                     " (did it exit or crash?)");
}

void TcpConnectionImpl::failQueuedSendsLocked() {
  for (; sendHead_ < sendQueue_.size(); ++sendHead_) {
    auto& op = sendQueue_[sendHead_];
    if (op->error.ok()) op->error = sendFailure_;
    doneSends_.push_back(std::move(op));
  }
}

void TcpConnectionImpl::flushWrites(bool nowWritable) {
  Status error;
  {
    std::lock_guard<std::mutex> w(writeMu_);
    if (nowWritable) writable_ = true;
    if (!sendFailure_.ok()) failQueuedSendsLocked();
    while (writeReady_ && writable_ && sendHead_ < sendQueue_.size() &&
           !closing_.load(std::memory_order_relaxed)) {
      // Ops that failed validation complete in their turn, without touching the socket.
      if (!sendQueue_[sendHead_]->error.ok()) {
        doneSends_.push_back(std::move(sendQueue_[sendHead_++]));
        continue;
      }
      gather_.clear();
      for (size_t i = sendHead_; i < sendQueue_.size() && gather_.size() < kMaxGather; ++i) {
        SendOp& op = *sendQueue_[i];
        if (!op.error.ok()) break;
        for (size_t k = op.next; k < op.iov.size() && gather_.size() < kMaxGather; ++k) {
          gather_.push_back(op.iov[k]);
        }
      }
      const ssize_t n = writeIov(fd_.get(), gather_.data(), gather_.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          writable_ = false;
          break;
        }
        error = ioError("sendmsg", errno);
        break;
      }
      size_t left = static_cast<size_t>(n);
      while (sendHead_ < sendQueue_.size()) {
        SendOp& op = *sendQueue_[sendHead_];
        if (!op.error.ok()) break;
        while (op.next < op.iov.size() && left >= op.iov[op.next].iov_len) {
          left -= op.iov[op.next].iov_len;
          ++op.next;
        }
        if (op.next < op.iov.size()) {
          auto& v = op.iov[op.next];
          v.iov_base = static_cast<uint8_t*>(v.iov_base) + left;
          v.iov_len -= left;
          left = 0;
          break;
        }
        doneSends_.push_back(std::move(sendQueue_[sendHead_++]));
      }
    }
    dropConsumed(sendQueue_, sendHead_);
    completing_.swap(doneSends_);
  }
  // Callbacks run without writeMu_ (they may send again, even inline).
  for (auto& op : completing_) {
    const Status s = op->error;
    completeSend(std::move(op), s);
  }
  completing_.clear();
  if (error.ok()) return;
  if (!inputQueued()) {
    fail(error);
    return;
  }
  // Messages the peer sent before the reset are still in the socket: closing it now would
  // throw them away (an aggregator's last reply, a peer's error report). The sends fail with
  // the sticky error; the receives read what is queued and meet the error after it.
  markFailed(error);
  const Status sticky = status();  // submitMu_ before writeMu_
  {
    std::lock_guard<std::mutex> w(writeMu_);
    sendFailure_ = sticky;
    failQueuedSendsLocked();
    completing_.swap(doneSends_);
  }
  for (auto& op : completing_) {
    const Status s = op->error;
    completeSend(std::move(op), s);
  }
  completing_.clear();
}

// Finished operations leave empty slots in front of the head. A queue that never drains (a
// sender that always has sends waiting for the socket, a receiver that keeps several receives
// posted) would grow by a slot per message for the life of the connection: the slots go once
// they are the larger part, which keeps the cost per operation constant.
template <typename Op>
void TcpConnectionImpl::dropConsumed(std::vector<std::unique_ptr<Op>>& queue, size_t& head) {
  if (head == queue.size()) {
    queue.clear();
    head = 0;
  } else if (head >= 64 && 2 * head >= queue.size()) {
    queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(head));
    head = 0;
  }
}

void TcpConnectionImpl::pumpReads() {
  while (!failed_ && readable_ && recvHead_ < recvQueue_.size() &&
         !closing_.load(std::memory_order_relaxed)) {
    RecvOp& op = *recvQueue_[recvHead_];
    if (!op.error.ok() && !inPayload_ && headerGot_ == 0) {
      auto o = std::move(recvQueue_[recvHead_++]);
      Status s = o->error;  // before the move: argument order
      completeRecv(std::move(o), std::move(s), wire::Header{});
      continue;
    }
    if (!inPayload_) {
      if (!readHeader(op)) break;
    } else {
      if (!readPayload(op)) break;
    }
  }
  dropConsumed(recvQueue_, recvHead_);
}

// Reads (the rest of) the header and, for a posted receive, as much payload as fits the posted
// slices in the same readv. Returns false when the socket has no more data or the connection
// failed.
bool TcpConnectionImpl::readHeader(RecvOp& op) {
  iovec iov[kMaxGather];
  int cnt = 0;
  iov[cnt++] = {headerBuf_ + headerGot_, wire::kHeaderSize - headerGot_};
  if (!op.owned) {
    for (size_t i = 0; i < op.dest.size() && cnt < static_cast<int>(kMaxGather); ++i) {
      iov[cnt++] = op.dest[i];
    }
  }
  const ssize_t n = ::readv(fd_.get(), iov, cnt);
  if (n == 0) {
    fail(peerClosed());
    return false;
  }
  if (n < 0) {
    if (errno == EINTR) return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      readable_ = false;
      return false;
    }
    fail(ioError("readv", errno));
    return false;
  }
  const size_t forHeader = std::min(static_cast<size_t>(n), wire::kHeaderSize - headerGot_);
  headerGot_ += forHeader;
  const size_t extra = static_cast<size_t>(n) - forHeader;
  if (headerGot_ < wire::kHeaderSize) return true;

  auto decoded = wire::decodeHeader({headerBuf_, wire::kHeaderSize}, {maxPayload_});
  if (!decoded.ok()) {
    fail(decoded.status().withContext("tcp: from peer '" + peerId_ + "' (" + peerAddress_ + ")"));
    return false;
  }
  header_ = *decoded;
  inPayload_ = true;
  if (op.owned) {
    payloadGot_ = 0;
    const MutableSlice routed = op.route ? op.route(header_) : MutableSlice{};
    op.route = nullptr;
    if (routed.data != nullptr) {
      if (routed.size != header_.payloadLength) {
        const Status s =
            InvalidArgument("recvRouted on " + describe() + ": message payload is " +
                            std::to_string(header_.payloadLength) + " bytes but the route gave " +
                            std::to_string(routed.size) + " bytes (" + header_.describe() + ")");
        markFailed(s);  // sticky already in the callback finishRecv() runs
        finishRecv(s);
        fail(s);
        return false;
      }
      // Straight into the routed memory: no allocation, zero-fill or copy.
      op.routed = true;
      op.dest.assign(1, iovec{routed.data, routed.size});
      op.expected = routed.size;
    } else {
      op.buffer.resize(header_.payloadLength);
    }
  } else {
    if (header_.payloadLength != op.expected) {
      // The stream cannot be resynchronised without reading a payload nobody asked for.
      const Status s = InvalidArgument(
          "recv on " + describe() + ": message payload is " +
          std::to_string(header_.payloadLength) + " bytes but the posted receive expects " +
          std::to_string(op.expected) + " bytes (" + header_.describe() + ")");
      markFailed(s);  // sticky already in the callback finishRecv() runs
      finishRecv(s);
      fail(s);
      return false;
    }
    payloadGot_ = extra;
  }
  return true;
}

bool TcpConnectionImpl::readPayload(RecvOp& op) {
  const size_t len = header_.payloadLength;
  if (payloadGot_ < len) {
    iovec iov[kMaxGather];
    int cnt = 0;
    if (op.owned && !op.routed) {
      iov[cnt++] = {op.buffer.data() + payloadGot_, len - payloadGot_};
    } else {
      size_t skip = payloadGot_;
      for (size_t i = 0; i < op.dest.size() && cnt < static_cast<int>(kMaxGather); ++i) {
        const iovec& d = op.dest[i];
        if (skip >= d.iov_len) {
          skip -= d.iov_len;
          continue;
        }
        iov[cnt++] = {static_cast<uint8_t*>(d.iov_base) + skip, d.iov_len - skip};
        skip = 0;
      }
    }
    const ssize_t n = ::readv(fd_.get(), iov, cnt);
    if (n == 0) {
      fail(peerClosed());
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) return true;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        readable_ = false;
        return false;
      }
      fail(ioError("readv", errno));
      return false;
    }
    payloadGot_ += static_cast<size_t>(n);
    if (payloadGot_ < len) return true;
  }
  if (header_.hasPayloadCrc()) {
    uint32_t crc = 0;
    if (op.owned && !op.routed) {
      crc = wire::crc32c(0, op.buffer.data(), op.buffer.size());
    } else {
      for (const auto& d : op.dest) crc = wire::crc32c(crc, d.iov_base, d.iov_len);
    }
    if (crc != header_.payloadCrc) {
      const Status s = DataLoss("recv on " + describe() + ": payload CRC32C mismatch (" +
                                header_.describe() + "): corrupted in transit");
      markFailed(s);  // sticky already in the callback finishRecv() runs
      finishRecv(s);
      fail(s);
      return false;
    }
  }
  finishRecv(OkStatus());
  return true;
}

// Completes the receive at the head of the queue with the current header_.
void TcpConnectionImpl::finishRecv(const Status& status) {
  auto op = std::move(recvQueue_[recvHead_++]);
  const wire::Header h = header_;
  inPayload_ = false;
  headerGot_ = 0;
  payloadGot_ = 0;
  completeRecv(std::move(op), status, h);
}

void TcpConnectionImpl::completeSend(std::unique_ptr<SendOp> op, Status status) {
  SendCallback done = std::move(op->done);
  op->done = nullptr;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    freeSends_.push_back(std::move(op));
  }
  if (done) done(status);
}

void TcpConnectionImpl::completeRecv(std::unique_ptr<RecvOp> op, Status status,
                                     const wire::Header& header) {
  if (op->owned) {
    RecvOwnedCallback done = std::move(op->ownedDone);
    op->ownedDone = nullptr;
    std::vector<uint8_t> payload = std::move(op->buffer);
    op->buffer = {};
    op->route = nullptr;
    op->routed = false;
    {
      std::lock_guard<std::mutex> lock(submitMu_);
      freeRecvs_.push_back(std::move(op));
    }
    if (!status.ok()) payload.clear();
    if (done) done(status, header, std::move(payload));
    return;
  }
  RecvCallback done = std::move(op->done);
  op->done = nullptr;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    freeRecvs_.push_back(std::move(op));
  }
  if (done) done(status, header);
}

void TcpConnectionImpl::markFailed(const Status& status) {
  std::lock_guard<std::mutex> lock(submitMu_);
  if (error_.ok()) error_ = status;
}

void TcpConnectionImpl::fail(const Status& status, bool linger) {
  if (failed_) return;
  failed_ = true;
  markFailed(status);
  // Pending operations get the connection's first error, which status() reports too (an error
  // kept while queued input was still read, say a reset, beats what the read then met), except
  // at a local close: Cancelled, as connection.h promises.
  const Status reported = status.code() == StatusCode::kCancelled ? status : this->status();
  std::vector<std::unique_ptr<SendOp>> sends;
  std::vector<std::unique_ptr<SendOp>> written;
  size_t sendHead = 0;
  {
    // Under writeMu_ so that no caller is inside writev() on this descriptor when it closes.
    std::lock_guard<std::mutex> w(writeMu_);
    writeReady_ = false;
    if (fd_.valid()) {
      if (attached_) loop_->remove(fd_.get());
      if (linger && attached_) {
        LingeringClose::start(*loop_, std::move(fd_));
      } else {
        fd_.reset();
      }
    }
    sends = std::move(sendQueue_);
    sendHead = sendHead_;
    sendQueue_.clear();
    sendHead_ = 0;
    written.swap(doneSends_);
  }
  // Pending operations fail in the order they were posted (after those already written). A
  // receive in the middle of a message reports the header it was reading.
  for (auto& op : written) {
    const Status s = op->error;
    completeSend(std::move(op), s);
  }
  for (size_t i = sendHead; i < sends.size(); ++i) {
    const Status s = sends[i]->error.ok() ? reported : sends[i]->error;
    completeSend(std::move(sends[i]), s);
  }
  auto recvs = std::move(recvQueue_);
  const size_t recvHead = recvHead_;
  recvQueue_.clear();
  recvHead_ = 0;
  for (size_t i = recvHead; i < recvs.size(); ++i) {
    const wire::Header h = (i == recvHead && inPayload_) ? header_ : wire::Header{};
    const Status s = recvs[i]->error.ok() ? reported : recvs[i]->error;
    completeRecv(std::move(recvs[i]), s, h);
  }
  inPayload_ = false;
  headerGot_ = 0;
}

}  // namespace cofab::transport::tcp
