#include "fabric/comm/collective_op.h"

#include <optional>
#include <string>

#include "fabric/comm/communicator.h"

namespace cofab::comm {
namespace {

// Completion callbacks capture (op, tag) only: 16 bytes, which std::function stores inline, so
// posting an operation allocates nothing here.
uint64_t makeTag(int peer, uint32_t index) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32) | index;
}
int tagPeer(uint64_t tag) { return static_cast<int>(tag >> 32); }
uint32_t tagIndex(uint64_t tag) { return static_cast<uint32_t>(tag); }

}  // namespace

CollectiveOp::CollectiveOp(Communicator& comm, const OpSignature& signature, Deadline deadline)
    : comm_(comm),
      sig_(signature),
      deadline_(deadline),
      rank_(comm.rank()),
      size_(comm.size()),
      heard_(static_cast<size_t>(comm.size()), false) {}

void CollectiveOp::start() {
  std::unique_lock<std::mutex> lock(mu_);
  started_ = true;
  begin();
  if (leavesQueueWhenPosted()) {
    lock.unlock();
    comm_.opPosted(this);
    lock.lock();
  }
  maybeComplete(lock);
}

void CollectiveOp::completeUnstarted(const Status& status) {
  std::unique_lock<std::mutex> lock(mu_);
  started_ = true;
  failed_ = true;
  failureHandled_ = true;
  status_ = status;
  maybeComplete(lock);
}

void CollectiveOp::failureHandled(const Status& status) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return;  // it completed while the failure procedure ran: its status stands
  failed_ = true;
  failureHandled_ = true;
  status_ = status;
  maybeComplete(lock);
}

bool CollectiveOp::heardFrom(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return heard_[static_cast<size_t>(peer)];
}

bool CollectiveOp::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool CollectiveOp::test() {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return true;
  // Taken while not done: the communicator outlives the calls below even if we complete now.
  Communicator::OpCall call(comm_);
  if (!timeoutRequested_ && deadline_.expired()) {
    timeoutRequested_ = true;
    lock.unlock();
    comm_.reportTimeout(this);
    return false;
  }
  lock.unlock();
  comm_.enforcePendingDeadlines(this);  // an earlier op's shorter deadline (docs/COLLECTIVES.md)
  return false;
}

Status CollectiveOp::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return Unavailable(sig_.describe() + " is still running");
  return status_;
}

Status CollectiveOp::wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_) {
    // The ops this one waits behind (running, posted point-to-point, queued ahead) may end
    // sooner: their deadlines are enforced by whoever waits, on any handle. Asked without our
    // lock (an op takes the communicator's lock inside its own, never the other way round),
    // under an OpCall taken while not done: the communicator cannot be freed meanwhile.
    std::optional<Communicator::OpCall> call(std::in_place, comm_);
    lock.unlock();
    const Deadline others = comm_.pendingDeadline(this);
    lock.lock();
    if (done_) break;
    const Deadline wake = (timeoutRequested_ ? deadline : deadline.min(deadline_)).min(others);
    if (wake.isNever()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, wake.when());
    }
    if (done_) break;
    if (!timeoutRequested_ && deadline_.expired()) {
      // The op's own deadline: fail it (and the communicator) with a report naming the ranks
      // that did not arrive. The report runs on the communicator's helper thread.
      timeoutRequested_ = true;
      lock.unlock();
      comm_.reportTimeout(this);
      lock.lock();
      continue;
    }
    if (others.expired()) {
      lock.unlock();
      comm_.enforcePendingDeadlines(this);
      lock.lock();
      continue;
    }
    if (deadline.expired()) {
      return DeadlineExceeded("waiting for " + sig_.describe() +
                              ": the wait's deadline passed while the operation is still "
                              "running (it keeps running; wait again or abort the communicator)");
    }
  }
  return status_;
}

void CollectiveOp::sendTo(int peer, uint32_t index, const void* data, size_t bytes) {
  ++outstanding_;
  const wire::Header h = sig_.header(static_cast<uint32_t>(rank_), index, messagesTo(peer));
  const uint64_t tag = makeTag(peer, index);
  comm_.connection(peer)->send(h, data, bytes,
                               [this, tag](const Status& s) { onSendDone(tag, s); });
}

void CollectiveOp::recvFrom(int peer, uint32_t index, void* data, size_t bytes) {
  ++outstanding_;
  const uint64_t tag = makeTag(peer, index);
  comm_.connection(peer)->recv(
      data, bytes, [this, tag](const Status& s, const wire::Header& h) { onRecvDone(tag, s, h); });
}

void CollectiveOp::fail(const Status& status, int peer) {
  if (failed_) return;
  failed_ = true;
  status_ = status;
  comm_.reportFailure(this, status, peer);
}

void CollectiveOp::onSendDone(uint64_t tag, const Status& s) {
  std::unique_lock<std::mutex> lock(mu_);
  --outstanding_;
  if (!failed_) {
    if (!s.ok()) {
      fail(transportError(tagPeer(tag), s, wire::Header{}, true), tagPeer(tag));
    } else {
      onSent(tagPeer(tag), tagIndex(tag));
    }
  }
  maybeComplete(lock);
}

void CollectiveOp::onRecvDone(uint64_t tag, const Status& s, const wire::Header& h) {
  std::unique_lock<std::mutex> lock(mu_);
  --outstanding_;
  const int peer = tagPeer(tag);
  const uint32_t index = tagIndex(tag);
  if (s.ok()) {
    heard_[static_cast<size_t>(peer)] = true;
    if (sig_.code != OpCode::kSendRecv) comm_.noteArrived(peer, h.sequence);
  }
  if (!failed_) {
    if (!s.ok()) {
      Status e = transportError(peer, s, h, false);
      // A desync seen through a size mismatch is this rank's own finding, not the peer's.
      fail(e, e.code() == StatusCode::kInvalidArgument ? -1 : peer);
    } else if (Status bad = checkHeader(sig_, rank_, peer, index, messagesFrom(peer), h);
               !bad.ok()) {
      fail(bad);
    } else {
      onReceived(peer, index);
    }
  }
  maybeComplete(lock);
}

Status CollectiveOp::transportError(int peer, const Status& s, const wire::Header& h,
                                    bool sending) const {
  // A size mismatch still carries the sender's header: if it describes another collective,
  // that is the cause worth reporting.
  if (h.opcode != 0) {
    const wire::Header mine = sig_.header(h.senderRank, h.chunkIndex, h.chunkCount);
    if (h.opcode != mine.opcode || h.dtype != mine.dtype || h.key != mine.key ||
        h.iteration != mine.iteration || h.sequence != mine.sequence) {
      return checkHeader(sig_, rank_, peer, h.chunkIndex, h.chunkCount, h);
    }
    // The same collective cut into another number of messages: the ranks chunk differently
    // (COFAB_RING_CHUNK_BYTES), which checkHeader names; the sizes differ from the first message.
    if (!sending && h.chunkCount != messagesFrom(peer)) {
      return checkHeader(sig_, rank_, peer, h.chunkIndex, messagesFrom(peer), h);
    }
  }
  return Status(s.code(), sig_.describe() + ": " + (sending ? "sending to" : "receiving from") +
                              " rank " + std::to_string(peer) + " failed: " + s.message());
}

void CollectiveOp::maybeComplete(std::unique_lock<std::mutex>& lock) {
  if (done_ || !started_ || outstanding_ > 0) return;
  if (failed_ ? !failureHandled_ : !algorithmDone_) return;
  done_ = true;
  cv_.notify_all();
  lock.unlock();
  // May drop the communicator's reference to this op: touch nothing afterwards.
  comm_.opFinished(this);
}

}  // namespace cofab::comm
