// TcpConnection: the tcp backend's Connection (contract: fabric/transport/connection.h).
//
// The user holds a TcpConnection handle; the socket's state lives in a TcpConnectionImpl that
// is touched only on its EpollLoop thread, except the submission queue, a short mutex-protected
// hand-off from caller threads. Sends are batched into writev() calls straight from the callers'
// slices (header bytes + payload pointers, no copies); receives readv() the header and, for a
// posted receive, the payload straight into the caller's slices in the same call. Operation
// objects are pooled per connection, so steady-state traffic allocates nothing but what the
// callbacks themselves capture. Dropping the handle closes the connection.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/transport/connection.h"
#include "fabric/transport/off_loop_runner.h"
#include "fabric/transport/tcp/epoll_loop.h"
#include "fabric/transport/tcp/socket_util.h"

namespace cofab::transport::tcp {

// The checks send() / recv() make before an operation touches the stream (null slices, a header
// the peer would reject). An operation failing them fails alone, the connection stays healthy.
Status checkSendable(const wire::Header& header, ConstSlices payload);
Status checkReceivable(MutableSlices dest);

class TcpConnectionImpl final : public EpollHandler,
                                public Schedulable,
                                public std::enable_shared_from_this<TcpConnectionImpl> {
 public:
  struct Params {
    Fd fd;
    std::string peerId;
    std::string peerAddress;
    uint64_t maxPayload = wire::kDefaultMaxPayload;
    std::shared_ptr<EpollLoop> loop;
  };
  explicit TcpConnectionImpl(Params params);
  ~TcpConnectionImpl() override;

  // Registers the socket with the loop; from any thread (posts to the loop).
  Status attach();

  void send(const wire::Header& header, ConstSlices payload, SendCallback done);
  void recv(MutableSlices dest, RecvCallback done);
  void recvOwned(RecvOwnedCallback done);
  void recvRouted(RecvRoute route, RecvOwnedCallback done);
  void close();
  Status status() const;
  const std::string& peerId() const { return peerId_; }
  const std::string& peerAddress() const { return peerAddress_; }
  std::string describe() const;

  void handleEvents(uint32_t events) override;
  void runScheduled() override;

 private:
  struct SendOp {
    wire::EncodedHeader header;
    std::vector<iovec> iov;  // [0] is the header; entries are advanced in place as bytes go out
    size_t next = 0;         // first iov entry not completely written
    SendCallback done;
    Status error;          // set when the op must fail without being sent
    bool written = false;  // completed by an inline write (for the off-loop fallback)
  };
  struct RecvOp {
    bool owned = false;
    std::vector<iovec> dest;  // posted receive: caller's slices
    size_t expected = 0;
    RecvCallback done;
    RecvOwnedCallback ownedDone;
    std::vector<uint8_t> buffer;  // owned receive
    RecvRoute route;              // routed receive: picks `dest` from the header (owned = true)
    bool routed = false;          // the route gave memory: the payload goes to `dest`
    Status error;
  };

  std::unique_ptr<SendOp> takeSendOp();  // under submitMu_
  std::unique_ptr<RecvOp> takeRecvOp();  // under submitMu_
  void submitSend(std::unique_ptr<SendOp> op);
  void submitRecv(std::unique_ptr<RecvOp> op);
  // Completes ops on a helper thread when the loop has stopped (context joined).
  void completeOffLoop(std::vector<std::unique_ptr<SendOp>> sends,
                       std::vector<std::unique_ptr<RecvOp>> recvs, Status why);

  // Caller thread, under submitMu_: writes `op` right away when nothing is queued ahead of it.
  // Drops the finished operations in front of `head` (see the definition).
  template <typename Op>
  static void dropConsumed(std::vector<std::unique_ptr<Op>>& queue, size_t& head);
  // Takes `op` when it wrote any of it (into doneSends_ when whole, sendQueue_ when partly).
  void tryInlineWrite(std::unique_ptr<SendOp>& op);
  // The loop is gone (context joined): completes what was posted on a helper thread.
  void failOffLoop();

  // Loop thread only.
  void flushWrites(bool nowWritable = false);
  // Under writeMu_: moves every queued send to doneSends_ with sendFailure_ (its own error if it
  // has one); the caller runs their callbacks after releasing the lock.
  void failQueuedSendsLocked();
  void pumpReads();
  bool readHeader(RecvOp& op);
  bool readPayload(RecvOp& op);
  void finishRecv(const Status& status);
  // `status` by value: the op goes back to the free list before its callback runs, and the
  // callback may take it again (a new operation), so it must not refer into the op.
  void completeSend(std::unique_ptr<SendOp> op, Status status);
  void completeRecv(std::unique_ptr<RecvOp> op, Status status, const wire::Header& header);
  // Fails every pending operation with `status` and gives up the socket: closed at once, or
  // with `linger` (a local close) through LingeringClose, so that what was sent still arrives.
  void fail(const Status& status, bool linger = false);
  // Records `status` as the connection's sticky error (if none yet) without failing anything:
  // before a failing receive's callback runs, so that status() and sends posted from inside it
  // see the error.
  void markFailed(const Status& status);
  // Bytes have arrived that no receive has read yet.
  bool inputQueued() const;
  Status ioError(const char* call, int err) const;
  Status peerClosed() const;

  const std::string peerId_;
  const std::string peerAddress_;
  const uint64_t maxPayload_;
  std::shared_ptr<EpollLoop> loop_;

  // Submission hand-off: caller threads -> loop.
  // Completions once the loop has stopped (after Context::join()): one at a time, in order.
  const std::shared_ptr<OffLoopRunner> offLoop_ = std::make_shared<OffLoopRunner>();
  mutable std::mutex submitMu_;
  std::vector<std::unique_ptr<SendOp>> submittedSends_;
  std::vector<std::unique_ptr<RecvOp>> submittedRecvs_;
  std::vector<std::unique_ptr<SendOp>> freeSends_;
  std::vector<std::unique_ptr<RecvOp>> freeRecvs_;
  bool scheduled_ = false;
  bool closeRequested_ = false;
  bool closed_ = false;  // close() called: later ops fail with FailedPrecondition
  // closed_ for the loop's read and write loops, without submitMu_: a close() from a callback
  // stops them before the next message instead of at the next scheduling round.
  std::atomic<bool> closing_{false};
  Status error_;         // sticky error, readable from any thread (under submitMu_)
  // The loop has taken sends out of submittedSends_ but not yet queued them for writing: an
  // inline write now would overtake them.
  bool sendsInTransit_ = false;

  // The write side: the loop, and a caller's inline write, under writeMu_. Lock order:
  // submitMu_ before writeMu_; the loop never holds writeMu_ while taking submitMu_ or running
  // callbacks.
  std::mutex writeMu_;
  bool writeReady_ = false;  // attached and not failed: fd_ may be written
  bool writable_ = true;
  std::vector<std::unique_ptr<SendOp>> sendQueue_;
  size_t sendHead_ = 0;
  // Set when a write failed while input was still queued (a reset after whole messages): the
  // socket stays open for reading them, and every send fails with this, the sticky error.
  Status sendFailure_;
  std::vector<iovec> gather_;
  // Written completely (by the loop or a caller's inline write), callbacks not yet run; the
  // loop runs them in this order.
  std::vector<std::unique_ptr<SendOp>> doneSends_;

  // Loop state.
  Fd fd_;
  bool attached_ = false;
  bool failed_ = false;
  bool readable_ = true;
  std::vector<std::unique_ptr<RecvOp>> recvQueue_;
  size_t recvHead_ = 0;
  std::vector<std::unique_ptr<SendOp>> completing_;  // loop-local copy of doneSends_
  std::vector<std::unique_ptr<SendOp>> batchSends_;
  std::vector<std::unique_ptr<RecvOp>> batchRecvs_;
  // Receive state machine for the message at the head of the stream.
  bool inPayload_ = false;
  uint8_t headerBuf_[wire::kHeaderSize];
  size_t headerGot_ = 0;
  wire::Header header_;
  size_t payloadGot_ = 0;
};

class TcpConnection final : public Connection {
 public:
  explicit TcpConnection(std::shared_ptr<TcpConnectionImpl> impl) : impl_(std::move(impl)) {}
  ~TcpConnection() override { impl_->close(); }

  using Connection::recv;
  using Connection::send;
  void send(const wire::Header& header, ConstSlices payload, SendCallback done) override {
    impl_->send(header, payload, std::move(done));
  }
  void recv(MutableSlices dest, RecvCallback done) override { impl_->recv(dest, std::move(done)); }
  void recvOwned(RecvOwnedCallback done) override { impl_->recvOwned(std::move(done)); }
  void recvRouted(RecvRoute route, RecvOwnedCallback done) override {
    impl_->recvRouted(std::move(route), std::move(done));
  }
  void close() override { impl_->close(); }
  Status status() const override { return impl_->status(); }
  const std::string& peerId() const override { return impl_->peerId(); }
  const std::string& peerAddress() const override { return impl_->peerAddress(); }
  std::string describe() const override { return impl_->describe(); }

  const std::shared_ptr<TcpConnectionImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<TcpConnectionImpl> impl_;
};

}  // namespace cofab::transport::tcp
