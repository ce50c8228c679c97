#include "fabric/transport/loopback/loopback_connection.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "fabric/wire/crc32c.h"

namespace cofab::transport::loopback {
namespace {

void queueSend(SendCallback cb, const Status& s, std::vector<std::function<void()>>& out) {
  out.push_back([cb = std::move(cb), s] {
    if (cb) cb(s);
  });
}

}  // namespace

Endpoint::Endpoint(Params p)
    : worker_(std::move(p.worker)),
      peerId_(std::move(p.peerId)),
      peerAddress_(std::move(p.peerAddress)),
      maxPayload_(p.maxPayload),
      faults_(p.faults) {}

void Endpoint::setPeer(const std::shared_ptr<Endpoint>& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_ = peer;
}

std::string Endpoint::describe() const {
  return "loopback connection to '" + peerId_ + "' (" + peerAddress_ + ")";
}

Status Endpoint::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Endpoint::setFaults(const FaultPlan& faults) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_ = faults;
}

void Endpoint::schedulePumpLocked() {
  if (helperRunning_) {
    helperAgain_ = true;
    return;
  }
  if (pumpScheduled_) return;
  pumpScheduled_ = true;
  // The task owns this end: when the connection object is dropped right after close(), the pump
  // must still run, or pending callbacks would be destroyed unrun and the peer never see EOF.
  auto self = shared_from_this();
  if (worker_->post([self] { self->pump(); })) return;
  pumpScheduled_ = false;
  // The worker has stopped (context joined): complete what is queued on a helper thread so that
  // callbacks still run exactly once and never inline; one helper at a time per end, so that
  // they also stay serial and in order.
  helperRunning_ = true;
  std::thread([self] { self->runHelper(); }).detach();
}

void Endpoint::runHelper() {
  while (true) {
    pump();
    std::lock_guard<std::mutex> lock(mu_);
    if (!helperAgain_) {
      helperRunning_ = false;
      return;
    }
    helperAgain_ = false;
  }
}

void Endpoint::send(const wire::Header& header, ConstSlices payload, SendCallback done) {
  SendOp op;
  op.done = std::move(done);
  for (size_t i = 0; i < payload.size() && op.error.ok(); ++i) {
    if (payload[i].data == nullptr && payload[i].size > 0) {
      op.error =
          InvalidArgument("send on " + describe() + ": slice " + std::to_string(i) +
                          " has a null pointer and " + std::to_string(payload[i].size) + " bytes");
    }
  }
  if (op.error.ok()) {
    wire::Header h = header;
    h.payloadLength = totalSize(payload);
    h.payloadCrc = 0;
    if (h.hasPayloadCrc()) {
      for (const auto& s : payload) h.payloadCrc = wire::crc32c(h.payloadCrc, s.data, s.size);
    }
    op.error = wire::validateHeader(h, wire::DecodeOptions{UINT64_MAX});
    if (op.error.ok()) {
      op.bytes.resize(wire::kHeaderSize + h.payloadLength);
      wire::encodeHeader(h, op.bytes.data());
      size_t off = wire::kHeaderSize;
      for (const auto& s : payload) {
        if (s.size > 0) std::memcpy(op.bytes.data() + off, s.data, s.size);
        off += s.size;
      }
    } else {
      op.error = op.error.withContext("send on " + describe());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ && op.error.ok()) {
    op.error = FailedPrecondition("send on " + describe() + ": the connection is closed");
  }
  sends_.push_back(std::move(op));
  schedulePumpLocked();
}

void Endpoint::recv(MutableSlices dest, RecvCallback done) {
  RecvOp op;
  op.done = std::move(done);
  for (size_t i = 0; i < dest.size(); ++i) {
    if (dest[i].data == nullptr && dest[i].size > 0 && op.error.ok()) {
      op.error =
          InvalidArgument("recv on " + describe() + ": slice " + std::to_string(i) +
                          " has a null pointer and " + std::to_string(dest[i].size) + " bytes");
    }
    op.dest.push_back(dest[i]);
    op.expected += dest[i].size;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ && op.error.ok()) {
    op.error = FailedPrecondition("recv on " + describe() + ": the connection is closed");
  }
  recvs_.push_back(std::move(op));
  schedulePumpLocked();
}

void Endpoint::recvOwned(RecvOwnedCallback done) {
  RecvOp op;
  op.owned = true;
  op.ownedDone = std::move(done);
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_)
    op.error = FailedPrecondition("recv on " + describe() + ": the connection is closed");
  recvs_.push_back(std::move(op));
  schedulePumpLocked();
}

void Endpoint::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  // Now, not when the pump runs: status() right after close() must not say OK.
  if (error_.ok()) error_ = Cancelled(describe() + " was closed locally");
  closeRequested_ = true;
  schedulePumpLocked();
}

void Endpoint::deliver(Message m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  inbox_.push_back(std::move(m));
  schedulePumpLocked();
}

void Endpoint::pump() {
  Completions done;
  std::vector<Message> outgoing;
  std::shared_ptr<Endpoint> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pumpScheduled_ = false;
    peer = peer_.lock();
    if (closeRequested_) {
      closeRequested_ = false;
      failLocked(Cancelled(describe() + " was closed locally"), done);
    }
    // Sends: complete in order; healthy ones turn into messages for the peer.
    while (!sends_.empty()) {
      SendOp op = std::move(sends_.front());
      sends_.pop_front();
      Status s = op.error.ok() ? error_ : op.error;
      if (s.ok() && !peer) {
        s = RemoteError("loopback: peer '" + peerId_ + "' (" + peerAddress_ + ") is gone");
        // This send completes before the later ones that failLocked fails: posting order.
        queueSend(std::move(op.done), s, done);
        failLocked(s, done);
        continue;
      }
      if (s.ok()) {
        Message m;
        m.bytes = std::move(op.bytes);
        const auto len = static_cast<int64_t>(m.bytes.size());
        if (faults_.corruptByteAt >= sentBytes_ && faults_.corruptByteAt < sentBytes_ + len) {
          m.bytes[faults_.corruptByteAt - sentBytes_] ^= 0xFF;
        }
        bool cut = false;
        if (faults_.dropAfterBytes >= 0 && sentBytes_ + len > faults_.dropAfterBytes) {
          // A plan injected after more than dropAfterBytes went out cuts at once.
          const int64_t keep = std::max<int64_t>(0, faults_.dropAfterBytes - sentBytes_);
          m.bytes.resize(static_cast<size_t>(keep));
          cut = true;
        }
        sentBytes_ += static_cast<int64_t>(m.bytes.size());
        m.readyAt = std::max(Clock::now() + faults_.delay, lastReady_);
        lastReady_ = m.readyAt;
        if (!m.bytes.empty()) outgoing.push_back(std::move(m));
        if (cut) {
          s = RemoteError("loopback: connection to '" + peerId_ + "' (" + peerAddress_ +
                          ") dropped by fault injection after " + std::to_string(sentBytes_) +
                          " bytes");
          queueSend(std::move(op.done), s, done);
          failLocked(s, done);
          continue;
        }
      }
      queueSend(std::move(op.done), s, done);
    }
    processRecvsLocked(done);
    if (!error_.ok() && !eofSent_) {
      // Whatever broke this end, the peer sees the connection go away, as with a socket.
      eofSent_ = true;
      Message eof;
      eof.eof = true;
      eof.reason =
          closed_ ? "closed the connection" : "broke the connection (" + error_.message() + ")";
      eof.readyAt = std::max(Clock::now(), lastReady_);
      outgoing.push_back(std::move(eof));
    }
  }
  if (peer) {
    for (auto& m : outgoing) peer->deliver(std::move(m));
  }
  for (auto& fn : done) fn();
}

void Endpoint::processRecvsLocked(Completions& out) {
  while (true) {
    if (!recvs_.empty() && (!recvs_.front().error.ok() || !error_.ok())) {
      RecvOp op = std::move(recvs_.front());
      recvs_.pop_front();
      const Status s = op.error.ok() ? error_ : op.error;
      completeRecvLocked(std::move(op), s, wire::Header{}, {}, out);
      continue;
    }
    if (!error_.ok() || inbox_.empty()) return;
    // With no receive posted, data waits for one, but an EOF at the head is taken at once: the
    // connection breaks for sends too (status() and later sends report it), as with a socket.
    if (recvs_.empty() && !inbox_.front().eof) return;
    Message& m = inbox_.front();
    if (m.readyAt > Clock::now()) {
      std::weak_ptr<Endpoint> weak = weak_from_this();
      worker_->postAt(m.readyAt, [weak] {
        if (auto self = weak.lock()) self->pump();
      });
      return;
    }
    if (m.eof) {
      failLocked(RemoteError("loopback: peer '" + peerId_ + "' (" + peerAddress_ + ") " + m.reason),
                 out);
      inbox_.clear();
      return;
    }
    Message msg = std::move(inbox_.front());
    inbox_.pop_front();
    RecvOp op = std::move(recvs_.front());
    recvs_.pop_front();
    const std::string from = "loopback: from peer '" + peerId_ + "' (" + peerAddress_ + ")";
    if (msg.bytes.size() < wire::kHeaderSize) {
      const Status s = RemoteError(from + ": the connection broke in the middle of a header");
      completeRecvLocked(std::move(op), s, wire::Header{}, {}, out);
      failLocked(s, out);
      return;
    }
    auto h = wire::decodeHeader({msg.bytes.data(), wire::kHeaderSize}, {maxPayload_});
    if (!h.ok()) {
      const Status s = h.status().withContext(from);
      completeRecvLocked(std::move(op), s, wire::Header{}, {}, out);
      failLocked(s, out);
      return;
    }
    const size_t got = msg.bytes.size() - wire::kHeaderSize;
    if (!op.owned && h->payloadLength != op.expected) {
      const Status s = InvalidArgument(
          "recv on " + describe() + ": message payload is " + std::to_string(h->payloadLength) +
          " bytes but the posted receive expects " + std::to_string(op.expected) + " bytes (" +
          h->describe() + ")");
      completeRecvLocked(std::move(op), s, *h, {}, out);
      failLocked(s, out);
      return;
    }
    if (got < h->payloadLength) {
      const Status s = RemoteError(from + ": the connection broke in the middle of a message (" +
                                   h->describe() + ")");
      completeRecvLocked(std::move(op), s, *h, {}, out);
      failLocked(s, out);
      return;
    }
    const uint8_t* payload = msg.bytes.data() + wire::kHeaderSize;
    if (h->hasPayloadCrc() && wire::crc32c(0, payload, got) != h->payloadCrc) {
      const Status s = DataLoss("recv on " + describe() + ": payload CRC32C mismatch (" +
                                h->describe() + "): corrupted in transit");
      completeRecvLocked(std::move(op), s, *h, {}, out);
      failLocked(s, out);
      return;
    }
    std::vector<uint8_t> owned;
    if (op.owned) {
      owned.assign(payload, payload + got);
    } else {
      size_t off = 0;
      for (const auto& d : op.dest) {
        if (d.size > 0) std::memcpy(d.data, payload + off, d.size);
        off += d.size;
      }
    }
    completeRecvLocked(std::move(op), OkStatus(), *h, std::move(owned), out);
  }
}

void Endpoint::completeRecvLocked(RecvOp op, const Status& s, const wire::Header& h,
                                  std::vector<uint8_t>&& payload, Completions& out) {
  if (op.owned) {
    auto cb = std::make_shared<RecvOwnedCallback>(std::move(op.ownedDone));
    auto data = std::make_shared<std::vector<uint8_t>>(std::move(payload));
    out.push_back([cb, s, h, data] {
      if (*cb) (*cb)(s, h, std::move(*data));
    });
  } else {
    auto cb = std::move(op.done);
    out.push_back([cb, s, h] {
      if (cb) cb(s, h);
    });
  }
}

void Endpoint::failLocked(const Status& status, Completions& out) {
  if (error_.ok()) error_ = status;
  while (!sends_.empty()) {
    SendOp op = std::move(sends_.front());
    sends_.pop_front();
    const Status s = op.error.ok() ? error_ : op.error;
    auto cb = std::move(op.done);
    out.push_back([cb, s] {
      if (cb) cb(s);
    });
  }
  while (!recvs_.empty()) {
    RecvOp op = std::move(recvs_.front());
    recvs_.pop_front();
    const Status s = op.error.ok() ? error_ : op.error;
    completeRecvLocked(std::move(op), s, wire::Header{}, {}, out);
  }
}

}  // namespace cofab::transport::loopback
