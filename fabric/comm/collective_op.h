// CollectiveOp: one collective (or point-to-point operation) in flight on a Communicator, and
// the engine the algorithms are written on.
//
// An algorithm subclass posts sends and receives through sendTo()/recvFrom() and reacts to their
// completions (onReceived/onSent); everything it does runs under the op's mutex, on the thread
// that started the op or on a transport I/O thread, so algorithm state needs no other locking.
// The base counts outstanding transport operations, checks every received header against the
// op's signature (desync detection), turns transport errors into statuses naming the peer, and
// completes the op only when nothing the transport holds still points at the caller's memory.
// Handles (fabric/comm/collectives.h) share ownership; the Communicator keeps the queued and
// running ops alive.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/comm/op_signature.h"
#include "fabric/wire/header.h"

namespace cofab::comm {

class Communicator;

class CollectiveOp {
 public:
  CollectiveOp(Communicator& comm, const OpSignature& signature, Deadline deadline);
  virtual ~CollectiveOp() = default;
  CollectiveOp(const CollectiveOp&) = delete;
  CollectiveOp& operator=(const CollectiveOp&) = delete;

  const OpSignature& signature() const { return sig_; }
  // Communicator::submit only, before anyone else sees the op.
  void setSequence(uint64_t sequence) { sig_.sequence = sequence; }
  Deadline deadline() const { return deadline_; }
  Communicator& comm() const { return comm_; }

  // Communicator side. start(): the op's turn has come (no op or communicator lock held).
  void start();
  // Completes an op that never started (the communicator failed first).
  void completeUnstarted(const Status& status);
  // The failure procedure has finished: `status` is the final error of this op.
  void failureHandled(const Status& status);
  // Ranks from which this op has received at least one message (for timeout reports).
  bool heardFrom(int peer) const;

  // Handle side.
  bool done() const;
  // done() without the op's lock (any lock may be held).
  bool completed() const { return done_.load(); }
  // done(), and past the op's own deadline asks the communicator to time it out, as wait()
  // does: a caller that only polls gets its DeadlineExceeded too.
  bool test();
  // Waits until done or `deadline`. Past the op's own deadline it asks the communicator to time
  // the op out (DeadlineExceeded naming the ranks that did not arrive).
  Status wait(Deadline deadline);
  // The final status once done(); Unavailable while running.
  Status status() const;

 protected:
  // Posts the op's first transport operations. Called under mu_.
  virtual void begin() = 0;
  // Message `index` from `peer` has arrived (header checked). Called under mu_.
  virtual void onReceived(int peer, uint32_t index) = 0;
  // Send `index` to `peer` has been handed to the transport. Called under mu_.
  virtual void onSent(int peer, uint32_t index) {
    (void)peer;
    (void)index;
  }
  // True: once begin() has posted every message, the next operation may start while this
  // one's transfers finish (point-to-point; Communicator::opPosted says why). Only for ops that
  // use no communicator scratch and post everything in begin().
  virtual bool leavesQueueWhenPosted() const { return false; }
  // Messages this rank receives from `peer` in this op (the headers' chunkCount).
  virtual uint32_t messagesFrom(int peer) const = 0;
  // Messages this rank sends to `peer` in this op.
  virtual uint32_t messagesTo(int peer) const = 0;

  // Under mu_. The caller's memory must stay untouched until the completion.
  void sendTo(int peer, uint32_t index, const void* data, size_t bytes);
  void recvFrom(int peer, uint32_t index, void* data, size_t bytes);
  // Under mu_: the algorithm has nothing more to do once outstanding operations complete.
  void finish() { algorithmDone_ = true; }
  // Under mu_: fails the op (and the communicator).
  void fail(const Status& status, int peer = -1);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  void onSendDone(uint64_t tag, const Status& s);
  void onRecvDone(uint64_t tag, const Status& s, const wire::Header& h);
  // Under mu_ (given as `lock`): completes the op when nothing is outstanding; unlocks.
  void maybeComplete(std::unique_lock<std::mutex>& lock);
  Status transportError(int peer, const Status& s, const wire::Header& h, bool sending) const;

  Communicator& comm_;
  OpSignature sig_;  // its sequence number is set once, by setSequence()
  const Deadline deadline_;
  const int rank_;
  const int size_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int outstanding_ = 0;
  bool started_ = false;
  bool algorithmDone_ = false;
  bool failed_ = false;
  bool failureHandled_ = false;
  bool timeoutRequested_ = false;
  // Written under mu_; atomic so that the communicator may read it under its own lock
  // (completed()) without taking an op's lock inside the communicator's.
  std::atomic<bool> done_{false};
  Status status_;
  std::vector<bool> heard_;
};

}  // namespace cofab::comm
