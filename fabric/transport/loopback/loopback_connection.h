// LoopbackConnection: one end of an in-process connection (contract:
// fabric/transport/connection.h). Internal to fabric/transport/loopback.
//
// Each end lives on its context's Worker: its callbacks run there. A send encodes the header and
// copies the payload into a message (the one copy standing in for the wire), applies the fault
// plan and hands the message to the peer end, which decodes and checks it exactly as tcp would
// and copies the payload into the posted receive. All state is under one mutex per end;
// callbacks run with no lock held.
//
// Lifetime: every pump task owns a reference to its end, so an end whose LoopbackConnection is
// dropped (or that a closing listener discards unaccepted) still runs its pump: pending
// callbacks complete exactly once and the peer sees the close. Once the worker has stopped
// (context joined), one helper thread per end at a time runs its pumps, so callbacks stay
// serial and in order.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/transport/connection.h"
#include "fabric/transport/loopback/factory.h"
#include "fabric/transport/loopback/worker.h"

namespace cofab::transport::loopback {

class Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  struct Params {
    std::shared_ptr<Worker> worker;
    std::string peerId;
    std::string peerAddress;
    uint64_t maxPayload = wire::kDefaultMaxPayload;
    FaultPlan faults;
  };
  explicit Endpoint(Params p);

  void setPeer(const std::shared_ptr<Endpoint>& peer);
  void send(const wire::Header& header, ConstSlices payload, SendCallback done);
  void recv(MutableSlices dest, RecvCallback done);
  void recvOwned(RecvOwnedCallback done);
  void close();
  Status status() const;
  void setFaults(const FaultPlan& faults);
  const std::string& peerId() const { return peerId_; }
  const std::string& peerAddress() const { return peerAddress_; }
  std::string describe() const;

 private:
  struct Message {
    std::vector<uint8_t> bytes;
    bool eof = false;  // the peer end went away; `reason` says how
    std::string reason;
    Clock::time_point readyAt;
  };
  struct SendOp {
    std::vector<uint8_t> bytes;  // header + payload
    SendCallback done;
    Status error;
  };
  struct RecvOp {
    bool owned = false;
    std::vector<MutableSlice> dest;
    size_t expected = 0;
    RecvCallback done;
    RecvOwnedCallback ownedDone;
    Status error;
  };
  using Completions = std::vector<std::function<void()>>;

  // Called by the peer end (its worker thread).
  void deliver(Message m);
  void schedulePumpLocked();
  void pump();
  // Runs pump() on the helper thread until no operation arrived meanwhile.
  void runHelper();
  void processRecvsLocked(Completions& out);
  void failLocked(const Status& status, Completions& out);
  void completeRecvLocked(RecvOp op, const Status& s, const wire::Header& h,
                          std::vector<uint8_t>&& payload, Completions& out);

  const std::shared_ptr<Worker> worker_;
  const std::string peerId_;
  const std::string peerAddress_;
  const uint64_t maxPayload_;

  mutable std::mutex mu_;
  std::weak_ptr<Endpoint> peer_;
  FaultPlan faults_;
  int64_t sentBytes_ = 0;
  Clock::time_point lastReady_{};
  bool closed_ = false;
  bool closeRequested_ = false;
  bool pumpScheduled_ = false;
  bool helperRunning_ = false;  // a helper thread drains this end (the worker has stopped)
  bool helperAgain_ = false;    // something arrived while it did: it pumps once more
  bool eofSent_ = false;
  Status error_;
  std::deque<SendOp> sends_;
  std::deque<RecvOp> recvs_;
  std::deque<Message> inbox_;
};

class LoopbackConnection final : public Connection {
 public:
  explicit LoopbackConnection(std::shared_ptr<Endpoint> ep) : ep_(std::move(ep)) {}
  ~LoopbackConnection() override { ep_->close(); }

  using Connection::recv;
  using Connection::send;
  void send(const wire::Header& header, ConstSlices payload, SendCallback done) override {
    ep_->send(header, payload, std::move(done));
  }
  void recv(MutableSlices dest, RecvCallback done) override { ep_->recv(dest, std::move(done)); }
  void recvOwned(RecvOwnedCallback done) override { ep_->recvOwned(std::move(done)); }
  void close() override { ep_->close(); }
  Status status() const override { return ep_->status(); }
  const std::string& peerId() const override { return ep_->peerId(); }
  const std::string& peerAddress() const override { return ep_->peerAddress(); }
  std::string describe() const override { return ep_->describe(); }
  Endpoint& endpoint() { return *ep_; }

 private:
  std::shared_ptr<Endpoint> ep_;
};

}  // namespace cofab::transport::loopback
